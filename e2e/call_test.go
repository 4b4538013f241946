package e2e

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/probe"
)

// TestCallThroughRelays is the walking skeleton end to end: a Pion client
// posts its offer, connects through global relay → cluster relay →
// transceiver, hears its audio back, gets data-channel answers and hangs
// up; afterwards nothing of the call remains.
func TestCallThroughRelays(t *testing.T) {
	w := startWorld(t, devworld.Config{FlowIdle: time.Second, RouteTTL: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	call, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Logger: testLogger()})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer call.Close()

	// The answer is ICE-lite and names only relay VIPs.
	if !strings.Contains(call.Answer, "a=ice-lite") {
		t.Errorf("answer lacks a=ice-lite:\n%s", call.Answer)
	}
	if !strings.Contains(call.Answer, "a=setup:active") {
		t.Errorf("answer lacks a=setup:active:\n%s", call.Answer)
	}
	vips := map[netip.AddrPort]bool{}
	for _, rg := range w.Regions {
		vips[rg.GlobalRelay.PublicAddr()] = true
	}
	cands := map[netip.AddrPort]bool{}
	for _, l := range strings.Split(call.Answer, "\r\n") {
		if !strings.HasPrefix(l, "a=candidate:") {
			continue
		}
		f := strings.Fields(l)
		if strings.EqualFold(f[2], "tcp") {
			continue // the POPs' ICE-TCP candidates: TestCallOverTCPOnly
		}
		ap, err := netip.ParseAddrPort(f[4] + ":" + f[5])
		if err != nil || !vips[ap] || f[7] != "host" {
			t.Errorf("answer candidate is not a relay VIP: %q", l)
		}
		cands[ap] = true
	}
	if len(cands) != 2 {
		t.Errorf("answer names %d candidate addresses, want 2 (nearest and backup POP)", len(cands))
	}
	if call.Region != "eu-central" || call.POP != "fra" {
		t.Errorf("loopback client placed in region %q POP %q, want the default eu-central/fra", call.Region, call.POP)
	}

	// Audio comes back through both tiers.
	if err := call.WaitEcho(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "50 echoed packets", func() bool { return call.Stats().Received >= 50 })

	// The events channel is answered.
	if err := call.SendEvent([]byte(`{"type":"response.create"}`)); err != nil {
		t.Fatalf("send event: %v", err)
	}
	select {
	case msg := <-call.Events():
		var reply struct {
			Type string          `json:"type"`
			Echo json.RawMessage `json:"echo"`
		}
		if err := json.Unmarshal(msg, &reply); err != nil || reply.Type != "rtcedge.echo" || !strings.Contains(string(reply.Echo), "response.create") {
			t.Errorf("unexpected event reply %s (%v)", msg, err)
		}
	case <-ctx.Done():
		t.Fatal("no reply on the events channel")
	}

	tm, st := call.Timings(), call.Stats()
	t.Logf("setup: signaling %v, ICE connected %v, DTLS connected %v, first echo %v",
		tm.Signaling, tm.ICEConnected, tm.DTLSConnected, tm.FirstEcho)
	t.Logf("echo RTT over loopback through both relay tiers: p50 %v p90 %v p99 %v over %d packets, jitter %v",
		st.Percentile(50), st.Percentile(90), st.Percentile(99), len(st.RTTs), st.Jitter)

	// Both tiers carried the traffic, both ways.
	for _, m := range []struct {
		name, dir string
	}{
		{"rtcedge_globalrelay_packets_total", "to_cluster"},
		{"rtcedge_globalrelay_packets_total", "to_client"},
		{"rtcedge_clusterrelay_packets_total", "to_pod"},
		{"rtcedge_clusterrelay_packets_total", "to_client"},
	} {
		if v := metricSum(t, w.Registry, m.name, map[string]string{"direction": m.dir}); v < 50 {
			t.Errorf("%s{direction=%q} = %v, want ≥ 50", m.name, m.dir, v)
		}
	}

	// The pods accepted only their cluster relays, and knew them.
	for _, rg := range w.Regions {
		for _, p := range rg.Pods {
			for _, cr := range rg.ClusterRelays {
				if !p.Relays.Trusted(cr.Relay.Addr()) {
					t.Errorf("pod %d of %s does not trust its cluster relay %v", p.ID, rg.Spec.Name, cr.Relay.Addr())
				}
			}
			if p.Relays.Trusted(netip.MustParseAddrPort("127.0.0.1:1")) {
				t.Errorf("pod %d of %s trusts any sender: its relay set is empty", p.ID, rg.Spec.Name)
			}
		}
	}
	if v := metricSum(t, w.Registry, "rtcedge_transceiver_dropped_packets_total", map[string]string{"reason": "unknown_relay"}); v != 0 {
		t.Errorf("pods dropped %v datagrams from unknown relays in a normal call", v)
	}

	// Hang up: the session, its return routes and the relay flows go.
	if err := call.Hangup(ctx); err != nil {
		t.Fatalf("hangup: %v", err)
	}
	call.Close()
	eventually(t, 5*time.Second, "no sessions", func() bool { return w.Sessions() == 0 })
	eventually(t, 10*time.Second, "no flows and no return routes", func() bool {
		n := 0
		for _, rg := range w.Regions {
			n += rg.GlobalRelay.Flows()
		}
		return n == 0 && metricSum(t, w.Registry, "rtcedge_transceiver_client_routes", nil) == 0
	})
	if v := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", map[string]string{"reason": "deleted"}); v != 1 {
		t.Errorf("sessions ended by DELETE = %v, want 1", v)
	}
}
