package netsim_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/netsim"
)

var natOutside = []netip.Addr{netip.MustParseAddr("127.0.0.21"), netip.MustParseAddr("127.0.0.22")}

func startNAT(t *testing.T, linger time.Duration) *netsim.NAT {
	t.Helper()
	n, err := netsim.NewNAT(netsim.NATConfig{OutsideIPs: natOutside, Linger: linger, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("nat run: %v", err)
		}
		n.Close()
	})
	return n
}

// natPeer is a server outside the NAT that records each datagram's source.
type natPeer struct {
	conn *net.UDPConn
	from chan netip.AddrPort
}

func startNATPeer(t *testing.T) *natPeer {
	t.Helper()
	p := &natPeer{conn: listenUDP(t), from: make(chan netip.AddrPort, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			_, from, err := p.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			select {
			case p.from <- from:
			default:
			}
		}
	}()
	t.Cleanup(func() { p.conn.Close(); <-done })
	return p
}

func (p *natPeer) next(t *testing.T) netip.AddrPort {
	t.Helper()
	select {
	case a := <-p.from:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("peer received nothing")
		return netip.AddrPort{}
	}
}

func hostSend(t *testing.T, h *netsim.NATHost, to netip.AddrPort, b []byte) {
	t.Helper()
	if _, err := h.WriteTo(b, net.UDPAddrFromAddrPort(to)); err != nil {
		t.Fatalf("host write: %v", err)
	}
}

// hostRead reads one datagram or fails after d.
func hostRead(h *netsim.NATHost, d time.Duration) ([]byte, netip.AddrPort, error) {
	h.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 2048)
	n, from, err := h.ReadFrom(buf)
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	return buf[:n], from.(*net.UDPAddr).AddrPort(), nil
}

// stunLike is the shape of a STUN Binding Request header (no attributes).
var stunLike = []byte{0x00, 0x01, 0x00, 0x00, 0x21, 0x12, 0xa4, 0x42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

func TestNATConfigRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  netsim.NATConfig
	}{
		{"no outside IP", netsim.NATConfig{}},
		{"not loopback", netsim.NATConfig{OutsideIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := netsim.NewNAT(tc.cfg); err == nil {
				t.Fatal("config accepted")
			}
		})
	}
}

// TestNATMapsAndFilters: a host's datagrams leave from its mapping on the
// first outside IP, replies from the peer come back with the peer's address,
// and a stranger's datagrams to the mapping are dropped.
func TestNATMapsAndFilters(t *testing.T) {
	n := startNAT(t, 0)
	peer := startNATPeer(t)
	h, err := n.NewHost()
	if err != nil {
		t.Fatal(err)
	}
	if !h.LocalAddr().(*net.UDPAddr).IP.IsLoopback() {
		t.Errorf("inside address %v is not loopback", h.LocalAddr())
	}
	m := h.Mapping()
	if m.Outside.Addr() != natOutside[0] || m.Gen != 0 {
		t.Fatalf("first mapping %+v, want gen 0 on %v", m, natOutside[0])
	}
	hostSend(t, h, addrOf(peer.conn), []byte("hello"))
	if got := peer.next(t); got != m.Outside {
		t.Fatalf("peer saw source %v, want the mapping %v", got, m.Outside)
	}
	<-m.OutSeen
	if _, err := peer.conn.WriteToUDPAddrPort([]byte("reply"), m.Outside); err != nil {
		t.Fatal(err)
	}
	b, from, err := hostRead(h, 5*time.Second)
	if err != nil || string(b) != "reply" || from != addrOf(peer.conn) {
		t.Fatalf("host read %q from %v (%v), want the reply from %v", b, from, err, addrOf(peer.conn))
	}

	stranger := listenUDP(t)
	defer stranger.Close()
	if _, err := stranger.WriteToUDPAddrPort([]byte("unsolicited"), m.Outside); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the stranger's datagram to be filtered", func() bool { return n.Stats().Drops(netsim.NATDropFiltered) == 1 })
	if b, _, err := hostRead(h, 50*time.Millisecond); err == nil {
		t.Fatalf("host received %q from a stranger", b)
	}
	if got := h.Mapping(); got.Sent != 1 || got.Received != 1 || !got.FirstSTUN.IsZero() {
		t.Errorf("mapping counters %+v, want 1 sent, 1 received, no STUN", got)
	}
}

// TestNATRebind: after a rebind the host's next datagram leaves from a new
// port (or the next outside IP); the old mapping no longer delivers, and
// what is sent to it is counted as stale.
func TestNATRebind(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kind   netsim.RebindKind
		wantIP netip.Addr
	}{
		{"new port", netsim.RebindPort, natOutside[0]},
		{"new IP", netsim.RebindIP, natOutside[1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNAT(t, 0)
			peer := startNATPeer(t)
			h, err := n.NewHost()
			if err != nil {
				t.Fatal(err)
			}
			hostSend(t, h, addrOf(peer.conn), []byte("before"))
			old := peer.next(t)

			m, err := h.Rebind(tc.kind)
			if err != nil {
				t.Fatal(err)
			}
			if m.Gen != 1 || m.Outside == old || m.Outside.Addr() != tc.wantIP {
				t.Fatalf("new mapping %+v (old %v), want gen 1 on %v", m, old, tc.wantIP)
			}
			if !m.FirstOut.IsZero() {
				t.Fatal("new mapping has sent before the host did")
			}
			// The peer, not knowing, answers the old address.
			if _, err := peer.conn.WriteToUDPAddrPort([]byte("to old"), old); err != nil {
				t.Fatal(err)
			}
			eventually(t, 5*time.Second, "the datagram to the old mapping to be dropped", func() bool { return h.StaleDrops() == 1 })
			if got := n.Stats().Drops(netsim.NATDropStale); got != 1 {
				t.Errorf("stale drops %d, want 1", got)
			}

			next := h.NextSTUN()
			hostSend(t, h, addrOf(peer.conn), stunLike)
			<-next
			if got := peer.next(t); got != m.Outside {
				t.Fatalf("after the rebind the peer saw %v, want %v", got, m.Outside)
			}
			<-m.OutSeen
			<-m.STUNSeen
			if _, err := peer.conn.WriteToUDPAddrPort([]byte("to new"), m.Outside); err != nil {
				t.Fatal(err)
			}
			b, _, err := hostRead(h, 5*time.Second)
			if err != nil || string(b) != "to new" {
				t.Fatalf("host read %q (%v), want the reply to the new mapping", b, err)
			}
			if got := h.Mapping(); got.FirstSTUN.IsZero() || got.FirstOut.After(got.FirstSTUN) {
				t.Errorf("mapping %+v: want first STUN recorded, not before the first datagram", got)
			}
		})
	}
}

func TestNATRebindIPNeedsTwoIPs(t *testing.T) {
	n, err := netsim.NewNAT(netsim.NATConfig{OutsideIPs: natOutside[:1], Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	h, err := n.NewHost()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Rebind(netsim.RebindIP); err == nil {
		t.Fatal("rebind to a new IP with one outside IP succeeded")
	}
	n.Close()
	if _, err := n.NewHost(); !errors.Is(err, netsim.ErrNATClosed) {
		t.Fatalf("NewHost after Close: %v, want ErrNATClosed", err)
	}
	if _, _, err := hostRead(h, time.Second); err == nil {
		t.Fatal("read on a closed host succeeded")
	}
}

// TestNATAbandonedMappingCloses: once it has lingered, an abandoned mapping
// stops counting (its socket is closed).
func TestNATAbandonedMappingCloses(t *testing.T) {
	n := startNAT(t, 50*time.Millisecond)
	peer := startNATPeer(t)
	h, err := n.NewHost()
	if err != nil {
		t.Fatal(err)
	}
	hostSend(t, h, addrOf(peer.conn), []byte("x"))
	old := peer.next(t)
	if _, err := h.Rebind(netsim.RebindPort); err != nil {
		t.Fatal(err)
	}
	// While lingering the old socket counts; after, nothing listens there:
	// a fresh socket can bind the old address again.
	eventually(t, 5*time.Second, "the abandoned mapping's socket to close", func() bool {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(old))
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}
