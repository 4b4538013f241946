// Package echo is the reference backend: it sends the caller's audio back
// unchanged (a phone call's DTMF digits too) and answers every oai-events
// message with an event quoting it.
// It lets the whole system run, and be measured, with no model behind it.
package echo

import (
	"context"
	"encoding/json"
	"time"

	"github.com/rtcedge/rtcedge/backend"
)

// Backend is the echo backend. The zero value is ready to use.
type Backend struct{}

// Open implements backend.Backend.
func (Backend) Open(_ context.Context, info backend.SessionInfo, out backend.Sink) (backend.Handler, error) {
	return &handler{id: info.ID, out: out}, nil
}

var (
	_ backend.Backend = Backend{}
	_ backend.Handler = (*handler)(nil)
)

type handler struct {
	id  string
	out backend.Sink
}

func (h *handler) Audio(payload []byte, d time.Duration) {
	// A failed write means the session is ending; nothing to do about it.
	_ = h.out.WriteAudio(payload, d)
}

// Reply is the event the echo backend sends for every message it receives.
type Reply struct {
	Type    string          `json:"type"`
	Session string          `json:"session"`
	Echo    json.RawMessage `json:"echo,omitempty"`
	Text    string          `json:"text,omitempty"`
}

func (h *handler) Event(data []byte) {
	r := Reply{Type: backend.EventEcho, Session: h.id}
	if json.Valid(data) {
		r.Echo = json.RawMessage(data)
	} else {
		r.Text = string(data)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	_ = h.out.SendEvent(b)
}

func (h *handler) Close() error { return nil }

// DTMF implements backend.DTMFHandler: a phone call's caller's digit is
// sent back to the carrier as DTMF, as the audio is.
func (h *handler) DTMF(digit byte) {
	if s, ok := h.out.(backend.DTMFSender); ok {
		_ = s.SendDTMF(string(digit)) // the call is ending, or its queue full: nothing to do
	}
}

var _ backend.DTMFHandler = (*handler)(nil)
