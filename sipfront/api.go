// The call-control API of SIP calls, served by the front that holds them
// (docs/sip.md, "Call control"): POST /v1/realtime/calls/{call_id}/accept,
// /reject, /refer and /hangup behind API keys, with OpenAI's JSON errors.

package sipfront

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/placement"
)

// maxControlBody caps a call-control request body.
const maxControlBody = placement.MaxSessionJSON + 1024

// apiKey is a configured key, resolved.
type apiKey struct {
	key    []byte
	tenant string
	policy sessionapi.Caller
}

func newAPIKeys(c Config) []apiKey {
	out := make([]apiKey, 0, len(c.APIKeys))
	for _, k := range c.APIKeys {
		p := sessionapi.Caller{SessionFields: c.ClientSessionFields, SealedWins: c.SealedFieldsWin}
		if k.ClientSessionFields != nil {
			p.SessionFields = k.ClientSessionFields
		}
		if k.SealedFieldsWin != nil {
			p.SealedWins = *k.SealedFieldsWin
		}
		out = append(out, apiKey{key: []byte(k.key()), tenant: k.Tenant, policy: p})
	}
	return out
}

// API is the call-control API's handler. The node serves it on api_addr;
// it answers only calls this front holds.
func (f *Front) API() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/realtime/calls/{call_id}/accept", f.control("accept", f.accept))
	mux.HandleFunc("POST /v1/realtime/calls/{call_id}/reject", f.control("reject", f.reject))
	mux.HandleFunc("POST /v1/realtime/calls/{call_id}/refer", f.control("refer", f.referCall))
	mux.HandleFunc("POST /v1/realtime/calls/{call_id}/hangup", f.control("hangup", f.hangupCall))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/realtime/calls/") && r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			apierr.Write(w, http.StatusMethodNotAllowed, apierr.TypeInvalidRequest, "method_not_allowed", "use POST", 0)
			return
		}
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "not_found", "no such endpoint", 0)
	})
	return mux
}

// controlFunc handles one action on a call the caller's key may control;
// it returns the status it answered with and the metric's result.
type controlFunc func(w http.ResponseWriter, r *http.Request, d *dialog, k apiKey, body []byte) string

// control authenticates a request, reads its bounded body and finds its
// call: 401 without a valid key, 413 over the cap, 404 for a call that
// does not exist here or belongs to another tenant (the two look alike).
func (f *Front) control(action string, h controlFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		result := f.serveControl(w, r, h)
		f.m.control.WithLabelValues(action, result).Inc()
	}
}

func (f *Front) serveControl(w http.ResponseWriter, r *http.Request, h controlFunc) string {
	k, ok := f.authenticate(r)
	if !ok {
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "invalid_api_key", "an Authorization: Bearer header with a valid API key is required", 0)
		return "unauthorized"
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxControlBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			apierr.Write(w, http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large", fmt.Sprintf("the body is over %d bytes", maxControlBody), 0)
		} else {
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_body", "the body could not be read", 0)
		}
		return "invalid"
	}
	id := r.PathValue("call_id")
	if peer, ok := f.peerFor(r, id); ok {
		return f.forward(w, r, peer, body)
	}
	d := f.pending.get(id)
	if d == nil || d.trunk.tenant != k.tenant {
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "call_not_found", "no call with that call_id", 0)
		return "not_found"
	}
	return h(w, r, d, k, body)
}

// authenticate finds the request's API key, comparing with every key so
// the time taken says nothing about which one matched.
func (f *Front) authenticate(r *http.Request) (apiKey, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return apiKey{}, false
	}
	match := -1
	for i, k := range f.keys {
		if subtle.ConstantTimeCompare([]byte(tok), k.key) == 1 {
			match = i
		}
	}
	if match < 0 {
		return apiKey{}, false
	}
	return f.keys[match], true
}

// conflict answers a decision the call can no longer take.
func conflict(w http.ResponseWriter, msg string) string {
	apierr.Write(w, http.StatusConflict, apierr.TypeInvalidRequest, "call_state_conflict", msg, 0)
	return "conflict"
}

// accept places a ringing call with the accept's session merged under
// the trunk's (placement.MergeSession with the key's caller policy) and
// answers 200 once the carrier has been sent its 200 OK.
func (f *Front) accept(w http.ResponseWriter, r *http.Request, d *dialog, k apiKey, body []byte) string {
	client, err := placement.CanonicalSession(body)
	if err != nil {
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_session", err.Error(), "session")
		return "invalid"
	}
	session, err := placement.MergeSession(d.trunk.session, client, k.policy)
	if err != nil {
		param := "session"
		var fe *placement.FieldError
		if errors.As(err, &fe) {
			param = "session." + fe.Field
			err = fmt.Errorf("session.%s is fixed by the trunk or not open to this key", fe.Field)
		}
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_session", err.Error(), param)
		return "invalid"
	}
	placed := make(chan error, 1)
	if !d.claim(&decision{session: session, placed: placed}) {
		return conflict(w, "the call was already accepted, rejected or ended")
	}
	// The INVITE's goroutine reports within InviteTimeout of taking the
	// decision; the bound is a second guard.
	timer := time.NewTimer(f.cfg.InviteTimeout + f.cfg.AcceptTimeout)
	defer timer.Stop()
	select {
	case err = <-placed:
	case <-timer.C:
		err = context.DeadlineExceeded
	case <-r.Context().Done():
		return "failed"
	}
	if err == nil {
		w.WriteHeader(http.StatusOK)
		return "ok"
	}
	if errors.Is(err, errCallCanceled) || errors.Is(err, errNotAnswered) {
		return conflict(w, "the call ended before it was answered: "+err.Error())
	}
	status, _, result := placeFailure(err)
	apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "call_not_placed",
		fmt.Sprintf("the call could not be placed (%s, SIP %d to the carrier)", result, status), 2*time.Second)
	return "failed"
}

// reject refuses a ringing call with status_code (default 603 Decline; a
// 4xx, 5xx or 6xx only).
func (f *Front) reject(w http.ResponseWriter, _ *http.Request, d *dialog, _ apiKey, body []byte) string {
	var req struct {
		StatusCode *int `json:"status_code"`
	}
	if !decodeStrict(w, body, &req) {
		return "invalid"
	}
	status := 603
	if req.StatusCode != nil {
		status = *req.StatusCode
	}
	if status < 400 || status > 699 {
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_status_code",
			"status_code must be a SIP 4xx, 5xx or 6xx status", "status_code")
		return "invalid"
	}
	if !d.claim(&decision{status: status, reason: reasonPhrase(status)}) {
		return conflict(w, "the call was already accepted, rejected or ended")
	}
	w.WriteHeader(http.StatusOK)
	return "ok"
}

// hangupCall ends a call: a ringing one is declined (603), an answered
// one gets a BYE and its session is deleted.
func (f *Front) hangupCall(w http.ResponseWriter, r *http.Request, d *dialog, _ apiKey, _ []byte) string {
	switch d.current() {
	case statePlacing:
		if !d.claim(&decision{status: 603, reason: reasonPhrase(603)}) {
			return conflict(w, "the call is being placed; hang up once it is answered")
		}
	case stateAnswered, stateConfirmed:
		// The BYE and the delete go on if the API's caller leaves.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), referTimeout)
		defer cancel()
		f.hangup(ctx, d)
	default:
		return conflict(w, "the call has ended")
	}
	w.WriteHeader(http.StatusOK)
	return "ok"
}

// decodeStrict decodes an optional JSON object body into v, refusing
// unknown fields and trailing data (400 naming why).
func decodeStrict(w http.ResponseWriter, body []byte, v any) bool {
	if len(strings.TrimSpace(string(body))) == 0 {
		return true
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil || dec.More() {
		msg := "the body must be one JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_body", msg, 0)
		return false
	}
	return true
}

// reasonPhrase is the reason phrase of a refusal's status.
func reasonPhrase(status int) string {
	if p, ok := map[int]string{403: "Forbidden", 404: "Not Found", 408: "Request Timeout", 480: "Temporarily Unavailable",
		486: "Busy Here", 488: "Not Acceptable Here", 500: "Server Internal Error", 503: "Service Unavailable",
		600: "Busy Everywhere", 603: "Decline", 604: "Does Not Exist Anywhere", 606: "Not Acceptable"}[status]; ok {
		return p
	}
	return "Rejected"
}
