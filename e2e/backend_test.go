package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
)

// TestCallThroughNetworkBackend: the pods bridge the call to a backend in
// another "process" over the netbackend protocol (loopback TCP); the echo
// comes back through it, events too.
func TestCallThroughNetworkBackend(t *testing.T) {
	w := startWorld(t, devworld.Config{NetBackend: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := dial(t, ctx, w)
	eventually(t, 5*time.Second, "50 echoes through the network backend", func() bool { return call.Stats().Received >= 50 })
	if err := call.SendEvent([]byte(`{"type":"response.create"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-call.Events():
		if !strings.Contains(string(msg), "rtcedge.echo") {
			t.Errorf("event reply %s", msg)
		}
	case <-ctx.Done():
		t.Fatal("no event reply through the network backend")
	}
	st := call.Stats()
	t.Logf("echo RTT through relays and the network backend: p50 %v p99 %v", st.Percentile(50), st.Percentile(99))
	if err := call.Hangup(ctx); err != nil {
		t.Fatal(err)
	}
}
