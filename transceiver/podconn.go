package transceiver

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// podBuf is one datagram buffer of the pod socket: the largest datagram
// between tiers (encap.MaxDatagram, the one size limit of every tier) plus
// one byte, so that a longer datagram is seen as such and dropped.
type podBuf = [encap.MaxDatagram + 1]byte

// errNoRoute is returned by popConn writes for a client address that has
// sent nothing through this pod recently: there is no header to answer with.
var errNoRoute = errors.New("transceiver: no relay route to client")

// datagram is one client datagram waiting for a session's ICE reader
// (popmux.go), in a pooled buffer.
type datagram struct {
	buf  *podBuf
	n    int
	from netip.AddrPort
}

var bufPool = sync.Pool{New: func() any { return new(podBuf) }}

// route is how to reach one client through one POP: the to-client header
// (built from the last header the client's packets carried) and the cluster
// relay those packets came from. Replaced whole, never mutated, so readers
// need no lock beyond the map's.
type route struct {
	hdr      encap.Header
	relay    netip.AddrPort
	lastSeen atomic.Int64 // unix nanoseconds of the last packet from the client
}

// podSocket owns the pod's single UDP socket and splits its traffic into one
// popConn per POP (WIRE.md "Why the POP ID").
type podSocket struct {
	// Static after construction.
	conn    *net.UDPConn
	cluster uint16
	pod     uint16
	relays  *RelaySet // nil: every sender trusted
	m       *metrics
	now     func() time.Time
	out     *outQueue // batched sends (podbatch.go)

	mu   sync.RWMutex
	pops map[uint16]*popConn // guarded by mu
}

func newPodSocket(conn *net.UDPConn, cluster, pod uint16, relays *RelaySet, m *metrics, now func() time.Time) *podSocket {
	return &podSocket{conn: conn, cluster: cluster, pod: pod, relays: relays, m: m, now: now, pops: map[uint16]*popConn{},
		out: newOutQueue(conn, m)}
}

// popConn returns the virtual conn for a POP, creating it on first use. It
// fails when the POP ID is already bound to another VIP.
func (s *podSocket) popConn(id uint16, vip netip.AddrPort) (*popConn, bool, error) {
	s.mu.RLock()
	pc := s.pops[id]
	s.mu.RUnlock()
	if pc == nil {
		s.mu.Lock()
		if pc = s.pops[id]; pc == nil {
			pc = &popConn{
				sock:   s,
				id:     id,
				vip:    vip,
				local:  net.UDPAddrFromAddrPort(vip),
				closed: make(chan struct{}),
				routes: map[netip.AddrPort]*route{},
			}
			pc.mux = newPOPMux(pc)
			s.pops[id] = pc
			s.mu.Unlock()
			return pc, true, nil
		}
		s.mu.Unlock()
	}
	if pc.vip != vip {
		return nil, false, errors.New("transceiver: POP ID already bound to another VIP")
	}
	return pc, false, nil
}

func (s *podSocket) lookup(id uint16) *popConn {
	s.mu.RLock()
	pc := s.pops[id]
	s.mu.RUnlock()
	return pc
}

// The socket's readers are in podbatch.go (readBatches).

// handle routes one datagram from a cluster relay to its POP conn. It
// reports whether buf was handed on (and must not be reused by the caller).
// Several socket readers call it at once.
func (s *podSocket) handle(buf *podBuf, n int, from netip.AddrPort) bool {
	pkt := buf[:n]
	if !s.relays.Trusted(from) {
		s.m.drop(dropUnknownRelay)
		return false
	}
	h, hl, err := encap.Decode(pkt)
	switch {
	case err != nil:
		s.m.encapDrops.Inc(encap.ReasonOf(err))
		return false
	case h.ToClient:
		s.m.drop(dropDirection)
		return false
	case h.Cluster != s.cluster || h.Pod != s.pod:
		s.m.drop(dropWrongPod)
		return false
	case n-hl == 0:
		s.m.drop(dropEmpty)
		return false
	case n-hl > encap.MaxPayload:
		s.m.drop(dropOversize)
		return false
	}
	pc := s.lookup(h.POP)
	if pc == nil {
		s.m.drop(dropUnknownPOP)
		return false
	}
	if !pc.learn(h, from, s.now()) {
		s.m.drop(dropRouteTable)
		return false
	}
	// Shift the payload to the front so the buffer can be handed to Pion
	// as is; datagrams are small, a copy is cheaper than a second buffer.
	copy(buf[:], pkt[hl:])
	if reason, ok := pc.mux.deliver(buf, n-hl, h.Client); !ok {
		s.m.drop(reason)
		return false
	}
	s.m.packetsIn.Inc()
	s.m.bytesIn.Add(float64(n - hl))
	return true
}

// sweep forgets routes idle for longer than ttl and returns how many remain.
func (s *podSocket) sweep(ttl time.Duration) int {
	cutoff := s.now().Add(-ttl).UnixNano()
	s.mu.RLock()
	pops := make([]*popConn, 0, len(s.pops))
	for _, pc := range s.pops {
		pops = append(pops, pc)
	}
	s.mu.RUnlock()
	left := 0
	for _, pc := range pops {
		pc.mu.Lock()
		for addr, r := range pc.routes {
			if r.lastSeen.Load() < cutoff {
				delete(pc.routes, addr)
			}
		}
		left += len(pc.routes)
		pc.mu.Unlock()
	}
	return left
}

// lastSeen returns when the client last sent a datagram through a POP.
func (s *podSocket) lastSeen(pop uint16, client netip.AddrPort) (time.Time, bool) {
	pc := s.lookup(pop)
	if pc == nil {
		return time.Time{}, false
	}
	pc.mu.RLock()
	r := pc.routes[client]
	pc.mu.RUnlock()
	if r == nil {
		return time.Time{}, false
	}
	return time.Unix(0, r.lastSeen.Load()), true
}

// closeAll closes every POP conn: writes through it fail from then on.
func (s *podSocket) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pc := range s.pops {
		pc.Close()
	}
}

// popConn is one POP's side of the pod socket: its ICE mux (popmux.go),
// whose conns' LocalAddr is the POP's VIP, so host candidates name the VIP,
// and the return routes to its clients, whose addresses are the real ones
// taken from the encapsulation header.
type popConn struct {
	// Static after construction.
	sock  *podSocket
	id    uint16
	vip   netip.AddrPort
	local *net.UDPAddr
	mux   *popMux

	closed    chan struct{}
	closeOnce sync.Once

	mu     sync.RWMutex
	routes map[netip.AddrPort]*route // guarded by mu
}

// maxRoutesPerPOP bounds the return routes of one POP conn: a route is
// made by any datagram with a well-formed header, before Pion has looked
// at it, so without a bound forged headers could grow the map.
const maxRoutesPerPOP = 1 << 16

// learn records the return route for a client. The common case (same
// ingress, same relay) only refreshes a timestamp under a read lock. It
// reports false when the table is full and the client is new.
func (c *popConn) learn(h encap.Header, relay netip.AddrPort, now time.Time) bool {
	h.ToClient = true
	c.mu.RLock()
	r := c.routes[h.Client]
	c.mu.RUnlock()
	if r != nil && r.hdr == h && r.relay == relay {
		r.lastSeen.Store(now.UnixNano())
		return true
	}
	nr := &route{hdr: h, relay: relay}
	nr.lastSeen.Store(now.UnixNano())
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.routes[h.Client]; !ok && len(c.routes) >= maxRoutesPerPOP {
		return false
	}
	c.routes[h.Client] = nr
	return true
}

// WriteToAddrPort sends b to a client through the cluster relay and global
// relay replica its packets last came through.
func (c *popConn) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	c.mu.RLock()
	r := c.routes[addr]
	c.mu.RUnlock()
	if r == nil {
		c.sock.m.drop(dropNoRoute)
		return 0, errNoRoute
	}
	buf := bufPool.Get().(*podBuf)
	defer bufPool.Put(buf)
	hl, err := r.hdr.Put(buf[:])
	if err != nil || len(b) > encap.MaxPayload {
		c.sock.m.drop(dropOversize)
		return 0, errors.New("transceiver: datagram too large")
	}
	copy(buf[hl:], b)
	if err := c.sock.out.send(buf[:hl+len(b)], r.relay); err != nil {
		c.sock.m.writeErrors.Inc()
		return 0, err
	}
	c.sock.m.packetsOut.Inc()
	c.sock.m.bytesOut.Add(float64(len(b)))
	return len(b), nil
}

// Close makes writes through the POP fail from then on.
func (c *popConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

// RelaySet is the set of cluster relays whose datagrams the pod accepts
// (their data addresses, from the cluster pool). A datagram's header sets
// the return route of its client, so only the cluster's own relays may
// send them. Lookups are lock-free; Set replaces the whole set.
type RelaySet struct {
	addrs atomic.Pointer[map[netip.AddrPort]struct{}]
}

// Set replaces the trusted relays.
func (r *RelaySet) Set(addrs []netip.AddrPort) {
	m := make(map[netip.AddrPort]struct{}, len(addrs))
	for _, a := range addrs {
		m[a] = struct{}{}
	}
	r.addrs.Store(&m)
}

// Trusted reports whether a datagram from addr is accepted. A nil set, or
// one not yet filled by gossip, trusts everyone: a pod must not drop its
// first calls while the cluster pool is still joining.
func (r *RelaySet) Trusted(addr netip.AddrPort) bool {
	if r == nil {
		return true
	}
	m := r.addrs.Load()
	if m == nil || len(*m) == 0 {
		return true
	}
	_, ok := (*m)[addr]
	return ok
}
