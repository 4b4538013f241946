package podnet

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v4"
)

// newTestMux returns the ICE mux of POP 1 on a pod socket over loopback.
func newTestMux(t *testing.T) *popMux {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_, pc := testPOP(t, conn)
	t.Cleanup(func() { _ = pc.mux.Close() })
	return pc.mux
}

// testPOP is a pod socket on conn (cluster 7, pod 3) with POP 1's conn.
func testPOP(t *testing.T, conn *net.UDPConn) (*Socket, *popConn) {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := newPodSocket(conn, 7, 3, testHop, nil, m, time.Now)
	pc, _, err := s.popConn(1, netip.MustParseAddrPort("192.0.2.1:3478"))
	if err != nil {
		t.Fatal(err)
	}
	return s, pc
}

// bindingRequest is a STUN Binding Request whose USERNAME names serverUfrag.
func bindingRequest(t *testing.T, serverUfrag string) []byte {
	t.Helper()
	msg, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(serverUfrag+":client"))
	if err != nil {
		t.Fatal(err)
	}
	return msg.Raw
}

// offer delivers payload from a client address and returns the drop
// reason ("" when a session took it).
func offer(m *popMux, payload []byte, from netip.AddrPort) string {
	buf := bufPool.Get().(*podBuf)
	n := copy(buf[:], payload)
	_, reason, ok := m.deliver(buf, n, from)
	if ok {
		return ""
	}
	bufPool.Put(buf)
	return reason.String()
}

// readOne reads one datagram from a session conn, failing after 5 s.
func readOne(t *testing.T, c net.PacketConn) (string, netip.AddrPort) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1500)
	n, from, err := c.(*muxConn).ReadFromAddrPort(b)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b[:n]), from
}

// TestPOPMuxRoutes: a client address reaches the session its first Binding
// Request names, and only that session; anything else from an address no
// session knows is dropped with a reason.
func TestPOPMuxRoutes(t *testing.T) {
	m := newTestMux(t)
	a, err := m.GetConn("ufragA", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.GetConn("ufragB", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetConn("ufragA", nil); !errors.Is(err, errUfragInUse) {
		t.Errorf("second GetConn for one ufrag: %v, want errUfragInUse", err)
	}
	c1 := netip.MustParseAddrPort("198.51.100.1:5000")
	c2 := netip.MustParseAddrPort("198.51.100.2:5000")

	for _, tc := range []struct {
		name    string
		payload []byte
		from    netip.AddrPort
		reason  string
	}{
		{"media before any check", []byte("media"), c1, dropUnknownClient.String()},
		{"check for an unknown ufrag", bindingRequest(t, "nobody"), c1, dropUnknownClient.String()},
		{"not a binding request", []byte{0x01, 0x01, 0, 0, 0x21, 0x12, 0xa4, 0x42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, c1, dropUnknownClient.String()},
	} {
		if got := offer(m, tc.payload, tc.from); got != tc.reason {
			t.Errorf("%s: reason %q, want %q", tc.name, got, tc.reason)
		}
	}

	// A check for session A maps c1 to it; media from c1 follows.
	check := bindingRequest(t, "ufragA")
	if r := offer(m, check, c1); r != "" {
		t.Fatalf("check for A dropped: %s", r)
	}
	if r := offer(m, []byte("media-a"), c1); r != "" {
		t.Fatalf("media from c1 dropped: %s", r)
	}
	if got, from := readOne(t, a); got != string(check) || from != c1 {
		t.Errorf("A read %q from %v, want the check from %v", got, from, c1)
	}
	if got, _ := readOne(t, a); got != "media-a" {
		t.Errorf("A read %q, want media-a", got)
	}
	// B learns c2 the same way and never sees A's client.
	if r := offer(m, bindingRequest(t, "ufragB"), c2); r != "" {
		t.Fatalf("check for B dropped: %s", r)
	}
	if got, from := readOne(t, b); from != c2 || len(got) == 0 {
		t.Errorf("B read %d bytes from %v, want the check from %v", len(got), from, c2)
	}

	// Removing A (ICE closes it) ends its reads and forgets c1.
	m.RemoveConnByUfrag("ufragA")
	if _, _, err := a.(*muxConn).ReadFromAddrPort(make([]byte, 1500)); !errors.Is(err, io.EOF) {
		t.Errorf("read after removal: %v, want io.EOF", err)
	}
	if r := offer(m, []byte("late"), c1); r != dropUnknownClient.String() {
		t.Errorf("media for a removed session: reason %q, want %q", r, dropUnknownClient.String())
	}
	_ = b.Close()
	if r := offer(m, []byte("late"), c2); r != dropUnknownClient.String() {
		t.Errorf("media for a closed conn: reason %q, want %q", r, dropUnknownClient.String())
	}
}

// TestPOPMuxSessionQueueIsolated: a session whose reader has stalled
// fills only its own queue; the others' datagrams still go through (the
// per-POP queue it replaces dropped every session's datagrams once one
// reader fell behind).
func TestPOPMuxSessionQueueIsolated(t *testing.T) {
	m := newTestMux(t)
	stalled, err := m.GetConn("stalled", nil)
	if err != nil {
		t.Fatal(err)
	}
	live, err := m.GetConn("live", nil)
	if err != nil {
		t.Fatal(err)
	}
	cs := netip.MustParseAddrPort("198.51.100.1:5000")
	cl := netip.MustParseAddrPort("198.51.100.2:5000")
	if r := offer(m, bindingRequest(t, "stalled"), cs); r != "" {
		t.Fatal(r)
	}
	if r := offer(m, bindingRequest(t, "live"), cl); r != "" {
		t.Fatal(r)
	}
	readOne(t, live)
	for i := 1; i < sessionQueueLen; i++ {
		if r := offer(m, []byte("x"), cs); r != "" {
			t.Fatalf("datagram %d of the stalled session dropped early: %s", i, r)
		}
	}
	if r := offer(m, []byte("x"), cs); r != dropSessionQueue.String() {
		t.Errorf("datagram beyond the stalled session's queue: reason %q, want %q", r, dropSessionQueue.String())
	}
	for i := range 3 * sessionQueueLen {
		if r := offer(m, []byte("y"), cl); r != "" {
			t.Fatalf("live session's datagram %d dropped: %s", i, r)
		}
		readOne(t, live)
	}
	_ = stalled.Close() // returns its queued buffers
}

// TestPOPMuxAddressBound: one session keeps at most maxAddrsPerSession
// client addresses; a new one replaces the oldest.
func TestPOPMuxAddressBound(t *testing.T) {
	m := newTestMux(t)
	c, err := m.GetConn("u", nil)
	if err != nil {
		t.Fatal(err)
	}
	check := bindingRequest(t, "u")
	addr := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr("198.51.100.1"), uint16(5000+i))
	}
	for i := range maxAddrsPerSession + 1 {
		if r := offer(m, check, addr(i)); r != "" {
			t.Fatal(r)
		}
		readOne(t, c)
	}
	if r := offer(m, []byte("x"), addr(0)); r != dropUnknownClient.String() {
		t.Errorf("oldest address: reason %q, want %q", r, dropUnknownClient.String())
	}
	if r := offer(m, []byte("x"), addr(maxAddrsPerSession)); r != "" {
		t.Errorf("newest address dropped: %s", r)
	}
	readOne(t, c)
}

// String returns the reason's label.
func (r dropReason) String() string { return dropLabels[r] }
