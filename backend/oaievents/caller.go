// Package oaievents translates the events a caller sends on a call's
// oai-events data channel into the events a backend receives: read
// strictly (strict.go), checked against an allow-list of event types and
// of the fields each may carry (schema.go), and re-encoded from what was
// read. What a client secret seals (model, instructions, tools,
// tool_choice, prompt) belongs to the app server; so do tool results and
// system or developer items, which come from the server side (the
// sideband, the app). A refused event, or a refused part of a
// session.update, is named to the caller in one error event carrying the
// caller's event_id; the backend never sees it.
//
// The realtime connector and the network backend translate every caller
// event through a Caller; the sideband's events are read strictly and
// re-encoded (Canonical) but not filtered: they are the app's.
package oaievents

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// Policy is what a call's caller may change of the call's session, set
// per call by signaling (sealed in the client secret or configured per
// API key; internal/sessionapi.Caller).
type Policy struct {
	// SessionFields are the top-level session fields a caller's
	// session.update may set; nil: sessionapi.DefaultClientSessionFields.
	SessionFields []string
	// SealedWins drops the session fields a caller may not set without an
	// error (for SDKs that always send an agent's whole configuration):
	// the call keeps the sealed values, the allowed fields apply.
	SealedWins bool
}

// Action is what a backend does with a translated event.
type Action uint8

// Actions.
const (
	// Forward: send Result.Event to the backend (and Result.Error, if
	// set, to the caller: a session.update accepted in part).
	Forward Action = iota
	// Drop: send nothing; count Result.Reason (input_audio_buffer.append:
	// audio comes by media only).
	Drop
	// Clear: the caller's output_audio_buffer.clear, the pod's to act on
	// (it holds the output buffer).
	Clear
	// Refuse: send Result.Error to the caller, nothing to the backend;
	// count Result.Reason.
	Refuse
)

// Reasons of Drop and Refuse, the reason label of a backend's counter.
const (
	ReasonAppend    = "append_event" // input_audio_buffer.append: audio comes by media
	ReasonMalformed = "malformed"    // not one strictly read JSON object (ErrMalformed)
	ReasonType      = "event_type"   // an event type off the allow-list
	ReasonFields    = "fields"       // fields a caller may not send
)

// Result is one translated caller event.
type Result struct {
	Action Action
	// Event is the event for the backend (Forward), re-encoded from what
	// was read: never the caller's bytes. Owned by the receiver.
	Event []byte
	// Error is an error event for the caller (Refuse; Forward of a
	// session.update some fields of which were refused), or nil.
	Error []byte
	// Session is set for a session.update: Event's session holds only the
	// fields the caller may set.
	Session bool
	// Reason labels a Drop or a Refuse (and a partial session.update).
	Reason string
}

// Caller translates one call's caller events. Translate is called from
// the call's data-channel reader; Sealed from the sideband's; both may
// run at once.
type Caller struct {
	allow      []string // static after NewCaller
	sealedWins bool     // static after NewCaller

	mu  sync.Mutex
	cfg map[string]any // the call's session (top-level fields); guarded by mu
}

// NewCaller is the translator of a call with policy p and session config
// (a JSON object, or empty). A config that is not an object counts as
// empty: the backend refuses it on its own.
func NewCaller(p Policy, config []byte) *Caller {
	c := &Caller{allow: p.SessionFields, sealedWins: p.SealedWins, cfg: map[string]any{}}
	if c.allow == nil {
		c.allow = sessionapi.DefaultClientSessionFields
	}
	if len(config) > 0 {
		var m map[string]any
		if json.Unmarshal(config, &m) == nil && m != nil {
			c.cfg = m
		}
	}
	return c
}

// Sealed lays the top-level fields of a sideband's session.update over the
// call's session: a caller's field that repeats the call's value is
// accepted, and it repeats the app's latest value.
func (c *Caller) Sealed(session map[string]any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range session {
		c.cfg[k] = v
	}
}

// Translate reads one caller event and decides what the backend gets.
func (c *Caller) Translate(data []byte) Result {
	w := getWalker()
	defer putWalker(w)
	top, err := w.check(data)
	eventID := string(top.eventID)
	if err != nil && eventID == "" && bytes.HasPrefix(data, bom) {
		// The caller still gets its event_id back, read past the mark.
		if again, _ := w.check(data[len(bom):]); again.eventID != nil {
			eventID = string(again.eventID)
		}
	}
	if err != nil {
		return refuse(ReasonMalformed, "invalid_event", "", eventID, "The event was refused: "+err.Error()+".")
	}
	if !top.hasType {
		return refuse(ReasonMalformed, "invalid_event", "type", eventID, "The event has no \"type\" string.")
	}
	var n *node
	switch typ := string(top.typ); typ { // no allocation: compared in place
	case "input_audio_buffer.append":
		return Result{Action: Drop, Reason: ReasonAppend}
	case "output_audio_buffer.clear":
		return Result{Action: Clear}
	case "session.update":
		return c.session(w, data, eventID)
	default:
		if n = events[typ]; n == nil {
			return refuse(ReasonType, "event_not_allowed", "type", eventID,
				fmt.Sprintf("Events of type %q may not be sent by the client.", typ))
		}
	}
	w.begin(data)
	if err := w.walk(&w.dec, n); err != nil {
		return refuse(ReasonMalformed, "invalid_event", "", eventID, "The event was refused: "+err.Error()+".")
	}
	if len(w.refused) > 0 {
		return refuse(ReasonFields, "field_not_allowed", w.refused[0], eventID,
			fmt.Sprintf("The event was refused: %s may not be sent by the client.", list(w.refused)))
	}
	return Result{Action: Forward, Event: w.result()}
}

// session translates a session.update: the fields the policy allows go
// on, the others are refused (named in one error) or, with SealedWins,
// dropped; a field that repeats the call's value and tracing (which the
// edge does not honour) are dropped without a word.
func (c *Caller) session(w *walker, data []byte, eventID string) Result {
	w.caller = c
	w.begin(data)
	if err := w.walk(&w.dec, sessionUpdate); err != nil {
		return refuse(ReasonMalformed, "invalid_event", "", eventID, "The event was refused: "+err.Error()+".")
	}
	if !w.emitting { // the event itself, not a session field, was refused
		return refuse(ReasonFields, "field_not_allowed", w.refused[0], eventID,
			fmt.Sprintf("The event was refused: %s may not be sent by the client.", list(w.refused)))
	}
	res := Result{Action: Forward, Event: w.result(), Session: true}
	if len(w.refused) > 0 {
		res.Reason = ReasonFields
		res.Error = ErrorEvent("invalid_request_error", "invalid_session", w.refused[0],
			fmt.Sprintf("%s may not be set by the client; the other fields were applied.", list(w.refused)), eventID)
	}
	return res
}

// sessionMember decides one member of a caller's session object: whether
// it goes on (its value checked against its schema first), or is dropped,
// refused or kept silently.
func (c *Caller) sessionMember(w *walker, name string, raw jsontext.Value) (keep bool) {
	if slices.Contains(c.allow, name) {
		before := len(w.refused)
		w.subIn = *bytesBuffer(raw)
		w.sub.Reset(&w.subIn)
		w.path = append(w.path, seg{name: name})
		emitting := w.emitting
		w.emitting = false // a dry run: the value is copied once accepted
		err := w.walk(&w.sub, sessionFields[name])
		w.emitting = emitting
		w.path = w.path[:len(w.path)-1]
		if err != nil || len(w.refused) > before {
			if len(w.refused) == before {
				w.refused = append(w.refused, "session."+name)
			}
			return false
		}
		return true
	}
	switch {
	case name == "tracing", c.sealedWins:
		return false
	case c.repeats(name, raw):
		return false
	}
	w.refused = append(w.refused, "session."+name)
	return false
}

// repeats reports whether raw is the call's current value of field name.
func (c *Caller) repeats(name string, raw jsontext.Value) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cur, ok := c.cfg[name]
	return ok && reflect.DeepEqual(cur, v)
}

func refuse(reason, code, param, eventID, msg string) Result {
	return Result{Action: Refuse, Reason: reason, Error: ErrorEvent("invalid_request_error", code, param, msg, eventID)}
}

// list names the refused fields for a message.
func list(fields []string) string {
	if len(fields) == 1 {
		return fields[0]
	}
	return strings.Join(fields[:len(fields)-1], ", ") + " and " + fields[len(fields)-1]
}

// ErrorEvent is an error event for the caller in OpenAI's shape: error.type
// typ, error.code code, error.param param (null if empty), error.event_id
// the caller's event's (null if empty).
func ErrorEvent(typ, code, param, msg, eventID string) []byte {
	e := map[string]any{"type": typ, "code": code, "message": msg, "param": nil, "event_id": nil}
	if param != "" {
		e["param"] = param
	}
	if eventID != "" {
		e["event_id"] = eventID
	}
	b, _ := json.Marshal(map[string]any{"type": "error", "event_id": backend.EventIDPrefix + code, "error": e})
	return b
}
