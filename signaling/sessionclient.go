package signaling

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/metacheck"
	"github.com/rtcedge/rtcedge/internal/sdpcheck"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// offerCodes are the error codes with which a pod judges the client's
// offer itself; a 400 with any of them is the client's to see.
var offerCodes = map[string]bool{
	sdpcheck.CodeInvalidSDP: true, sdpcheck.CodeNotOffer: true, sdpcheck.CodeNoAudio: true, sdpcheck.CodeNoOpus: true,
	sdpcheck.CodeNoICECreds: true, sdpcheck.CodeNoFingerprint: true, sdpcheck.CodeTooManySection: true,
	sdpcheck.CodeBadFingerprint: true, sdpcheck.CodeNotSecure: true,
}

// podFaultError is a pod refusing a create for a reason other than the
// offer (invalid_pops, invalid_json): a server-side fault.
type podFaultError struct {
	cluster uint16
	code    string
}

func (e *podFaultError) Error() string {
	return fmt.Sprintf("cluster %d refused the create with %q, a fault on our side", e.cluster, e.code)
}

// sessionAPI returns the base URL to reach a cluster's session API: one of
// the live endpoints gossip reports that the catalogue allows (spread over
// them), else the catalogue's address. An endpoint off the cluster's
// session_api host and session_api_nets is never sent an offer, whoever
// advertised it.
func (s *Server) sessionAPI(c geo.Cluster) string {
	if s.cfg.SessionAPIs != nil {
		var eps []string
		for _, ep := range s.cfg.SessionAPIs(c.ID) {
			if metacheck.APIAllowed(c.SessionAPI, c.SessionAPINets, ep) {
				eps = append(eps, ep)
			} else {
				s.m.refusedEndpoints.Inc()
			}
		}
		if len(eps) > 0 {
			return strings.TrimSuffix(eps[int(s.apiTurn.Add(1))%len(eps)], "/")
		}
	}
	return strings.TrimSuffix(c.SessionAPI, "/")
}

// exchange sends method to c's session API at sessionapi.SessionsPath +
// path within ClusterTimeout, body as JSON unless nil, and returns the
// status and at most limit bytes of the answer. Status 0: the cluster did
// not answer (err says why); err with a status: the body broke off.
func (s *Server) exchange(ctx context.Context, c geo.Cluster, method, path string, body []byte, limit int64) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ClusterTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.sessionAPI(c)+sessionapi.SessionsPath+path, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	sessionapi.Authorize(req, s.cfg.SessionAPISecrets[c.ID])
	resp, err := s.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s session: %w", strings.ToLower(method), err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return resp.StatusCode, data, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, data, nil
}

// createOn posts a create to one cluster's session API within
// ClusterTimeout. It returns the decoded answer of a 201, or the status and
// body of a 400 carrying a JSON error; every other outcome is an error
// (a *badAnswerError when the cluster answered something unusable).
func (s *Server) createOn(ctx context.Context, c geo.Cluster, body []byte) (sessionapi.CreateResponse, int, []byte, error) {
	status, data, err := s.exchange(ctx, c, http.MethodPost, "", body, 256<<10)
	if err != nil {
		return sessionapi.CreateResponse{}, 0, nil, fmt.Errorf("cluster %d: %w", c.ID, err)
	}
	switch {
	case status == http.StatusBadRequest:
		var e apierr.Body
		if err := json.Unmarshal(data, &e); err != nil {
			return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 400 without a JSON body", c.ID)}
		}
		if !offerCodes[e.Error.Code] {
			// The pod blames its input, but the offer passed our checks:
			// what it refuses is ours (POPs, config), and the next
			// cluster may well take it.
			return sessionapi.CreateResponse{}, status, nil, &podFaultError{cluster: c.ID, code: e.Error.Code}
		}
		return sessionapi.CreateResponse{}, status, data, nil
	case status != http.StatusCreated:
		return sessionapi.CreateResponse{}, status, nil, nil
	}
	var out sessionapi.CreateResponse
	if err := json.Unmarshal(data, &out); err != nil || out.Answer == "" {
		return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 201 with a bad body (%v)", c.ID, err)}
	}
	// The ID is what a DELETE is routed by: it must name this cluster.
	if id, err := sessionid.Parse(out.ID); err != nil || id.Cluster != c.ID {
		return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 201 with session id %q that does not name it", c.ID, out.ID)}
	}
	return out, status, nil, nil
}

// handleDelete hangs up a call (DELETE of its URL, or POST .../hangup).
// Only the credential that placed the call, or an API key of its tenant,
// may: the call ID carries a MAC binding it to them (callMinter). Any other
// caller, like an unknown call, gets 404.
func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	_, cred, ok := s.precheck(w, r, true)
	if !ok {
		return
	}
	raw, c, ok := s.sessionCluster(w, r, cred)
	if !ok {
		return
	}
	status, _, err := s.exchange(r.Context(), c, http.MethodDelete, "/"+raw, nil, 64<<10)
	switch status {
	case 0:
		s.unreachable(w, "delete", c, err)
	case http.StatusNoContent, http.StatusOK:
		w.WriteHeader(http.StatusNoContent)
	case http.StatusNotFound:
		sessionNotFound(w)
	default:
		clusterAnswered(w, status)
	}
}

// unreachable answers 502 for a session's cluster that did not answer.
func (s *Server) unreachable(w http.ResponseWriter, what string, c geo.Cluster, err error) {
	s.log.Warn(what+": cluster session API failed", "cluster", c.ID, "err", err)
	apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_unreachable", "the session's cluster did not answer", 0)
}

// clusterAnswered answers 502 for a session's cluster that answered an
// unexpected status.
func clusterAnswered(w http.ResponseWriter, status int) {
	apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_error", fmt.Sprintf("the session's cluster answered %d", status), 0)
}
