package main

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/mmdbfixture"
	"github.com/rtcedge/rtcedge/internal/proctest"
	"github.com/rtcedge/rtcedge/internal/testsdp"
)

// TestDevSteeringFromTerminal is what README.md tells a newcomer to do:
// `rtcedge dev -geoip FILE -trust-proxy 127.0.0.0/8`, then an offer sent
// with CF-Connecting-IP lands in the region the database puts that address
// in. The database swaps the embedded one's ranges (198.51.100.0/24 is
// Frankfurt here, Ashburn there), so the answer shows the file was used.
func TestDevSteeringFromTerminal(t *testing.T) {
	db, err := mmdbfixture.Build([]mmdbfixture.Record{
		{Network: netip.MustParsePrefix("198.51.100.0/24"), City: "Frankfurt am Main", Country: "DE", Lat: 50.11, Lon: 8.68},
		{Network: netip.MustParsePrefix("192.0.2.0/24"), City: "Ashburn", Country: "US", Lat: 39.04, Lon: -77.49},
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "GeoLite2-City.mmdb")
	if err := os.WriteFile(path, db, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := proctest.Build(t, ".")
	dev := proctest.Start(t, bin, proctest.Spec{Name: "dev", Args: []string{"dev", "-http", "127.0.0.1:0", "-sip", "127.0.0.1:0", "-metrics", "",
		"-pop-port", "0", "-geoip", path, "-trust-proxy", "127.0.0.0/8", "-trust-proxy", "::1/128"}})
	var url string
	proctest.Await(t, 30*time.Second, "the dev world to print its URL", func() bool {
		for _, l := range dev.Lines() {
			if _, u, ok := strings.Cut(l, "signaling + demo page: "); ok {
				url = strings.TrimSpace(u)
				return true
			}
		}
		return false
	})
	offer := testsdp.Offer(t)
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for _, tc := range []struct{ ip, region string }{
		{"198.51.100.7", "eu-central"},
		{"192.0.2.10", "us-east"},
	} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/realtime/sdp", strings.NewReader(offer))
		req.Header.Set("Content-Type", "application/sdp")
		req.Header.Set("CF-Connecting-IP", tc.ip)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("%s: offer answered %d: %s", tc.ip, resp.StatusCode, body)
		}
		if got := resp.Header.Get("X-Rtcedge-Region"); got != tc.region {
			t.Errorf("CF-Connecting-IP %s steered to %q, want %s", tc.ip, got, tc.region)
		}
		if loc := resp.Header.Get("Location"); loc != "" {
			del, _ := http.NewRequest(http.MethodDelete, url+loc, nil)
			if r, err := client.Do(del); err == nil {
				r.Body.Close()
			}
		}
	}
	if err := dev.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	dev.Wait(t, 15*time.Second)
}
