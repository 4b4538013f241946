package transceiver_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/echo"
	"github.com/rtcedge/rtcedge/backend/netbackend"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/transceiver"
)

// TestNewBackend: backend_url selects the Realtime connector (its key from
// the environment, ready while its server accepts connections),
// backend_addr the network backend, neither the echo.
func TestNewBackend(t *testing.T) {
	env := map[string]string{"RTCEDGE_BACKEND_API_KEY": "sk-test"}
	getenv := func(k string) string { return env[k] }
	if b, err := (&transceiver.Config{}).NewBackend(getenv, nodetest.Quiet, nil); err != nil || b != (echo.Backend{}) {
		t.Errorf("no backend setting: %T %v, want the echo", b, err)
	}
	if b, err := (&transceiver.Config{BackendAddr: "127.0.0.1:9500"}).NewBackend(getenv, nodetest.Quiet, nil); err != nil {
		t.Error(err)
	} else if _, ok := b.(*netbackend.Backend); !ok {
		t.Errorf("backend_addr: %T, want netbackend", b)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := transceiver.Config{BackendURL: "ws://" + ln.Addr().String() + "/v1/realtime?model=m", BackendProtocol: "beta"}
	b, err := cfg.NewBackend(getenv, nodetest.Quiet, reg)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := b.(backend.InputRater); !ok || r.InputRate() != 24000 {
		t.Errorf("backend_url: %T: no input rate of 24000 for the answer", b)
	}
	r, ok := b.(backend.Ready)
	if !ok {
		t.Fatalf("backend_url: %T has no Ready", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Ready(ctx); err != nil {
		t.Errorf("Ready with the server listening: %v", err)
	}
	ln.Close()
	if err := r.Ready(ctx); err == nil || strings.Contains(err.Error(), "sk-test") {
		t.Errorf("Ready with the server gone: %v", err)
	}
	if mfs, _ := reg.Gather(); len(mfs) == 0 {
		t.Error("the connector registered no metrics")
	}
	if _, err := (&transceiver.Config{BackendURL: "http://x/v1/realtime"}).NewBackend(getenv, nodetest.Quiet, nil); err == nil || !strings.Contains(err.Error(), "backend_url") {
		t.Errorf("bad URL: %v", err)
	}
}
