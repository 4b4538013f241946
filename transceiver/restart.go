package transceiver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/transceiver/podnet"
)

// ICE restart (RFC 8445 section 9, asked for the WHIP way, RFC 9725 section
// 4.4.1): the client sends new ICE credentials in an SDP fragment, the
// server answers with new credentials of its own, and the call goes on —
// same pod, same PeerConnection, same DTLS association, same backend
// session. The new server ufrag is a freshly minted routing token for this
// cluster and pod, so the relays route the client's new checks (from
// whatever address it now has) here with no lookup.
//
// The session's agent keeps its credentials: the packet layer translates
// checks on the new ones to them (podnet.Socket.Restart), so Pion
// authenticates them as usual (onBindingRequest, nomination, address
// following all apply).

// Errors of RestartICE.
var (
	// ErrBadFragment: the SDP fragment carries no valid ICE credentials.
	ErrBadFragment = errors.New("transceiver: bad ICE fragment")
	// ErrPrecondition: If-Match named another state of the session.
	ErrPrecondition = errors.New("transceiver: ICE state does not match If-Match")
)

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
	// The check of If-Match and the new state are one step: of PATCHes
	// racing with the same If-Match exactly one restarts, the others get
	// ErrPrecondition, and the winner's credentials stay current.
	s.restartMu.Lock()
	defer s.restartMu.Unlock()
	curUfrag, cur, restarted := t.sock.Restarted(s)
	if !restarted {
		curUfrag, cur = s.ufrag, s.client // the agent's own
	}
	if ifMatch != "" && ifMatch != "*" && ifMatch != etag(curUfrag) {
		return RestartResult{}, ErrPrecondition
	}
	// The same offer is the same whole credential: a new password under
	// the same ufrag is a restart too (an answerer detects a restart by a
	// change of either, as browsers do).
	if client == cur {
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
	if !t.addRestart(s, ufrag, pwd, client) {
		return RestartResult{}, ErrNotFound // it ended meanwhile
	}
	t.log.Info("ICE restart", "session", s.id)
	return RestartResult{
		Restarted: true,
		Fragment:  "a=ice-lite\r\na=ice-ufrag:" + ufrag + "\r\na=ice-pwd:" + pwd + "\r\n",
		ETag:      etag(ufrag),
	}, nil
}

// addRestart registers an ICE restart's translation and routing token for s,
// unless s has ended: under t.mu, so that it comes either before forget
// (whose cleanup, and teardown's, then remove both) or not at all. A
// restart racing the session's end left both behind for good, each
// holding the dead session.
func (t *Transceiver) addRestart(s *session, ufrag, pwd string, client podnet.Creds) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions[s.id] != s { // forget removes it under t.mu
		return false
	}
	t.sock.Restart(s, ufrag, pwd, client)
	t.indexUfrag(ufrag, s)
	return true
}

// handleRestart serves PATCH SessionsPath/{id}: an ICE restart.
func (t *Transceiver) handleRestart(w http.ResponseWriter, r *http.Request) {
	var req sessionapi.RestartRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, sessionapi.MaxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		t.m.iceRestarts.WithLabelValues(restartBadFrag).Inc()
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_json", "request body is not valid JSON", 0)
		return
	}
	res, err := t.RestartICE(r.PathValue("id"), req.Fragment, req.IfMatch)
	switch {
	case errors.Is(err, ErrNotFound):
		t.m.iceRestarts.WithLabelValues(restartNotFound).Inc()
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
	case errors.Is(err, ErrBadFragment):
		t.m.iceRestarts.WithLabelValues(restartBadFrag).Inc()
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_ice_fragment", err.Error(), 0)
	case errors.Is(err, ErrPrecondition):
		t.m.iceRestarts.WithLabelValues(restartStale).Inc()
		apierr.Write(w, http.StatusPreconditionFailed, apierr.TypeInvalidRequest, "precondition_failed", "If-Match does not match the session's ICE state", 0)
	case err != nil:
		t.m.iceRestarts.WithLabelValues(restartFailed).Inc()
		t.log.Warn("ICE restart failed", "err", err)
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not restart ICE", 0)
	default:
		if res.Restarted {
			t.m.iceRestarts.WithLabelValues(restartOK).Inc()
		}
		writeJSON(w, http.StatusOK, sessionapi.RestartResponse{Restarted: res.Restarted, Fragment: res.Fragment, ETag: res.ETag})
	}
}
