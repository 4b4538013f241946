package podnet

import (
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/transport/v5"
	"github.com/pion/transport/v5/stdnet"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// ICE-TCP presentation (docs/tcp.md). A client behind a UDP-blocking
// firewall reaches a POP's TCP port; the global relay de-frames its RFC 4571
// stream and forwards every frame as one datagram with the header's TCP
// flag. The pod presents such clients to Pion as ICE-TCP does: each session
// advertises a passive TCP host candidate per POP VIP (at a priority below
// every UDP candidate, shapeAnswer), and Pion reads and writes those
// candidates through a TCPMux of ours whose packet conns carry the
// datagrams directly, one conn per (session ufrag, POP), keyed by the
// client's address. There is no TCP state here: a reply is a datagram
// with the TCP flag, which the global relay frames into the connection.
//
// Pion gathers TCP host candidates from the addresses of local interfaces
// and asks the mux for a conn per address; the VIPs are not local
// addresses, so each session's agent is given a transport.Net whose only
// interface holds the session's VIP addresses (vipNet). Nothing else of
// Pion uses that Net on the pod: UDP candidates come from the UDP muxes,
// mDNS is off, and active TCP (dialling out) is disabled.

// tcpInQueueLen bounds the datagrams waiting for Pion per TCP conn.
const tcpInQueueLen = 256

// maxTCPPeers bounds the TCP client bindings of a pod: one is made only by
// a Binding Request naming a live session's ufrag, so a full table means
// many sessions' clients, not forgery.
const maxTCPPeers = 1 << 16

// Drops on the TCP path, counted as "tcp_<reason>" in the pod's drop counter.
type tcpDropReason uint8

const (
	tcpDropOther     tcpDropReason = iota
	tcpDropNoSession               // first datagram from a client names no session conn of this POP
	tcpDropNotCheck                // first datagram from a client is not a Binding Request
	tcpDropPeerTable               // maxTCPPeers reached
	tcpDropQueueFull               // Pion's reader is behind
	tcpDropNoPeer                  // Pion wrote to a client with no binding (gone or expired)
	numTCPDropReasons
)

var tcpDropLabels = [numTCPDropReasons]string{
	tcpDropOther: "other", tcpDropNoSession: "no_session", tcpDropNotCheck: "not_check",
	tcpDropPeerTable: "peer_table_full", tcpDropQueueFull: "queue_full", tcpDropNoPeer: "no_peer",
}

type tcpConnKey struct {
	ufrag string
	pop   uint16
}

type tcpPeerKey struct {
	pop    uint16
	client netip.AddrPort
}

// tcpPeer binds one TCP client (its address through one POP) to the
// session conn its first check named, with the return route its datagrams
// carry. hdr and relay are replaced with the whole peer, never mutated.
type tcpPeer struct {
	// Static: a new header or relay makes a new peer.
	conn  *tcpICEConn
	hdr   encap.Header // to-client, TCP flag set, key ID cleared
	relay netip.AddrPort
	// Written by the readers, read by the sweep and LastSeen.
	lastSeen atomic.Int64 // unix nanoseconds of the last datagram from the client
}

// tcpSide is the pod's ICE-TCP state: session conns and client bindings.
// It lives in the podSocket; its zero value is ready after init.
type tcpSide struct {
	sock  *Socket
	drops *udpio.Drops[tcpDropReason]

	mu    sync.RWMutex
	conns map[tcpConnKey]*tcpICEConn // guarded by mu
	peers map[tcpPeerKey]*tcpPeer    // guarded by mu
}

func (ts *tcpSide) init(s *Socket) {
	ts.sock = s
	ts.drops = udpio.NewDrops[tcpDropReason](s.m.dropVec, "tcp_", tcpDropLabels[:]...)
	ts.conns = map[tcpConnKey]*tcpICEConn{}
	ts.peers = map[tcpPeerKey]*tcpPeer{}
}

// handle takes a verified datagram with the TCP flag for this pod (payload
// at buf[hl:n]) and queues it on its session's conn. It reports whether buf
// was handed on.
func (ts *tcpSide) handle(buf *podBuf, n, hl int, h encap.Header, relay netip.AddrPort) bool {
	// The payload moves to the front, where Pion reads it; a check of an
	// ICE-restarted session is translated first (restart.go), so that it
	// names the conn's ufrag.
	copy(buf[:], buf[hl:n])
	n = ts.sock.restarts.rewriteIn(buf[:], n-hl, ts.sock.now())
	pkt := buf[:n]
	key := tcpPeerKey{h.POP, h.Client}
	now := ts.sock.now().UnixNano()
	h.ToClient, h.KeyID = true, 0
	ts.mu.RLock()
	p := ts.peers[key]
	ts.mu.RUnlock()
	if p == nil || p.hdr != h || p.relay != relay {
		var ok bool
		if p, ok = ts.bind(key, h, relay, pkt, p); !ok {
			return false
		}
	}
	p.lastSeen.Store(now)
	if mp := p.conn.media.Load(); mp != nil && stunmsg.DemuxClass(pkt) == stunmsg.ClassRTP {
		ts.sock.m.in(n)
		mp.receive(pkt)
		return false
	}
	select {
	case p.conn.in <- datagram{buf: buf, n: n, from: h.Client}:
		ts.sock.m.in(n)
		return true
	default:
		ts.drops.Inc(tcpDropQueueFull)
		return false
	}
}

// bind creates or refreshes a client's binding. A new client's first
// datagram must be a Binding Request whose USERNAME names a session conn
// of the POP (the global relay opened the connection with exactly such a
// check); a known client keeps its conn when its route changes (another
// relay replica) under the same routing token. Another token from the same
// address is another connection — a NAT that reused the port for a new
// call — and binds afresh from its check.
func (ts *tcpSide) bind(key tcpPeerKey, h encap.Header, relay netip.AddrPort, pkt []byte, old *tcpPeer) (*tcpPeer, bool) {
	var conn *tcpICEConn
	if old != nil && old.hdr.Token == h.Token {
		conn = old.conn
	} else {
		user, err := stunmsg.Username(pkt)
		if err != nil {
			ts.drops.Inc(tcpDropNotCheck)
			return nil, false
		}
		ufrag, err := stunmsg.ServerUfrag(user)
		if err != nil {
			ts.drops.Inc(tcpDropNotCheck)
			return nil, false
		}
		ts.mu.RLock()
		conn = ts.conns[tcpConnKey{string(ufrag), key.pop}]
		ts.mu.RUnlock()
		if conn == nil {
			ts.drops.Inc(tcpDropNoSession)
			return nil, false
		}
	}
	np := &tcpPeer{conn: conn, hdr: h, relay: relay}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if cur := ts.peers[key]; cur == nil && len(ts.peers) >= maxTCPPeers {
		ts.drops.Inc(tcpDropPeerTable)
		return nil, false
	}
	if ts.conns[conn.key] != conn {
		ts.drops.Inc(tcpDropNoSession) // closed meanwhile
		return nil, false
	}
	ts.peers[key] = np
	return np, true
}

// peer returns the binding of a client through a POP.
func (ts *tcpSide) peer(pop uint16, client netip.AddrPort) *tcpPeer {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	return ts.peers[tcpPeerKey{pop, client}]
}

// open registers a session's conn for one POP, replacing (and closing) an
// older one of the same ufrag and POP.
func (ts *tcpSide) open(ufrag string, pop POP) *tcpICEConn {
	c := &tcpICEConn{
		side:   ts,
		key:    tcpConnKey{ufrag, pop.ID},
		local:  &net.TCPAddr{IP: pop.VIP.Addr().AsSlice(), Port: int(pop.TCPPort)},
		in:     make(chan datagram, tcpInQueueLen),
		closed: make(chan struct{}),
	}
	ts.mu.Lock()
	old := ts.conns[c.key]
	ts.conns[c.key] = c
	ts.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return c
}

// conn returns a session's conn for one POP, nil if none.
func (ts *tcpSide) conn(ufrag string, pop uint16) *tcpICEConn {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	return ts.conns[tcpConnKey{ufrag, pop}]
}

// setMedia points every conn of a session's ufrag at its media path.
func (ts *tcpSide) setMedia(ufrag string, mp *Media) {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	for k, c := range ts.conns {
		if k.ufrag == ufrag {
			c.media.Store(mp)
		}
	}
}

// remove forgets a closed conn and the clients bound to it.
func (ts *tcpSide) remove(c *tcpICEConn) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.conns[c.key] == c {
		delete(ts.conns, c.key)
	}
	for k, p := range ts.peers {
		if p.conn == c {
			delete(ts.peers, k)
		}
	}
}

// sweep forgets bindings idle since before cutoff and returns how many
// remain.
func (ts *tcpSide) sweep(cutoff int64) int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for k, p := range ts.peers {
		if p.lastSeen.Load() < cutoff {
			delete(ts.peers, k)
		}
	}
	return len(ts.peers)
}

// closeAll closes every session conn (the transceiver's Close).
func (ts *tcpSide) closeAll() {
	ts.mu.Lock()
	all := make([]*tcpICEConn, 0, len(ts.conns))
	for _, c := range ts.conns {
		all = append(all, c)
	}
	ts.mu.Unlock()
	for _, c := range all {
		_ = c.Close()
	}
}

// tcpICEConn is the packet conn Pion reads and writes for one session's
// passive TCP candidate at one POP. Its LocalAddr is the VIP's address and
// TCP port; its peers are the TCP clients bound to it by their first check.
type tcpICEConn struct {
	// Static after open.
	side  *tcpSide
	key   tcpConnKey
	local *net.TCPAddr

	in           chan datagram
	closed       chan struct{}
	closeOnce    sync.Once
	readDeadline atomic.Pointer[time.Time]
	media        atomic.Pointer[Media] // the session's SRTP goes here, not to Pion
}

// ReadFromAddrPort implements ice.AddrPortReaderWriter.
func (c *tcpICEConn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	return readInbox(c.in, c.closed, &c.readDeadline, b)
}

// ReadFrom implements net.PacketConn; peers are *net.TCPAddr, so Pion
// sees them on the TCP network type.
func (c *tcpICEConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, from, err := c.ReadFromAddrPort(b)
	if err != nil {
		return 0, nil, err
	}
	return n, net.TCPAddrFromAddrPort(from), nil
}

// WriteToAddrPort sends b to a TCP client bound to this conn: a datagram
// with the TCP flag through the relays its datagrams came through.
func (c *tcpICEConn) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	select {
	case <-c.closed:
		return 0, io.ErrClosedPipe
	default:
	}
	p := c.side.peer(c.key.pop, netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port()))
	if p == nil || p.conn != c {
		c.side.drops.Inc(tcpDropNoPeer)
		return 0, errNoRoute
	}
	if _, err := c.side.sock.send(&p.hdr, p.relay, c.side.sock.restarts.rewriteOut(b)); err != nil {
		return 0, err
	}
	return len(b), nil // what the caller asked to write, whatever rewriteOut made of it
}

// WriteTo implements net.PacketConn.
func (c *tcpICEConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return 0, errNotTCPAddr
	}
	return c.WriteToAddrPort(b, ta.AddrPort())
}

// Close ends reads with io.EOF and unbinds the conn's clients.
func (c *tcpICEConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.side.remove(c)
	})
	return nil
}

// LocalAddr is the POP's VIP address with its TCP port.
func (c *tcpICEConn) LocalAddr() net.Addr { return c.local }

// SetDeadline sets the read deadline; writes never block.
func (c *tcpICEConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

// SetReadDeadline bounds ReadFrom calls started after it.
func (c *tcpICEConn) SetReadDeadline(t time.Time) error {
	c.readDeadline.Store(&t)
	return nil
}

// SetWriteDeadline is a no-op: a write is one non-blocking UDP send.
func (c *tcpICEConn) SetWriteDeadline(time.Time) error { return nil }

// sessionTCPMux is the ice.TCPMux (and ice.AllConnsGetter) one session's
// agent gathers its passive TCP candidates from: one conn per POP of the
// session that has a TCP port, for the VIP address Pion asks about.
type sessionTCPMux struct {
	side *tcpSide
	pops []POP
}

// GetAllConns returns a conn per POP of the session whose VIP address is
// local (the address of vipNet's interface Pion is gathering for).
func (m *sessionTCPMux) GetAllConns(ufrag string, _ bool, local net.IP) ([]net.PacketConn, error) {
	ip, ok := netip.AddrFromSlice(local)
	if !ok {
		return nil, errBadLocalAddr
	}
	var out []net.PacketConn
	for _, p := range m.pops {
		if p.TCPPort != 0 && p.VIP.Addr().Unmap() == ip.Unmap() {
			out = append(out, m.side.open(ufrag, p))
		}
	}
	return out, nil
}

// GetConnByUfrag returns the first of GetAllConns (TCPMux).
func (m *sessionTCPMux) GetConnByUfrag(ufrag string, isIPv6 bool, local net.IP) (net.PacketConn, error) {
	all, err := m.GetAllConns(ufrag, isIPv6, local)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, errNoTCPPOP
	}
	for _, c := range all[1:] {
		_ = c.Close()
	}
	return all[0], nil
}

// RemoveConnByUfrag closes the session's conns (Pion calls it when the
// agent closes).
func (m *sessionTCPMux) RemoveConnByUfrag(ufrag string) {
	ts := m.side
	ts.mu.Lock()
	var gone []*tcpICEConn
	for k, c := range ts.conns {
		if k.ufrag == ufrag {
			gone = append(gone, c)
		}
	}
	ts.mu.Unlock()
	for _, c := range gone {
		_ = c.Close()
	}
}

// Close is a no-op: the conns belong to sessions, the table to the pod.
func (m *sessionTCPMux) Close() error { return nil }

// vipNet is the transport.Net a session's agent gathers TCP host
// candidates from: the pod's real network for everything, except that its
// only interface carries the session's VIP addresses.
type vipNet struct {
	transport.Net
	iface *transport.Interface
}

// Interfaces returns the one virtual interface.
func (n *vipNet) Interfaces() ([]*transport.Interface, error) {
	return []*transport.Interface{n.iface}, nil
}

// InterfaceByIndex returns the virtual interface for its index.
func (n *vipNet) InterfaceByIndex(index int) (*transport.Interface, error) {
	if index == n.iface.Index {
		return n.iface, nil
	}
	return nil, errNoInterface
}

// InterfaceByName returns the virtual interface for its name.
func (n *vipNet) InterfaceByName(name string) (*transport.Interface, error) {
	if name == n.iface.Name {
		return n.iface, nil
	}
	return nil, errNoInterface
}

// podNet is the pod's real network, which vipNet wraps; created once.
var podNet = sync.OnceValues(func() (transport.Net, error) { return stdnet.NewNet() })

// TCP returns what a session's agent gathers passive TCP candidates from
// for the POPs that take TCP: the mux, and the network whose only
// interface carries those POPs' VIP addresses, with whether any is IPv4 or
// IPv6. The mux is nil when no POP takes TCP.
func (s *Socket) TCP(pops []POP) (mux ice.TCPMux, n transport.Net, v4, v6 bool) {
	var tp []POP
	for _, p := range pops {
		if p.TCPPort != 0 {
			tp = append(tp, p)
		}
	}
	std, err := podNet()
	if len(tp) == 0 || err != nil {
		return nil, nil, false, false
	}
	iface := transport.NewInterface(net.Interface{Index: 1, MTU: 1500, Name: "rtcedge-vips", Flags: net.FlagUp})
	seen := map[netip.Addr]bool{}
	for _, p := range tp {
		ip := p.VIP.Addr().Unmap()
		if seen[ip] {
			continue
		}
		seen[ip] = true
		bits := 32
		if ip.Is6() {
			bits, v6 = 128, true
		} else {
			v4 = true
		}
		iface.AddAddress(&net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, bits)})
	}
	return &sessionTCPMux{side: &s.tcp, pops: tp}, &vipNet{Net: std, iface: iface}, v4, v6
}

var _ ice.TCPMux = (*sessionTCPMux)(nil)
var _ ice.AllConnsGetter = (*sessionTCPMux)(nil)
var _ ice.AddrPortReaderWriter = (*tcpICEConn)(nil)
