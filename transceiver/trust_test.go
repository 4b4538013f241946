package transceiver

import (
	"context"
	"net"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
	"github.com/rtcedge/rtcedge/internal/testsdp"
)

// unitSocket is a pod socket with POP 1 bound, driven by direct calls.
func unitSocket(t *testing.T, relays *RelaySet) (*podSocket, *popConn, *prometheus.Registry) {
	return unitSocketAt(t, relays, time.Now)
}

func unitSocketAt(t *testing.T, relays *RelaySet, now func() time.Time) (*podSocket, *popConn, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	conn := udp4(t)
	t.Cleanup(func() { conn.Close() })
	sock := newPodSocket(conn, 7, 3, testHop, relays, m, now)
	pc, _, err := sock.popConn(1, popA.VIP)
	if err != nil {
		t.Fatal(err)
	}
	return sock, pc, reg
}

// feed hands one datagram to the socket as if read from relay, draining
// the POP queue so it never fills.
func feed(sock *podSocket, pc *popConn, pkt []byte, relay netip.AddrPort) bool {
	buf := bufPool.Get().(*podBuf)
	n := copy(buf[:], pkt)
	ok := sock.handle(buf, n, relay)
	if !ok {
		bufPool.Put(buf)
	}
	select {
	case d := <-pc.in:
		bufPool.Put(d.buf)
	default:
	}
	return ok
}

var unitRelay = netip.MustParseAddrPort("127.0.0.1:9")

func clientHeader(client netip.AddrPort) encap.Header {
	return encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: client, Ingress: netip.MustParseAddrPort("127.0.0.1:8")}
}

// TestForgedHeaderAtPodChangesNothing: a datagram whose header does not
// verify (no key, wrong key ID), sent from a host on loopback that is in the
// allow-list or, before the first gossip join, trusted by bootstrap, is
// dropped and counted before it sets any route; nothing is sent.
func TestForgedHeaderAtPodChangesNothing(t *testing.T) {
	sock, pc, reg := unitSocket(t, nil)
	victim := netip.MustParseAddrPort("198.51.100.30:5000")
	h := clientHeader(victim)
	h.KeyID = 1
	forged, _ := h.AppendTo(nil)
	forged = append(forged, "hijack"...)
	h.KeyID = 9
	unknown, _ := h.AppendTo(nil)
	unknown = append(unknown, "hijack"...)
	for _, tc := range []struct {
		pkt    []byte
		reason string
	}{{forged, "encap_mac"}, {unknown, "encap_unknown_key"}} {
		before := testmetrics.Take(t, reg)
		if feed(sock, pc, tc.pkt, unitRelay) {
			t.Fatalf("%s: forged datagram handed to WebRTC", tc.reason)
		}
		testmetrics.OnlyIncremented(t, before, testmetrics.Take(t, reg), "rtcedge_transceiver_dropped_packets_total,reason="+tc.reason)
	}
	if n := sock.sweep(time.Hour); n != 0 {
		t.Fatalf("%d routes after forged headers", n)
	}
	if _, err := pc.WriteToAddrPort([]byte("downlink"), victim); err != errNoRoute {
		t.Fatalf("write to the victim after forged headers: %v, want no route", err)
	}
}

// TestRouteTableCannotBeFilled: 70,000 client addresses with authenticated
// headers but no check Pion accepted (what a token holder spoofing sources
// through the relays could make) fill at most maxProvisional routes; a
// confirmed caller keeps its route and a new caller still gets one. Before,
// every header made a route and the 65,537th caller was refused.
func TestRouteTableCannotBeFilled(t *testing.T) {
	sock, pc, _ := unitSocket(t, nil)
	caller := netip.MustParseAddrPort("198.51.100.31:5000")
	if !feed(sock, pc, sealed(t, clientHeader(caller), "check"), unitRelay) || sock.confirm(1, caller) != 1 {
		t.Fatal("caller's check did not make a route")
	}
	for i := range 70000 {
		a := netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, byte(113 + i>>16), byte(i >> 8)}), uint16(i))
		feed(sock, pc, sealed(t, clientHeader(a), "x"), unitRelay)
	}
	newcomer := netip.MustParseAddrPort("198.51.100.32:5000")
	if !feed(sock, pc, sealed(t, clientHeader(newcomer), "check"), unitRelay) || sock.confirm(1, newcomer) != 1 {
		t.Fatal("a new caller got no route after the flood")
	}
	pc.mu.RLock()
	n, prov := len(pc.routes), pc.provisional
	pc.mu.RUnlock()
	if n > maxProvisional+2 || prov > maxProvisional {
		t.Fatalf("%d routes (%d provisional) after the flood, want at most %d", n, prov, maxProvisional+2)
	}
	for _, a := range []netip.AddrPort{caller, newcomer} {
		if _, err := pc.WriteToAddrPort([]byte{0x80, 1}, a); err != nil {
			t.Errorf("media to confirmed %v: %v", a, err)
		}
	}
}

// TestEmptiedAllowListTrustsNoOne: a relay set that has held relays and is
// now empty (a partition, a rollout with no live relay) trusts no one; only
// a set that has never been filled trusts the bootstrap.
func TestEmptiedAllowListTrustsNoOne(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:9")
	var r RelaySet
	if !r.Trusted(a) {
		t.Fatal("a never-joined set must trust the bootstrap")
	}
	r.Set(nil) // gossip joined, no relay seen yet
	if !r.Trusted(a) {
		t.Fatal("a set that has never held a relay must trust the bootstrap")
	}
	r.Set([]netip.AddrPort{netip.MustParseAddrPort("[::ffff:127.0.0.1]:9")})
	if !r.Trusted(a) || r.Trusted(netip.MustParseAddrPort("127.0.0.1:10")) {
		t.Fatal("a filled set must trust exactly its (unmapped) members")
	}
	r.Set(nil)
	if r.Trusted(a) || r.Trusted(netip.MustParseAddrPort("127.0.0.1:10")) {
		t.Fatal("an emptied set trusts someone")
	}
	sock, pc, reg := unitSocket(t, &r)
	if feed(sock, pc, sealed(t, clientHeader(netip.MustParseAddrPort("198.51.100.33:1")), "x"), a) {
		t.Fatal("the pod accepted a datagram with an emptied allow-list")
	}
	if v := (&pod{reg: reg}).counter(t, "rtcedge_transceiver_dropped_packets_total", "reason", dropUnknownRelay.String()); v != 1 {
		t.Errorf("unknown_relay drops = %v, want 1", v)
	}
}

var (
	ufragRE = regexp.MustCompile(`a=ice-ufrag:(\S+)`)
	pwdRE   = regexp.MustCompile(`a=ice-pwd:(\S+)`)
)

// TestSpoofedCheckStartsNoDTLS: one Binding Request from a spoofed client
// address, carrying valid credentials of a session (the spoofer's own),
// gets its STUN answer and nothing else: no DTLS flight goes toward the
// spoofed address. Before, early pair selection started the DTLS handshake
// toward it on that single check. A second check from the address does
// select it (the early selection still saves a browser its ping interval).
func TestSpoofedCheckStartsNoDTLS(t *testing.T) {
	p := newPod(t, Config{})
	offer := testsdp.Offer(t)
	res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: offer, POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.t.EndSession(res.ID)
	cu, su, spwd := ufragRE.FindStringSubmatch(offer), ufragRE.FindStringSubmatch(res.Answer), pwdRE.FindStringSubmatch(res.Answer)
	if cu == nil || su == nil || spwd == nil {
		t.Fatal("no ICE credentials in offer/answer")
	}
	relay := udp4(t)
	defer relay.Close()
	spoofed := netip.MustParseAddrPort("198.51.100.34:6000")
	check := func() {
		m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(su[1]+":"+cu[1]),
			ice.PriorityAttr(1<<24), ice.AttrControlling(42),
			stun.NewShortTermIntegrity(spwd[1]), stun.Fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		h := clientHeader(spoofed)
		h.Ingress = relay.LocalAddr().(*net.UDPAddr).AddrPort()
		if _, err := relay.WriteToUDPAddrPort(sealed(t, h, string(m.Raw)), p.addr); err != nil {
			t.Fatal(err)
		}
	}
	// read returns the class of every datagram the pod sends toward the
	// spoofed address within d.
	read := func(d time.Duration) (stunN, dtlsN int) {
		buf := make([]byte, 2048)
		deadline := time.Now().Add(d)
		for {
			_ = relay.SetReadDeadline(deadline)
			n, _, err := relay.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			h, hl, err := encap.Decode(buf[:n])
			if err != nil || testHop.Verify(buf[:n], hl) != nil || h.Client != spoofed || !h.ToClient {
				t.Fatalf("pod sent something unexpected: %x", buf[:n])
			}
			switch c := buf[hl]; {
			case c < 4:
				stunN++
			case c >= 20 && c <= 63:
				dtlsN++
			}
		}
	}
	check()
	if s, d := read(1500 * time.Millisecond); s != 1 || d != 0 {
		t.Fatalf("after one spoofed check the pod sent %d STUN and %d DTLS datagrams; want 1 and 0", s, d)
	}
	check()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, d := read(200 * time.Millisecond); d > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a second authenticated check did not start DTLS: the test cannot tell the difference")
		}
	}
}

// TestProvisionalRoutesExpireQuickly: a route Pion never confirmed lives at
// most provisionalTTL, even while datagrams keep arriving for it (each
// sweep removes it; a new datagram starts a new provisional one); a
// confirmed route lives for the route TTL.
func TestProvisionalRoutesExpireQuickly(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	clock := t0
	sock, pc, _ := unitSocketAt(t, nil, func() time.Time { return clock })
	spoofed, caller := netip.MustParseAddrPort("198.51.100.40:1"), netip.MustParseAddrPort("198.51.100.41:1")
	feed(sock, pc, sealed(t, clientHeader(caller), "x"), unitRelay)
	sock.confirm(1, caller)
	age := func(a netip.AddrPort) (time.Duration, bool) {
		pc.mu.RLock()
		defer pc.mu.RUnlock()
		r := pc.routes[a]
		if r == nil {
			return 0, false
		}
		return clock.Sub(time.Unix(0, r.created)), true
	}
	for ; clock.Before(t0.Add(3 * provisionalTTL)); clock = clock.Add(time.Second) {
		feed(sock, pc, sealed(t, clientHeader(spoofed), "x"), unitRelay)
		feed(sock, pc, sealed(t, clientHeader(caller), "x"), unitRelay)
		sock.sweep(time.Minute)
		if a, ok := age(spoofed); ok && a > provisionalTTL {
			t.Fatalf("an unconfirmed route is %v old", a)
		}
	}
	clock = clock.Add(provisionalTTL + time.Second)
	feed(sock, pc, sealed(t, clientHeader(caller), "x"), unitRelay)
	sock.sweep(time.Minute)
	if _, ok := age(spoofed); ok {
		t.Error("an unconfirmed route outlived provisionalTTL after its last datagram")
	}
	if a, ok := age(caller); !ok || a < 3*provisionalTTL {
		t.Errorf("the confirmed route was swept (present %v, age %v)", ok, a)
	}
}
