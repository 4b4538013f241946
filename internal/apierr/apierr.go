// Package apierr writes rtcedge's JSON error bodies, the same shape on the
// public API and the internal session API, and the shape of OpenAI's error
// object:
//
//	{"error": {"type": "invalid_request_error", "code": "no_audio", "message": "...", "param": null}}
//
// "param" names the request parameter at fault ("session.model") and is
// null when no single parameter is.
package apierr

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Error types, the "type" field.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_error"
	TypeUnavailable    = "service_unavailable_error"
	TypeServer         = "server_error"
)

// Body is the JSON error envelope.
type Body struct {
	Error Detail `json:"error"`
}

// Detail is the content of an error body.
type Detail struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Param is the parameter at fault; nil is written as null.
	Param *string `json:"param"`
}

// Write sends an error response with a null param. A positive retryAfter
// sets Retry-After in whole seconds (at least 1).
func Write(w http.ResponseWriter, status int, typ, code, msg string, retryAfter time.Duration) {
	write(w, status, Detail{Type: typ, Code: code, Message: msg}, retryAfter)
}

// WriteParam sends an error response naming the parameter at fault.
func WriteParam(w http.ResponseWriter, status int, typ, code, msg, param string) {
	write(w, status, Detail{Type: typ, Code: code, Message: msg, Param: &param}, 0)
}

func write(w http.ResponseWriter, status int, d Detail, retryAfter time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		secs := int(retryAfter.Round(time.Second) / time.Second)
		h.Set("Retry-After", strconv.Itoa(max(secs, 1)))
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Body{Error: d})
}
