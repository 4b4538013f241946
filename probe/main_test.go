package probe_test

import (
	"log/slog"
	"net"
	"net/http"
	"testing"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testleak"
	"github.com/rtcedge/rtcedge/internal/testlog"
	"github.com/rtcedge/rtcedge/probe"
)

// TestMain checks for leaked goroutines, once memberlist's probes of the
// stopped worlds have ended.
func TestMain(m *testing.M) { testleak.Main(m) }

func testLogger() *slog.Logger { return testlog.Logger() }

// startWorld starts a dev world that the test closes.
func startWorld(t *testing.T, cfg devworld.Config) *devworld.World {
	t.Helper()
	cfg.Logger = testLogger()
	w, err := devworld.Start(cfg)
	if err != nil {
		t.Fatalf("start dev world: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// callConfig is a probe config for url that gathers candidates on loopback
// only, with its own HTTP client whose idle connections the test closes.
func callConfig(t *testing.T, url string) probe.Config {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	t.Cleanup(client.CloseIdleConnections)
	return probe.Config{
		SignalingURL: url,
		HTTPClient:   client,
		Logger:       testLogger(),
		IPFilter:     func(ip net.IP) bool { return ip.IsLoopback() },
	}
}
