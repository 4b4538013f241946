package transceiver

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// podBuf is one datagram buffer of the pod socket: the largest datagram
// between tiers (encap.MaxDatagram, the one size limit of every tier) plus
// one byte, so that a longer datagram is seen as such and dropped.
type podBuf = [encap.MaxDatagram + 1]byte

// errNoRoute is returned by popConn writes for a client address that has
// sent nothing through this pod recently: there is no header to answer with.
var errNoRoute = errors.New("transceiver: no relay route to client")

// errProvisional is returned by popConn writes of anything but STUN toward a
// client address Pion has not authenticated yet.
var errProvisional = errors.New("transceiver: route to client not yet authenticated")

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
// relay those packets came from. hdr and relay are replaced whole (a new
// route), never mutated, so readers need no lock beyond the map's.
//
// A route is provisional until Pion has authenticated a check from the
// client address (confirm, from the session's binding-request hook): a
// provisional route carries only STUN responses, never DTLS or media, is
// capped per POP (the oldest is evicted) and expires after provisionalTTL.
type route struct {
	hdr       encap.Header
	relay     netip.AddrPort
	lastSeen  atomic.Int64 // unix nanoseconds of the last packet from the client
	created   int64        // unix nanoseconds when the client address was first seen
	confirmed atomic.Bool  // Pion authenticated a check from the address
	checks    atomic.Int32 // authenticated checks seen from the address
	reachable atomic.Bool  // the address answered our probe, or sent a second check (reach.go)
	reach     *reach       // shared by the routes of one address
}

const (
	// maxProvisional bounds the unconfirmed routes of one POP conn; a new
	// one beyond it evicts the oldest, so routes made without Pion's
	// consent cannot crowd out new callers, whose check is confirmed
	// within a round trip of arriving.
	maxProvisional = 1024
	// provisionalTTL is how long an unconfirmed route lives.
	provisionalTTL = 10 * time.Second
)

// podSocket owns the pod's single UDP socket and splits its traffic into one
// popConn per POP (WIRE.md "Why the POP ID").
type podSocket struct {
	// Static after construction.
	conn    *net.UDPConn
	cluster uint16
	pod     uint16
	relays  *RelaySet // nil: every sender trusted (the MAC still applies)
	m       *metrics
	now     func() time.Time
	keys    atomic.Pointer[encap.Keyring]
	// restarts translates checks of ICE-restarted sessions (restart.go);
	// set once after construction.
	restarts *restartTable
	out      *outQueue // batched sends (podbatch.go)
	// stray is told of RTP from a client address no session's mux knows
	// (hint.go); set once after construction.
	stray func(pc *popConn, token [6]byte, client netip.AddrPort)

	tcp tcpSide // ICE-TCP clients (tcp.go)

	mu   sync.RWMutex
	pops map[uint16]*popConn // guarded by mu
}

func newPodSocket(conn *net.UDPConn, cluster, pod uint16, keys *encap.Keyring, relays *RelaySet, m *metrics, now func() time.Time) *podSocket {
	s := &podSocket{conn: conn, cluster: cluster, pod: pod, relays: relays, m: m, now: now, pops: map[uint16]*popConn{},
		out: newOutQueue(conn, m)}
	s.keys.Store(keys)
	s.tcp.init(s)
	return s
}

// SetHopKeys replaces the pod's inter-tier keys (key rotation): replies are
// sealed with the new current key and datagrams verified against every key
// it holds, from the next datagram on.
func (t *Transceiver) SetHopKeys(k *encap.Keyring) {
	if k != nil {
		t.sock.keys.Store(k)
	}
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

// podBatch is the most datagrams the pod socket reads per system call
// (recvmmsg through udpio.BatchConn: no allocation per datagram).
const podBatch = 32

// readers runs n readLoops on the pod socket's port until it is closed and
// returns the first reader's error. Every reader has a socket or descriptor
// of its own (readerConns): the runtime lets one goroutine at a time read a
// descriptor, and a readLoop holds it for as long as it runs
// (udpio.BatchConn.ReadLoop handles its batches inside the raw read), so
// readers of one descriptor would take turns, never run at once
// (TestReadersRunInParallel). When one reader ends (the socket was closed,
// or it failed), the others are stopped.
func (s *podSocket) readers(n int) error {
	conns, err := readerConns(s.conn, n)
	if errors.Is(err, net.ErrClosed) {
		return nil // closed before the readers started: the normal end
	}
	if err != nil {
		return err
	}
	errs := make(chan error, len(conns))
	for _, c := range conns {
		go func() { errs <- s.readLoop(c) }()
	}
	var first error
	for i := range conns {
		err := <-errs
		if i == 0 {
			for _, c := range conns {
				_ = c.Close()
			}
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// dupUDP returns a second conn on c's socket, with a descriptor of its own
// (readerConns).
func dupUDP(c *net.UDPConn) (*net.UDPConn, error) {
	f, err := c.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pc, err := net.FilePacketConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		_ = pc.Close()
		return nil, errors.New("duplicate is not a UDP conn")
	}
	return uc, nil
}

// readLoop reads conn (the pod socket or a duplicate of it) until it is
// closed, a batch per system call. It never blocks on Pion: a full session
// queue drops the datagram.
func (s *podSocket) readLoop(conn *net.UDPConn) error {
	bc := udpio.NewBatchConn(conn, podBatch)
	bufs := make([]*podBuf, podBatch)
	ms := make([]udpio.Msg, podBatch)
	for i := range bufs {
		bufs[i] = bufPool.Get().(*podBuf)
		ms[i].Buf = bufs[i][:]
	}
	defer func() {
		for _, b := range bufs {
			bufPool.Put(b)
		}
	}()
	err := bc.ReadLoop(ms, func(n int) bool {
		s.out.cork()
		defer s.out.uncork()
		for i := range n {
			if ms[i].N > encap.MaxDatagram {
				// Longer than any tier forwards: never a WebRTC datagram.
				s.m.drop(dropOversize)
				continue
			}
			if encap.IsBundle(bufs[i][:ms[i].N]) {
				s.unbundle(bufs[i][:ms[i].N], ms[i].Addr)
				continue
			}
			// Sources are unmapped by BatchConn.
			if s.handle(bufs[i], ms[i].N, ms[i].Addr) {
				bufs[i] = bufPool.Get().(*podBuf) // handed on: take a fresh one
				ms[i].Buf = bufs[i][:]
			}
		}
		return true
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// unbundle hands every item of a bundle (docs/bundle.md) to handle as if
// it had come alone from the bundle's sender, each in a pooled buffer of
// its own. A malformed bundle is dropped whole.
func (s *podSocket) unbundle(b []byte, from netip.AddrPort) {
	if _, err := encap.CheckBundle(b); err != nil {
		s.m.encapDrops.Inc(encap.ReasonOf(err))
		return
	}
	for off := encap.BundleHeaderLen; off < len(b); {
		var item []byte
		item, off = encap.NextItem(b, off)
		buf := bufPool.Get().(*podBuf)
		n := copy(buf[:], item)
		if !s.handle(buf, n, from) {
			bufPool.Put(buf)
		}
	}
}

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
	if err == nil && h.Cluster == s.cluster {
		// Before any field is believed (no route, no counter but the drop).
		err = s.keys.Load().Verify(pkt, hl)
	}
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
	if h.TCP {
		return s.tcp.handle(buf, n, hl, h, from)
	}
	pc := s.lookup(h.POP)
	if pc == nil {
		s.m.drop(dropUnknownPOP)
		return false
	}
	if !pc.learn(h, from, s.now().UnixNano()) {
		s.m.drop(dropRouteTable)
		return false
	}
	if pc.answer(h.Client, pkt[hl:]) {
		return false // the answer to our own probe: not Pion's
	}
	if stunmsg.DemuxClass(pkt[hl:]) == stunmsg.ClassRTP {
		if mp := pc.mux.media(h.Client); mp != nil {
			// The session's own media path (media.go): decrypted and
			// handed to the backend here, on this reader.
			s.m.packetsIn.Inc()
			s.m.bytesIn.Add(float64(n - hl))
			mp.receive(pkt[hl:])
			return false
		}
	}
	// Shift the payload to the front so the buffer can be handed to Pion
	// as is; datagrams are small, a copy is cheaper than a second buffer.
	copy(buf[:], pkt[hl:])
	n = hl + s.restarts.rewriteIn(buf[:], n-hl, s.now())
	if reason, ok := pc.mux.deliver(buf, n-hl, h.Client); !ok {
		if reason == dropUnknownClient && s.stray != nil && stunmsg.DemuxClass(buf[:n-hl]) == stunmsg.ClassRTP {
			s.stray(pc, h.Token, h.Client)
		}
		s.m.drop(reason)
		return false
	}
	s.m.packetsIn.Inc()
	s.m.bytesIn.Add(float64(n - hl))
	return true
}

// sweep forgets routes idle for longer than ttl, and provisional ones older
// than provisionalTTL, and returns how many remain.
func (s *podSocket) sweep(ttl time.Duration) int {
	now := s.now()
	cutoff, provCutoff := now.Add(-ttl).UnixNano(), now.Add(-provisionalTTL).UnixNano()
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
			if r.lastSeen.Load() < cutoff || (!r.confirmed.Load() && r.created < provCutoff) {
				pc.remove(addr, r)
			}
			for range r.expireHeld(now.UnixNano()) {
				s.m.drop(dropHeldExpired)
			}
		}
		left += len(pc.routes)
		pc.mu.Unlock()
	}
	return left + s.tcp.sweep(cutoff)
}

// confirm marks the client's route through a POP as authenticated by Pion
// and returns how many authenticated checks (distinct transaction IDs: a
// check presented again by the address follower counts once) it has seen
// from the client, 0 if there is no route. A second distinct check proves
// the address (reach.go) for clients that do not answer probes.
func (s *podSocket) confirm(pop uint16, client netip.AddrPort, txID [stun.TransactionIDSize]byte) int {
	if s.tcp.peer(pop, client) != nil {
		// A TCP client's address is proven by its handshake with the
		// global relay: one authenticated check is enough.
		return earlySelectChecks
	}
	pc := s.lookup(pop)
	if pc == nil {
		return 0
	}
	pc.mu.Lock()
	r := pc.routes[client]
	if r == nil {
		pc.mu.Unlock()
		return 0
	}
	if !r.confirmed.Swap(true) {
		pc.provisional--
	}
	r.reach.mu.Lock()
	fresh := r.reach.lastTx != txID
	r.reach.lastTx = txID
	r.reach.mu.Unlock()
	n := int(r.checks.Load())
	if fresh {
		n = int(r.checks.Add(1))
	}
	pc.mu.Unlock()
	if fresh && n >= 2 {
		pc.prove(r)
	}
	return n
}

// route returns the client's route, nil if none.
func (c *popConn) route(client netip.AddrPort) *route {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.routes[client]
}

// lastSeen returns when the client last sent a datagram through a POP.
func (s *podSocket) lastSeen(pop uint16, client netip.AddrPort) (time.Time, bool) {
	if p := s.tcp.peer(pop, client); p != nil {
		return time.Unix(0, p.lastSeen.Load()), true
	}
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
	s.tcp.closeAll()
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

	mu          sync.RWMutex
	routes      map[netip.AddrPort]*route // guarded by mu
	provisional int                       // unconfirmed routes; guarded by mu
	provQueue   []netip.AddrPort          // unconfirmed routes, oldest first (may hold stale entries); guarded by mu
}

// maxRoutesPerPOP bounds the return routes of one POP conn.
const maxRoutesPerPOP = 1 << 16

// learn records the return route for a client from an authenticated
// header. The common case (same header, same relay) only refreshes a
// timestamp under a read lock. A new client address gets a provisional
// route (see route); a known one keeps its confirmation when the header
// changes (another relay replica, a restarted global relay). It reports
// false when the table is full and the client is new.
func (c *popConn) learn(h encap.Header, relay netip.AddrPort, now int64) bool {
	h.ToClient = true
	h.KeyID = 0 // the to-client header is sealed afresh
	c.mu.RLock()
	r := c.routes[h.Client]
	c.mu.RUnlock()
	if r != nil && r.hdr == h && r.relay == relay {
		r.lastSeen.Store(now)
		return true
	}
	nr := &route{hdr: h, relay: relay, created: now, reach: &reach{}}
	nr.lastSeen.Store(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.routes[h.Client]
	if old != nil {
		nr.created, nr.reach = old.created, old.reach
		nr.checks.Store(old.checks.Load())
		nr.reachable.Store(old.reachable.Load())
		if old.confirmed.Load() {
			nr.confirmed.Store(true)
		} else {
			c.provisional-- // counted again below
		}
	} else if len(c.routes) >= maxRoutesPerPOP {
		return false
	}
	if !nr.confirmed.Load() {
		if old == nil {
			for c.provisional >= maxProvisional && len(c.provQueue) > 0 {
				c.evictOldestProvisional()
			}
			c.provQueue = append(c.provQueue, h.Client)
		}
		c.provisional++
	}
	c.routes[h.Client] = nr
	return true
}

// evictOldestProvisional removes the oldest route still unconfirmed.
// Callers hold mu.
func (c *popConn) evictOldestProvisional() {
	for len(c.provQueue) > 0 {
		a := c.provQueue[0]
		c.provQueue = c.provQueue[1:]
		if r := c.routes[a]; r != nil && !r.confirmed.Load() {
			c.remove(a, r)
			c.sock.m.drop(dropProvisionalEvicted)
			return
		}
	}
}

// remove forgets a route. Callers hold mu.
func (c *popConn) remove(a netip.AddrPort, r *route) {
	delete(c.routes, a)
	if !r.confirmed.Load() {
		c.provisional--
	}
	if len(c.provQueue) > 2*maxProvisional {
		// Drop stale entries (confirmed or removed) now and then.
		q := c.provQueue[:0]
		for _, a := range c.provQueue {
			if r := c.routes[a]; r != nil && !r.confirmed.Load() {
				q = append(q, a)
			}
		}
		c.provQueue = q
	}
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
	written := len(b) // what the caller asked to write, whatever rewriteOut makes of it
	b = c.sock.restarts.rewriteOut(b)
	if !r.reachable.Load() && stunmsg.DemuxClass(b) != stunmsg.ClassSTUN {
		if !r.confirmed.Load() {
			// Only the answer to a check may go to an address Pion has
			// not authenticated: no DTLS flight or media toward it.
			c.sock.m.drop(dropProvisional)
			return 0, errProvisional
		}
		// Authenticated, not yet proven to be the client's: wait for
		// the probe's answer (reach.go).
		if !c.hold(r, b, c.sock.now().UnixNano()) {
			c.sock.m.drop(dropHeldOverflow)
		}
		return written, nil
	}
	if err := c.send(r, b); err != nil {
		return 0, err
	}
	return written, nil
}

// send writes b to the client through the route's relay, sealed.
func (c *popConn) send(r *route, b []byte) error {
	_, err := c.sock.send(&r.hdr, r.relay, b)
	return err
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
	addrs  atomic.Pointer[map[netip.AddrPort]struct{}]
	joined atomic.Bool // has held at least one relay
}

// Set replaces the trusted relays. Addresses are unmapped, as datagram
// sources are.
func (r *RelaySet) Set(addrs []netip.AddrPort) {
	m := make(map[netip.AddrPort]struct{}, len(addrs))
	for _, a := range addrs {
		m[netip.AddrPortFrom(a.Addr().Unmap(), a.Port())] = struct{}{}
	}
	r.addrs.Store(&m)
	if len(m) > 0 {
		r.joined.Store(true)
	}
}

// Trusted reports whether a datagram from addr is accepted. A nil set, or
// one that has never held a relay, trusts everyone (the bootstrap: a pod
// must not drop its first calls while the cluster pool is still joining;
// the MAC still applies). A set that has held relays and is now empty
// trusts no one: a partition or a rollout that leaves no live relay must
// not open the pod.
func (r *RelaySet) Trusted(addr netip.AddrPort) bool {
	if r == nil || !r.joined.Load() {
		return true
	}
	_, ok := (*r.addrs.Load())[addr]
	return ok
}
