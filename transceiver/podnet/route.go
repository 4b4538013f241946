package podnet

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
)

// errNoRoute is returned by writes toward a client address that has sent
// nothing through this pod recently: there is no header to answer with.
var errNoRoute = errors.New("podnet: no relay route to client")

// errProvisional is returned by writes of anything but STUN toward a client
// address Pion has not authenticated yet.
var errProvisional = errors.New("podnet: route to client not yet authenticated")

// route is how to reach one client through one POP: the to-client header
// (built from the last header the client's packets carried) and the cluster
// relay those packets came from. hdr and relay are replaced whole (a new
// route), never mutated, so readers need no lock beyond the map's.
//
// A route is provisional until Pion has authenticated a check from the
// client address (Confirm, from the session's binding-request hook): a
// provisional route carries only STUN responses, never DTLS or media, is
// capped per POP (the oldest is evicted) and expires after provisionalTTL.
type route struct {
	hdr       encap.Header
	relay     netip.AddrPort
	lastSeen  atomic.Int64 // unix nanoseconds of the last packet from the client
	created   int64        // unix nanoseconds when the client address was first seen
	confirmed atomic.Bool  // Pion authenticated a check from the address
	checks    atomic.Int32 // authenticated checks seen from the address
	reachable atomic.Bool  // the address answered our probe, or sent a second check
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
	// maxRoutesPerPOP bounds the return routes of one POP conn.
	maxRoutesPerPOP = 1 << 16
)

// popConn is one POP's side of the pod socket: its ICE mux, whose conns'
// LocalAddr is the POP's VIP, so host candidates name the VIP, and the
// return routes to its clients, whose addresses are the real ones taken
// from the encapsulation header.
type popConn struct {
	// Static after construction.
	sock  *Socket
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

// learn records the return route for a client from an authenticated
// header. The common case (same header, same relay) only refreshes a
// timestamp under a read lock. A new client address gets a provisional
// route (see route); a known one keeps its confirmation when the header
// changes (another relay replica, a restarted global relay). It reports
// false when the table is full and the client is new.
func (c *popConn) learn(h encap.Header, relay netip.AddrPort, now int64) bool {
	h.ToClient = true
	h.KeyID = 0 // the to-client header is sealed afresh
	r := c.route(h.Client)
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

// route returns the client's route, nil if none.
func (c *popConn) route(client netip.AddrPort) *route {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.routes[client]
}

// WriteToAddrPort sends b to a client through the cluster relay and global
// relay replica its packets last came through.
func (c *popConn) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	r := c.route(addr)
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
		// the probe's answer.
		if !c.hold(r, b, c.sock.now().UnixNano()) {
			c.sock.m.drop(dropHeldOverflow)
		}
		return written, nil
	}
	if _, err := c.sock.send(&r.hdr, r.relay, b); err != nil {
		return 0, err
	}
	return written, nil
}

// Close makes writes through the POP fail from then on.
func (c *popConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

// Return routability. A check Pion has authenticated proves the sender
// knows the session's credentials, not that it owns the source address: a
// spoofer with its own session's ufrag and password can send one from a
// victim's address. So after the first authenticated check from an
// address the pod sends one STUN Binding Request of its own to it (with
// the client's ICE credentials from the offer), and DTLS and media toward
// that address wait (held, a few datagrams) until the answer — which only
// the real owner of the address can give — comes back, or until a second
// authenticated check arrives. Early pair selection can then start the
// DTLS handshake on the first check without a flight ever going to a
// spoofed source: one round trip instead of waiting for the client's
// nomination.

const (
	// maxHeld bounds the datagrams a route holds while unproven: some
	// 600 ms of a call's downlink, more than a probe round trip.
	maxHeld = 32
	// heldTTL is how long held datagrams wait for the proof.
	heldTTL = 2e9 // nanoseconds
)

// EarlySelectChecks is how many authenticated checks an address must have
// sent before its pair is selected ahead of nomination. One is safe since
// DTLS toward the address waits for the return-routability proof.
const EarlySelectChecks = 1

// reach is a route's return-routability state, shared by the route
// objects that replace each other for one client address.
type reach struct {
	mu     sync.Mutex
	sent   bool                // a probe went out
	sentAt int64               // unix nanos when it went out
	txID   [12]byte            // its transaction ID
	pwd    string              // the client's ICE password, to check the answer
	held   [][]byte            // DTLS/media waiting for the proof, oldest first
	heldAt int64               // unix nanos when the oldest was held
	lastTx [12]byte            // transaction ID of the last authenticated check (Confirm)
	onRTT  func(time.Duration) // the probe out measures the round trip (rtt.go)
	follow Session             // the probe was started by this session's audio from the address (follow.go)
}

// Confirm marks the client's route through a POP as authenticated by Pion
// and returns how many authenticated checks (distinct transaction IDs: a
// check presented again by the follower counts once) it has seen from the
// client, 0 if there is no route. A second distinct check proves the
// address for clients that do not answer probes.
func (s *Socket) Confirm(pop uint16, client netip.AddrPort, txID [stun.TransactionIDSize]byte) int {
	if s.tcp.peer(pop, client) != nil {
		// A TCP client's address is proven by its handshake with the
		// global relay: one authenticated check is enough.
		return EarlySelectChecks
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

// Probe sends the client at the POP route a Binding Request with its own
// ICE credentials (USERNAME remote:local, MESSAGE-INTEGRITY with the
// client's password), once per address. username is the USERNAME of the
// client's check ("local:remote"); pwd is the client's ICE password.
func (s *Socket) Probe(pop uint16, client netip.AddrPort, username, pwd string) {
	pc := s.lookup(pop)
	if pc == nil {
		return
	}
	r := pc.route(client)
	if r == nil || r.reachable.Load() {
		return
	}
	local, remote, ok := cut(username)
	if !ok || pwd == "" {
		return
	}
	if pc.sendProbe(r, remote+":"+local, pwd, -1, nil, s.now().UnixNano()) {
		s.m.reachProbes.Inc()
	}
}

// sendProbe sends the route's client a Binding Request with USERNAME user
// (client ufrag ":" server ufrag), signed with the client's password pwd,
// and records it for answer. It sends nothing when a probe went out less
// than again ago (again < 0: only one probe per address). follow, when
// set, is the session whose audio from the address asked for the probe: a
// valid answer presents ICE a check for it. It reports whether a probe was
// sent.
func (c *popConn) sendProbe(r *route, user, pwd string, again time.Duration, follow Session, now int64) bool {
	r.reach.mu.Lock()
	if r.reach.sent && (again < 0 || now-r.reach.sentAt < int64(again)) {
		r.reach.mu.Unlock()
		return false
	}
	msg, err := newProbe(user, pwd)
	if err != nil {
		r.reach.mu.Unlock()
		return false
	}
	r.reach.sent, r.reach.sentAt, r.reach.txID, r.reach.pwd, r.reach.onRTT = true, now, msg.TransactionID, pwd, nil
	if follow != nil {
		r.reach.follow = follow
	}
	r.reach.mu.Unlock()
	_, err = c.sock.send(&r.hdr, r.relay, msg.Raw)
	return err == nil
}

func cut(username string) (local, remote string, ok bool) {
	for i := 0; i < len(username); i++ {
		if username[i] == ':' {
			return username[:i], username[i+1:], true
		}
	}
	return "", "", false
}

// answer reports whether payload from client is the answer to the route's
// probe; a valid one proves the address and releases what it held. It is
// consumed either way (Pion did not send the probe).
func (c *popConn) answer(client netip.AddrPort, payload []byte) bool {
	if len(payload) < 20 || payload[0] != 0x01 || payload[1] != 0x01 || !stunmsg.IsSTUN(payload) {
		return false // not a Binding Success Response
	}
	r := c.route(client)
	if r == nil {
		return false
	}
	r.reach.mu.Lock()
	if !r.reach.sent || [12]byte(payload[8:20]) != r.reach.txID {
		r.reach.mu.Unlock()
		return false
	}
	pwd, follow := r.reach.pwd, r.reach.follow
	r.reach.mu.Unlock()
	m := &stun.Message{Raw: append([]byte(nil), payload...)}
	if m.Decode() != nil || stun.NewShortTermIntegrity(pwd).Check(m) != nil {
		return true
	}
	if c.measured(r, [12]byte(payload[8:20])) && r.reachable.Load() {
		return true
	}
	c.prove(r)
	c.sock.m.reachProven.Inc()
	if follow != nil {
		r.reach.mu.Lock()
		r.reach.follow = nil
		r.reach.mu.Unlock()
		c.presentCheck(follow, client)
	}
	return true
}

// prove marks a route's address as its client's and sends what it held.
func (c *popConn) prove(r *route) {
	if r.reachable.Swap(true) {
		return
	}
	r.reach.mu.Lock()
	held := r.reach.held
	r.reach.held = nil
	r.reach.mu.Unlock()
	for _, b := range held {
		_, _ = c.sock.send(&r.hdr, r.relay, b)
	}
}

// hold keeps a copy of b until the route's address is proven; false when
// the route holds its share already.
func (c *popConn) hold(r *route, b []byte, now int64) bool {
	r.reach.mu.Lock()
	defer r.reach.mu.Unlock()
	if len(r.reach.held) >= maxHeld {
		return false
	}
	if len(r.reach.held) == 0 {
		r.reach.heldAt = now
	}
	r.reach.held = append(r.reach.held, append([]byte(nil), b...))
	return true
}

// expireHeld drops held datagrams older than heldTTL and returns how many.
func (r *route) expireHeld(now int64) int {
	r.reach.mu.Lock()
	defer r.reach.mu.Unlock()
	n := len(r.reach.held)
	if n == 0 || now-r.reach.heldAt < heldTTL {
		return 0
	}
	r.reach.held = nil
	return n
}
