package podnet

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
// live. Each stored check is presented at most maxFollowRetries times (a
// late packet from the old address, delayed in a queue, can make it look
// live once more), so a client that keeps two addresses alive costs a few
// extra STUN answers per check, not a loop.
type Follower struct {
	sock    *Socket // set by Defer, guarded by mu
	mu      sync.Mutex
	timer   *time.Timer // guarded by mu; nil when nothing is pending
	check   []byte      // the stored check (copied), guarded by mu
	txID    [stun.TransactionIDSize]byte
	from    netip.AddrPort // where it came from, guarded by mu
	pop     uint16         // the POP it came through, guarded by mu
	stored  time.Time      // when the stored check came, guarded by mu
	retries int            // times the stored check has been presented again, guarded by mu
	retried bool           // it is being presented again now, guarded by mu
	closed  bool           // guarded by mu
}

// maxFollowRetries bounds how often one stored check is presented again.
const maxFollowRetries = 3

// injectAgain is how soon a stored check is offered again when the
// session's queue could not take it (its ICE reader is behind, as on a
// loaded machine), and followWindow how long that goes on: about a consent
// interval, after which the client's own next check comes. Without it a
// check the queue refused was never presented, and the follow waited for
// that next check.
const (
	injectAgain  = 20 * time.Millisecond
	followWindow = 2 * time.Second
)

// Defer stores an authenticated check that asked for a path change too
// early and arranges for it to be presented again through sock after wait.
func (f *Follower) Defer(sock *Socket, msg *stun.Message, pop uint16, from netip.AddrPort, wait time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || msg == nil {
		return
	}
	if f.retried && f.txID == msg.TransactionID && f.from == from {
		// The stored check came back and the old address still looked
		// live: look once more, a bounded number of times.
		if f.retries >= maxFollowRetries {
			return
		}
		f.retried = false
		f.timer.Reset(wait)
		return
	}
	f.check = append(f.check[:0], msg.Raw...)
	f.txID, f.from, f.pop, f.retried, f.retries, f.sock, f.stored = msg.TransactionID, from, pop, false, 0, sock, time.Now()
	if f.timer == nil {
		f.timer = time.AfterFunc(wait, f.retry)
	} else {
		f.timer.Reset(wait)
	}
}

// retry presents the stored check to Pion again.
func (f *Follower) retry() {
	f.mu.Lock()
	if f.closed || f.retried || len(f.check) == 0 {
		f.mu.Unlock()
		return
	}
	sock := f.sock
	pc := sock.lookup(f.pop)
	if pc == nil || !pc.inject(f.check, f.from) {
		// Not presented: offer it again shortly, within followWindow.
		if time.Since(f.stored) < followWindow {
			f.timer.Reset(injectAgain)
		}
		f.mu.Unlock()
		return
	}
	f.retried = true
	f.retries++
	f.mu.Unlock()
	sock.m.followRetries.Inc()
}

// Disarm forgets a pending change once the session has moved.
func (f *Follower) Disarm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.timer != nil {
		f.timer.Stop()
	}
	f.check, f.retried, f.retries = f.check[:0], false, 0
}

// Stop stops the follower for good (session teardown).
func (f *Follower) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.timer != nil {
		f.timer.Stop()
	}
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
// selected address has been silent long enough (or defers, Follower). Nothing moves on unauthenticated traffic, nothing moves while
// the current address is live.

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
