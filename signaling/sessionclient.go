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
			if metacheck.APIAllowed(c, ep) {
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

// createOn posts a create to one cluster's session API within
// ClusterTimeout. It returns the decoded answer of a 201, or the status and
// body of a 400 carrying a JSON error; every other outcome is an error
// (a *badAnswerError when the cluster answered something unusable).
func (s *Server) createOn(ctx context.Context, c geo.Cluster, body []byte) (sessionapi.CreateResponse, int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ClusterTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.sessionAPI(c)+sessionapi.SessionsPath, bytes.NewReader(body))
	if err != nil {
		return sessionapi.CreateResponse{}, 0, nil, fmt.Errorf("cluster %d: build request: %w", c.ID, err)
	}
	req.Header.Set("Content-Type", "application/json")
	sessionapi.Authorize(req, s.cfg.SessionAPISecrets[c.ID])
	resp, err := s.cfg.HTTPClient.Do(req)
	if err != nil {
		return sessionapi.CreateResponse{}, 0, nil, fmt.Errorf("cluster %d: post session: %w", c.ID, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<10))
	if err != nil {
		return sessionapi.CreateResponse{}, 0, nil, fmt.Errorf("cluster %d: read answer: %w", c.ID, err)
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest:
		var e apierr.Body
		if err := json.Unmarshal(data, &e); err != nil {
			return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 400 without a JSON body", c.ID)}
		}
		if !offerCodes[e.Error.Code] {
			// The pod blames its input, but the offer passed our checks:
			// what it refuses is ours (POPs, config), and the next
			// cluster may well take it.
			return sessionapi.CreateResponse{}, resp.StatusCode, nil, &podFaultError{cluster: c.ID, code: e.Error.Code}
		}
		return sessionapi.CreateResponse{}, resp.StatusCode, data, nil
	case resp.StatusCode != http.StatusCreated:
		return sessionapi.CreateResponse{}, resp.StatusCode, nil, nil
	}
	var out sessionapi.CreateResponse
	if err := json.Unmarshal(data, &out); err != nil || out.Answer == "" {
		return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 201 with a bad body (%v)", c.ID, err)}
	}
	// The ID is what a DELETE is routed by: it must name this cluster.
	if id, err := sessionid.Parse(out.ID); err != nil || id.Cluster != c.ID {
		return sessionapi.CreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 201 with session id %q that does not name it", c.ID, out.ID)}
	}
	return out, resp.StatusCode, nil, nil
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
	notFound := func() { sessionNotFound(w) }
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ClusterTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, s.sessionAPI(c)+sessionapi.SessionsPath+"/"+raw, nil)
	if err != nil {
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not build the request", 0)
		return
	}
	sessionapi.Authorize(req, s.cfg.SessionAPISecrets[c.ID])
	resp, err := s.cfg.HTTPClient.Do(req)
	if err != nil {
		s.log.Warn("delete: cluster session API failed", "cluster", c.ID, "err", err)
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_unreachable", "the session's cluster did not answer", 0)
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusNoContent, http.StatusOK:
		w.WriteHeader(http.StatusNoContent)
	case http.StatusNotFound:
		notFound()
	default:
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_error",
			fmt.Sprintf("the session's cluster answered %d", resp.StatusCode), 0)
	}
}
