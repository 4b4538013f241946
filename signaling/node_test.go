package signaling_test

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
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

// TestNodeServesTLS: with tls set, the node serves its API over HTTPS on
// listen_addr (its URL says https), and a plain HTTP request gets no API.
func TestNodeServesTLS(t *testing.T) {
	server, client, err := sessionapi.WriteDevCA(t.TempDir(), net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	cfg := signaling.Config{ListenAddr: "127.0.0.1:0", AllowAnonymous: true, TLS: server,
		Catalogue: filepath.Join("..", "geo", "testdata", "catalogue.yaml")}
	s, err := signaling.OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := signaling.NewNode(cfg, s, node.Env{Logger: nodetest.Quiet})
	if err != nil {
		t.Fatal(err)
	}
	nodetest.Run(t, n)
	if !strings.HasPrefix(n.URL(), "https://127.0.0.1:") {
		t.Fatalf("URL %s, want https://127.0.0.1:PORT", n.URL())
	}
	hc, err := client.Client(&http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer hc.CloseIdleConnections()
	res, err := hc.Get(n.URL() + "/livez")
	if err != nil {
		t.Fatalf("GET /livez over TLS: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /livez over TLS = %d", res.StatusCode)
	}
	plain := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	defer plain.CloseIdleConnections()
	if res, err := plain.Get("http://" + strings.TrimPrefix(n.URL(), "https://") + "/livez"); err == nil {
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP got the API: %d %s", res.StatusCode, body)
		}
	}
	cfg.TLS.CA = client.CA
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "tls") {
		t.Errorf("tls with a ca: %v, want refused", err)
	}
}
