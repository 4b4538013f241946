package transceiver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/stun/v4"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/token"
)

// ICE restart (RFC 8445 section 9, asked for the WHIP way, RFC 9725 section
// 4.4.1): the client sends new ICE credentials in an SDP fragment, the
// server answers with new credentials of its own, and the call goes on —
// same pod, same PeerConnection, same DTLS association, same backend
// session. The new server ufrag is a freshly minted routing token for this
// cluster and pod, so the relays route the client's new checks (from
// whatever address it now has) here with no lookup.
//
// Pion would restart its ICE agent with the static credentials of the
// session's SettingEngine (it offers no way to give an agent new local
// credentials), which would reuse the old routing token. So the agent is
// left alone: the pod translates instead. A check that arrives with the
// new credentials — USERNAME "newServerUfrag:newClientUfrag", signed with
// the new server password — is verified here and rewritten to the
// credentials the agent knows before Pion sees it; Pion then authenticates
// it as usual (onBindingRequest, nomination, address following all apply),
// and its answer is signed again with the new password on the way out.
// Only checks are translated: a lite server sends no requests of its own,
// so the client's new password is never needed. DTLS and SRTP, which do not
// depend on ICE credentials, flow on untouched.

// Errors of RestartICE.
var (
	// ErrBadFragment: the SDP fragment carries no valid ICE credentials.
	ErrBadFragment = errors.New("transceiver: bad ICE fragment")
	// ErrPrecondition: If-Match named another state of the session.
	ErrPrecondition = errors.New("transceiver: ICE state does not match If-Match")
)

// iceCreds are the credentials of one side of an ICE session.
type iceCreds struct{ ufrag, pwd string }

// iceAlias maps a session's current (restarted) credentials to the ones its
// ICE agent was created with.
type iceAlias struct {
	session    *session
	serverPwd  string   // the new server password: new checks are signed with it
	client     string   // the new client ufrag
	clientPwd  string   // the new client password (probes to a new address, hint.go)
	orig       iceCreds // the agent's own server credentials
	origClient string   // the client ufrag the agent knows
	username   string   // orig.ufrag + ":" + origClient, what Pion expects
}

// restartTable holds the translations of restarted sessions. Lookups on
// the packet path happen only for STUN, and not at all while no session of
// the pod has restarted.
type restartTable struct {
	mu        sync.RWMutex
	byUfrag   map[string]*iceAlias                  // new server ufrag -> alias; guarded by mu
	bySession map[*session]string                   // session -> its current new server ufrag; guarded by mu
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

func newRestartTable() *restartTable {
	return &restartTable{byUfrag: map[string]*iceAlias{}, bySession: map[*session]string{}, pending: map[[stun.TransactionIDSize]byte]pend{}}
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
func (rt *restartTable) current(s *session) (*iceAlias, string) {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	u, ok := rt.bySession[s]
	if !ok {
		return nil, ""
	}
	return rt.byUfrag[u], u
}

// forget drops a session's translation (it ended).
func (rt *restartTable) forget(s *session) {
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
	if a == nil || string(user[len(su)+1:]) != a.client {
		return n
	}
	in := &stun.Message{Raw: append([]byte(nil), b[:n]...)}
	if in.Decode() != nil || stun.NewShortTermIntegrity(a.serverPwd).Check(in) != nil {
		return n
	}
	out, err := resign(in, a.orig.pwd, func(m *stun.Message) error { return stun.NewUsername(a.username).AddTo(m) })
	if err != nil || len(out) > len(b) {
		return n
	}
	rt.mu.Lock()
	if len(rt.pending) < maxPending {
		rt.pending[in.TransactionID] = pend{pwd: a.serverPwd, when: now.UnixNano()}
		rt.waiting.Store(int32(len(rt.pending)))
	}
	rt.mu.Unlock()
	a.session.noteRestartCheck(now)
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

// iceFragment reads the ICE credentials of an SDP (or SDP fragment): the
// first ice-ufrag and ice-pwd, wherever they appear.
func iceFragment(sdp string) (iceCreds, error) {
	var c iceCreds
	for line := range strings.Lines(sdp) {
		line = strings.TrimRight(line, "\r\n")
		if v, ok := strings.CutPrefix(line, "a=ice-ufrag:"); ok && c.ufrag == "" {
			c.ufrag = v
		} else if v, ok := strings.CutPrefix(line, "a=ice-pwd:"); ok && c.pwd == "" {
			c.pwd = v
		}
	}
	// RFC 8839: ufrag 4..256 and pwd 22..256 ice-chars.
	switch {
	case len(c.ufrag) < 4 || len(c.ufrag) > 256 || !iceChars(c.ufrag):
		return c, fmt.Errorf("%w: missing or invalid a=ice-ufrag", ErrBadFragment)
	case len(c.pwd) < 22 || len(c.pwd) > 256 || !iceChars(c.pwd):
		return c, fmt.Errorf("%w: missing or invalid a=ice-pwd", ErrBadFragment)
	}
	return c, nil
}

func iceChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}

// etag is the entity tag of a session's ICE state: its current server
// ufrag, quoted.
func etag(ufrag string) string { return `"` + ufrag + `"` }

// RestartResult is the outcome of RestartICE.
type RestartResult struct {
	// Restarted is false when the fragment carried the credentials already
	// in use (a trickle of candidates, which a lite server does not need).
	Restarted bool
	// Fragment is the server's answer (application/trickle-ice-sdpfrag):
	// a=ice-lite and the new credentials.
	Fragment string
	ETag     string // the session's new entity tag
}

// RestartICE restarts ICE of a session with the client credentials in frag
// (an SDP fragment or a whole offer). ifMatch is the request's If-Match
// ("" or "*" match any state). It fails with ErrNotFound, ErrBadFragment or
// ErrPrecondition.
func (t *Transceiver) RestartICE(id, frag, ifMatch string) (RestartResult, error) {
	t.mu.Lock()
	s := t.sessions[id]
	t.mu.Unlock()
	if s == nil {
		return RestartResult{}, ErrNotFound
	}
	client, err := iceFragment(frag)
	if err != nil {
		return RestartResult{}, err
	}
	// The agent's own credentials, those it was set up with.
	orig, origClient := iceCreds{s.ufrag, s.pwd}, s.client
	cur, curUfrag := t.restarts.current(s)
	curClient := origClient.ufrag
	if cur != nil {
		curClient = cur.client
	} else {
		curUfrag = orig.ufrag
	}
	if ifMatch != "" && ifMatch != "*" && ifMatch != etag(curUfrag) {
		return RestartResult{}, ErrPrecondition
	}
	if client.ufrag == curClient {
		return RestartResult{ETag: etag(curUfrag)}, nil
	}
	ufrag, err := t.cfg.Keys.Mint(t.cfg.Cluster, t.cfg.Pod)
	if err != nil {
		return RestartResult{}, fmt.Errorf("mint ufrag: %w", err)
	}
	pwd, err := token.NewPassword()
	if err != nil {
		return RestartResult{}, fmt.Errorf("ice password: %w", err)
	}
	if !t.addRestart(s, ufrag, &iceAlias{
		session: s, serverPwd: pwd, client: client.ufrag, clientPwd: client.pwd, orig: orig, origClient: origClient.ufrag,
		username: orig.ufrag + ":" + origClient.ufrag,
	}) {
		return RestartResult{}, ErrNotFound // it ended meanwhile
	}
	s.restartedAt.Store(t.cfg.Now().UnixNano())
	t.log.Info("ICE restart", "session", s.id)
	return RestartResult{
		Restarted: true,
		Fragment:  "a=ice-lite\r\na=ice-ufrag:" + ufrag + "\r\na=ice-pwd:" + pwd + "\r\n",
		ETag:      etag(ufrag),
	}, nil
}

// addRestart registers an ICE restart's alias and routing token for s,
// unless s has ended: under t.mu, so that it comes either before forget
// (whose cleanup, and teardown's, then remove both) or not at all. A
// restart racing the session's end left both behind for good, each
// holding the dead session.
func (t *Transceiver) addRestart(s *session, ufrag string, a *iceAlias) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions[s.id] != s { // forget removes it under t.mu
		return false
	}
	t.restarts.set(ufrag, a)
	t.indexUfrag(ufrag, s)
	return true
}

// noteRestartCheck records the first authenticated check after an ICE
// restart: the gap the restart cost, seen from the pod.
func (s *session) noteRestartCheck(now time.Time) {
	if at := s.restartedAt.Swap(0); at != 0 {
		s.t.m.path.observeGap(causeICERestart, now.Sub(time.Unix(0, at)))
	}
}

// handleRestart serves PATCH SessionsPath/{id}: an ICE restart.
func (t *Transceiver) handleRestart(w http.ResponseWriter, r *http.Request) {
	var req sessionapi.RestartRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, sessionapi.MaxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		t.m.path.iceRestarts.WithLabelValues(restartBadFrag).Inc()
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_json", "request body is not valid JSON", 0)
		return
	}
	res, err := t.RestartICE(r.PathValue("id"), req.Fragment, req.IfMatch)
	switch {
	case errors.Is(err, ErrNotFound):
		t.m.path.iceRestarts.WithLabelValues(restartNotFound).Inc()
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
	case errors.Is(err, ErrBadFragment):
		t.m.path.iceRestarts.WithLabelValues(restartBadFrag).Inc()
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_ice_fragment", err.Error(), 0)
	case errors.Is(err, ErrPrecondition):
		t.m.path.iceRestarts.WithLabelValues(restartStale).Inc()
		apierr.Write(w, http.StatusPreconditionFailed, apierr.TypeInvalidRequest, "precondition_failed", "If-Match does not match the session's ICE state", 0)
	case err != nil:
		t.m.path.iceRestarts.WithLabelValues(restartFailed).Inc()
		t.log.Warn("ICE restart failed", "err", err)
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not restart ICE", 0)
	default:
		if res.Restarted {
			t.m.path.iceRestarts.WithLabelValues(restartOK).Inc()
		}
		writeJSON(w, http.StatusOK, sessionapi.RestartResponse{Restarted: res.Restarted, Fragment: res.Fragment, ETag: res.ETag})
	}
}
