package e2e

import (
	"context"
	"encoding/binary"
	"net/netip"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/probe"
	"github.com/rtcedge/rtcedge/transceiver"
)

// TestCallSurvivesSpoofedHijackChecks is issue 10's goal: an attacker who
// knows a caller's address and holds another session's valid ufrag (on the
// other region's pod) sends 100 spoofed Binding Requests a second from the
// caller's address to the caller's POP, for 5 seconds. The call's echo
// continues with under 1 % loss, and every spoofed check is refused at the
// global relay without moving the flow. Before quiet-time takeover, the
// first spoofed check moved the caller's uplink to the attacker's pod.
//
// Spoofing uses a raw IPv4 socket on loopback (CAP_NET_RAW, as root).
func TestCallSurvivesSpoofedHijackChecks(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	call, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Logger: testLogger()})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer call.Close()
	if err := call.WaitEcho(ctx); err != nil {
		t.Fatal(err)
	}
	victim, vip, ok := call.SelectedPair()
	if !ok || !victim.Addr().Is4() {
		t.Fatalf("no IPv4 selected pair (%v → %v)", victim, vip)
	}

	// The attacker's own session, on the other region's pod: its ufrag is
	// a valid token for another cluster and pod.
	other := w.Regions[1]
	res, err := other.Pods[0].Transceiver.CreateSession(ctx, transceiver.CreateRequest{Offer: testsdp.Offer(t),
		POPs: []transceiver.POPAddr{{ID: other.Spec.POP, VIP: other.GlobalRelay.PublicAddr()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Pods[0].Transceiver.EndSession(res.ID)
	su := regexp.MustCompile(`a=ice-ufrag:(\S+)`).FindStringSubmatch(res.Answer)
	pw := regexp.MustCompile(`a=ice-pwd:(\S+)`).FindStringSubmatch(res.Answer)
	if su == nil || pw == nil {
		t.Fatal("no ICE credentials in the attacker's answer")
	}
	spoof := spoofer(t, victim, vip)

	busy := func() float64 {
		return metricSum(t, w.Registry, "rtcedge_globalrelay_dropped_packets_total", map[string]string{"reason": "flow_busy"})
	}
	before := call.Stats()
	const checks = 500 // 100 a second for 5 seconds
	tick := time.NewTicker(10 * time.Millisecond)
	for range checks {
		m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(su[1]+":abcd"),
			ice.PriorityAttr(1<<24), ice.AttrControlling(7), ice.UseCandidate(),
			stun.NewShortTermIntegrity(pw[1]), stun.Fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		spoof(m.Raw)
		<-tick.C
	}
	tick.Stop()
	// Lost counts packets sent more than a second ago and never echoed.
	time.Sleep(1500 * time.Millisecond)
	after := call.Stats()
	sent, lost := after.Sent-before.Sent, after.Lost-before.Lost
	t.Logf("during the attack: %d packets sent, %d lost; %v spoofed checks refused as flow_busy", sent, lost, busy())
	if sent < 200 {
		t.Fatalf("only %d packets sent during the attack", sent)
	}
	if float64(lost) >= 0.01*float64(sent) {
		t.Errorf("%d of %d packets lost (≥ 1 %%) under spoofed hijack checks", lost, sent)
	}
	if v := busy(); v < checks*0.9 {
		t.Errorf("flow_busy drops = %v, want about %d: the spoofed checks did not all reach the relay and get refused", v, checks)
	}
	if call.ConnectionState().String() != "connected" {
		t.Errorf("call state %v after the attack", call.ConnectionState())
	}
}

// spoofer returns a function that sends one UDP datagram from src to dst
// (both IPv4) through a raw socket, whatever socket owns src.
func spoofer(t *testing.T, src, dst netip.AddrPort) func([]byte) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		t.Fatalf("raw socket for source spoofing: %v (the test needs CAP_NET_RAW: run it as root)", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	to := &syscall.SockaddrInet4{Addr: dst.Addr().As4()}
	return func(payload []byte) {
		pkt := make([]byte, 28+len(payload))
		pkt[0] = 0x45 // IPv4, 20-byte header; the kernel fills in length, ID and checksum
		binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
		pkt[8], pkt[9] = 64, syscall.IPPROTO_UDP
		s, d := src.Addr().As4(), dst.Addr().As4()
		copy(pkt[12:16], s[:])
		copy(pkt[16:20], d[:])
		binary.BigEndian.PutUint16(pkt[20:], src.Port())
		binary.BigEndian.PutUint16(pkt[22:], dst.Port())
		binary.BigEndian.PutUint16(pkt[24:], uint16(8+len(payload))) // checksum 0: none (IPv4)
		copy(pkt[28:], payload)
		if err := syscall.Sendto(fd, pkt, 0, to); err != nil {
			t.Fatalf("send spoofed datagram: %v", err)
		}
	}
}
