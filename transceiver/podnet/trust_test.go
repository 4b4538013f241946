package podnet

import (
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
)

// unitSocket is a pod socket with POP 1 bound, driven by direct calls.
func unitSocket(t *testing.T, relays *RelaySet) (*Socket, *popConn, *prometheus.Registry) {
	return unitSocketAt(t, relays, time.Now)
}

func unitSocketAt(t *testing.T, relays *RelaySet, now func() time.Time) (*Socket, *popConn, *prometheus.Registry) {
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

// feed hands one datagram to the socket as if read from relay, as if its
// client belonged to a session (feedSession) whose queue it drains so that
// it never fills.
func feed(sock *Socket, pc *popConn, pkt []byte, relay netip.AddrPort) bool {
	c := feedSession(pc, pkt)
	buf := bufPool.Get().(*podBuf)
	n := copy(buf[:], pkt)
	ok := sock.handle(buf, n, relay)
	if !ok {
		bufPool.Put(buf)
	}
	select {
	case d := <-c.in:
		bufPool.Put(d.buf)
	default:
	}
	return ok
}

// feedSession maps the client address of pkt's header to one session conn
// of the POP, the one every fed datagram goes to (normally the mux learns
// addresses from STUN checks).
func feedSession(pc *popConn, pkt []byte) *muxConn {
	m := pc.mux
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.byUfrag["feed"]
	if c == nil {
		c = &muxConn{mux: m, ufrag: "feed", in: make(chan datagram, sessionQueueLen), closed: make(chan struct{})}
		m.byUfrag["feed"] = c
	}
	if h, _, err := encap.Decode(pkt); err == nil {
		m.byAddr[h.Client] = c
	}
	return c
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
	if n := sock.Sweep(time.Hour); n != 0 {
		t.Fatalf("%d routes after forged headers", n)
	}
	if _, err := pc.write([]byte("downlink"), victim, "feed"); err != errNoRoute {
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
	if !feed(sock, pc, sealed(t, clientHeader(caller), "check"), unitRelay) || sock.Confirm(1, caller, "feed", [12]byte{1}) != 1 {
		t.Fatal("caller's check did not make a route")
	}
	for i := range 70000 {
		a := netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, byte(113 + i>>16), byte(i >> 8)}), uint16(i))
		feed(sock, pc, sealed(t, clientHeader(a), "x"), unitRelay)
	}
	newcomer := netip.MustParseAddrPort("198.51.100.32:5000")
	if !feed(sock, pc, sealed(t, clientHeader(newcomer), "check"), unitRelay) || sock.Confirm(1, newcomer, "feed", [12]byte{1}) != 1 {
		t.Fatal("a new caller got no route after the flood")
	}
	pc.mu.RLock()
	n, prov := len(pc.routes), pc.provisional
	pc.mu.RUnlock()
	if n > maxProvisional+2 || prov > maxProvisional {
		t.Fatalf("%d routes (%d provisional) after the flood, want at most %d", n, prov, maxProvisional+2)
	}
	for _, a := range []netip.AddrPort{caller, newcomer} {
		if _, err := pc.write([]byte{0x80, 1}, a, "feed"); err != nil {
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
	if v := counter(t, reg, "rtcedge_transceiver_dropped_packets_total", "reason", dropUnknownRelay.String()); v != 1 {
		t.Errorf("unknown_relay drops = %v, want 1", v)
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
	sock.Confirm(1, caller, "feed", [12]byte{1})
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
		sock.Sweep(time.Minute)
		if a, ok := age(spoofed); ok && a > provisionalTTL {
			t.Fatalf("an unconfirmed route is %v old", a)
		}
	}
	clock = clock.Add(provisionalTTL + time.Second)
	feed(sock, pc, sealed(t, clientHeader(caller), "x"), unitRelay)
	sock.Sweep(time.Minute)
	if _, ok := age(spoofed); ok {
		t.Error("an unconfirmed route outlived provisionalTTL after its last datagram")
	}
	if a, ok := age(caller); !ok || a < 3*provisionalTTL {
		t.Errorf("the confirmed route was swept (present %v, age %v)", ok, a)
	}
}
