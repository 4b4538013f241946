package podnet

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// tcpSideRig is a pod socket of cluster 7, pod 3, a socket playing its
// cluster relay, and a POP with a TCP port; all closed when the test ends.
func tcpSideRig(t *testing.T, reg *prometheus.Registry) (*Socket, *net.UDPConn, POP) {
	t.Helper()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	podConn, relay := udp4(t), udp4(t)
	s := newPodSocket(podConn, 7, 3, testHop, nil, m, time.Now)
	t.Cleanup(func() {
		s.closeAll()
		podConn.Close()
		relay.Close()
	})
	return s, relay, POP{ID: 1, VIP: netip.MustParseAddrPort("127.0.0.2:3478"), TCPPort: 443}
}

// TestTCPSide: a TCP-flagged datagram binds its client to the session conn
// its check names and reaches Pion's conn with a TCP peer address; replies
// leave as datagrams with the TCP flag toward the relay they came from;
// datagrams naming no session, or not starting with a check, are dropped
// and counted, and nothing is answered.
func TestTCPSide(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, relay, pop := tcpSideRig(t, reg)
	const ufrag = "EQABAAKc6XVfTs3E56z0"
	conn := s.tcp.open(ufrag, pop)
	if got := conn.LocalAddr().String(); got != "127.0.0.2:443" {
		t.Fatalf("conn local address %s, want the VIP with the TCP port", got)
	}
	relayAddr := relay.LocalAddr().(*net.UDPAddr).AddrPort()
	client := netip.MustParseAddrPort("198.51.100.1:40000")
	hdr := encap.Header{TCP: true, Cluster: 7, Pod: 3, POP: 1, Client: client, Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	check := func(u string) []byte {
		msg, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(u+":clnt"))
		if err != nil {
			t.Fatal(err)
		}
		return msg.Raw
	}
	feed := func(h encap.Header, payload []byte) bool {
		b := sealed(t, h, string(payload))
		buf := bufPool.Get().(*podBuf)
		n := copy(buf[:], b)
		ok := s.handle(buf, n, relayAddr)
		if !ok {
			bufPool.Put(buf)
		}
		return ok
	}
	drops := func(reason string) float64 {
		return metricValue(t, reg, "rtcedge_transceiver_dropped_packets_total", reason)
	}

	// Not a check first, and a check naming no session: dropped.
	if feed(hdr, []byte{0x80, 111, 0, 1}) || drops("tcp_not_check") != 1 {
		t.Errorf("media before a check: accepted, or tcp_not_check = %v", drops("tcp_not_check"))
	}
	if feed(hdr, check("AAAAAAAAAAAAAAAAAAAA")) || drops("tcp_no_session") != 1 {
		t.Errorf("check for another session: accepted, or tcp_no_session = %v", drops("tcp_no_session"))
	}
	// The session's check binds the client; media follows.
	c1 := check(ufrag)
	if !feed(hdr, c1) || !feed(hdr, []byte{0x80, 111, 0, 2}) {
		t.Fatal("check or media of a bound client refused")
	}
	buf := make([]byte, 1500)
	for i, want := range [][]byte{c1, {0x80, 111, 0, 2}} {
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := conn.ReadFrom(buf)
		if err != nil || !bytes.Equal(buf[:n], want) || from.String() != client.String() || from.Network() != "tcp" {
			t.Fatalf("read %d: %x from %v (%v), want %x from TCP %v", i, buf[:n], from, err, want, client)
		}
	}
	// Pion's reply goes back to the relay with the TCP flag.
	if _, err := conn.WriteTo([]byte("answer"), net.TCPAddrFromAddrPort(client)); err != nil {
		t.Fatal(err)
	}
	_ = relay.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := relay.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	h, hl, err := encap.Decode(buf[:n])
	if err != nil || testHop.Verify(buf[:n], hl) != nil {
		t.Fatalf("reply does not decode and verify: %v", err)
	}
	if !h.TCP || !h.ToClient || h.Client != client || h.POP != 1 || string(buf[hl:n]) != "answer" {
		t.Fatalf("reply %+v %q, want TCP to-client for %v", h, buf[hl:n], client)
	}
	// A client the conn never saw gets nothing; after Close nobody does.
	if _, err := conn.WriteTo([]byte("x"), net.TCPAddrFromAddrPort(netip.MustParseAddrPort("198.51.100.2:1"))); err == nil || drops("tcp_no_peer") != 1 {
		t.Errorf("write to an unbound client: %v, tcp_no_peer = %v", err, drops("tcp_no_peer"))
	}
	conn.Close()
	if s.tcp.peer(1, client) != nil {
		t.Error("closed conn's client is still bound")
	}
	if feed(hdr, []byte{0x80, 111, 0, 3}) {
		t.Error("media for a closed conn's client accepted")
	}
}

// TestTCPSideNewSessionSameAddress: a client address and port that a
// session's connection had comes back with another session's check (a
// NAT reusing the port for a new call's TCP connection): it is bound to
// the session its check names, not kept on the old one, while a route
// change of the same session (another relay replica) keeps its conn.
func TestTCPSideNewSessionSameAddress(t *testing.T) {
	s, relay, pop := tcpSideRig(t, prometheus.NewRegistry())
	old, next := s.tcp.open("EQABAAKc6XVfTs3E56z0", pop), s.tcp.open("EQABAAKc6XVfTs3E56z1", pop)
	relayAddr := relay.LocalAddr().(*net.UDPAddr).AddrPort()
	client := netip.MustParseAddrPort("198.51.100.1:40000")
	feed := func(h encap.Header, ufrag string) {
		msg, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(ufrag+":clnt"))
		if err != nil {
			t.Fatal(err)
		}
		buf := bufPool.Get().(*podBuf)
		if !s.handle(buf, copy(buf[:], sealed(t, h, string(msg.Raw))), relayAddr) {
			bufPool.Put(buf)
			t.Fatalf("check for %s refused", ufrag)
		}
	}
	got := func(c net.PacketConn) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := c.ReadFrom(make([]byte, 1500)); err != nil {
			t.Fatalf("the check did not reach its session: %v", err)
		}
	}
	hdr := encap.Header{TCP: true, Cluster: 7, Pod: 3, POP: 1, Token: [6]byte{1}, Client: client, Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	feed(hdr, "EQABAAKc6XVfTs3E56z0")
	got(old)
	moved := hdr
	moved.Ingress = netip.MustParseAddrPort("127.0.0.1:10") // another replica, same session
	feed(moved, "EQABAAKc6XVfTs3E56z0")
	got(old)
	call := hdr
	call.Token = [6]byte{2} // another session's connection from the same address
	feed(call, "EQABAAKc6XVfTs3E56z1")
	got(next)
	if p := s.tcp.peer(1, client); p == nil || p.conn != next {
		t.Error("the address stayed bound to the old session")
	}
}

// TestReadersClosedBeforeStart: a pod closed before its socket readers
// started (a test's or a node's shutdown racing Run) ends as a closed pod
// does, not with an error from setting up the readers.
func TestReadersClosedBeforeStart(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	podConn := udp4(t)
	s := newPodSocket(podConn, 7, 3, testHop, nil, m, time.Now)
	defer s.closeAll()
	podConn.Close()
	if err := s.Read(2); err != nil {
		t.Errorf("readers on a closed socket: %v, want the normal end", err)
	}
}
