package transceiver

// The pod's session API over HTTP: the routes (create, delete, ICE
// restart, the sideband in sideband.go, the pod's status and health) and
// the JSON errors each answers with.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sdpcheck"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// Paths of the internal session API that signaling calls (see
// internal/sessionapi, which defines the wire format for every hop).
const (
	SessionsPath = sessionapi.SessionsPath
	StatusPath   = sessionapi.StatusPath
)

// APICreateRequest is the JSON body of POST /internal/v1/sessions.
type APICreateRequest = sessionapi.CreateRequest

// APICreateResponse is the JSON body of a 201 from POST /internal/v1/sessions.
type APICreateResponse = sessionapi.CreateResponse

// APIStatus is the JSON body of GET /internal/v1/status.
type APIStatus = sessionapi.PodStatus

// CreateTimeout bounds how long one create may take inside the pod.
const CreateTimeout = 5 * time.Second

// Handler returns the pod's internal session API and health endpoints:
//
//	POST   /internal/v1/sessions        create (201, 400, 503 + Retry-After when full or draining)
//	DELETE /internal/v1/sessions/{id}   end (204, 404)
//	PATCH  /internal/v1/sessions/{id}   ICE restart (200, 400, 404, 412)
//	GET    /internal/v1/sessions/{id}/sideband   the call's sideband WebSocket (101, 404, 409)
//	GET    /internal/v1/sessions/{id}/ended      a phone call's end, held until it ends (200, 204, 404)
//	GET    /internal/v1/status          load and state
//	GET    /livez, /readyz              liveness; readiness is 503 while draining
//
// With Config.PodKeys, all but /livez and /readyz need the pod's own
// session API credential as a bearer token (401 otherwise); else
// Config.SessionAPISecret (or its SHA256) when set.
func (t *Transceiver) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+SessionsPath, t.handleCreate)
	mux.HandleFunc("DELETE "+SessionsPath+"/{id}", t.handleDelete)
	mux.HandleFunc("PATCH "+SessionsPath+"/{id}", t.handleRestart)         // ICE restart
	mux.HandleFunc("GET "+SessionsPath+"/{id}/sideband", t.handleSideband) // WebSocket (sideband.go)
	mux.HandleFunc("GET "+SessionsPath+"/{id}/ended", t.handleCallEnded)   // a phone call's end (rtpend.go)
	mux.HandleFunc("GET "+StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, APIStatus{
			Cluster: t.cfg.Cluster, Pod: t.cfg.Pod, Sessions: t.Sessions(),
			Capacity: t.cfg.MaxSessions, Draining: t.Draining(),
		})
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if t.Draining() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	if t.cfg.PodKeys != nil {
		return sessionapi.RequireAnySecret(t.cfg.PodKeys.SessionAPI, mux)
	}
	if t.cfg.SessionAPISecretSHA256 != "" {
		return sessionapi.RequireSecretHash(t.cfg.SessionAPISecretSHA256, mux)
	}
	return sessionapi.RequireSecret(t.cfg.SessionAPISecret, mux)
}

func (t *Transceiver) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req APICreateRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, sessionapi.MaxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			apierr.Write(w, http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large", "request body too large", 0)
			return
		}
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_json", "request body is not valid JSON: "+err.Error(), 0)
		return
	}
	if req.Kind != sessionapi.KindWebRTC && req.Kind != sessionapi.KindRTP {
		// Refused as an offer this pod cannot take, so a front answers its
		// caller instead of trying every cluster.
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, sessionapi.CodeUnsupportedKind,
			fmt.Sprintf("this pod does not terminate sessions of kind %q", req.Kind), 0)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), CreateTimeout)
	defer cancel()
	var res CreateResult
	var err error
	if req.Kind == sessionapi.KindRTP {
		// A phone call (rtpcall.go): the carrier's offer, no ICE.
		res, err = t.CreateCall(ctx, CallRequest{Offer: req.Offer, POPs: req.POPs, Config: req.Config, Caller: req.Caller})
	} else {
		res, err = t.CreateSession(ctx, CreateRequest{Offer: req.Offer, POPs: req.POPs, Config: req.Config, Caller: req.Caller,
			Steer: req.Steer, SteerTicket: r.Header.Get(sessionapi.HeaderSteerTicket)})
	}
	if err != nil {
		t.writeCreateError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, APICreateResponse{ID: res.ID, Answer: res.Answer, Cluster: t.cfg.Cluster, Pod: t.cfg.Pod})
}

func (t *Transceiver) writeCreateError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrDraining):
		apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "draining", "pod is draining", time.Second)
	case errors.Is(err, ErrBackendEnded):
		apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "backend_unavailable", "the backend did not take the call", time.Second)
	case errors.Is(err, ErrFull), errors.Is(err, ErrClosed):
		apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity", "pod is at capacity", time.Second)
	case errors.Is(err, ErrBadOffer):
		// The client sees sdpcheck's own words, or a fixed sentence: what
		// Pion said about an offer it could not answer names our
		// internals, and goes to the log.
		var se *sdpcheck.Error
		code, msg := sdpcheck.CodeInvalidSDP, "the offer cannot be answered"
		if errors.As(err, &se) {
			code, msg = se.Code, se.Msg
		} else {
			t.log.Info("offer not answerable", "err", err)
		}
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, code, msg, 0)
	case errors.Is(err, ErrBadPOP):
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_pops", err.Error(), 0)
	default:
		t.log.Warn("create session failed", "err", err)
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not create the session", 0)
	}
}

func (t *Transceiver) handleDelete(w http.ResponseWriter, r *http.Request) {
	if err := t.EndSession(r.PathValue("id")); err != nil {
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		slog.Debug("write json", "err", err)
	}
}
