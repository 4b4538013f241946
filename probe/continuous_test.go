package probe_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/probe"
)

// scrape fetches a Prometheus text page and returns its samples by series
// (name plus labels as printed).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape: bad sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestContinuous runs the prober for two calls and scrapes its metrics:
// both runs succeed, and the setup, RTT, jitter and loss series carry the
// placement signaling reported.
func TestContinuous(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	m, srv := newMetrics(t)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var reports []probe.Report
	start := time.Now()
	err := probe.Continuous(ctx, probe.ContinuousConfig{
		Call: callConfig(t, w.SignalingURL), Interval: 200 * time.Millisecond, Hold: 300 * time.Millisecond,
		Iterations: 2, Metrics: m,
		OnResult: func(r probe.Report, err error) {
			if err != nil {
				t.Errorf("probe call failed: %v", err)
			}
			reports = append(reports, r)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != 2 {
		t.Fatalf("%d results, want 2", len(reports))
	}
	r := reports[0]
	t.Logf("first call: %s", r)

	got := scrape(t, srv.URL)
	place := `cluster="` + r.Cluster + `",pop="` + r.POP + `",region="` + r.Region + `"`
	want := map[string]float64{
		`rtcedge_probe_runs_total{result="ok"}`:    2,
		`rtcedge_probe_runs_total{result="error"}`: 0,
	}
	for _, s := range probe.SetupStages {
		want[`rtcedge_probe_setup_seconds_count{`+place+`,stage="`+s+`"}`] = 2
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if n := got[`rtcedge_probe_rtt_seconds_count{`+place+`}`]; n < 10 {
		t.Errorf("%v RTT samples, want the echoes of two calls", n)
	}
	if _, ok := got[`rtcedge_probe_jitter_seconds{`+place+`}`]; !ok {
		t.Error("no jitter gauge for the placement")
	}
	if l, ok := got[`rtcedge_probe_loss_ratio{`+place+`}`]; !ok || l < 0 || l > 1 {
		t.Errorf("loss gauge %v (present %v)", l, ok)
	}
	if ts := got[`rtcedge_probe_last_success_timestamp_seconds`]; ts < float64(start.Unix()) {
		t.Errorf("last success at %v, before the run started at %v", ts, start.Unix())
	}
}

// TestContinuousRecordsFailures counts a failed call by reason and stops
// on ctx.
func TestContinuousRecordsFailures(t *testing.T) {
	m, srv := newMetrics(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Signaling that refuses every offer.
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	defer refuse.Close()
	runs := 0
	err := probe.Continuous(ctx, probe.ContinuousConfig{
		Call: callConfig(t, refuse.URL), Interval: 10 * time.Millisecond, Metrics: m,
		OnResult: func(_ probe.Report, err error) {
			if probe.FailureReason(err) != "signaling_http_503" {
				t.Errorf("error %v: reason %q, want signaling_http_503", err, probe.FailureReason(err))
			}
			if runs++; runs == 3 {
				cancel()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := scrape(t, srv.URL)
	if got[`rtcedge_probe_runs_total{result="error"}`] != 3 || got[`rtcedge_probe_failures_total{reason="signaling_http_503"}`] != 3 {
		t.Errorf("after 3 refused calls: runs %v, failures %v", got[`rtcedge_probe_runs_total{result="error"}`], got[`rtcedge_probe_failures_total{reason="signaling_http_503"}`])
	}
	if got[`rtcedge_probe_last_success_timestamp_seconds`] != 0 {
		t.Error("last success set without a success")
	}
}

// newMetrics returns the prober's metrics and a server scraping them, closed
// when the test ends.
func newMetrics(t *testing.T) (*probe.Metrics, *httptest.Server) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := probe.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return m, srv
}
