package geo

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func cfRequest(peer string, located bool) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/realtime/calls", nil)
	r.RemoteAddr = peer + ":40000"
	r.Header.Set("CF-Ray", "8a1b2c3d4e5f6789-FRA")
	r.Header.Set("CF-Connecting-IP", "198.51.100.7")
	if located {
		r.Header.Set("CF-IPLatitude", "50.11")
		r.Header.Set("CF-IPLongitude", "8.68")
	}
	return r
}

func TestCFHeaderCheck(t *testing.T) {
	const cloudflare = "173.245.48.10"
	tests := []struct {
		name     string
		requests []*http.Request
		warn     bool
	}{
		{"transform off: warns once", repeat(25, func() *http.Request { return cfRequest(cloudflare, false) }), true},
		{"below the threshold", repeat(19, func() *http.Request { return cfRequest(cloudflare, false) }), false},
		{"transform on", append(repeat(25, func() *http.Request { return cfRequest(cloudflare, false) }), cfRequest(cloudflare, true)), true},
		{"some located before the threshold", append([]*http.Request{cfRequest(cloudflare, true)}, repeat(25, func() *http.Request { return cfRequest(cloudflare, false) })...), false},
		{"forged CF-Ray from an untrusted peer", repeat(25, func() *http.Request { return cfRequest("203.0.113.9", false) }), false},
		{"no CF-Ray: not through Cloudflare", repeat(25, func() *http.Request {
			r := cfRequest(cloudflare, false)
			r.Header.Del("CF-Ray")
			return r
		}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			reg := prometheus.NewRegistry()
			c, err := NewCFHeaderCheck(CFHeaderCheckConfig{
				Proxies: []netip.Prefix{netip.MustParsePrefix("173.245.48.0/20")},
				Logger:  slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg,
			})
			if err != nil {
				t.Fatal(err)
			}
			served := 0
			h := c.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
			for _, r := range tt.requests {
				h.ServeHTTP(httptest.NewRecorder(), r)
			}
			if served != len(tt.requests) {
				t.Errorf("served %d of %d", served, len(tt.requests))
			}
			if got := strings.Count(logs.String(), "Add visitor location headers"); got != map[bool]int{true: 1, false: 0}[tt.warn] {
				t.Errorf("%d warnings, want warn=%v:\n%s", got, tt.warn, logs.String())
			}
			located := 0
			for _, r := range tt.requests {
				if r.Header.Get("CF-IPLatitude") != "" {
					located++
				}
			}
			if got := counterValue(t, c.present); tt.warn && got != float64(located) {
				t.Errorf("present = %v, want %d", got, located)
			}
			if tt.name == "transform off: warns once" && !c.Missing() {
				t.Error("Missing() = false with the transform off")
			}
			if tt.name == "transform on" && c.Missing() {
				t.Error("Missing() = true once a located request arrived")
			}
		})
	}
}

func repeat(n int, f func() *http.Request) []*http.Request {
	out := make([]*http.Request, n)
	for i := range out {
		out[i] = f()
	}
	return out
}

func TestCFHeaderCheckDoesNotAllocate(t *testing.T) {
	c, err := NewCFHeaderCheck(CFHeaderCheckConfig{Proxies: []netip.Prefix{netip.MustParsePrefix("173.245.48.0/20")}, Threshold: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	located, bare := cfRequest("173.245.48.10", true), cfRequest("173.245.48.10", false)
	if n := testing.AllocsPerRun(100, func() { c.Observe(located); c.Observe(bare) }); n != 0 {
		t.Errorf("Observe allocates %v times", n)
	}
}
