package transceiver

import (
	"net/netip"
	"sync"
	"time"

	"github.com/pion/stun/v4"
)

// follower holds a path change an authenticated check asked for too early:
// the check came from a new client address (or through another POP) while
// the selected address had delivered something too recently (less than
// addressSwitchSilence, or popSwitchSilence, ago). A client whose NAT has
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
type follower struct {
	mu      sync.Mutex
	timer   *time.Timer // guarded by mu; nil when nothing is pending
	check   []byte      // the stored check (copied), guarded by mu
	txID    [stun.TransactionIDSize]byte
	from    netip.AddrPort // where it came from, guarded by mu
	pop     uint16         // the POP it came through, guarded by mu
	retries int            // times the stored check has been presented again, guarded by mu
	retried bool           // it is being presented again now, guarded by mu
	closed  bool           // guarded by mu
}

// maxFollowRetries bounds how often one stored check is presented again.
const maxFollowRetries = 3

// deferFollow stores an authenticated check that asked for a path change
// too early and arranges for it to be presented again after wait.
func (s *session) deferFollow(msg *stun.Message, pop uint16, from netip.AddrPort, wait time.Duration) {
	f := &s.follow
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
	f.txID, f.from, f.pop, f.retried, f.retries = msg.TransactionID, from, pop, false, 0
	if f.timer == nil {
		f.timer = time.AfterFunc(wait, s.retryFollow)
	} else {
		f.timer.Reset(wait)
	}
}

// retryFollow presents the stored check to Pion again.
func (s *session) retryFollow() {
	f := &s.follow
	f.mu.Lock()
	if f.closed || f.retried || len(f.check) == 0 {
		f.mu.Unlock()
		return
	}
	f.retried = true
	f.retries++
	pc := s.t.sock.lookup(f.pop)
	ok := pc != nil && pc.inject(f.check, f.from)
	f.mu.Unlock()
	if ok {
		s.t.m.path.followRetries.Inc()
	}
}

// clearFollow forgets a pending change once the session has moved.
func (s *session) clearFollow() {
	f := &s.follow
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.timer != nil {
		f.timer.Stop()
	}
	f.check, f.retried, f.retries = f.check[:0], false, 0
}

// stopFollow stops the follower for good (session teardown).
func (s *session) stopFollow() {
	f := &s.follow
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.timer != nil {
		f.timer.Stop()
	}
}

// inject hands Pion's mux reader a datagram as if it had arrived from a
// client through this POP. It reports false when the conn is closed or its
// queue is full.
func (c *popConn) inject(b []byte, from netip.AddrPort) bool {
	select {
	case <-c.closed:
		return false
	default:
	}
	buf := bufPool.Get().(*podBuf)
	n := copy(buf[:], b)
	select {
	case c.in <- datagram{buf: buf, n: n, from: from}:
		return true
	default:
		bufPool.Put(buf)
		return false
	}
}
