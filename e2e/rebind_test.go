package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/netsim"
)

// natOutsideIPs are the public addresses of the test NAT: loopback
// addresses no POP of the dev world uses.
var natOutsideIPs = []netip.Addr{netip.MustParseAddr("127.0.10.1"), netip.MustParseAddr("127.0.10.2")}

// startNAT runs a user-space NAT until the test ends.
func startNAT(t *testing.T) *netsim.NAT {
	t.Helper()
	n, err := netsim.NewNAT(netsim.NATConfig{OutsideIPs: natOutsideIPs, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return n
}

// behindNAT returns SettingEngine settings that put a Pion client's only
// socket behind a new host of nat: its ICE runs over a UDP mux on the
// host, exactly as over a kernel socket.
func behindNAT(t *testing.T, nat *netsim.NAT) (*netsim.NATHost, func(*webrtc.SettingEngine)) {
	t.Helper()
	host, err := nat.NewHost()
	if err != nil {
		t.Fatal(err)
	}
	mux := ice.NewUDPMuxDefault(ice.UDPMuxParams{UDPConn: host})
	t.Cleanup(func() { _ = mux.Close() }) // after the call's own cleanup
	return host, func(se *webrtc.SettingEngine) { se.SetICEUDPMux(mux) }
}

// rebindOutcome is what one rebind cost a call.
type rebindOutcome struct {
	firstOut, firstCheck time.Duration // the client's first datagram and first check from the new address
	lastBefore, resumed  time.Duration // last echo before the rebind, first echo of audio sent after it
	sent, echoed         int           // audio sent in the 3 s after resumption, and echoed
}

// rebindMidCall runs one call through a NAT, rebinds the client two seconds
// into it, and measures how the call comes back.
func rebindMidCall(t *testing.T, w *devworld.World, nat *netsim.NAT, kind netsim.RebindKind) rebindOutcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	host, settings := behindNAT(t, nat)
	c := dialEchoCall(ctx, t, w.SignalingURL, settings)
	// Two seconds of audio at 50 packets per second have come back.
	eventually(t, 10*time.Second, "two seconds of echo before the rebind", func() bool {
		after, _ := c.echoesSentAfter(0)
		return len(after) >= 100
	})
	old := host.Mapping().Outside
	m, err := host.Rebind(kind)
	if err != nil {
		t.Fatal(err)
	}
	rebound := c.since(time.Now())
	t.Logf("rebound the client from %v to %v at %v", old, m.Outside, rebound.Round(time.Millisecond))
	for what, ch := range map[string]<-chan struct{}{"datagram": m.OutSeen, "ICE check": m.STUNSeen} {
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("the client sent no %s from its new address", what)
		}
	}
	m = host.Mapping()
	var o rebindOutcome
	o.firstOut, o.firstCheck = c.since(m.FirstOut), c.since(m.FirstSTUN)
	eventually(t, 15*time.Second, "echo of audio sent after the rebind (the transceiver must follow the client's new address)", func() bool {
		after, _ := c.echoesSentAfter(rebound)
		return len(after) >= 10
	})
	var after []echoArrival
	after, o.lastBefore = c.echoesSentAfter(rebound)
	o.resumed = after[0].received
	// Loss is counted over the three seconds after echo resumed, once the
	// echoes of audio sent at the end of that window have had time back.
	window := o.resumed + 3*time.Second
	eventually(t, 15*time.Second, "three seconds of audio after the echo resumed", func() bool {
		after, _ := c.echoesSentAfter(window + 500*time.Millisecond)
		return len(after) > 0
	})
	o.sent, o.echoed = c.lossBetween(o.resumed, window)
	return o
}

// TestCallSurvivesNATRebind moves a standard Pion client's NAT mapping to a
// new outside port, or to a new outside IP, two seconds into a call. The
// client does not know: its audio and its next consent check simply leave
// from the new address. The transceiver must move the session's downlink
// there once the check (authenticated by Pion) arrives while the old address
// is silent: echo resumes within a second of that check, with under 1 %
// loss afterwards, and the backend session is the same throughout.
//
// The gap from the rebind to the check is the client's consent interval
// (about 2 s for Pion): the global relay creates a flow for a new address
// only from a STUN check carrying a valid token, so audio that arrives from
// the new address before it cannot be routed (docs/operations.md).
func TestCallSurvivesNATRebind(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind netsim.RebindKind
	}{
		{"new port", netsim.RebindPort},
		{"new IP", netsim.RebindIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startWorld(t, devworld.Config{})
			nat := startNAT(t)
			o := rebindMidCall(t, w, nat, tc.kind)
			t.Logf("first datagram from the new address at %v, first check at %v; last echo before %v, echo resumed at %v: "+
				"%v after the first check, %v after the first datagram; %d of %d echoed in the 3 s after",
				o.firstOut.Round(time.Millisecond), o.firstCheck.Round(time.Millisecond), o.lastBefore.Round(time.Millisecond),
				o.resumed.Round(time.Millisecond), (o.resumed - o.firstCheck).Round(time.Millisecond),
				(o.resumed - o.firstOut).Round(time.Millisecond), o.echoed, o.sent)
			if d := o.resumed - o.firstCheck; d > time.Second {
				t.Errorf("echo resumed %v after the client's first check from the new address, want ≤ 1 s", d)
			}
			if o.sent == 0 || float64(o.sent-o.echoed) > 0.01*float64(o.sent) {
				t.Errorf("%d of %d packets echoed after the rebind: loss over 1 %%", o.echoed, o.sent)
			}
			if n := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_created_total", nil); n != 1 {
				t.Errorf("%v backend sessions created, want the one call's", n)
			}
			if n := metricSum(t, w.Registry, "rtcedge_transceiver_address_changes_total", nil); n != 1 {
				t.Errorf("%v address changes followed, want 1", n)
			}
		})
	}
}
