package transceiver

import (
	"net/netip"
	"sync"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/stunmsg"
)

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

// reach is a route's return-routability state, shared by the route
// objects that replace each other for one client address.
type reach struct {
	mu     sync.Mutex
	sent   bool     // a probe went out
	sentAt int64    // unix nanos when it went out
	txID   [12]byte // its transaction ID
	pwd    string   // the client's ICE password, to check the answer
	held   [][]byte // DTLS/media waiting for the proof, oldest first
	heldAt int64    // unix nanos when the oldest was held
	lastTx [12]byte // transaction ID of the last authenticated check (confirm)
	follow *session // the probe was started by this session's audio from the address (hint.go)
}

// probe sends the client at the POP route a Binding Request with its own
// ICE credentials (USERNAME remote:local, MESSAGE-INTEGRITY with the
// client's password), once per address. username is the USERNAME of the
// client's check ("local:remote"); pwd is the client's ICE password.
func (s *podSocket) probe(pop uint16, client netip.AddrPort, username, pwd string) {
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
// set, is the session whose audio from the address asked for the probe
// (hint.go): a valid answer presents ICE a check for it. It reports
// whether a probe was sent.
func (c *popConn) sendProbe(r *route, user, pwd string, again time.Duration, follow *session, now int64) bool {
	r.reach.mu.Lock()
	if r.reach.sent && (again < 0 || now-r.reach.sentAt < int64(again)) {
		r.reach.mu.Unlock()
		return false
	}
	msg, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(user),
		ice.AttrControlled(tieBreaker()), ice.PriorityAttr(1),
		stun.NewShortTermIntegrity(pwd), stun.Fingerprint)
	if err != nil {
		r.reach.mu.Unlock()
		return false
	}
	r.reach.sent, r.reach.sentAt, r.reach.txID, r.reach.pwd = true, now, msg.TransactionID, pwd
	if follow != nil {
		r.reach.follow = follow
	}
	r.reach.mu.Unlock()
	return c.send(r, msg.Raw) == nil
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
	c.prove(r)
	c.sock.m.reachProven.Inc()
	if follow != nil {
		r.reach.mu.Lock()
		r.reach.follow = nil
		r.reach.mu.Unlock()
		follow.presentCheck(c, client)
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
		_ = c.send(r, b)
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
