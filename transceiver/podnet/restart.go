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
// The session's previous restart stays translated too (a client whose
// PATCH lost a race, or whose answer is still on its way, keeps working);
// older ones are dropped, so a session holds at most two.
func (s *Socket) Restart(sess Session, ufrag, pwd string, client Creds) {
	server, orig := sess.Creds()
	a := &iceAlias{session: sess, ufrag: ufrag, serverPwd: pwd, client: client, origPwd: server.Pwd, username: server.Ufrag + ":" + orig.Ufrag}
	a.at.Store(s.now().UnixNano())
	s.restarts.set(ufrag, a)
}

// Restarted returns the server ufrag and client credentials of the
// session's latest ICE restart; ok is false if it has none.
func (s *Socket) Restarted(sess Session) (ufrag string, client Creds, ok bool) {
	a := s.restarts.current(sess)
	if a == nil {
		return "", Creds{}, false
	}
	return a.ufrag, a.client, true
}

// Translated returns the credentials a check the pod translated (by its
// transaction ID) really carried: its USERNAME (server ufrag ":" client
// ufrag, as the client sent it) and the client's password of that
// restart. Pion sees the agent's own credentials in it, so a probe the
// binding-request hook sends in answer must be built from these: the
// restarted client knows no others. ok is false for a check that was not
// translated.
func (s *Socket) Translated(txID [stun.TransactionIDSize]byte) (username, clientPwd string, ok bool) {
	s.restarts.mu.RLock()
	defer s.restarts.mu.RUnlock()
	p := s.restarts.pending[txID]
	if p == nil {
		return "", "", false
	}
	return p.alias.ufrag + ":" + p.alias.client.Ufrag, p.alias.client.Pwd, true
}

// Forget drops the restart translation of an ended session.
func (s *Socket) Forget(sess Session) { s.restarts.forget(sess) }

// iceAlias maps one of a session's restarted credentials to the ones its
// ICE agent was created with. Immutable but for at.
type iceAlias struct {
	// Static after the restart made it.
	session   Session
	ufrag     string // the new server ufrag
	serverPwd string // the new server password: new checks are signed with it
	client    Creds  // the new client credentials (the password for probes to a new address)
	origPwd   string // the agent's own server password
	username  string // the agent's server ufrag ":" the client ufrag it knows, what Pion expects
	// Cleared by the reader that translates the first check on it.
	at atomic.Int64 // unix nanos of the restart, until the first check on it
}

// restartTable holds the translations of restarted sessions. Lookups on
// the packet path happen only for STUN, and not at all while no session of
// the pod has restarted. All its state is per session and bounded per
// session: at most maxAliases credentials and maxTranslatedPerSession
// translated checks each, so no session can crowd out another's restart.
type restartTable struct {
	m         *Metrics
	mu        sync.RWMutex
	byUfrag   map[string]*iceAlias                   // new server ufrag -> alias; guarded by mu
	bySession map[Session]*sessionRestarts           // guarded by mu
	pending   map[[stun.TransactionIDSize]byte]*pend // translated checks, by transaction; guarded by mu
	active    atomic.Int32                           // len(byUfrag)
	waiting   atomic.Int32                           // translated checks not answered yet
}

// sessionRestarts is one session's part of the table.
type sessionRestarts struct {
	ufrags [maxAliases]string                                    // its restarted server ufrags, latest first ("" none)
	recent [maxTranslatedPerSession][stun.TransactionIDSize]byte // its latest translated checks, a ring
	next   int                                                   // the ring's oldest slot
}

// pend is a translated check: its answer must be signed again, and the
// binding-request hook asks which credentials it carried (Translated).
type pend struct {
	alias    *iceAlias
	when     int64 // unix nanoseconds
	answered bool
}

const (
	// maxAliases is how many restarted credentials a session holds: its
	// current and its previous ones.
	maxAliases = 2
	// maxTranslatedPerSession bounds a session's translated checks held
	// (answered ones too, for Translated). Pion answers within
	// microseconds; a client that keeps more checks unanswered (a flood)
	// overwrites only its own oldest, whose answer then leaves with the
	// old signature and is retried.
	maxTranslatedPerSession = 16
)

// pendingTTL is how long a translated check is remembered.
const pendingTTL = 5 * time.Second

func (rt *restartTable) init(m *Metrics) {
	rt.m, rt.byUfrag, rt.bySession, rt.pending = m, map[string]*iceAlias{}, map[Session]*sessionRestarts{}, map[[stun.TransactionIDSize]byte]*pend{}
}

// set makes a the session's current restart; the one before stays as its
// previous, any older one is dropped.
func (rt *restartTable) set(ufrag string, a *iceAlias) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	sr := rt.bySession[a.session]
	if sr == nil {
		sr = &sessionRestarts{}
		rt.bySession[a.session] = sr
	}
	if old := sr.ufrags[maxAliases-1]; old != "" {
		delete(rt.byUfrag, old)
	}
	copy(sr.ufrags[1:], sr.ufrags[:maxAliases-1])
	sr.ufrags[0] = ufrag
	rt.byUfrag[ufrag] = a
	rt.active.Store(int32(len(rt.byUfrag)))
}

// current returns the session's latest restart, nil if it has none.
func (rt *restartTable) current(s Session) *iceAlias {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	if sr := rt.bySession[s]; sr != nil {
		return rt.byUfrag[sr.ufrags[0]]
	}
	return nil
}

// forget drops a session's translations and its translated checks (it
// ended).
func (rt *restartTable) forget(s Session) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	sr := rt.bySession[s]
	if sr == nil {
		return
	}
	for _, u := range sr.ufrags {
		delete(rt.byUfrag, u)
	}
	for _, id := range sr.recent {
		rt.dropLocked(id, s)
	}
	delete(rt.bySession, s)
	rt.active.Store(int32(len(rt.byUfrag)))
}

// dropLocked forgets the translated check id if it is s's.
func (rt *restartTable) dropLocked(id [stun.TransactionIDSize]byte, s Session) {
	if p := rt.pending[id]; p != nil && p.alias.session == s {
		delete(rt.pending, id)
		if !p.answered {
			rt.waiting.Add(-1)
		}
	}
}

// noteLocked records a translated check of a's session, in place of the
// session's oldest when it holds its share.
func (rt *restartTable) noteLocked(id [stun.TransactionIDSize]byte, a *iceAlias, now int64) {
	if p := rt.pending[id]; p != nil { // a retransmission
		if p.answered {
			rt.waiting.Add(1)
		}
		*p = pend{alias: a, when: now}
		return
	}
	sr := rt.bySession[a.session]
	if sr == nil {
		return // forgotten meanwhile
	}
	rt.dropLocked(sr.recent[sr.next], a.session)
	sr.recent[sr.next] = id
	sr.next = (sr.next + 1) % maxTranslatedPerSession
	rt.pending[id] = &pend{alias: a, when: now}
	rt.waiting.Add(1)
}

// sweep forgets translated checks older than pendingTTL.
func (rt *restartTable) sweep(now time.Time) {
	if rt.active.Load() == 0 { // forget dropped every check with its session
		return
	}
	cutoff := now.Add(-pendingTTL).UnixNano()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for id, p := range rt.pending {
		if p.when < cutoff {
			rt.dropLocked(id, p.alias.session)
		}
	}
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
	rt.noteLocked(in.TransactionID, a, now.UnixNano())
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
	var pwd string
	if p := rt.pending[id]; p != nil && !p.answered {
		p.answered, pwd = true, p.alias.serverPwd
		rt.waiting.Add(-1)
	}
	rt.mu.Unlock()
	if pwd == "" {
		return b
	}
	in := &stun.Message{Raw: append([]byte(nil), b...)}
	if in.Decode() != nil {
		return b
	}
	out, err := resign(in, pwd, nil)
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
