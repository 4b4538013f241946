package signaling

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sdpcheck"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/placement"
)

// call is an offer to place.
type call struct {
	loc   geo.Location
	cred  credential
	offer string
	// session is the client's session field (multipart /calls only).
	session json.RawMessage
	// location prefixes the call's public ID in the Location header.
	location string
}

// effectiveSession is the session config the backend gets: a client
// secret's server-chosen config with the client's permitted additions; an
// API key's or an anonymous caller's own.
func (s *Server) effectiveSession(c call) (json.RawMessage, error) {
	if c.cred.kind == credSecret {
		return mergeSession(c.cred.secret.session, c.session, s.callerPolicy(c.cred))
	}
	return canonicalSession(c.session)
}

// newPlacer builds the Server's share of the shared placement: its
// session API client and the placer that uses it with signaling's
// steering and metrics.
func (s *Server) newPlacer() error {
	s.clusters = &placement.Clusters{HTTPClient: s.cfg.HTTPClient, Timeout: s.cfg.ClusterTimeout,
		Secrets: s.cfg.SessionAPISecrets, Endpoints: s.cfg.SessionAPIs, Refused: s.m.refusedEndpoints}
	var err error
	s.placer, err = placement.New(placement.Config{
		Catalogue: s.cfg.CatalogueData, Health: s.cfg.Health, POPUp: s.cfg.POPUp, POPs: s.choosePOPs,
		Clusters: s.clusters, MaxAttempts: s.cfg.MaxAttempts, Logger: s.log, Now: s.cfg.Now,
		Metrics: placement.Metrics{Attempts: s.m.attempts, AttemptSeconds: s.m.attemptSeconds, Located: s.m.located, NoCapacity: s.m.noCapacity},
	})
	return err
}

// placeCall validates the offer, has the shared placement choose where
// the call goes and ask the clusters nearest first, and answers the client
// with the result. Nothing is allocated anywhere for an offer that fails
// validation.
func (s *Server) placeCall(w http.ResponseWriter, r *http.Request, c call) {
	session, err := s.effectiveSession(c)
	if err != nil {
		param := "session"
		var fe *sessionFieldError
		if errors.As(err, &fe) {
			param = "session." + fe.Field
		}
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_session", err.Error(), param)
		return
	}
	if err := sdpcheck.Offer(c.offer); err != nil {
		code := sdpcheck.CodeOf(err)
		if code == "" {
			code = sdpcheck.CodeInvalidSDP
		}
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, code, err.Error(), 0)
		return
	}
	policy := s.callerPolicy(c.cred)
	res, err := s.placer.Place(r.Context(), placement.Request{Loc: c.loc, What: "offer",
		Create: sessionapi.CreateRequest{Offer: c.offer, Config: session, Caller: &policy}})
	if err != nil {
		s.placeFailed(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/sdp")
	h.Set("Location", c.location+s.calls.publicID(res.Session.ID, c.cred))
	h.Set(HeaderRegion, res.Region)
	h.Set(HeaderCluster, strconv.Itoa(int(res.Cluster.ID)))
	h.Set(HeaderPOP, res.POPs[0].Name)
	h.Set(HeaderSteering, res.Reason)
	s.steer.choices.WithLabelValues(res.Reason).Inc()
	if len(res.POPs) > 1 {
		h.Set(HeaderBackupPOP, res.POPs[1].Name)
	}
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, res.Session.Answer)
}

// placeFailed answers the client for a call the placement did not place.
func (s *Server) placeFailed(w http.ResponseWriter, r *http.Request, err error) {
	var rejected *placement.RejectedError
	var tooLarge *placement.TooLargeError
	switch {
	case r.Context().Err() != nil:
		// The client left; a late answer would go nowhere.
	case errors.As(err, &rejected):
		// The pod judged the offer itself bad: pass its JSON error on.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write(rejected.Body)
	case errors.As(err, &tooLarge):
		apierr.Write(w, http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large", tooLarge.Error(), 0)
	case errors.Is(err, placement.ErrNoCluster):
		apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity",
			"no cluster can take a call right now", 2*time.Second)
	case errors.Is(err, placement.ErrNoCapacity):
		apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity",
			"no cluster could take the call; retry shortly", 2*time.Second)
	default:
		s.log.Error("place a call", "err", err)
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not build the request", 0)
	}
}

// encodeForCluster is a session API request body for v, or false once it
// has answered the client: a 413 when the body would be over the session
// API's cap (JSON escapes control characters to six bytes each, so a
// request under signaling's own cap can still be; the clusters would
// refuse it one after another), a 500 when v does not encode. what names
// the client's part of the request in the 413.
func (s *Server) encodeForCluster(w http.ResponseWriter, v any, what string) ([]byte, bool) {
	body, err := sessionapi.Encode(v)
	if err != nil {
		s.log.Error("encode a session API request", "err", err)
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not build the request", 0)
		return nil, false
	}
	if len(body) > sessionapi.MaxRequestBody {
		apierr.Write(w, http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large",
			fmt.Sprintf("the %s takes %d bytes once encoded, over %d", what, len(body), sessionapi.MaxRequestBody), 0)
		return nil, false
	}
	return body, true
}
