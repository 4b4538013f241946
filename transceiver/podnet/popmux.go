package podnet

import (
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/internal/stunmsg"
)

// datagram is one client datagram waiting for a session's ICE reader, in a
// pooled buffer.
type datagram struct {
	buf  *podBuf
	n    int
	from netip.AddrPort
}

// sessionQueueLen bounds the datagrams waiting for one session's ICE reader.
// Once connected a session's audio and RTCP no longer pass through it (the
// media path): it carries STUN, DTLS and SCTP, a few
// datagrams a second, and a burst of data-channel events. A full queue
// drops that session's datagram (dropSessionQueue) and no other session's.
const sessionQueueLen = 32

// maxAddrsPerSession bounds the client addresses one session is reached
// from (host, server reflexive, a NAT rebinding or two). A new address
// beyond it replaces the oldest.
const maxAddrsPerSession = 8

// popMux is the ice.UDPMux of one POP. It replaces Pion's UDPMuxDefault,
// whose single reader goroutine per POP took every datagram from a queue
// and handed it on to the session: here the pod socket's readers hand each
// datagram straight to its session's queue (deliver), so there is one
// goroutine hand-off less per datagram, no per-POP bottleneck, and a slow
// session fills only its own queue.
//
// Routing is as in Pion's mux: by client address, learnt from the first
// STUN Binding Request whose USERNAME names the session's server ufrag.
// Datagrams from an unknown address that are not such a request are
// dropped (dropUnknownClient).
type popMux struct {
	// Static after newPOPMux.
	pc    *popConn
	addrs []net.Addr

	mu      sync.RWMutex
	byUfrag map[string]*muxConn         // guarded by mu
	byAddr  map[netip.AddrPort]*muxConn // guarded by mu
	closed  bool                        // guarded by mu
}

func newPOPMux(pc *popConn) *popMux {
	return &popMux{
		pc:      pc,
		addrs:   []net.Addr{pc.local},
		byUfrag: map[string]*muxConn{},
		byAddr:  map[netip.AddrPort]*muxConn{},
	}
}

// GetConn implements ice.UDPMux: the conn of one session (its server ufrag)
// on this POP.
func (m *popMux) GetConn(ufrag string, _ net.Addr) (net.PacketConn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, io.ErrClosedPipe
	}
	if m.byUfrag[ufrag] != nil {
		return nil, errUfragInUse
	}
	c := &muxConn{mux: m, ufrag: ufrag, in: make(chan datagram, sessionQueueLen), closed: make(chan struct{})}
	m.byUfrag[ufrag] = c
	return c, nil
}

// RemoveConnByUfrag implements ice.UDPMux.
func (m *popMux) RemoveConnByUfrag(ufrag string) {
	m.mu.Lock()
	c := m.byUfrag[ufrag]
	if c != nil {
		m.removeLocked(c)
	}
	m.mu.Unlock()
	if c != nil {
		c.shut()
	}
}

// GetListenAddresses implements ice.UDPMux: the POP's VIP.
func (m *popMux) GetListenAddresses() []net.Addr { return m.addrs }

// Close implements ice.UDPMux: it ends every session conn of the POP.
func (m *popMux) Close() error {
	m.mu.Lock()
	m.closed = true
	conns := make([]*muxConn, 0, len(m.byUfrag))
	for _, c := range m.byUfrag {
		conns = append(conns, c)
		m.removeLocked(c)
	}
	m.mu.Unlock()
	for _, c := range conns {
		c.shut()
	}
	return nil
}

func (m *popMux) removeLocked(c *muxConn) {
	if m.byUfrag[c.ufrag] == c {
		delete(m.byUfrag, c.ufrag)
	}
	for _, a := range c.addrs {
		if m.byAddr[a] == c {
			delete(m.byAddr, a)
		}
	}
	c.addrs = nil
}

// deliver hands one client datagram (buf[:n], already stripped of its
// header) to its session's conn, which it returns (nil if none). It
// reports true when buf was handed on and must not be reused by the
// caller, else why it was not. Safe for concurrent use
// by several socket readers.
func (m *popMux) deliver(buf *podBuf, n int, from netip.AddrPort) (*muxConn, dropReason, bool) {
	c := m.routed(from)
	if c == nil {
		if c = m.learn(buf[:n], from); c == nil {
			return nil, dropUnknownClient, false
		}
	}
	select {
	case c.in <- datagram{buf: buf, n: n, from: from}:
		return c, 0, true
	default:
		return c, dropSessionQueue, false
	}
}

// hasUfrag reports whether a session conn of the ufrag is on the POP.
func (m *popMux) hasUfrag(ufrag string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.byUfrag[ufrag] != nil
}

// routed returns the session conn a client address is routed to, nil if
// none.
func (m *popMux) routed(from netip.AddrPort) *muxConn {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.byAddr[from]
}

// learn maps a new client address to the session its STUN Binding Request
// names. Pion's agent then checks the request's MESSAGE-INTEGRITY; an
// address learnt from a forged request only ever reaches that check.
func (m *popMux) learn(pkt []byte, from netip.AddrPort) *muxConn {
	user, err := stunmsg.Username(pkt)
	if err != nil {
		return nil
	}
	ufrag, err := stunmsg.ServerUfrag(user)
	if err != nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.byUfrag[string(ufrag)]
	if c == nil {
		return nil
	}
	if prev := m.byAddr[from]; prev != nil && prev != c {
		prev.dropAddrLocked(from)
	}
	if len(c.addrs) >= maxAddrsPerSession {
		if m.byAddr[c.addrs[0]] == c {
			delete(m.byAddr, c.addrs[0])
		}
		c.addrs = append(c.addrs[:0], c.addrs[1:]...)
	}
	c.addrs = append(c.addrs, from)
	m.byAddr[from] = c
	return c
}

// muxConn is one session's net.PacketConn on one POP, the conn Pion's ICE
// agent reads its host candidate from.
type muxConn struct {
	// Static after GetConn.
	mux   *popMux
	ufrag string

	in        chan datagram
	closed    chan struct{}
	closeOnce sync.Once

	readDeadline atomic.Pointer[time.Time]
	media        atomic.Pointer[Media]    // the session's SRTP goes here, not to Pion
	follow       atomic.Pointer[Follower] // a path change waiting for datagrams from its address (follow.go)

	addrs []netip.AddrPort // client addresses routed here; guarded by mux.mu
}

func (c *muxConn) dropAddrLocked(a netip.AddrPort) {
	for i, x := range c.addrs {
		if x == a {
			c.addrs = append(c.addrs[:i], c.addrs[i+1:]...)
			return
		}
	}
}

// ReadFromAddrPort implements ice.AddrPortReaderWriter.
func (c *muxConn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	return readInbox(c.in, c.closed, &c.readDeadline, b)
}

// ReadFrom implements net.PacketConn.
func (c *muxConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, from, err := c.ReadFromAddrPort(b)
	if err != nil {
		return 0, nil, err
	}
	return n, net.UDPAddrFromAddrPort(from), nil
}

// WriteToAddrPort sends through the POP's relays (popConn).
func (c *muxConn) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	return c.mux.pc.write(b, addr, c.ufrag)
}

// WriteTo implements net.PacketConn.
func (c *muxConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, errNotUDPAddr
	}
	return c.WriteToAddrPort(b, ua.AddrPort())
}

// Close removes the conn from its POP and ends reads with io.EOF.
func (c *muxConn) Close() error {
	c.mux.mu.Lock()
	c.mux.removeLocked(c)
	c.mux.mu.Unlock()
	c.shut()
	return nil
}

// shut ends reads; the caller has removed the conn from the mux. Datagrams
// still queued go back to the pool.
func (c *muxConn) shut() {
	c.closeOnce.Do(func() {
		close(c.closed)
		for {
			select {
			case d := <-c.in:
				bufPool.Put(d.buf)
			default:
				return
			}
		}
	})
}

// LocalAddr is the POP's VIP.
func (c *muxConn) LocalAddr() net.Addr { return c.mux.pc.local }

// SetDeadline sets the read deadline; writes never block.
func (c *muxConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

// SetReadDeadline bounds ReadFrom calls started after it.
func (c *muxConn) SetReadDeadline(t time.Time) error {
	c.readDeadline.Store(&t)
	return nil
}

// SetWriteDeadline is a no-op: a write is one non-blocking UDP send.
func (c *muxConn) SetWriteDeadline(time.Time) error { return nil }

// conn returns the session conn of a server ufrag, nil if none.
func (m *popMux) conn(ufrag string) *muxConn {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.byUfrag[ufrag]
}

// arrived is told of a datagram handed to the session from a client
// address: a path change waiting for that address may go now (follow.go).
// One atomic load when none waits.
func (c *muxConn) arrived(from netip.AddrPort) {
	if f := c.follow.Load(); f != nil {
		f.nudge(from)
	}
}

// setMedia points the session conn of a ufrag at its media path.
func (m *popMux) setMedia(ufrag string, mp *Media) {
	if c := m.conn(ufrag); c != nil {
		c.media.Store(mp)
	}
}

// inject hands a datagram to its session as if it had arrived from a
// client through this POP. It reports false (counted as a drop) when the
// conn is closed or its queue is full.
func (c *popConn) inject(b []byte, from netip.AddrPort) bool {
	select {
	case <-c.closed:
		return false
	default:
	}
	buf := bufPool.Get().(*podBuf)
	n := copy(buf[:], b)
	if _, reason, ok := c.mux.deliver(buf, n, from); !ok {
		c.sock.m.drop(reason)
		bufPool.Put(buf)
		return false
	}
	return true
}

// readInbox reads the next queued datagram into b, honouring a read
// deadline, io.EOF once closed is closed. Shared by the virtual conns.
func readInbox(in <-chan datagram, closed <-chan struct{}, deadline *atomic.Pointer[time.Time], b []byte) (int, netip.AddrPort, error) {
	var timeout <-chan time.Time
	if d := deadline.Load(); d != nil && !d.IsZero() {
		wait := time.Until(*d)
		if wait <= 0 {
			return 0, netip.AddrPort{}, os.ErrDeadlineExceeded
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case d := <-in:
		n := copy(b, d.buf[:d.n])
		bufPool.Put(d.buf)
		return n, d.from, nil
	case <-closed:
		return 0, netip.AddrPort{}, io.EOF
	case <-timeout:
		return 0, netip.AddrPort{}, os.ErrDeadlineExceeded
	}
}
