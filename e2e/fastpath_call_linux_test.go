package e2e

// A Pion call through the fast path's site, fast path off and on, across
// NAT rebinds and a global relay restart.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/proctest"
	"github.com/rtcedge/rtcedge/probe"
)

// Bounds on the longest echo gap around each event, the same with the
// fast path off and on (a loaded machine's margin over the e2e tests'
// own: TestBrowserSurvivesNATRebind's 1.5 s, TestGlobalRelayRestart's 4 s
// without a shared cache, the flow coming back with the client's next
// consent check).
const (
	rebindGap  = 1500 * time.Millisecond
	restartGap = 4 * time.Second
)

// TestCallWithFastPath: a Pion call from a client behind a kernel NAT
// through global relay → cluster relay → pod, each its own process on its
// own host, with fast_path off and auto (the default). The call connects and echoes; then
// an attacker on the LAN spoofs the tiers' datagrams with a key of its
// own (forge), then the NAT moves the client to a new port, then to a new IP, and the
// global relay is killed and restarted: each time the echo must come back
// within the same bound, on the same session, with one address change per
// rebind. With auto, the relays' kernel counters must show the call's media
// forwarded by the programs before each event (the flows are in the
// kernel when it comes) and again after it (the new flow, the new
// process's programs).
func TestCallWithFastPath(t *testing.T) {
	// auto, the default, rather than tc: a relay that fell back to user
	// space in silence (as the cluster relay's node once did) fails the
	// kernel's counters here; TestBrowserCallWithFastPath runs tc.
	for _, mode := range []string{"off", "auto"} {
		t.Run(mode, func(t *testing.T) { testCall(t, mode) })
	}
}

func testCall(t *testing.T, mode string) {
	s := newSite(t, mode)
	s.rebind(clientAddr)
	conn := s.client.ListenUDP(netip.AddrPortFrom(clientAddr, 40000))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	call, err := probe.Dial(ctx, probe.Config{SignalingURL: fmt.Sprintf("http://%s:8080", sigAddr), HTTPClient: s.http,
		PacketConn: conn, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer call.Close()
	if err := call.WaitEcho(ctx); err != nil {
		t.Fatal(err)
	}
	proctest.Await(t, 10*time.Second, "25 echoes", func() bool { return call.Stats().Received >= 25 })
	s.checkKernel("the call", s.kernel())
	s.forge()

	events := []struct {
		name string
		do   func()
		max  time.Duration
	}{
		{"NAT rebind to a new port", func() { s.rebind(clientAddr) }, rebindGap},
		{"NAT rebind to a new IP", func() { s.rebind(clientAddr2) }, rebindGap},
		{"global relay restart", s.restartGR, restartGap},
	}
	for _, ev := range events {
		start, before := time.Now(), call.Stats().Received
		ev.do()
		proctest.Await(t, 20*time.Second, ev.name+": the echo to resume", func() bool { return call.Stats().Received >= before+50 })
		gap := gapSince(call, start)
		t.Logf("%s: longest echo gap %v", ev.name, gap.Round(time.Millisecond))
		if gap > ev.max {
			t.Errorf("%s: echo gap %v, want ≤ %v", ev.name, gap, ev.max)
		}
		s.checkKernel("after the "+ev.name, s.kernel())
	}
	if v := s.metric(podAddr, "rtcedge_transceiver_sessions_created_total"); v != 1 {
		t.Errorf("%v sessions created, want the call's one", v)
	}
	moves := s.metric(podAddr, "rtcedge_transceiver_address_changes_total") + s.metric(podAddr, "rtcedge_transceiver_pop_switches_total")
	if moves != 2 {
		t.Errorf("the pod moved the session %v times, want once per rebind", moves)
	}
	if call.ConnectionState().String() != "connected" {
		t.Errorf("call state at the end: %v", call.ConnectionState())
	}
}

// kernelCounts are the relays' fast-path forwards.
type kernelCounts struct{ up, down, pod, client float64 }

// kernel reads the relays' fast-path forward counters.
func (s *site) kernel() kernelCounts {
	const gr, cr = "rtcedge_globalrelay_fast_path_packets_total", "rtcedge_clusterrelay_fast_path_packets_total"
	return kernelCounts{
		up:     s.metric(grAddr, gr, `verdict="forward_up"`),
		down:   s.metric(grAddr, gr, `verdict="forward_down"`),
		pod:    s.metric(crAddr, cr, `verdict="forward_pod"`),
		client: s.metric(crAddr, cr, `verdict="forward_client"`),
	}
}

// checkKernel checks, with the fast path on, that every program forwarded
// at least a second of the call's media (50 datagrams each way) since
// from; off, that nothing is attached and nothing was forwarded.
func (s *site) checkKernel(what string, from kernelCounts) {
	s.t.Helper()
	if s.mode == "off" {
		now := s.kernel()
		if now != (kernelCounts{}) || s.metric(grAddr, "rtcedge_globalrelay_fast_path_active") != 0 ||
			s.metric(crAddr, "rtcedge_clusterrelay_fast_path_active") != 0 {
			s.t.Errorf("%s: fast path off, yet the kernel forwarded %+v", what, now)
		}
		return
	}
	var now kernelCounts
	proctest.Await(s.t, 10*time.Second, what+": the kernel to forward the call's media", func() bool {
		now = s.kernel()
		return now.up-from.up >= 50 && now.down-from.down >= 50 && now.pod-from.pod >= 50 && now.client-from.client >= 50
	})
	s.t.Logf("%s: the kernel forwarded %+v", what, now)
}

// gapSince is the longest gap between echoes that ended after t.
func gapSince(call *probe.Call, t time.Time) time.Duration {
	var longest time.Duration
	for _, g := range call.GapsOver(50 * time.Millisecond) {
		if g.End.After(t) && g.End.Sub(g.Start) > longest {
			longest = g.End.Sub(g.Start)
		}
	}
	return longest
}
