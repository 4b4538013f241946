package signaling_test

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/signaling"
)

// TestNodeDrain: a signaling node loads its catalogue file and is ready;
// on stop both /readyz (public and metrics listener) turn 503 while it
// keeps serving for drain_delay, then it exits.
func TestNodeDrain(t *testing.T) {
	cfg := signaling.Config{Common: node.Common{MetricsAddr: "127.0.0.1:0"}, ListenAddr: "127.0.0.1:0", DrainDelay: 2 * time.Second,
		AllowAnonymous: true, Catalogue: filepath.Join("..", "geo", "testdata", "catalogue.yaml")}
	s, err := signaling.OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	metrics := s.Metrics.Addr()
	n, err := signaling.NewNode(cfg, s, node.Env{Logger: nodetest.Quiet})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Catalogue().Regions) == 0 {
		t.Fatal("no regions loaded")
	}
	stop := nodetest.Run(t, n)
	urls := []string{n.URL() + "/readyz", "http://" + metrics.String() + "/readyz"}
	for _, u := range urls {
		if code := nodetest.Readyz(t, u); code != http.StatusOK {
			t.Fatalf("%s = %d before the stop", u, code)
		}
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	nodetest.Await(t, "readiness to fail", func() bool { return n.Ready() != nil })
	for _, u := range urls {
		if code := nodetest.Readyz(t, u); code != http.StatusServiceUnavailable {
			t.Errorf("%s = %d while draining", u, code)
		}
	}
	select {
	case <-stopped:
		t.Fatal("stopped before drain_delay passed")
	default:
	}
	<-stopped
}
