package refserver

// A response: how one starts (the session's first tool, or the parrot of
// the caller's last audio, or a tone), and its stream of events in
// OpenAI's order, from response.created through the audio deltas to
// response.done.

import (
	"fmt"
	"math"
	"time"
)

// startLocked starts a response: a call of the session's first tool when
// it has tools and the conversation does not end with a tool's output
// (toolCall), else the parrot of the conversation's last user audio, or a
// tone at ToneHz of Config.ToneMs when there is none.
func (s *Session) startLocked() {
	if name := s.toolLocked(); name != "" {
		last := len(s.items) == 0 || s.items[len(s.items)-1].typ != "function_call_output"
		if last {
			s.startToolCallLocked(name)
			return
		}
	}
	var audio []int16
	for i := len(s.items) - 1; i >= 0; i-- {
		if it := s.items[i]; it.role == "user" && len(it.pcm) > 0 {
			audio = it.pcm
			break
		}
	}
	if audio == nil {
		audio = tone(ToneHz, s.h.cfg.Rate, s.h.cfg.ToneMs*s.h.cfg.Rate/1000)
	}
	if limit := s.h.cfg.MaxReplyMs * s.h.cfg.Rate / 1000; len(audio) > limit {
		audio = audio[:limit]
	}
	r := &response{id: s.h.id("resp"), itemID: s.h.id("item"), audio: audio, law: s.outLaw, done: make(chan struct{}), rec: len(s.st.Responses)}
	s.active = r
	s.st.Responses = append(s.st.Responses, Response{ID: r.id, ItemID: r.itemID, Status: "in_progress"})
	s.notify()
	prev := s.lastIDLocked()
	s.addItemLocked(&item{id: r.itemID, role: "assistant"})
	s.wg.Add(1)
	go s.respond(r, prev)
}

// cancelLocked stops r; its responder sends the closing events.
func (s *Session) cancelLocked(r *response, reason string) {
	if r.reason == "" {
		r.reason = reason
		close(r.done)
	}
}

func tone(hz, rate, n int) []int16 {
	pcm := make([]int16, n)
	for i := range pcm {
		pcm[i] = int16(0.3 * 32767 * math.Sin(2*math.Pi*float64(hz)*float64(i)/float64(rate)))
	}
	return pcm
}

// name maps a GA event name to what the server speaks.
func (s *Session) name(ga string) string {
	if !s.h.cfg.Beta {
		return ga
	}
	switch ga {
	case "response.output_audio.delta":
		return "response.audio.delta"
	case "response.output_audio.done":
		return "response.audio.done"
	case "response.output_audio_transcript.delta":
		return "response.audio_transcript.delta"
	case "response.output_audio_transcript.done":
		return "response.audio_transcript.done"
	}
	return ga
}

func (s *Session) responseObject(r *response, status string, details, output any) map[string]any {
	rate := s.h.cfg.Rate
	obj := map[string]any{"object": "realtime.response", "id": r.id, "status": status, "status_details": details,
		"output": output, "conversation_id": "conv_" + s.ID, "usage": nil, "metadata": nil}
	if s.h.cfg.Beta {
		obj["modalities"] = []string{"audio", "text"}
		obj["voice"] = "alloy"
		obj["output_audio_format"] = betaName(r.law)
		obj["max_output_tokens"] = "inf"
	} else {
		obj["output_modalities"] = []string{"audio"}
		obj["max_output_tokens"] = "inf"
		obj["audio"] = map[string]any{"output": map[string]any{"format": gaFormat(r.law, rate), "voice": "marin"}}
	}
	return obj
}

// respond streams r: created, the assistant item, its audio content part,
// the audio deltas (faster than real time unless Config.Speed slows them)
// and the closing events, in OpenAI's order.
func (s *Session) respond(r *response, prev any) {
	defer s.wg.Done()
	transcript := fmt.Sprintf("Parrot: %d ms of audio.", len(r.audio)*1000/s.h.cfg.Rate)
	s.send(map[string]any{"type": "response.created", "response": s.responseObject(r, "in_progress", nil, []any{})})
	s.sendItemAdded(prev, s.replyItem(r, "in_progress", ""), false)
	s.send(map[string]any{"type": "response.output_item.added", "response_id": r.id, "output_index": 0, "item": s.replyItem(r, "in_progress", "")})
	s.send(partEvent(r, "type", "response.content_part.added", "part", map[string]any{"type": "audio", "transcript": ""}))
	s.send(partEvent(r, "type", s.name("response.output_audio_transcript.delta"), "delta", transcript))
	sent := s.streamAudio(r)
	s.finish(r, prev, sent, transcript)
}

// partEvent is an event about r's audio content part: its IDs and indexes
// with the key-value pairs kv.
func partEvent(r *response, kv ...any) map[string]any {
	m := map[string]any{"response_id": r.id, "item_id": r.itemID, "output_index": 0, "content_index": 0}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// replyItem is r's assistant item as the events carry it: no content while
// in progress, its audio part with transcript once over.
func (s *Session) replyItem(r *response, status, transcript string) map[string]any {
	audioType := "output_audio"
	if s.h.cfg.Beta {
		audioType = "audio"
	}
	content := []any{}
	if status != "in_progress" {
		content = []any{map[string]any{"type": audioType, "transcript": transcript}}
	}
	return map[string]any{"id": r.itemID, "object": "realtime.item", "type": "message", "status": status, "role": "assistant", "content": content}
}

// streamAudio sends r's audio as deltas of Config.DeltaMs, paced by
// Config.Speed if set, until it is all sent, r is cancelled or the session
// ends; it returns the samples sent. The item holds each delta's audio
// before the client can hear it: a truncate the client sends on hearing a
// delta must find it.
func (s *Session) streamAudio(r *response) int {
	rate := s.h.cfg.Rate
	chunk := s.h.cfg.DeltaMs * rate / 1000
	start := time.Now()
	sent := 0
	buf := make([]byte, 2*chunk)
	deltaType := s.name("response.output_audio.delta")
	var ev []byte // a delta event, encoded (appendDelta), reused
	var evID []byte
	for sent < len(r.audio) {
		if s.h.cfg.Speed > 0 {
			due := start.Add(time.Duration(float64(sent) / float64(rate) / s.h.cfg.Speed * float64(time.Second)))
			if !s.sleepUntil(due, r.done) {
				break
			}
		}
		select {
		case <-r.done:
			return sent
		case <-s.ctx.Done():
			return sent
		default:
		}
		n := min(chunk, len(r.audio)-sent)
		b := s.deltaAudio(buf, r.audio[sent:sent+n], r.law)
		sent += n
		s.mu.Lock()
		if i := s.findLocked(r.itemID); i >= 0 { // a truncate may come before the response ends
			s.items[i].pcm = r.audio[:sent]
		}
		s.st.Responses[r.rec].Samples = sent
		s.notify()
		s.mu.Unlock()
		evID = appendID(evID[:0], "event", s.h.ids.Add(1))
		ev = appendDelta(ev[:0], deltaType, r.id, r.itemID, evID, b)
		s.write(ev)
	}
	return sent
}

// finish sends r's closing events, completed or cancelled (r.reason), with
// the item holding the sent samples of its audio.
func (s *Session) finish(r *response, prev any, sent int, transcript string) {
	s.mu.Lock()
	reason := r.reason
	if i := s.findLocked(r.itemID); i >= 0 {
		s.items[i].pcm = r.audio[:sent]
	}
	s.mu.Unlock()
	status, itemStatus, details := "completed", "completed", any(nil)
	if reason != "" {
		status, itemStatus = "cancelled", "incomplete"
		details = map[string]any{"type": "cancelled", "reason": reason}
	}
	final := s.replyItem(r, itemStatus, transcript)
	s.send(partEvent(r, "type", s.name("response.output_audio.done")))
	s.send(partEvent(r, "type", s.name("response.output_audio_transcript.done"), "transcript", transcript))
	s.send(partEvent(r, "type", "response.content_part.done", "part", map[string]any{"type": "audio", "transcript": transcript}))
	s.send(map[string]any{"type": "response.output_item.done", "response_id": r.id, "output_index": 0, "item": final})
	if !s.h.cfg.Beta {
		s.send(map[string]any{"type": "conversation.item.done", "previous_item_id": prev, "item": final})
	}
	// Over before response.done says so: a response.create that answers
	// it must find no active response.
	s.mu.Lock()
	if s.active == r {
		s.active = nil
	}
	rec := &s.st.Responses[r.rec]
	rec.Status, rec.Reason = status, reason
	s.notify()
	s.mu.Unlock()
	s.send(map[string]any{"type": "response.done", "response": s.responseObject(r, status, details, []any{final})})
}

// toolLocked is the name of the session's first function tool, or "".
func (s *Session) toolLocked() string {
	tools, _ := s.st.Config["tools"].([]any)
	for _, t := range tools {
		if m, ok := t.(map[string]any); ok {
			if name, _ := m["name"].(string); name != "" {
				return name
			}
		}
	}
	return ""
}

// startToolCallLocked starts a response that calls tool name (its
// arguments: the duration of the last user turn), as a model does when
// its instructions and tools say so: the client answers with a
// function_call_output item and response.create.
func (s *Session) startToolCallLocked(name string) {
	ms := 0
	for i := len(s.items) - 1; i >= 0; i-- {
		if it := s.items[i]; it.role == "user" {
			ms = len(it.pcm) * 1000 / s.h.cfg.Rate
			break
		}
	}
	r := &response{id: s.h.id("resp"), itemID: s.h.id("item"), done: make(chan struct{}), rec: len(s.st.Responses)}
	s.active = r
	s.st.Responses = append(s.st.Responses, Response{ID: r.id, ItemID: r.itemID, Status: "in_progress", ToolCall: name})
	s.notify()
	prev := s.lastIDLocked()
	s.addItemLocked(&item{id: r.itemID, typ: "function_call"})
	callID := s.h.id("call")
	args := fmt.Sprintf(`{"turn_ms":%d}`, ms)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		obj := func(status, arguments string) map[string]any {
			return map[string]any{"id": r.itemID, "object": "realtime.item", "type": "function_call", "status": status,
				"name": name, "call_id": callID, "arguments": arguments}
		}
		s.send(map[string]any{"type": "response.created", "response": s.responseObject(r, "in_progress", nil, []any{})})
		s.send(map[string]any{"type": "response.output_item.added", "response_id": r.id, "output_index": 0, "item": obj("in_progress", "")})
		s.sendItemAdded(prev, obj("in_progress", ""), false)
		base := map[string]any{"response_id": r.id, "item_id": r.itemID, "output_index": 0, "call_id": callID}
		delta := map[string]any{"type": "response.function_call_arguments.delta", "delta": args}
		done := map[string]any{"type": "response.function_call_arguments.done", "arguments": args, "name": name}
		for k, v := range base {
			delta[k], done[k] = v, v
		}
		s.send(delta)
		s.send(done)
		final := obj("completed", args)
		s.send(map[string]any{"type": "response.output_item.done", "response_id": r.id, "output_index": 0, "item": final})
		if !s.h.cfg.Beta {
			s.send(map[string]any{"type": "conversation.item.done", "previous_item_id": prev, "item": final})
		}
		s.mu.Lock() // over before response.done says so, as in respond
		if s.active == r {
			s.active = nil
		}
		s.st.Responses[r.rec].Status = "completed"
		s.notify()
		s.mu.Unlock()
		s.send(map[string]any{"type": "response.done", "response": s.responseObject(r, "completed", nil, []any{final})})
	}()
}
