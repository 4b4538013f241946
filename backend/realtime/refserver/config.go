package refserver

// A session's configuration as the reference server keeps it: its
// defaults, the session.update that changes it (audio formats checked) and
// the turn detection read from it.

import (
	"encoding/json"
	"fmt"
	"time"
)

// defaultConfig is the session a connection starts with, in the shape of
// the server's protocol (GA: audio.input/output objects; beta: flat
// *_audio_format fields).
func (s *Session) defaultConfig() map[string]any {
	td := map[string]any{"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": defaultPrefixMs,
		"silence_duration_ms": defaultSilenceMs, "idle_timeout_ms": nil, "create_response": true, "interrupt_response": true}
	common := map[string]any{"object": "realtime.session", "id": s.ID, "model": s.Model, "instructions": "",
		"tools": []any{}, "tool_choice": "auto", "tracing": nil, "prompt": nil, "include": nil,
		"expires_at": time.Now().Add(time.Hour).Unix()}
	if s.h.cfg.Beta {
		common["modalities"] = []any{"audio", "text"}
		common["voice"] = "alloy"
		common["input_audio_format"] = "pcm16"
		common["output_audio_format"] = "pcm16"
		common["input_audio_transcription"] = nil
		common["turn_detection"] = td
		common["max_response_output_tokens"] = "inf"
		return common
	}
	format := func() map[string]any { return map[string]any{"type": "audio/pcm", "rate": s.h.cfg.Rate} }
	common["type"] = "realtime"
	common["output_modalities"] = []any{"audio"}
	common["max_output_tokens"] = "inf"
	common["audio"] = map[string]any{
		"input":  map[string]any{"format": format(), "transcription": nil, "noise_reduction": nil, "turn_detection": td},
		"output": map[string]any{"format": format(), "voice": "marin", "speed": 1},
	}
	return common
}

// lookup walks nested objects of m.
func lookup(m map[string]any, path ...string) (any, bool) {
	var v any = m
	for _, k := range path {
		o, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = o[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// turnDetection reads the session's server VAD settings; nil when turn
// detection is off (null). s.mu must be held.
func (s *Session) turnDetection() *turnDetection {
	path := []string{"audio", "input", "turn_detection"}
	if s.h.cfg.Beta {
		path = []string{"turn_detection"}
	}
	v, _ := lookup(s.st.Config, path...)
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	num := func(k string, def float64) float64 {
		if f, ok := m[k].(float64); ok {
			return f
		}
		if i, ok := m[k].(int); ok {
			return float64(i)
		}
		return def
	}
	flag := func(k string) bool { b, ok := m[k].(bool); return !ok || b }
	return &turnDetection{
		thresholdDB:    threshold(num("threshold", 0.5)),
		prefixMs:       int(num("prefix_padding_ms", defaultPrefixMs)),
		silenceMs:      max(10, int(num("silence_duration_ms", defaultSilenceMs))),
		createResponse: flag("create_response"),
		interrupt:      flag("interrupt_response"),
	}
}

// merge applies an update to a session object: objects merge key by key,
// anything else (null included) replaces.
func merge(dst, src map[string]any) {
	for k, v := range src {
		if sv, ok := v.(map[string]any); ok {
			if dv, ok := dst[k].(map[string]any); ok {
				merge(dv, sv)
				continue
			}
		}
		dst[k] = v
	}
}

// checkFormats refuses audio formats the server does not speak: PCM16 at
// its rate, and G.711 (g711.go).
func (s *Session) checkFormats(upd map[string]any) (param, msg string) {
	if s.h.cfg.Beta {
		for _, k := range []string{"input_audio_format", "output_audio_format"} {
			if v, ok := upd[k]; ok && v != "pcm16" && betaLaws[fmt.Sprint(v)] == nil {
				return "session." + k, fmt.Sprintf("Invalid value: '%v'. Supported values are: 'pcm16', 'g711_ulaw', and 'g711_alaw'.", v)
			}
		}
		return "", ""
	}
	for _, dir := range []string{"input", "output"} {
		v, ok := lookup(upd, "audio", dir, "format")
		if !ok {
			continue
		}
		f, _ := v.(map[string]any)
		if typ, _ := f["type"].(string); gaLaws[typ] != nil {
			continue // G.711 is 8 kHz: no rate
		}
		if f == nil || f["type"] != "audio/pcm" {
			return "session.audio." + dir + ".format.type", "Invalid value: supported types are 'audio/pcm', 'audio/pcmu' and 'audio/pcma'."
		}
		if r, ok := f["rate"]; ok && r != float64(s.h.cfg.Rate) {
			return "session.audio." + dir + ".format.rate", fmt.Sprintf("Invalid value: %v. This server's rate is %d.", r, s.h.cfg.Rate)
		}
	}
	return "", ""
}

func (s *Session) sessionUpdate(ev clientEvent) {
	var upd map[string]any
	if err := json.Unmarshal(ev.Session, &upd); err != nil || upd == nil {
		s.sendError(ev.EventID, "invalid_request_error", "missing_required_parameter", "session", "Missing required parameter: 'session'.")
		return
	}
	if !s.h.cfg.Beta {
		if t, _ := upd["type"].(string); t != "realtime" {
			s.sendError(ev.EventID, "invalid_request_error", "missing_required_parameter", "session.type",
				"Missing required parameter: 'session.type' (this server serves 'realtime' sessions).")
			return
		}
	}
	if param, msg := s.checkFormats(upd); param != "" {
		s.sendError(ev.EventID, "invalid_request_error", "invalid_value", param, msg)
		return
	}
	delete(upd, "model") // as OpenAI: the model is fixed for the connection
	delete(upd, "id")
	delete(upd, "object")
	s.mu.Lock()
	merge(s.st.Config, upd)
	s.inLaw, s.outLaw = s.lawsLocked()
	cfg := json.RawMessage(mustJSON(s.st.Config))
	s.notify()
	s.mu.Unlock()
	s.send(map[string]any{"type": "session.updated", "session": cfg})
}
