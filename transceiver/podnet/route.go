package podnet

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
)

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
	// Static once in the table: a new header or relay makes a new route (learn).
	hdr     encap.Header
	relay   netip.AddrPort
	created int64  // unix nanoseconds when the client address was first seen
	reach   *reach // shared by the routes of one address
	// Written by the readers and Pion's hook, read by anyone.
	lastSeen  atomic.Int64 // unix nanoseconds of the last packet from the client
	confirmed atomic.Bool  // Pion authenticated a check from the address (for some session)
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
// header, and size payload bytes received from the client (the
// anti-amplification budget, reach). The common case (same header, same
// relay) only refreshes a timestamp and a counter under a read lock. A new client address gets a provisional
// route (see route); a known one keeps its confirmation when the header
// changes (another relay replica, a restarted global relay). It reports
// false when the table is full and the client is new.
func (c *popConn) learn(h encap.Header, relay netip.AddrPort, size int, now int64) bool {
	h.ToClient = true
	h.KeyID = 0 // the to-client header is sealed afresh
	r := c.route(h.Client)
	if r != nil && r.hdr == h && r.relay == relay {
		r.lastSeen.Store(now)
		r.reach.recv.Add(int64(size))
		return true
	}
	nr := &route{hdr: h, relay: relay, created: now, reach: &reach{}}
	nr.lastSeen.Store(now)
	nr.reach.recv.Add(int64(size))
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.routes[h.Client]
	if old != nil {
		nr.created, nr.reach = old.created, old.reach
		nr.reach.recv.Add(int64(size))
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

// write sends b, from the session whose agent's server ufrag is ufrag, to
// a client through the cluster relay and global relay replica its packets
// last came through. Toward an address not proven for that session
// (reach), what goes is bounded: nothing but STUN answers before Pion has
// authenticated a check from it; then STUN and DTLS within the
// anti-amplification budget (a DTLS datagram beyond it waits for the
// proof, a STUN message beyond it is dropped); media only once proven.
func (c *popConn) write(b []byte, addr netip.AddrPort, ufrag string) (int, error) {
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
	if r.reach.isProven(ufrag) {
		if _, err := c.sock.send(&r.hdr, r.relay, b); err != nil {
			return 0, err
		}
		return written, nil
	}
	class := stunmsg.DemuxClass(b)
	switch {
	case class != stunmsg.ClassSTUN && !r.confirmed.Load():
		// Only the answer to a check may go to an address Pion has
		// not authenticated: no DTLS flight or media toward it.
		c.sock.m.drop(dropProvisional)
		return 0, errProvisional
	case class == stunmsg.ClassSTUN || class == stunmsg.ClassDTLS:
		if c.spend(r, len(b)) {
			if _, err := c.sock.send(&r.hdr, r.relay, b); err != nil {
				return 0, err
			}
			return written, nil
		}
		if class == stunmsg.ClassSTUN {
			c.sock.m.drop(dropAmplification)
			return written, nil
		}
	}
	// Media, or DTLS past the budget: wait for the probe's answer.
	if !c.hold(r, ufrag, b, c.sock.now().UnixNano()) {
		c.sock.m.drop(dropHeldOverflow)
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
// the client's ICE credentials from the offer); only the real owner of the
// address, holding that session's client password, can answer it. The
// proof is the session's, not the address's: an address proven for one
// session (an attacker's own call from it) is unproven for every other,
// which must earn its own answer or second check (TestProofIsPerSession).
//
// Until its proof, what goes toward an address is bounded by what came
// from it, as QUIC bounds a server before address validation (RFC 9000
// section 8): the pod sends an address no more than ampFactor times the
// payload bytes it received from it (the STUN answers, the probes, and the
// DTLS flights of the sessions not proven there, all counted together).
// DTLS starts at once within that budget, so a browser's handshake does
// not wait for the probe's round trip; a flight past it, and all media,
// wait (held, a few datagrams) for the proof.

const (
	// maxHeld bounds the datagrams a session holds toward an address
	// while unproven: some 600 ms of a call's downlink, more than a probe
	// round trip.
	maxHeld = 32
	// heldTTL is how long held datagrams wait for the proof.
	heldTTL = 2e9 // nanoseconds
	// ampFactor bounds what the pod sends an unproven address: at most
	// this many times the payload bytes received from it.
	ampFactor = 3
	// maxProofsPerAddr bounds the sessions one address keeps proof state
	// for (one normally; an agent sharing one socket among calls, a few).
	maxProofsPerAddr = 8
	// maxProbesOut is how many of a session's probes to an address an
	// answer is accepted for: a re-probe does not void the probes before
	// it, whose answers may still be on their way (a round trip longer
	// than reprobeAfter, as on a loaded machine, would otherwise void
	// every answer and the proof would never come).
	maxProbesOut = 8
)

// probeSent is one probe a session sent an address: its transaction ID
// and the client password its answer must be signed with.
type probeSent struct {
	txID [12]byte
	pwd  string
}

// EarlySelectChecks is how many authenticated checks an address must have
// sent before its pair is selected ahead of nomination. One is safe since
// DTLS toward the address is bounded by the anti-amplification budget and
// media waits for the return-routability proof.
const EarlySelectChecks = 1

// reach is the return-routability state of one client address through one
// POP, shared by the route objects that replace each other for it: the
// anti-amplification budget of the address and, per session that used
// it, that session's proof.
type reach struct {
	recv   atomic.Int64          // payload bytes received from the address
	spent  atomic.Int64          // payload bytes sent to it not covered by a proof
	proven atomic.Pointer[proof] // the last proof that succeeded (a lock-free first look)

	mu     sync.Mutex
	proofs []*proof // per session, oldest first, at most maxProofsPerAddr; guarded by mu
}

// proof is one session's return-routability state at one address.
// Guarded by its reach's mu, except ufrag and ok, which are set before it
// is published.
type proof struct {
	ufrag  string                  // the server ufrag of the session's agent
	ok     bool                    // the address answered the session's probe, or sent it a second check
	checks int                     // authenticated checks (distinct transaction IDs) seen
	lastTx [12]byte                // transaction ID of the last one (Confirm)
	sent   bool                    // a probe went out
	sentAt int64                   // unix nanos when the last one went out
	probes [maxProbesOut]probeSent // the last probes sent, any of which a valid answer may answer
	next   int                     // where the next probe is recorded in probes
	held   [][]byte                // DTLS/media waiting for the proof, oldest first
	heldAt int64                   // unix nanos when the oldest was held
	follow Session                 // the probe was started by this session's audio from the address (follow.go)
	// A round-trip measurement (rtt.go): its request, when it went out,
	// the password its answer is signed with, and who takes the figure.
	rttTx  [12]byte
	rttAt  int64
	rttPwd string
	onRTT  func(time.Duration)
}

// isProven reports whether the address is proven for the session of
// ufrag.
func (r *reach) isProven(ufrag string) bool {
	if p := r.proven.Load(); p != nil && p.ufrag == ufrag {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.proofs {
		if p.ufrag == ufrag {
			return p.ok
		}
	}
	return false
}

// proofLocked returns the session's proof state at the address, made if
// need be; nil when the address already keeps maxProofsPerAddr proofs of
// live sessions and all of them are proven. Callers hold r.mu.
func (c *popConn) proofLocked(r *reach, ufrag string) *proof {
	for _, p := range r.proofs {
		if p.ufrag == ufrag {
			return p
		}
	}
	if len(r.proofs) >= maxProofsPerAddr {
		// Make room: the proofs of sessions gone from the POP first, then
		// the oldest unproven one. A proven session is never evicted by
		// others' checks.
		live := r.proofs[:0]
		for _, p := range r.proofs {
			if c.mux.hasUfrag(p.ufrag) {
				live = append(live, p)
			}
		}
		clear(r.proofs[len(live):])
		r.proofs = live
		for i, p := range r.proofs {
			if len(r.proofs) < maxProofsPerAddr {
				break
			}
			if !p.ok {
				r.proofs = append(r.proofs[:i], r.proofs[i+1:]...)
				break
			}
		}
		if len(r.proofs) >= maxProofsPerAddr {
			return nil
		}
	}
	p := &proof{ufrag: ufrag}
	r.proofs = append(r.proofs, p)
	return p
}

// spend takes n bytes of the route's anti-amplification budget: false,
// and nothing taken, when sending them would put what was sent to the
// address without proof above ampFactor times what came from it.
func (c *popConn) spend(r *route, n int) bool {
	for {
		spent := r.reach.spent.Load()
		if spent+int64(n) > ampFactor*r.reach.recv.Load() {
			return false
		}
		if r.reach.spent.CompareAndSwap(spent, spent+int64(n)) {
			c.sock.m.unprovenBytes.Add(float64(n))
			return true
		}
	}
}

// Confirm marks the client's route through a POP as authenticated by Pion
// for the session whose agent's server ufrag is ufrag, and returns how many
// authenticated checks (distinct transaction IDs: a check presented again
// by the follower counts once) that session has seen from the client, 0
// if there is no route. A second distinct check proves the address for the
// session, for clients that do not answer probes.
func (s *Socket) Confirm(pop uint16, client netip.AddrPort, ufrag string, txID [stun.TransactionIDSize]byte) int {
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
	pc.mu.Unlock()
	r.reach.mu.Lock()
	p := pc.proofLocked(r.reach, ufrag)
	if p == nil {
		r.reach.mu.Unlock()
		return 1 // authenticated, never proven: held as any unproven session
	}
	if p.lastTx != txID || p.checks == 0 {
		p.lastTx = txID
		p.checks++
	}
	n := p.checks
	r.reach.mu.Unlock()
	if n >= 2 {
		pc.prove(r, ufrag)
	}
	return n
}

// Probe sends the client at the POP route a Binding Request with its own
// ICE credentials (USERNAME remote:local, MESSAGE-INTEGRITY with the
// client's password), once per session and address. ufrag is the server
// ufrag of the session's agent, which the proof is kept under; username is
// the USERNAME of the client's check ("local:remote", local the server
// ufrag the client used: after an ICE restart, the restarted one); pwd is
// the client's ICE password.
func (s *Socket) Probe(pop uint16, client netip.AddrPort, ufrag, username, pwd string) {
	pc := s.lookup(pop)
	if pc == nil {
		return
	}
	local, remote, ok := cut(username)
	if !ok || pwd == "" {
		return
	}
	r := pc.route(client)
	if r == nil || r.reach.isProven(ufrag) {
		return
	}
	if pc.sendProbe(r, ufrag, remote+":"+local, pwd, -1, nil, s.now().UnixNano()) {
		s.m.reachProbes.Inc()
	}
}

// sendProbe sends the route's client a Binding Request for the session
// whose agent's server ufrag is ufrag, with USERNAME user (client ufrag
// ":" server ufrag), signed with the client's password pwd, and records it
// for answer. It sends nothing when the session's last probe to the
// address went out less than again ago (again < 0: only one), nor past the
// address's anti-amplification budget. follow, when set, is the session
// whose audio from the address asked for the probe: a valid answer
// presents ICE a check for it. It reports whether a probe was sent.
func (c *popConn) sendProbe(r *route, ufrag, user, pwd string, again time.Duration, follow Session, now int64) bool {
	r.reach.mu.Lock()
	p := c.proofLocked(r.reach, ufrag)
	if p == nil || p.ok || p.sent && (again < 0 || now-p.sentAt < int64(again)) {
		r.reach.mu.Unlock()
		return false
	}
	msg, err := newProbe(user, pwd)
	if err != nil {
		r.reach.mu.Unlock()
		return false
	}
	if !c.spend(r, len(msg.Raw)) {
		r.reach.mu.Unlock()
		c.sock.m.drop(dropAmplification)
		return false
	}
	p.sent, p.sentAt = true, now
	p.probes[p.next] = probeSent{msg.TransactionID, pwd}
	p.next = (p.next + 1) % maxProbesOut
	if follow != nil {
		p.follow = follow
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

// answer reports whether payload from client is the answer to a probe of
// the route's; a valid one proves the address for the session that sent
// the probe and releases what that session held. It is consumed either
// way (Pion did not send the probe).
func (c *popConn) answer(client netip.AddrPort, payload []byte) bool {
	if len(payload) < 20 || payload[0] != 0x01 || payload[1] != 0x01 || !stunmsg.IsSTUN(payload) {
		return false // not a Binding Success Response
	}
	r := c.route(client)
	if r == nil {
		return false
	}
	tx := [12]byte(payload[8:20])
	var p *proof
	var pwd string
	r.reach.mu.Lock()
	for _, q := range r.reach.proofs {
		for _, sent := range q.probes {
			if q.sent && sent.txID == tx && sent.pwd != "" {
				p, pwd = q, sent.pwd
			}
		}
		if q.onRTT != nil && q.rttTx == tx {
			p, pwd = q, q.rttPwd
		}
	}
	if p == nil {
		r.reach.mu.Unlock()
		return false
	}
	ufrag, follow := p.ufrag, p.follow
	r.reach.mu.Unlock()
	m := &stun.Message{Raw: append([]byte(nil), payload...)}
	if m.Decode() != nil || stun.NewShortTermIntegrity(pwd).Check(m) != nil {
		return true
	}
	if proven, isRTT := c.measured(r, p, tx); isRTT && proven {
		return true
	}
	c.prove(r, ufrag)
	c.sock.m.reachProven.Inc()
	if follow != nil {
		r.reach.mu.Lock()
		p.follow = nil
		r.reach.mu.Unlock()
		c.presentCheck(follow, client)
	}
	return true
}

// prove marks a route's address as proven for the session of ufrag and
// sends what that session held.
func (c *popConn) prove(r *route, ufrag string) {
	r.reach.mu.Lock()
	p := c.proofLocked(r.reach, ufrag)
	if p == nil || p.ok {
		r.reach.mu.Unlock()
		return
	}
	p.ok = true
	held := p.held
	p.held = nil
	r.reach.proven.Store(p)
	r.reach.mu.Unlock()
	for _, b := range held {
		_, _ = c.sock.send(&r.hdr, r.relay, b)
	}
}

// hold keeps a copy of b, from the session of ufrag, until the route's
// address is proven for it; false when the session holds its share
// already.
func (c *popConn) hold(r *route, ufrag string, b []byte, now int64) bool {
	r.reach.mu.Lock()
	defer r.reach.mu.Unlock()
	p := c.proofLocked(r.reach, ufrag)
	if p != nil && p.ok {
		// Proven since the caller looked (prove has sent what was held).
		_, _ = c.sock.send(&r.hdr, r.relay, b)
		return true
	}
	if p == nil || len(p.held) >= maxHeld {
		return false
	}
	if len(p.held) == 0 {
		p.heldAt = now
	}
	p.held = append(p.held, append([]byte(nil), b...))
	return true
}

// expireHeld drops held datagrams older than heldTTL and returns how many.
func (r *route) expireHeld(now int64) int {
	r.reach.mu.Lock()
	defer r.reach.mu.Unlock()
	n := 0
	for _, p := range r.reach.proofs {
		if len(p.held) > 0 && now-p.heldAt >= heldTTL {
			n += len(p.held)
			p.held = nil
		}
	}
	return n
}
