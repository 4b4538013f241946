package refserver

// One client's WebSocket: its State (what a test reads back), the bounds
// on what the client can make the server hold, and the read loop that
// hands each event to the handler.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rtcedge/rtcedge/backend/internal/readbuf"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// readLimit is the largest client event accepted: OpenAI takes appends of
// up to 15 MiB.
const readLimit = 16 << 20

// What one connection may make the server hold, whatever its client sends
// (docs/operations.md, "Per-call bounds"):
const (
	// appendChunk is the base64 an append is decoded by (a multiple of 4).
	appendChunk = 4 << 10
	// maxRecorded bounds State.Received and State.Errors; later entries
	// are not recorded.
	maxRecorded = 4096
	// maxItems bounds the conversation: the oldest item goes first.
	maxItems = 256
)

// State is what a session has received and decided, for tests. It is
// read under the session's lock (Session.Wait); never keep it.
type State struct {
	Received []string // types of the client events, in order (malformed ones as "")
	// Events are the client events other than appends exactly as they
	// arrived, in order, up to maxRecordedEvents: what a test checks the
	// edge let through.
	Events [][]byte
	// Input is every sample appended, PCM16 at the server's rate (up to
	// Config.RecordMs); InputSamples counts them all.
	Input        []int16
	InputSamples int64
	// InputDropped counts the samples the input buffer let go to stay
	// within Config.MaxInputMs.
	InputDropped int64
	Config       map[string]any // the effective session configuration
	// SpeechStarted and SpeechStopped are the audio_start_ms and
	// audio_end_ms of the VAD events sent.
	SpeechStarted, SpeechStopped []int
	Commits                      int // input buffers committed (by the client or the VAD)
	Responses                    []Response
	Truncated                    []Truncation
	// ToolOutputs are the function_call_output items created, in order.
	ToolOutputs []ToolOutput
	Errors      []string // codes of the error events sent (the first maxRecorded)
	Closed      bool     // the connection ended
}

// Response is one response the server generated.
type Response struct {
	ID, ItemID string
	Status     string // in_progress, completed or cancelled
	Reason     string // for a cancelled one: client_cancelled or turn_detected
	Samples    int    // reply audio sent, in samples at the server's rate
	ToolCall   string // the tool a function-call response called ("" for audio)
}

// ToolOutput is one function_call_output item a client created.
type ToolOutput struct {
	CallID, Output string
}

// Truncation is one conversation.item.truncate the server applied.
type Truncation struct {
	ItemID     string
	AudioEndMs int
}

// Session is one WebSocket connection: its conversation, input buffer, VAD
// and at most one active response.
type Session struct {
	ID    string
	Model string

	h       *Handler
	conn    *websocket.Conn
	log     *slog.Logger
	ctx     context.Context // ends with the connection
	cancel  context.CancelFunc
	stalled atomic.Bool
	wg      sync.WaitGroup // the responder

	mu       sync.Mutex
	st       State         // guarded by mu
	changed  chan struct{} // guarded by mu: closed and replaced on every change of st
	items    []*item       // guarded by mu: the conversation
	buf      []int16       // guarded by mu: the uncommitted input buffer
	bufStart int64         // guarded by mu: sample position of buf[0] in the session's input
	vad      vad           // guarded by mu
	active   *response     // guarded by mu
	// The session's G.711 formats (nil: PCM16; g711.go), guarded by mu
	// and written only by run's goroutine (session.update), which reads
	// them without the lock.
	inLaw, outLaw *g711.Law
	lastIn        int16   // owned by run's goroutine: the last G.711 sample appended, for upsampling
	in8           []int16 // owned by run's goroutine: an append's G.711 decoded

	// Owned by run's goroutine: the message read (released when it grew
	// over readbuf.Keep), one chunk of an append decoded.
	rbuf readbuf.Buffer
	raw  []byte
	pcm  []int16
}

type item struct {
	id, role string
	typ      string  // message, function_call or function_call_output
	pcm      []int16 // a user item's audio, or an assistant item's audio sent
}

type response struct {
	id, itemID string
	audio      []int16
	law        *g711.Law     // the session's output format when it started (nil: PCM16)
	done       chan struct{} // closed to cancel
	reason     string        // guarded by Session.mu
	rec        int           // index in State.Responses
}

func (h *Handler) newSession(conn *websocket.Conn, model string) *Session {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Session{ID: h.id("sess"), Model: model, h: h, conn: conn, ctx: ctx, cancel: cancel, changed: make(chan struct{})}
	s.log = h.log.With("session", s.ID)
	s.st.Config = s.defaultConfig()
	conn.SetReadLimit(readLimit)
	return s
}

// Wait blocks until cond holds for the session's state (checked now and
// after every change) or ctx ends. cond runs under the session's lock.
func (s *Session) Wait(ctx context.Context, cond func(*State) bool) error {
	for {
		s.mu.Lock()
		ok, ch := cond(&s.st), s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("session %s: %w", s.ID, ctx.Err())
		}
	}
}

// notify wakes the waiters; s.mu must be held.
func (s *Session) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Stall makes the session stop answering: pings get no pong, client
// events are ignored, nothing more is sent (a hung model server).
func (s *Session) Stall() { s.stalled.Store(true) }

// Kill drops the connection without a close handshake (a crashed server).
func (s *Session) Kill() {
	s.cancel()
	_ = s.conn.CloseNow()
}

// CloseWith ends the connection with a close frame (a server that hangs up).
func (s *Session) CloseWith(code websocket.StatusCode, reason string) {
	_ = s.conn.Close(code, reason)
}

func (s *Session) run() {
	defer func() {
		s.cancel()
		_ = s.conn.CloseNow()
		s.wg.Wait()
		s.release()
		s.h.forget(s)
		s.mu.Lock()
		s.st.Closed = true
		s.notify()
		s.mu.Unlock()
	}()
	s.send(map[string]any{"type": "session.created", "session": s.st.Config}) // st.Config only changes on this goroutine
	for {
		typ, r, err := s.conn.Reader(s.ctx)
		var data []byte
		if err == nil {
			data, err = s.rbuf.Read(r, readLimit)
		}
		if err != nil {
			return
		}
		if s.stalled.Load() {
			continue
		}
		if typ != websocket.MessageText {
			s.sendError("", "invalid_request_error", "invalid_event", "", "Binary messages are not supported; send JSON text.")
			continue
		}
		s.handle(data)
		s.rbuf.Release()
	}
}

// release drops what a closed session holds beyond its State: the input
// buffer, the conversation and the read buffers.
func (s *Session) release() {
	s.rbuf.Drop()
	s.raw, s.pcm = nil, nil
	s.mu.Lock()
	s.buf, s.items = nil, nil
	s.mu.Unlock()
}

// clientEvent is the union of the client events' fields the server reads.
type clientEvent struct {
	Type         string          `json:"type"`
	EventID      string          `json:"event_id"`
	Session      json.RawMessage `json:"session"`
	Audio        *string         `json:"audio"`
	ItemID       string          `json:"item_id"`
	ContentIndex int             `json:"content_index"`
	AudioEndMs   *int            `json:"audio_end_ms"`
	ResponseID   string          `json:"response_id"`
	Item         *struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		CallID  string `json:"call_id"`
		Output  string `json:"output"`
		Content []struct {
			Type  string `json:"type"`
			Audio string `json:"audio"`
		} `json:"content"`
	} `json:"item"`
}

// handle decodes one client event and acts on it. data is only valid
// during the call.
func (s *Session) handle(data []byte) {
	if ev, ok := scanAppend(data); ok { // the hot event, without encoding/json
		s.record(appendType)
		s.appendAudio(ev)
		return
	}
	s.recordEvent(data)
	var ev clientEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		s.record("")
		s.sendError("", "invalid_request_error", "invalid_json", "", "The event is not valid JSON: "+err.Error())
		return
	}
	s.record(ev.Type)
	switch ev.Type {
	case "session.update":
		s.sessionUpdate(ev)
	case appendType:
		a := appendEvent{eventID: []byte(ev.EventID), hasAudio: ev.Audio != nil}
		if ev.Audio != nil {
			a.audio = []byte(*ev.Audio)
		}
		s.appendAudio(a)
	case "input_audio_buffer.commit":
		s.mu.Lock()
		if len(s.buf) < s.h.cfg.Rate/10 {
			ms := len(s.buf) * 1000 / s.h.cfg.Rate
			s.mu.Unlock()
			s.sendError(ev.EventID, "invalid_request_error", "input_audio_buffer_commit_empty", "",
				fmt.Sprintf("Error committing input audio buffer: buffer too small. Expected at least 100ms of audio, but buffer only has %dms of audio.", ms))
			return
		}
		s.commitLocked(s.bufStart, s.h.id("item"), false)
		s.mu.Unlock()
	case "input_audio_buffer.clear":
		s.mu.Lock()
		s.bufStart += int64(len(s.buf))
		s.buf = s.buf[:0]
		s.vad.reset()
		s.mu.Unlock()
		s.send(map[string]any{"type": "input_audio_buffer.cleared"})
	case "conversation.item.create":
		s.itemCreate(ev)
	case "conversation.item.delete":
		s.mu.Lock()
		i := s.findLocked(ev.ItemID)
		if i >= 0 {
			s.items = append(s.items[:i], s.items[i+1:]...)
		}
		s.mu.Unlock()
		if i < 0 {
			s.sendError(ev.EventID, "invalid_request_error", "item_not_found", "item_id", fmt.Sprintf("Item with item_id not found: %s", ev.ItemID))
			return
		}
		s.send(map[string]any{"type": "conversation.item.deleted", "item_id": ev.ItemID})
	case "conversation.item.truncate":
		s.truncate(ev)
	case "response.create":
		s.mu.Lock()
		busy := s.active != nil
		if !busy {
			s.startLocked()
		}
		s.mu.Unlock()
		if busy {
			s.sendError(ev.EventID, "invalid_request_error", "conversation_already_has_active_response", "",
				"Conversation already has an active response in progress.")
		}
	case "response.cancel":
		s.mu.Lock()
		r := s.active
		if r != nil && (ev.ResponseID == "" || ev.ResponseID == r.id) {
			s.cancelLocked(r, "client_cancelled")
		}
		s.mu.Unlock()
		if r == nil || (ev.ResponseID != "" && ev.ResponseID != r.id) {
			s.sendError(ev.EventID, "invalid_request_error", "response_cancel_not_active", "",
				"Cancellation failed: no active response found.")
		}
	case "":
		s.sendError(ev.EventID, "invalid_request_error", "missing_required_parameter", "type", "Missing required parameter: 'type'.")
	default:
		s.sendError(ev.EventID, "invalid_request_error", "invalid_value", "type", fmt.Sprintf("Invalid value: '%s'. This event type is not supported.", ev.Type))
	}
}

// maxRecordedEvents bounds State.Events.
const maxRecordedEvents = 1024

// recordEvent keeps a copy of a client event in State.Events.
func (s *Session) recordEvent(data []byte) {
	s.mu.Lock()
	if len(s.st.Events) < maxRecordedEvents {
		s.st.Events = append(s.st.Events, bytes.Clone(data))
	}
	s.mu.Unlock()
}

func (s *Session) record(typ string) {
	s.mu.Lock()
	if len(s.st.Received) < maxRecorded {
		s.st.Received = append(s.st.Received, typ)
	}
	s.notify()
	s.mu.Unlock()
}

// appendAudio appends an event's audio to the input buffer, decoding it
// into the session's reused buffers (run's goroutine only).
func (s *Session) appendAudio(ev appendEvent) {
	if !ev.hasAudio {
		s.sendError(string(ev.eventID), "invalid_request_error", "missing_required_parameter", "audio", "Missing required parameter: 'audio'.")
		return
	}
	audio := ev.audio
	if len(audio)%4 != 0 {
		s.sendError(string(ev.eventID), "invalid_request_error", "invalid_value", "audio", "Invalid 'audio': expected base64-encoded PCM16 audio.")
		return
	}
	for len(audio) > 0 {
		k := min(len(audio), appendChunk)
		if cap(s.raw) < appendChunk/4*3 {
			s.raw, s.pcm = make([]byte, appendChunk/4*3), make([]int16, appendChunk/4*3/2)
		}
		n, err := base64.StdEncoding.Decode(s.raw[:cap(s.raw)], audio[:k])
		raw := s.raw[:n]
		if err == nil && s.inLaw != nil {
			s.appendPCM(s.upsample(raw))
			audio = audio[k:]
			continue
		}
		if err != nil || len(raw)%2 != 0 {
			s.sendError(string(ev.eventID), "invalid_request_error", "invalid_value", "audio", "Invalid 'audio': expected base64-encoded PCM16 audio.")
			return
		}
		audio = audio[k:]
		pcm := s.pcm[:len(raw)/2]
		for i := range pcm {
			pcm[i] = int16(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
		}
		s.appendPCM(pcm)
	}
}

// appendPCM appends samples to the input buffer, which keeps the newest
// Config.MaxInputMs (the oldest go first: the buffer's start moves on).
func (s *Session) appendPCM(pcm []int16) {
	s.mu.Lock()
	if limit := s.h.cfg.RecordMs * s.h.cfg.Rate / 1000; len(s.st.Input) < limit {
		s.st.Input = append(s.st.Input, pcm[:min(len(pcm), limit-len(s.st.Input))]...)
	}
	s.st.InputSamples += int64(len(pcm))
	s.buf = append(s.buf, pcm...)
	if over := len(s.buf) - s.h.cfg.MaxInputMs*s.h.cfg.Rate/1000; over > 0 {
		s.buf = s.buf[:copy(s.buf, s.buf[over:])]
		s.bufStart += int64(over)
		s.st.InputDropped += int64(over)
	}
	if td := s.turnDetection(); td != nil {
		s.vadLocked(pcm, td)
	} else {
		s.vad.reset()
		s.vad.pos = s.st.InputSamples
	}
	s.notify()
	s.mu.Unlock()
}

func (s *Session) itemCreate(ev clientEvent) {
	if ev.Item == nil {
		s.sendError(ev.EventID, "invalid_request_error", "missing_required_parameter", "item", "Missing required parameter: 'item'.")
		return
	}
	it := &item{id: ev.Item.ID, role: ev.Item.Role, typ: ev.Item.Type}
	if it.id == "" {
		it.id = s.h.id("item")
	}
	if it.typ == "function_call_output" {
		if ev.Item.CallID == "" {
			s.sendError(ev.EventID, "invalid_request_error", "missing_required_parameter", "item.call_id", "Missing required parameter: 'item.call_id'.")
			return
		}
		s.mu.Lock()
		s.st.ToolOutputs = append(s.st.ToolOutputs, ToolOutput{CallID: ev.Item.CallID, Output: ev.Item.Output})
		s.notify()
		s.mu.Unlock()
	}
	for _, c := range ev.Item.Content {
		if c.Type == "input_audio" && c.Audio != "" {
			if raw, err := base64.StdEncoding.DecodeString(c.Audio); err == nil {
				raw = raw[:min(len(raw), 2*s.h.cfg.MaxInputMs*s.h.cfg.Rate/1000)]
				for i := 0; i+1 < len(raw); i += 2 {
					it.pcm = append(it.pcm, int16(uint16(raw[i])|uint16(raw[i+1])<<8))
				}
			}
		}
	}
	var obj map[string]any
	_ = json.Unmarshal(mustJSON(ev.Item), &obj)
	obj["id"], obj["object"], obj["status"] = it.id, "realtime.item", "completed"
	s.mu.Lock()
	prev := s.lastIDLocked()
	s.addItemLocked(it)
	s.mu.Unlock()
	s.sendItemAdded(prev, obj, true)
}

func (s *Session) truncate(ev clientEvent) {
	if ev.AudioEndMs == nil || *ev.AudioEndMs < 0 {
		s.sendError(ev.EventID, "invalid_request_error", "missing_required_parameter", "audio_end_ms", "Missing required parameter: 'audio_end_ms'.")
		return
	}
	end := *ev.AudioEndMs
	s.mu.Lock()
	i := s.findLocked(ev.ItemID)
	var code, msg string
	switch {
	case i < 0:
		code, msg = "item_not_found", fmt.Sprintf("Item with item_id not found: %s", ev.ItemID)
	case s.items[i].role != "assistant":
		code, msg = "invalid_value", "Only assistant messages can be truncated."
	case end > len(s.items[i].pcm)*1000/s.h.cfg.Rate:
		code, msg = "invalid_value", fmt.Sprintf("Audio content of %dms is already shorter than %dms", len(s.items[i].pcm)*1000/s.h.cfg.Rate, end)
	default:
		it := s.items[i]
		it.pcm = it.pcm[:end*s.h.cfg.Rate/1000]
		s.st.Truncated = append(s.st.Truncated, Truncation{ItemID: it.id, AudioEndMs: end})
		s.notify()
	}
	s.mu.Unlock()
	if code != "" {
		s.sendError(ev.EventID, "invalid_request_error", code, "item_id", msg)
		return
	}
	s.send(map[string]any{"type": "conversation.item.truncated", "item_id": ev.ItemID, "content_index": ev.ContentIndex, "audio_end_ms": end})
}

func (s *Session) findLocked(id string) int {
	for i, it := range s.items {
		if it.id == id {
			return i
		}
	}
	return -1
}

func (s *Session) lastIDLocked() any {
	if len(s.items) == 0 {
		return nil
	}
	return s.items[len(s.items)-1].id
}

// commitLocked turns the input buffer from sample position from into a
// user item; byVAD commits also start a response if the session asks.
func (s *Session) commitLocked(from int64, itemID string, byVAD bool) {
	skip := max(0, min(int(from-s.bufStart), len(s.buf)))
	it := &item{id: itemID, role: "user", pcm: append([]int16(nil), s.buf[skip:]...)}
	prev := s.lastIDLocked()
	s.addItemLocked(it)
	s.bufStart += int64(len(s.buf))
	s.buf = s.buf[:0]
	s.st.Commits++
	s.notify()
	obj := map[string]any{"id": it.id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
		"content": []any{map[string]any{"type": "input_audio", "transcript": nil}}}
	// Sent under the lock so the events of one commit stay in order with
	// a response it starts.
	s.send(map[string]any{"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": it.id})
	s.sendItemAdded(prev, obj, true)
	if byVAD && s.active == nil {
		if td := s.turnDetection(); td != nil && td.createResponse {
			s.startLocked()
		}
	}
}

// addItemLocked adds it to the conversation. Only the newest item of a
// role keeps its audio (what a reply parrots, or a truncate cuts), and the
// conversation keeps its newest maxItems items; mu held.
func (s *Session) addItemLocked(it *item) {
	if len(it.pcm) > 0 || it.role == "assistant" {
		for _, o := range s.items {
			if o.role == it.role {
				o.pcm = nil
			}
		}
	}
	if len(s.items) >= maxItems {
		copy(s.items, s.items[1:])
		s.items[len(s.items)-1] = nil
		s.items = s.items[:len(s.items)-1]
	}
	s.items = append(s.items, it)
}

// sendItemAdded announces an item: conversation.item.added (and .done when
// complete) in GA, conversation.item.created in beta.
func (s *Session) sendItemAdded(prev any, obj map[string]any, complete bool) {
	if s.h.cfg.Beta {
		s.send(map[string]any{"type": "conversation.item.created", "previous_item_id": prev, "item": obj})
		return
	}
	s.send(map[string]any{"type": "conversation.item.added", "previous_item_id": prev, "item": obj})
	if complete {
		s.send(map[string]any{"type": "conversation.item.done", "previous_item_id": prev, "item": obj})
	}
}

// send writes one server event, with a fresh event_id.
func (s *Session) send(ev map[string]any) {
	if s.stalled.Load() {
		return
	}
	ev["event_id"] = s.h.id("event")
	data, err := json.Marshal(ev)
	if err != nil {
		s.log.Error("marshal event", "type", ev["type"], "err", err)
		return
	}
	s.write(data)
}

// write sends one encoded server event.
func (s *Session) write(data []byte) {
	if s.stalled.Load() {
		return
	}
	_ = s.conn.Write(s.ctx, websocket.MessageText, data) // a failed write ends the connection; the reader sees it
}

func (s *Session) sendError(eventID, typ, code, param, msg string) {
	s.mu.Lock()
	if len(s.st.Errors) < maxRecorded {
		s.st.Errors = append(s.st.Errors, code)
	}
	s.notify()
	s.mu.Unlock()
	e := map[string]any{"type": typ, "code": code, "message": msg, "param": nil, "event_id": nil}
	if param != "" {
		e["param"] = param
	}
	if eventID != "" {
		e["event_id"] = eventID
	}
	s.send(map[string]any{"type": "error", "error": e})
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// sleepUntil waits until t or until done or the session ends; it reports
// whether t was reached.
func (s *Session) sleepUntil(t time.Time, done <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-done:
	case <-s.ctx.Done():
	}
	return false
}
