package signaling

import (
	"context"
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

// placeCall validates the offer, chooses where the call goes and asks the
// clusters nearest first until one answers. Nothing is allocated anywhere
// for an offer that fails validation.
func (s *Server) placeCall(w http.ResponseWriter, r *http.Request, c call) {
	loc, offer := c.loc, c.offer
	session, err := s.effectiveSession(c)
	if err != nil {
		param := "session"
		var fe *sessionFieldError
		if errors.As(err, &fe) {
			param = "session." + fe.field
		}
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_session", err.Error(), param)
		return
	}
	if err := sdpcheck.Offer(offer); err != nil {
		code := sdpcheck.CodeOf(err)
		if code == "" {
			code = sdpcheck.CodeInvalidSDP
		}
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, code, err.Error(), 0)
		return
	}
	s.m.located.WithLabelValues(loc.Source).Inc()
	// The catalogue's steering overrides (per country/continent) win over
	// distance; see geo.Catalogue.ChooseFor.
	choice := s.cfg.CatalogueData.ChooseFor(loc, s.cfg.Health)
	// Then the POPs: pinned, the catalogue's overrides, measured round
	// trips or distance (steering.go); a POP chosen otherwise than by
	// distance brings its region's clusters to the front.
	key := keyOf(loc)
	pops, reason := s.choosePOPs(loc, key, &choice)
	if len(choice.Clusters) == 0 || len(pops) == 0 {
		s.m.noCapacity.Inc()
		s.log.Warn("no usable cluster or POP", "clusters", len(choice.Clusters), "pops", len(pops), "client", loc.IP)
		apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity",
			"no cluster can take a call right now", 2*time.Second)
		return
	}
	policy := s.callerPolicy(c.cred)
	req := sessionapi.CreateRequest{Offer: offer, Config: session, Steer: key.String(), Caller: &policy}
	for _, p := range pops {
		req.POPs = append(req.POPs, sessionapi.POP{ID: p.ID, VIP: p.VIP, TCPPort: p.TCPPort})
	}
	body, ok := s.encodeForCluster(w, req, "offer")
	if !ok {
		return
	}
	start := s.cfg.Now()
	attempts := min(len(choice.Clusters), s.cfg.MaxAttempts)
	for i, cc := range choice.Clusters[:attempts] {
		if r.Context().Err() != nil {
			return // the client left; a late answer would go nowhere
		}
		t0 := s.cfg.Now()
		res, status, errBody, err := s.createOn(r.Context(), cc.Cluster, body)
		result := attemptResult(status, err)
		cluster := strconv.Itoa(int(cc.Cluster.ID))
		s.m.attempts.WithLabelValues(cluster, result).Inc()
		s.m.attemptSeconds.WithLabelValues(result).Observe(s.cfg.Now().Sub(t0).Seconds())
		switch result {
		case resultCreated:
			h := w.Header()
			h.Set("Content-Type", "application/sdp")
			h.Set("Location", c.location+s.calls.publicID(res.ID, c.cred))
			h.Set(HeaderRegion, cc.Region)
			h.Set(HeaderCluster, cluster)
			h.Set(HeaderPOP, pops[0].Name)
			h.Set(HeaderSteering, reason)
			s.steer.choices.WithLabelValues(reason).Inc()
			if len(pops) > 1 {
				h.Set(HeaderBackupPOP, pops[1].Name)
			}
			h.Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, res.Answer)
			s.log.Debug("call placed", "session", res.ID, "cluster", cc.Cluster.ID, "attempt", i+1,
				"elapsed", s.cfg.Now().Sub(start), "pop", pops[0].ID, "steering", reason, "client", loc.IP, "located_by", loc.Source)
			return
		case resultRejected:
			// The pod judged the offer itself bad: another cluster would
			// say the same. Pass its JSON error on. (A 400 about anything
			// else is a fault of ours, counted as a server error.)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(errBody)
			return
		}
		// Down, slow, full, draining or confused: the next-nearest cluster
		// gets the offer.
		s.log.Warn("cluster did not take the session, trying the next", "cluster", cc.Cluster.ID,
			"result", result, "status", status, "err", err, "elapsed", s.cfg.Now().Sub(t0))
	}
	s.m.noCapacity.Inc()
	apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity",
		"no cluster could take the call; retry shortly", 2*time.Second)
}

// Results of one cluster attempt, the "result" label of the attempt metrics.
const (
	resultCreated     = "created"
	resultRejected    = "rejected"     // 400 with a JSON error saying the offer is bad
	resultUnavailable = "unavailable"  // 503: full or draining
	resultServerError = "server_error" // 5xx, or a 400 about anything but the offer
	resultBadAnswer   = "bad_answer"   // any other status, or a 201 that does not decode
	resultTimeout     = "timeout"
	resultError       = "error" // refused, reset, unreachable
)

var attemptResults = []string{resultCreated, resultRejected, resultUnavailable, resultServerError, resultBadAnswer, resultTimeout, resultError}

func attemptResult(status int, err error) string {
	var bad *badAnswerError
	var fault *podFaultError
	switch {
	case errors.As(err, &fault):
		return resultServerError
	case errors.As(err, &bad):
		return resultBadAnswer
	case errors.Is(err, context.DeadlineExceeded):
		return resultTimeout
	case err != nil:
		return resultError
	case status == http.StatusCreated:
		return resultCreated
	case status == http.StatusBadRequest:
		return resultRejected
	case status == http.StatusServiceUnavailable:
		return resultUnavailable
	case status >= 500:
		return resultServerError
	default:
		return resultBadAnswer
	}
}

// badAnswerError is a session API answer that cannot be used as it is.
type badAnswerError struct{ msg string }

func (e *badAnswerError) Error() string { return e.msg }

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
