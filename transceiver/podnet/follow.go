package podnet

// Following a caller to a new address: the Follower presents a deferred
// check again once the old address falls silent, and stray audio from an
// unknown address starts the proof (a probe signed with the client's
// password) that lets the pod present a check for it.

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"
)

// Follower holds a path change an authenticated check asked for too early:
// the check came from a new client address (or through another POP) while
// the selected address had delivered something too recently (less than
// the session layer's silence thresholds, ago). A client whose NAT has
// just rebound sends its next consent check at a random moment of its
// interval (2 s for Pion, about as long for browsers), often within that
// window; waiting for the check after it would cost the call another
// interval of silence.
//
// Pion switches the selected pair of an ICE-lite agent only from the
// binding-request hook, so the follower keeps a copy of the client's last
// such check and, once the selected address has been silent long enough,
// presents it to Pion again through the POP it came from. Pion verifies it
// again (USERNAME, MESSAGE-INTEGRITY) and calls the hook, which judges
// silence afresh: nothing moves that the client did not ask for with the
// session's credentials, and nothing moves while the current address is
// live.
//
// What presents it is an event, not a timer: every datagram the pod
// hands the session from the check's address (a rebound caller's audio,
// 50 a second) asks the follower (nudge, on the socket reader that
// received it), and the first one after the silence is reached presents
// the check. A timer is only the backstop for a client that sends
// nothing but checks: on a loaded machine a timer's goroutine can run
// more than a second late while the caller's audio keeps arriving. A
// presentation whose verdict does not
// come (the check lost on its way to Pion, the queue full) is presented
// again by the next datagram at least presentAgain later. Each stored check
// is presented at most maxFollowRetries times (a late packet from the old
// address, delayed in a queue, can make it look live once more), and is
// dropped once followWindow has passed since it came, so a client that
// keeps two addresses alive costs a few extra STUN answers per check, not
// a loop.
//
// Lock order: mu is held across calls into the socket and the mux (lookup,
// LastSeen, popMux.conn, popConn.inject), so it comes before Socket.mu,
// popMux.mu, popConn.mu and the TCP side's lock, each held only for a map
// access. The readers call nudge (through muxConn.arrived) after every
// such lock is released; TestFollowerLockOrder checks that no function of
// the package calls toward the follower with a lock held.
type Follower struct {
	// Called from the session's ICE hook (Defer, Disarm), its teardown
	// (Stop), the socket's readers (nudge) and the backstop timer.
	mu sync.Mutex
	// Guarded by mu.
	sock      *Socket     // set by Defer
	timer     *time.Timer // the backstop
	d         Deferred    // what is pending, without its Check
	check     []byte      // the stored check (copied; empty when nothing is pending)
	txID      [stun.TransactionIDSize]byte
	conn      *muxConn  // the session conn whose datagrams nudge
	stored    time.Time // when the stored check came
	presented int       // times the stored check has been presented again
	lastAt    time.Time // when it was last presented
	closed    bool
}

// Deferred is a path change for the Follower: the check that asked for
// it, where it came from, and the selected pair's address that must fall
// silent first.
type Deferred struct {
	Check   *stun.Message  // the authenticated check (copied by Defer)
	POP     uint16         // the POP it came through
	From    netip.AddrPort // the client address it came from
	Ufrag   string         // the server ufrag of the session's agent
	OldPOP  uint16         // the selected pair's POP
	Old     netip.AddrPort // and client address
	Silence time.Duration  // how long Old must have been silent
}

const (
	// maxFollowRetries bounds how often one stored check is presented
	// again.
	maxFollowRetries = 3
	// followMargin: the backstop timer judges the old address a little
	// after it would have become silent.
	followMargin = 20 * time.Millisecond
	// presentAgain is how long a presentation waits for its verdict (the
	// hook moves, or defers the same check again) before the next datagram
	// or the backstop presents it again.
	presentAgain = 100 * time.Millisecond
	// injectAgain is how soon the backstop offers a check again when the
	// session's queue could not take it (its ICE reader is behind).
	injectAgain = 20 * time.Millisecond
	// followWindow is how long a stored check is kept: about a consent
	// interval, after which the client's own next check comes.
	followWindow = 2 * time.Second
)

// Defer stores an authenticated check that asked for a path change too
// early, to be presented again through sock once d.Old has been silent for
// d.Silence: at the first datagram from d.From after that, or by a timer.
// The same check deferred again (the hook found the old address live once
// more) keeps its count of presentations.
func (f *Follower) Defer(sock *Socket, d Deferred) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || d.Check == nil {
		return
	}
	now := sock.now()
	if len(f.check) > 0 && f.txID == d.Check.TransactionID && f.d.From == d.From {
		if f.presented >= maxFollowRetries {
			f.disarmLocked()
			return
		}
	} else {
		f.check = append(f.check[:0], d.Check.Raw...)
		f.txID = d.Check.TransactionID
		f.stored, f.presented, f.lastAt = now, 0, time.Time{}
	}
	d.Check = nil // Pion's; the copy is kept
	f.d, f.sock = d, sock
	f.attachLocked()
	f.armLocked(f.untilSilent(now) + followMargin)
}

// attachLocked points the session conn of the check's address at the
// follower, so that its datagrams nudge it.
func (f *Follower) attachLocked() {
	var c *muxConn
	if pc := f.sock.lookup(f.d.POP); pc != nil {
		c = pc.mux.conn(f.d.Ufrag)
	}
	if f.conn != nil && f.conn != c {
		f.conn.follow.CompareAndSwap(f, nil)
	}
	f.conn = c
	if c != nil {
		c.follow.Store(f)
	}
}

// untilSilent is how long until the old address has been silent for the
// threshold (0: it has).
func (f *Follower) untilSilent(now time.Time) time.Duration {
	last, seen := f.sock.LastSeen(f.d.OldPOP, f.d.Old)
	if !seen {
		return 0
	}
	return max(0, f.d.Silence-now.Sub(last))
}

func (f *Follower) armLocked(d time.Duration) {
	if f.timer == nil {
		f.timer = time.AfterFunc(d, f.backstop)
	} else {
		f.timer.Reset(d)
	}
}

// nudge is told of a datagram the pod handed the session from client:
// if the check waiting is from there and the old address has gone silent,
// it is presented now. Called by the socket's readers.
func (f *Follower) nudge(client netip.AddrPort) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || len(f.check) == 0 || client != f.d.From {
		return
	}
	now := f.sock.now()
	if now.Sub(f.stored) >= followWindow || now.Sub(f.lastAt) < presentAgain || f.untilSilent(now) > 0 {
		return
	}
	f.presentLocked(now)
}

// backstop is the timer's: it presents the stored check when the old
// address has gone silent, for a client whose datagrams do not come (it
// sends nothing but checks), and looks again later while it must.
func (f *Follower) backstop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || len(f.check) == 0 {
		return
	}
	now := f.sock.now()
	switch wait := f.untilSilent(now); {
	case now.Sub(f.stored) >= followWindow || f.presented >= maxFollowRetries:
		f.disarmLocked() // the client's own next check takes it from here
	case wait > 0:
		f.armLocked(wait + followMargin)
	case now.Sub(f.lastAt) < presentAgain:
		f.armLocked(presentAgain - now.Sub(f.lastAt))
	case !f.presentLocked(now):
		f.armLocked(injectAgain)
	default:
		f.armLocked(presentAgain)
	}
}

// presentLocked hands the stored check to the session's queue again; false
// when the queue could not take it. Callers hold mu.
func (f *Follower) presentLocked(now time.Time) bool {
	if f.presented >= maxFollowRetries {
		return false
	}
	pc := f.sock.lookup(f.d.POP)
	if pc == nil || !pc.inject(f.check, f.d.From) {
		return false
	}
	f.presented++
	f.lastAt = now
	f.sock.m.followRetries.Inc()
	return true
}

// Disarm forgets a pending change once the session has moved.
func (f *Follower) Disarm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disarmLocked()
}

func (f *Follower) disarmLocked() {
	if f.timer != nil {
		f.timer.Stop()
	}
	if f.conn != nil {
		f.conn.follow.CompareAndSwap(f, nil)
		f.conn = nil
	}
	f.check, f.d, f.presented = f.check[:0], Deferred{}, 0
}

// Stop stops the follower for good (session teardown).
func (f *Follower) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.disarmLocked()
}

// Following a caller's audio. A caller whose NAT rebinds sends its audio
// from the new address at once, its next consent check only up to a
// consent interval later (2 s for Pion, longer for browsers). The global
// relay routes such audio by its SSRC (globalrelay/ssrc.go), so it reaches
// the pod from an address no check has named: Pion would drop it, and the
// call would wait for the check.
//
// Audio proves nothing (the pod cannot read SRTP outside Pion, and an SSRC
// is visible on the path), so it only starts the proof the pod uses for
// every new address: a STUN Binding Request signed with the client's own
// ICE password (route.go). Only the client can answer it from that
// address. Once the answer verifies, the pod has what an authenticated
// check gives it — someone holding the session's credentials is at that
// address — and more, since the address is proven; so it presents Pion
// a check for the address built with the session's own credentials (the
// check the client would send), and Pion and the binding-request hook take
// it from there as for any check: the hook moves the downlink only once the
// selected address has been silent long enough (or defers, Follower).
// Nothing moves on unauthenticated traffic, nothing moves while the
// current address is live.

// strayMediaSilence is how long the selected address must have been silent
// before audio from another address starts a probe: a live path is never
// probed away from, and a stray or replayed packet during a call costs
// nothing.
const strayMediaSilence = 200 * time.Millisecond

// reprobeAfter is how soon a probe that got no answer may be sent again to
// the same address (the probe or its answer was lost).
const reprobeAfter = 250 * time.Millisecond

// stray is told of RTP from a client address no session conn of the POP
// knows (it was dropped): maybe a session's caller behind a rebound NAT,
// found by the routing token its relays routed it by.
func (s *Socket) stray(pc *popConn, token [6]byte, client netip.AddrPort) {
	if s.sessions == nil {
		return
	}
	sess := s.sessions.ByToken(token)
	if sess == nil {
		return
	}
	cur, peer, _ := sess.Path()
	if cur == 0 || (pc.id == cur && client == peer) {
		return
	}
	now := s.now()
	if last, seen := s.LastSeen(cur, peer); seen && now.Sub(last) < strayMediaSilence {
		return
	}
	r := pc.route(client)
	if r == nil {
		return
	}
	server, cl := sess.Creds()
	if r.reach.isProven(server.Ufrag) {
		// Proven for this session before (the client came back to an
		// address it used). Another session's proof at the address
		// counts for nothing here.
		pc.presentCheck(sess, client)
		return
	}
	// The USERNAME of a request to the client (client ufrag ":" server
	// ufrag) and its password: those of the last ICE restart, else of the
	// offer.
	user, pwd := cl.Ufrag+":"+server.Ufrag, cl.Pwd
	if ufrag, rc, ok := s.Restarted(sess); ok {
		user, pwd = rc.Ufrag+":"+ufrag, rc.Pwd
	}
	if pc.sendProbe(r, server.Ufrag, user, pwd, reprobeAfter, sess, now.UnixNano()) {
		s.m.mediaProbes.Inc()
	}
}

// presentCheck hands Pion a Binding Request from client built with the
// session's own credentials, as the client's agent would send it: the
// address has proven that the client is there (its answer to a probe
// signed with the client's password). No USE-CANDIDATE: whether the path
// moves is the binding-request hook's decision alone.
func (c *popConn) presentCheck(sess Session, client netip.AddrPort) {
	server, cl := sess.Creds()
	msg, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(server.Ufrag+":"+cl.Ufrag),
		ice.AttrControlling(tieBreaker()), ice.PriorityAttr(prflxPriority),
		stun.NewShortTermIntegrity(server.Pwd), stun.Fingerprint)
	if err != nil {
		return
	}
	c.offer(msg.Raw, client, time.Now())
}

// offer hands the session a presented check. While the session's queue
// cannot take it (its ICE reader is behind), it is offered again every
// injectAgain within followWindow: the address is routed to the session
// from now on, so its audio draws no more probes, and a check dropped here
// would leave the follow waiting for the client's own next check.
func (c *popConn) offer(b []byte, client netip.AddrPort, since time.Time) {
	if c.inject(b, client) {
		c.sock.m.mediaFollows.Inc()
		return
	}
	select {
	case <-c.closed:
		return
	default:
	}
	if time.Since(since) < followWindow {
		time.AfterFunc(injectAgain, func() { c.offer(b, client, since) })
	}
}

// prflxPriority is the PRIORITY of a presented check: that of a
// peer-reflexive UDP candidate (RFC 8445 5.1.2.1, type preference 110).
const prflxPriority = 110<<24 | 65535<<8 | 255

func tieBreaker() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}
