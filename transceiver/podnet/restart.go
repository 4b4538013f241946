package podnet

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/stunmsg"
)

// The packet side of an ICE restart (the session layer's RestartICE). Pion
// would restart a session's agent with the static credentials it was set
// up with (it offers no way to give an agent new local credentials), which
// would reuse the old routing token. So the agent is left alone and the
// pod translates: a check that arrives with the new credentials — USERNAME
// "newServerUfrag:newClientUfrag", signed with the new server password — is
// verified here and rewritten to the credentials the agent knows before
// Pion sees it; Pion then authenticates it as usual, and its answer is
// signed again with the new password on the way out. Only checks are
// translated: a lite server sends no requests of its own. DTLS and SRTP,
// which do not depend on ICE credentials, flow on untouched.

// Restart registers an ICE restart of sess: checks naming the new server
// ufrag and client's ufrag, signed with the new server pwd, reach the
// session's agent as checks on the credentials it was set up with
// (Session.Creds); probes to a new client address use client's password.
// It replaces an earlier restart's.
func (s *Socket) Restart(sess Session, ufrag, pwd string, client Creds) {
	server, orig := sess.Creds()
	a := &iceAlias{session: sess, serverPwd: pwd, client: client, origPwd: server.Pwd, username: server.Ufrag + ":" + orig.Ufrag}
	a.at.Store(s.now().UnixNano())
	s.restarts.set(ufrag, a)
}

// Restarted returns the server ufrag and client credentials of the
// session's latest ICE restart; ok is false if it has none.
func (s *Socket) Restarted(sess Session) (ufrag string, client Creds, ok bool) {
	a, ufrag := s.restarts.current(sess)
	if a == nil {
		return "", Creds{}, false
	}
	return ufrag, a.client, true
}

// Forget drops the restart translation of an ended session.
func (s *Socket) Forget(sess Session) { s.restarts.forget(sess) }

// iceAlias maps a session's current (restarted) credentials to the ones its
// ICE agent was created with.
type iceAlias struct {
	session   Session
	serverPwd string       // the new server password: new checks are signed with it
	client    Creds        // the new client credentials (the password for probes to a new address)
	origPwd   string       // the agent's own server password
	username  string       // the agent's server ufrag ":" the client ufrag it knows, what Pion expects
	at        atomic.Int64 // unix nanos of the restart, until the first check on it
}

// restartTable holds the translations of restarted sessions. Lookups on
// the packet path happen only for STUN, and not at all while no session of
// the pod has restarted.
type restartTable struct {
	m         *Metrics
	mu        sync.RWMutex
	byUfrag   map[string]*iceAlias                  // new server ufrag -> alias; guarded by mu
	bySession map[Session]string                    // session -> its current new server ufrag; guarded by mu
	pending   map[[stun.TransactionIDSize]byte]pend // checks translated, awaiting Pion's answer; guarded by mu
	active    atomic.Int32                          // len(byUfrag)
	waiting   atomic.Int32                          // len(pending)
}

// pend is a translated check whose response must be signed again.
type pend struct {
	pwd  string
	when int64 // unix nanoseconds
}

// maxPending bounds the translated checks awaiting an answer; Pion answers
// within microseconds, so only a flood of checks fills it (and then a
// response goes out with the old signature, and the client retries).
const maxPending = 4096

// pendingTTL is how long a translated check waits for its answer.
const pendingTTL = 5 * time.Second

func (rt *restartTable) init(m *Metrics) {
	rt.m, rt.byUfrag, rt.bySession, rt.pending = m, map[string]*iceAlias{}, map[Session]string{}, map[[stun.TransactionIDSize]byte]pend{}
}

// set makes ufrag the session's current server ufrag, replacing an earlier
// restart's.
func (rt *restartTable) set(ufrag string, a *iceAlias) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if prev, ok := rt.bySession[a.session]; ok {
		delete(rt.byUfrag, prev)
	}
	rt.byUfrag[ufrag] = a
	rt.bySession[a.session] = ufrag
	rt.active.Store(int32(len(rt.byUfrag)))
}

// current returns the session's current alias and server ufrag, if it has
// restarted.
func (rt *restartTable) current(s Session) (*iceAlias, string) {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	u, ok := rt.bySession[s]
	if !ok {
		return nil, ""
	}
	return rt.byUfrag[u], u
}

// forget drops a session's translation (it ended).
func (rt *restartTable) forget(s Session) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if u, ok := rt.bySession[s]; ok {
		delete(rt.byUfrag, u)
		delete(rt.bySession, s)
		rt.active.Store(int32(len(rt.byUfrag)))
	}
}

// sweep forgets translated checks that were never answered.
func (rt *restartTable) sweep(now time.Time) {
	if rt.waiting.Load() == 0 {
		return
	}
	cutoff := now.Add(-pendingTTL).UnixNano()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for id, p := range rt.pending {
		if p.when < cutoff {
			delete(rt.pending, id)
		}
	}
	rt.waiting.Store(int32(len(rt.pending)))
}

// rewriteIn translates a check carrying a restarted session's credentials
// in place: b[:n] is the datagram, b has room up to len(b). It returns the
// new length, or n when the datagram is not such a check (it then reaches
// Pion unchanged, which judges it as any other). A check that names new
// credentials but fails their integrity check is returned unchanged too:
// Pion drops it for its unknown USERNAME.
func (rt *restartTable) rewriteIn(b []byte, n int, now time.Time) int {
	if rt == nil || rt.active.Load() == 0 || !stunmsg.IsBindingRequest(b[:n]) {
		return n
	}
	user, err := stunmsg.Username(b[:n])
	if err != nil {
		return n
	}
	su, err := stunmsg.ServerUfrag(user)
	if err != nil {
		return n
	}
	rt.mu.RLock()
	a := rt.byUfrag[string(su)]
	rt.mu.RUnlock()
	if a == nil || string(user[len(su)+1:]) != a.client.Ufrag {
		return n
	}
	in := &stun.Message{Raw: append([]byte(nil), b[:n]...)}
	if in.Decode() != nil || stun.NewShortTermIntegrity(a.serverPwd).Check(in) != nil {
		return n
	}
	out, err := resign(in, a.origPwd, func(m *stun.Message) error { return stun.NewUsername(a.username).AddTo(m) })
	if err != nil || len(out) > len(b) {
		return n
	}
	rt.mu.Lock()
	if len(rt.pending) < maxPending {
		rt.pending[in.TransactionID] = pend{pwd: a.serverPwd, when: now.UnixNano()}
		rt.waiting.Store(int32(len(rt.pending)))
	}
	rt.mu.Unlock()
	if at := a.at.Swap(0); at != 0 {
		rt.m.ObserveGap(causeICERestart, now.Sub(time.Unix(0, at)))
	}
	return copy(b, out)
}

// rewriteOut signs Pion's answer to a translated check with the restarted
// password. It returns b itself when there is nothing to do.
func (rt *restartTable) rewriteOut(b []byte) []byte {
	if rt == nil || rt.waiting.Load() == 0 || !stunmsg.IsSTUN(b) {
		return b
	}
	var id [stun.TransactionIDSize]byte
	copy(id[:], b[8:20])
	rt.mu.Lock()
	p, ok := rt.pending[id]
	if ok {
		delete(rt.pending, id)
		rt.waiting.Store(int32(len(rt.pending)))
	}
	rt.mu.Unlock()
	if !ok {
		return b
	}
	in := &stun.Message{Raw: append([]byte(nil), b...)}
	if in.Decode() != nil {
		return b
	}
	out, err := resign(in, p.pwd, nil)
	if err != nil {
		return b
	}
	return out
}

// resign rebuilds a STUN message without its USERNAME, MESSAGE-INTEGRITY
// and FINGERPRINT, lets extra add attributes, and signs it with pwd.
func resign(in *stun.Message, pwd string, extra func(*stun.Message) error) ([]byte, error) {
	out := stun.New()
	out.Type = in.Type
	out.TransactionID = in.TransactionID
	out.WriteHeader()
	for _, at := range in.Attributes {
		switch at.Type {
		case stun.AttrUsername, stun.AttrMessageIntegrity, stun.AttrFingerprint:
			continue
		}
		out.Add(at.Type, at.Value)
	}
	if extra != nil {
		if err := extra(out); err != nil {
			return nil, err
		}
	}
	if err := stun.NewShortTermIntegrity(pwd).AddTo(out); err != nil {
		return nil, err
	}
	if err := stun.Fingerprint.AddTo(out); err != nil {
		return nil, err
	}
	return out.Raw, nil
}
