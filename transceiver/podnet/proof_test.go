package podnet

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
)

// proofBench is a pod socket with POP 1 whose replies go to a relay socket
// the test reads, and session conns named by their server ufrag.
type proofBench struct {
	t     *testing.T
	sock  *Socket
	pc    *popConn
	reg   *prometheus.Registry
	relay *net.UDPConn
	from  netip.AddrPort // the relay's address, the datagrams' source
}

func newProofBench(t *testing.T, now func() time.Time) *proofBench {
	sock, pc, reg := unitSocketAt(t, nil, now)
	relay := udp4(t)
	t.Cleanup(func() { relay.Close() })
	return &proofBench{t: t, sock: sock, pc: pc, reg: reg, relay: relay, from: relay.LocalAddr().(*net.UDPAddr).AddrPort()}
}

// conn adds a session conn of the POP for a server ufrag.
func (b *proofBench) conn(ufrag string) *muxConn {
	c, err := b.pc.mux.GetConn(ufrag, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { c.Close() })
	return c.(*muxConn)
}

// in hands the pod a datagram from client (routing token tok) through the
// relay, and returns its payload size.
func (b *proofBench) in(client netip.AddrPort, tok [6]byte, payload []byte) int {
	h := clientHeader(client)
	h.Token = tok
	pkt := sealed(b.t, h, string(payload))
	buf := bufPool.Get().(*podBuf)
	n := copy(buf[:], pkt)
	if !b.sock.handle(buf, n, b.from) {
		bufPool.Put(buf)
	}
	return len(payload)
}

// out reads what the pod sent toward client until nothing comes for
// 200 ms: the payloads.
func (b *proofBench) out(client netip.AddrPort) [][]byte {
	var got [][]byte
	buf := make([]byte, 2048)
	for {
		_ = b.relay.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, _, err := b.relay.ReadFromUDPAddrPort(buf)
		if err != nil {
			return got
		}
		h, hl, err := encap.Decode(buf[:n])
		if err != nil || h.Client != client {
			b.t.Fatalf("pod sent something unexpected: %x", buf[:n])
		}
		got = append(got, append([]byte(nil), buf[hl:n]...))
	}
}

func (b *proofBench) metric(name, label, value string) float64 {
	return counter(b.t, b.reg, name, label, value)
}

var (
	rtpPkt  = append([]byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef}, make([]byte, 20)...)
	dtlsPkt = append([]byte{22, 0xfe, 0xfd}, make([]byte, 200)...)
	tokV    = [6]byte{'v', 'i', 'c', 't', 'i', 'm'}
)

// TestProofIsPerSession: a return-routability proof belongs to the session
// that earned it. An attacker proves address Y with its own call, ends it,
// then sends audio with the victim's routing token from Y while the
// victim's address is silent: the pod probes Y with the victim's
// credentials (which the attacker cannot answer) instead of presenting
// the victim's agent a check from Y, and sends the victim's media nowhere
// near Y. And a check of the attacker's own session spoofed from the
// victim's proven address earns that session a probe, not the victim's
// proof: its media toward the address waits. Before, the proof belonged
// to the address, and both moved or started traffic with no probe.
func TestProofIsPerSession(t *testing.T) {
	clock := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	b := newProofBench(t, func() time.Time { return clock })
	victimConn := b.conn("victim")
	attackerConn := b.conn("attacker")
	victimAddr := netip.MustParseAddrPort("198.51.100.50:4000")
	y := netip.MustParseAddrPort("203.0.113.9:4000")
	victim := &fakeSession{pop: 1, peer: victimAddr, server: Creds{"victim", "victim-server-password"},
		client: Creds{"cvic", "victim-client-password-0123"}}
	b.sock.sessions = fakeSessions{tokV: victim}

	// The victim's own call: proven at its address by two checks.
	b.in(victimAddr, tokV, []byte("a check of the victim's, some hundred bytes long ........................."))
	b.sock.Confirm(1, victimAddr, "victim", [12]byte{1})
	b.sock.Confirm(1, victimAddr, "victim", [12]byte{2})

	// The attacker proves Y with its own call, then ends it.
	b.in(y, [6]byte{'a'}, bytes.Repeat([]byte{1}, 100))
	b.sock.Confirm(1, y, "attacker", [12]byte{1})
	b.sock.Confirm(1, y, "attacker", [12]byte{2})
	if _, err := attackerConn.WriteToAddrPort(rtpPkt, y); err != nil || len(b.out(y)) != 1 {
		t.Fatalf("the attacker's media to its own proven address did not go: %v", err)
	}
	attackerConn.Close()
	clock = clock.Add(time.Second) // the victim is silent

	// Audio with the victim's token from Y while the victim is silent.
	b.in(y, tokV, rtpPkt)
	if v := b.metric("rtcedge_transceiver_media_follows_total", "", ""); v != 0 {
		t.Fatalf("another session's proof at Y presented the victim's agent a check from Y (%v)", v)
	}
	got := b.out(y)
	if len(got) != 1 || stunmsg.DemuxClass(got[0]) != stunmsg.ClassSTUN {
		t.Fatalf("the victim's audio from Y: %d datagrams toward Y, want one probe", len(got))
	}
	m := &stun.Message{Raw: got[0]}
	var user stun.Username
	if m.Decode() != nil || user.GetFrom(m) != nil || user.String() != "cvic:victim" {
		t.Fatalf("the probe toward Y is not signed for the victim's session: %q", user.String())
	}
	if _, err := victimConn.WriteToAddrPort(rtpPkt, y); err != nil || len(b.out(y)) != 0 {
		t.Fatalf("the victim's media went to Y, proven only for another session (%v)", err)
	}

	// A check of a session of the attacker's, spoofed from the victim's
	// proven address: a probe, and the session's media waits.
	spoofer := b.conn("spoofer")
	b.sock.Confirm(1, victimAddr, "spoofer", [12]byte{3})
	probes := b.metric("rtcedge_transceiver_reach_probes_total", "", "")
	b.sock.Probe(1, victimAddr, "spoofer", "spoofer:cspo", "spoofer-client-password-01")
	if v := b.metric("rtcedge_transceiver_reach_probes_total", "", ""); v != probes+1 {
		t.Fatal("a spoofed check from the victim's proven address got no probe")
	}
	if _, err := spoofer.WriteToAddrPort(rtpPkt, victimAddr); err != nil {
		t.Fatal(err)
	}
	for _, d := range b.out(victimAddr) {
		if stunmsg.DemuxClass(d) != stunmsg.ClassSTUN {
			t.Fatalf("the spoofer's session sent %x toward the victim's address on the victim's proof", d)
		}
	}
	// The victim's own traffic still flows.
	if _, err := victimConn.WriteToAddrPort(rtpPkt, victimAddr); err != nil || len(b.out(victimAddr)) != 1 {
		t.Fatalf("the victim's media stopped: %v", err)
	}
}

// TestUnprovenAddressBudget: whatever goes toward an address not proven
// for the session sending it is at most 3 times what came from it, counted
// (unproven_bytes_sent_total). A spoofer sends the victim's audio, 32-byte
// RTP packets every 250 ms, from an address while the victim is silent,
// with a client ufrag of 256 characters in the victim's credentials:
// before, every packet drew a re-probe of some 370 bytes (9–15 times the
// bytes received with ordinary ufrags). The probes stop when the budget is
// spent (amplification_limit drops). A DTLS flight past the budget waits
// for the proof and goes once the address answers.
func TestUnprovenAddressBudget(t *testing.T) {
	clock := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	b := newProofBench(t, func() time.Time { return clock })
	victimConn := b.conn("victim")
	long := strings.Repeat("u", 256)
	b.sock.sessions = fakeSessions{tokV: &fakeSession{pop: 1, peer: netip.MustParseAddrPort("198.51.100.51:4000"),
		server: Creds{"victim", "victim-server-password"}, client: Creds{long, "victim-client-password-0123"}}}
	spoofed := netip.MustParseAddrPort("203.0.113.10:4000")

	received, sent := 0, 0
	for range 40 {
		received += b.in(spoofed, tokV, rtpPkt)
		clock = clock.Add(reprobeAfter)
	}
	for _, d := range b.out(spoofed) {
		sent += len(d)
	}
	if sent == 0 || sent > 3*received {
		t.Fatalf("%d bytes of spoofed audio drew %d bytes of probes; want some, at most 3 times as many", received, sent)
	}
	if v := b.metric("rtcedge_transceiver_unproven_bytes_sent_total", "", ""); int(v) != sent {
		t.Fatalf("unproven_bytes_sent_total = %v, want the %d bytes sent", v, sent)
	}
	if b.metric("rtcedge_transceiver_dropped_packets_total", "reason", "amplification_limit") == 0 {
		t.Fatal("no probe was refused by the budget")
	}
	t.Logf("%d bytes from the spoofed address, %d bytes of probes toward it", received, sent)

	// A DTLS flight toward an address authenticated but unproven: within
	// the budget it goes at once, past it it waits for the proof.
	caller := netip.MustParseAddrPort("198.51.100.52:4000")
	check := bytes.Repeat([]byte{1}, 100)
	received = b.in(caller, tokV, check)
	b.sock.Confirm(1, caller, "victim", [12]byte{7})
	for range 3 {
		if _, err := victimConn.WriteToAddrPort(dtlsPkt, caller); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := victimConn.WriteToAddrPort(rtpPkt, caller); err != nil {
		t.Fatal(err)
	}
	got := b.out(caller)
	if len(got) != 1 || stunmsg.DemuxClass(got[0]) != stunmsg.ClassDTLS || len(got[0]) > 3*received {
		t.Fatalf("before the proof %d datagrams went toward the caller, want the one DTLS datagram within 3 times %d bytes", len(got), received)
	}
	b.sock.Confirm(1, caller, "victim", [12]byte{8}) // its second check: proven
	if got := b.out(caller); len(got) != 3 || stunmsg.DemuxClass(got[2]) != stunmsg.ClassRTP {
		t.Fatalf("the proof released %d datagrams, want the two DTLS datagrams held and the media", len(got))
	}
}

// TestAnswerToAnEarlierProbeProves: a re-probe does not void the probes
// before it. When the round trip to the client is longer than
// reprobeAfter (a loaded pod, relay or client), the answer that comes is
// to an earlier probe than the last one sent; it proves the address all the
// same, and the session's agent is presented the check that follows the
// caller. Before, only the last probe's answer counted: with every answer
// overtaken by the next re-probe the proof never came while audio kept
// arriving, and the follow fell back to the client's next consent check
// (seconds; issue 26's flaky follow, seen in the NAT-rebind tests at load
// 10–30). Likewise a presented check that the session's queue cannot take
// at once (its reader is behind) is offered again, not dropped.
func TestAnswerToAnEarlierProbeProves(t *testing.T) {
	clock := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	b := newProofBench(t, func() time.Time { return clock })
	c := b.conn("victim")
	client := Creds{"cvic", "victim-client-password-0123"}
	b.sock.sessions = fakeSessions{tokV: &fakeSession{pop: 1, peer: netip.MustParseAddrPort("198.51.100.53:4000"),
		server: Creds{"victim", "victim-server-password"}, client: client}}
	rebound := netip.MustParseAddrPort("203.0.113.11:4000")

	var probes []*stun.Message
	for range 3 { // audio from the new address; the answers are slow
		for range 15 {
			b.in(rebound, tokV, rtpPkt)
			clock = clock.Add(20 * time.Millisecond)
		}
		for _, d := range b.out(rebound) {
			m := &stun.Message{Raw: d}
			if err := m.Decode(); err != nil || m.Type != stun.BindingRequest {
				t.Fatalf("the pod sent %x toward the new address, want probes", d)
			}
			probes = append(probes, m)
		}
	}
	if len(probes) < 2 {
		t.Fatalf("%d probes in 900 ms of audio, want re-probes", len(probes))
	}
	answer, err := stun.Build(probes[0], stun.BindingSuccess, &stun.XORMappedAddress{IP: net.IPv4(127, 0, 0, 2), Port: 3478},
		stun.NewShortTermIntegrity(client.Pwd), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	for range sessionQueueLen { // and the session's reader is behind
		c.in <- datagram{buf: bufPool.Get().(*podBuf)}
	}
	b.in(rebound, tokV, answer.Raw)
	eventually(t, "the check refused by the full queue", func() bool {
		return b.metric("rtcedge_transceiver_dropped_packets_total", "reason", "session_queue_full") >= 1
	})
	for range sessionQueueLen {
		d := <-c.in
		bufPool.Put(d.buf)
	}
	eventually(t, fmt.Sprintf("the answer to the first of %d probes to present a check", len(probes)), func() bool {
		return b.metric("rtcedge_transceiver_media_follows_total", "", "") == 1
	})
	d := <-c.in
	bufPool.Put(d.buf)
}

// TestFollowerOffersAgainWhenQueueFull: a deferred check that the
// session's queue cannot take when its time comes (the session's ICE
// reader is behind, as on a loaded machine) is offered again until it is
// taken, instead of being dropped for good, which left the follow waiting
// for the client's next consent check.
func TestFollowerOffersAgainWhenQueueFull(t *testing.T) {
	b := newProofBench(t, time.Now)
	c := b.conn("sess")
	from := netip.MustParseAddrPort("203.0.113.12:4000")
	msg, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername("sess:cl"),
		stun.NewShortTermIntegrity("server-password"), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	for range sessionQueueLen { // the reader is behind: the queue is full
		c.in <- datagram{buf: bufPool.Get().(*podBuf)}
	}
	var f Follower
	defer f.Stop()
	// The old address has no route: silent, so the check is due at once.
	f.Defer(b.sock, Deferred{Check: msg, POP: 1, From: from, Ufrag: "sess", OldPOP: 1,
		Old: netip.MustParseAddrPort("198.51.100.7:4000"), Silence: 600 * time.Millisecond})
	eventually(t, "the deferred check refused by the full queue", func() bool {
		return b.metric("rtcedge_transceiver_dropped_packets_total", "reason", "session_queue_full") >= 1
	})
	for range sessionQueueLen {
		d := <-c.in
		bufPool.Put(d.buf)
	}
	eventually(t, "the deferred check offered again once the queue had room", func() bool {
		return b.metric("rtcedge_transceiver_follow_retries_total", "", "") == 1
	})
	d := <-c.in
	defer bufPool.Put(d.buf)
	if d.from != from || !bytes.Equal(d.buf[:d.n], msg.Raw) {
		t.Fatal("the check presented is not the one deferred")
	}
}
