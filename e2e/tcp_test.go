package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/probe"
)

// answerCandidates parses an answer's candidate lines into
// transport → address → priority.
func answerCandidates(t *testing.T, answer string) map[string]map[netip.AddrPort]uint64 {
	t.Helper()
	out := map[string]map[netip.AddrPort]uint64{"udp": {}, "tcp": {}}
	for _, l := range strings.Split(answer, "\r\n") {
		if !strings.HasPrefix(l, "a=candidate:") {
			continue
		}
		f := strings.Fields(l)
		ap, err := netip.ParseAddrPort(f[4] + ":" + f[5])
		if err != nil {
			t.Fatalf("bad candidate %q", l)
		}
		prio, _ := strconv.ParseUint(f[3], 10, 32)
		tr := strings.ToLower(f[2])
		if tr == "tcp" && !strings.Contains(l, "tcptype passive") {
			t.Errorf("TCP candidate is not passive: %q", l)
		}
		out[tr][ap] = prio
	}
	return out
}

// TestCallOverTCPOnly: a Pion client that may use only TCP candidates (as
// from a network that drops all UDP) connects with ICE-TCP through the
// nearest POP's TCP port, both relay tiers and the pod, hears its audio
// back, gets data-channel answers and hangs up; the answer's TCP
// candidates rank below every UDP one.
func TestCallOverTCPOnly(t *testing.T) {
	w := startWorld(t, devworld.Config{FlowIdle: time.Second, RouteTTL: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Transport: probe.TransportTCP,
		IPFilter: func(ip net.IP) bool { return ip.IsLoopback() }, Logger: testLogger()})
	if err != nil {
		t.Fatalf("dial over TCP: %v", err)
	}
	defer call.Close()

	cands := answerCandidates(t, call.Answer)
	tcpAddrs := map[netip.AddrPort]bool{}
	for _, rg := range w.Regions {
		tcpAddrs[rg.TCPAddr] = true
	}
	if len(cands["tcp"]) != 2 {
		t.Errorf("answer has %d TCP candidates, want one per POP (2):\n%s", len(cands["tcp"]), call.Answer)
	}
	// A POP's TCP candidate ranks below its own UDP candidate and those of
	// nearer POPs, and above those of farther POPs: UDP to the nearest POP
	// first, then TCP to it, then the backups (transceiver/sdp.go).
	for ap, prio := range cands["tcp"] {
		if !tcpAddrs[ap] {
			t.Errorf("TCP candidate %v is not a POP's TCP address", ap)
		}
		var own uint64
		for uap, uprio := range cands["udp"] {
			if uap.Addr() == ap.Addr() {
				own = uprio
			}
		}
		if own == 0 {
			t.Fatalf("TCP candidate %v has no UDP candidate on its POP's address", ap)
		}
		for uap, uprio := range cands["udp"] {
			if uprio >= own && prio >= uprio {
				t.Errorf("TCP candidate %v (priority %d) does not rank below UDP %v (%d) of the same or a nearer POP", ap, prio, uap, uprio)
			}
			if uprio < own && prio <= uprio {
				t.Errorf("TCP candidate %v (priority %d) does not rank above UDP %v (%d) of a farther POP", ap, prio, uap, uprio)
			}
		}
	}
	local, remote, ok := call.SelectedPair()
	if !ok || !tcpAddrs[remote] {
		t.Fatalf("selected pair %v → %v (ok %v), want a POP's TCP address", local, remote, ok)
	}
	if remote != w.Regions[0].TCPAddr && remote != w.Regions[1].TCPAddr {
		t.Fatalf("selected remote %v", remote)
	}

	if err := call.WaitEcho(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "50 echoed packets", func() bool { return call.Stats().Received >= 50 })
	if err := call.SendEvent([]byte(`{"type":"response.create"}`)); err != nil {
		t.Fatalf("send event: %v", err)
	}
	select {
	case msg := <-call.Events():
		var reply struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(msg, &reply); err != nil || reply.Type != "rtcedge.echo" {
			t.Errorf("unexpected event reply %s (%v)", msg, err)
		}
	case <-ctx.Done():
		t.Fatal("no reply on the events channel")
	}
	tm := call.Timings()
	t.Logf("TCP setup on loopback: signaling %v, ICE connected %v, DTLS connected %v, first echo %v",
		tm.Signaling, tm.ICEConnected, tm.DTLSConnected, tm.FirstEcho)

	// Everything went through the TCP ingress and both tiers; no UDP flow.
	for _, m := range []struct{ name, dir string }{
		{"rtcedge_globalrelay_tcp_frames_total", "to_cluster"},
		{"rtcedge_globalrelay_tcp_frames_total", "to_client"},
		{"rtcedge_clusterrelay_packets_total", "to_pod"},
		{"rtcedge_clusterrelay_packets_total", "to_client"},
	} {
		if v := metricSum(t, w.Registry, m.name, map[string]string{"direction": m.dir}); v < 50 {
			t.Errorf("%s{direction=%q} = %v, want ≥ 50", m.name, m.dir, v)
		}
	}
	if v := metricSum(t, w.Registry, "rtcedge_globalrelay_flows_created_total", nil); v != 0 {
		t.Errorf("%v UDP flows created by a TCP-only client", v)
	}
	if v := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_established_total", nil); v < 1 {
		t.Errorf("no TCP connection established")
	}

	// DELETE ends the session; audio stops.
	if err := call.Hangup(ctx); err != nil {
		t.Fatalf("hangup: %v", err)
	}
	eventually(t, 5*time.Second, "no sessions", func() bool { return w.Sessions() == 0 })
	before := call.Stats().Received
	eventually(t, 5*time.Second, "audio stopped", func() bool {
		time.Sleep(300 * time.Millisecond)
		now := call.Stats().Received
		stopped := now == before
		before = now
		return stopped
	})
	if v := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", map[string]string{"reason": "deleted"}); v != 1 {
		t.Errorf("sessions ended by DELETE = %v, want 1", v)
	}
}

// TestNearestPOPDiesMidCallOverTCP: a client on ICE-TCP only (Pion with
// renomination) loses the nearest POP's global relay replica, and with it
// its TCP connection; its ICE moves to the backup POP's TCP candidate, the
// transceiver follows the checks there, and the echo resumes. The media
// gap is logged and bound loosely (the client's ICE timeouts dominate).
func TestNearestPOPDiesMidCallOverTCP(t *testing.T) {
	w := startWorld(t, devworld.Config{FlowIdle: time.Second, RouteTTL: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	renominate := renominatingSettings(t)
	c := dialEchoCall(ctx, t, w.SignalingURL, func(se *webrtc.SettingEngine) {
		renominate(se)
		se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeTCP4})
		se.SetIPFilter(func(ip net.IP) bool { return ip.IsLoopback() }) // active TCP dials from every address otherwise
	})
	eventually(t, 10*time.Second, "echoes through the nearest POP", func() bool {
		after, _ := c.echoesSentAfter(0)
		return len(after) >= 25
	})
	if v := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_frames_total", map[string]string{"direction": "to_client"}); v < 25 {
		t.Fatalf("the call is not on TCP: %v frames to clients", v)
	}
	switchesBefore := metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil)
	backupFrames := map[string]string{"direction": "to_client", "pop": w.Regions[1].Spec.POPName}
	backupBefore := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_frames_total", backupFrames)
	w.Regions[0].POPReplicas[0].Kill() // the replica's TCP connections die with it
	killed := time.Since(c.start)
	eventually(t, 20*time.Second, "audio sent after the nearest POP's replica died to come back through the backup's TCP port", func() bool {
		after, _ := c.echoesSentAfter(killed)
		return len(after) >= 50
	})
	after, lastBefore := c.echoesSentAfter(killed)
	gap := after[0].received - lastBefore
	switches := metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil) - switchesBefore
	t.Logf("nearest POP's replica killed at %v; last echo before %v, first via the backup's TCP port at %v: media gap %v; POP switches %v",
		killed.Round(time.Millisecond), lastBefore.Round(time.Millisecond), after[0].received.Round(time.Millisecond), gap.Round(time.Millisecond), switches)
	// The call must now run through the backup POP's TCP port (whether the
	// transceiver switched on its own or followed the client's nomination).
	if v := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_frames_total", backupFrames) - backupBefore; v < 25 {
		t.Errorf("the backup POP carried %v TCP frames to the client after the kill, want ≥ 25", v)
	}
	if gap >= 15*time.Second {
		t.Errorf("media gap %v, want < 15 s", gap)
	}
}
