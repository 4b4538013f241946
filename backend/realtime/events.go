package realtime

// The server's events as the connector reads them: the few top-level
// fields it routes by, scanned in place (backend/internal/jsonscan), the
// event names it acts on, and the session.update it sends in the shape
// the server speaks (GA or beta).

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/rtcedge/rtcedge/backend/internal/jsonscan"
	"github.com/rtcedge/rtcedge/backend/oaievents"
)

// fields are the top-level string fields of a server event the connector
// reads; they alias the event's bytes.
type fields struct {
	typ, delta, responseID, itemID []byte
	escaped                        bool // one of them holds a JSON escape: decode it with encoding/json
}

// scanEvent reads the top-level string fields of a JSON object without
// allocating (a server sends dozens of audio deltas per second per call).
// It reports false for anything but a well-formed object.
func scanEvent(data []byte, f *fields) bool {
	*f = fields{}
	i := jsonscan.SkipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = jsonscan.SkipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return true
	}
	for i < len(data) && data[i] == '"' {
		end, esc := jsonscan.String(data, i)
		if end < 0 || esc {
			return false
		}
		key := data[i+1 : end-1]
		i = jsonscan.SkipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = jsonscan.SkipSpace(data, i+1)
		if i < len(data) && data[i] == '"' {
			end, esc = jsonscan.String(data, i)
			if end < 0 {
				return false
			}
			var dst *[]byte
			switch string(key) { // no allocation: the compiler compares in place
			case "type":
				dst = &f.typ
			case "delta":
				dst = &f.delta
			case "response_id":
				dst = &f.responseID
			case "item_id":
				dst = &f.itemID
			}
			if dst != nil {
				*dst = data[i+1 : end-1]
				f.escaped = f.escaped || esc
			}
			i = end
		} else if i = jsonscan.SkipValue(data, i); i < 0 {
			return false
		}
		i = jsonscan.SkipSpace(data, i)
		if i < len(data) && data[i] == '}' {
			return true
		}
		if i >= len(data) || data[i] != ',' {
			return false
		}
		i = jsonscan.SkipSpace(data, i+1)
	}
	return false
}

// unescape decodes the fields through encoding/json when scanEvent found
// escapes (a server that writes "\/" in base64): rare, so it may allocate.
func (f *fields) unescape(data []byte) bool {
	var v struct {
		Type       string `json:"type"`
		Delta      string `json:"delta"`
		ResponseID string `json:"response_id"`
		ItemID     string `json:"item_id"`
	}
	if json.Unmarshal(data, &v) != nil {
		return false
	}
	f.typ, f.delta, f.responseID, f.itemID, f.escaped = []byte(v.Type), []byte(v.Delta), []byte(v.ResponseID), []byte(v.ItemID), false
	return true
}

// Server event names the connector acts on, GA and beta.
var (
	evAudioDelta      = []byte("response.output_audio.delta")
	evAudioDeltaBeta  = []byte("response.audio.delta")
	evResponseDone    = []byte("response.done")
	evResponseCreated = []byte("response.created")
	evSpeechStarted   = []byte("input_audio_buffer.speech_started")
	evSessionCreated  = []byte("session.created")
	evSessionUpdated  = []byte("session.updated")
	evSpeechStopped   = []byte("input_audio_buffer.speech_stopped")
	evError           = []byte("error")
)

func isAudioDelta(typ []byte) bool {
	return bytes.Equal(typ, evAudioDelta) || bytes.Equal(typ, evAudioDeltaBeta)
}

// gaToBeta pairs a GA session field (a path) with its beta name.
var gaToBeta = []struct {
	ga   []string
	beta string
}{
	{[]string{"audio", "input", "turn_detection"}, "turn_detection"},
	{[]string{"audio", "input", "transcription"}, "input_audio_transcription"},
	{[]string{"audio", "input", "noise_reduction"}, "input_audio_noise_reduction"},
	{[]string{"audio", "output", "voice"}, "voice"},
	{[]string{"audio", "output", "speed"}, "speed"},
	{[]string{"output_modalities"}, "modalities"},
	{[]string{"max_output_tokens"}, "max_response_output_tokens"},
}

// shapeSession rewrites a session object (GA or beta shaped, as the app or
// the caller wrote it) into the shape the server speaks, with the audio
// formats forced to the call's (PCM16 at the connector's rate, or a phone
// call's G.711): the edge chooses them, nobody else. The model is left
// out: it is the backend URL's.
func shapeSession(s map[string]any, beta bool, f audioFormat) map[string]any {
	out := make(map[string]any, len(s)+2)
	for k, v := range s {
		out[k] = v
	}
	delete(out, "model")
	if beta {
		for _, m := range gaToBeta {
			if v, ok := take(out, m.ga); ok {
				if m.beta == "modalities" {
					v = betaModalities(v)
				}
				if _, set := out[m.beta]; !set {
					out[m.beta] = v
				}
			}
		}
		delete(out, "type")
		out["input_audio_format"] = f.betaName()
		out["output_audio_format"] = f.betaName()
		return out
	}
	for _, m := range gaToBeta {
		if v, ok := out[m.beta]; ok {
			delete(out, m.beta)
			if m.beta == "modalities" {
				v = gaModalities(v)
			}
			put(out, m.ga, v, false)
		}
	}
	delete(out, "input_audio_format")
	delete(out, "output_audio_format")
	out["type"] = "realtime"
	put(out, []string{"audio", "input", "format"}, f.gaObject(), true)
	put(out, []string{"audio", "output", "format"}, f.gaObject(), true)
	return out
}

// take removes the value at path (dropping objects it leaves empty).
func take(m map[string]any, path []string) (any, bool) {
	if len(path) == 1 {
		v, ok := m[path[0]]
		delete(m, path[0])
		return v, ok
	}
	sub, ok := m[path[0]].(map[string]any)
	if !ok {
		return nil, false
	}
	sub = clone(sub)
	m[path[0]] = sub
	v, ok := take(sub, path[1:])
	if len(sub) == 0 {
		delete(m, path[0])
	}
	return v, ok
}

// put sets the value at path, copying the objects on the way so that the
// caller's maps are never changed; an existing value wins unless force.
func put(m map[string]any, path []string, v any, force bool) {
	if len(path) == 1 {
		if _, set := m[path[0]]; force || !set {
			m[path[0]] = v
		}
		return
	}
	sub, _ := m[path[0]].(map[string]any)
	sub = clone(sub)
	m[path[0]] = sub
	put(sub, path[1:], v, force)
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// betaModalities: GA's ["audio"] is beta's ["audio", "text"] (beta has no
// audio-only mode); gaModalities is the reverse.
func betaModalities(v any) any {
	if l, ok := v.([]any); ok {
		for _, x := range l {
			if x == "audio" {
				return []any{"audio", "text"}
			}
		}
	}
	return v
}

func gaModalities(v any) any {
	if l, ok := v.([]any); ok {
		for _, x := range l {
			if x == "audio" {
				return []any{"audio"}
			}
		}
	}
	return v
}

// sessionEvent is a session.update as the server gets it.
func sessionEvent(eventID string, session map[string]any) ([]byte, error) {
	ev := map[string]any{"type": "session.update", "session": session}
	if eventID != "" {
		ev["event_id"] = eventID
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("marshal session.update: %w", err)
	}
	return b, nil
}

// errorEvent is an error event for the caller, in OpenAI's shape.
func errorEvent(typ, code, param, msg, eventID string) []byte {
	return oaievents.ErrorEvent(typ, code, param, msg, eventID)
}
