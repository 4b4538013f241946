package refserver_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/backend/realtime/reftest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rate = 24000

// client is a test's side of one WebSocket; events arrive on ev.
type client struct {
	t    *testing.T
	conn *websocket.Conn
	ev   chan map[string]any
}

func dial(t *testing.T, srv *refserver.Server, header http.Header) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, srv.URL()+"?model=test-model", &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadLimit(16 << 20)
	c := &client{t: t, conn: conn, ev: make(chan map[string]any, 4096)}
	go func() {
		defer close(c.ev)
		for {
			_, data, err := conn.Read(context.Background())
			if err != nil {
				return
			}
			var m map[string]any
			if err := json.Unmarshal(data, &m); err != nil {
				t.Errorf("server sent bad JSON %q", data)
				return
			}
			c.ev <- m
		}
	}()
	t.Cleanup(func() { _ = conn.CloseNow() })
	return c
}

func (c *client) send(v any) {
	c.t.Helper()
	b, _ := json.Marshal(v)
	if err := c.conn.Write(context.Background(), websocket.MessageText, b); err != nil {
		c.t.Fatal(err)
	}
}

// next returns the next event, skipping none.
func (c *client) next() map[string]any {
	c.t.Helper()
	select {
	case m, ok := <-c.ev:
		if !ok {
			c.t.Fatal("connection closed")
		}
		if m["event_id"] == nil || m["event_id"] == "" {
			c.t.Errorf("event without event_id: %v", m)
		}
		return m
	case <-time.After(10 * time.Second):
		c.t.Fatal("no event within 10s")
	}
	return nil
}

// until reads events up to and including one of type typ and returns them.
func (c *client) until(typ string) []map[string]any {
	c.t.Helper()
	var seen []map[string]any
	for {
		m := c.next()
		seen = append(seen, m)
		if m["type"] == typ {
			return seen
		}
	}
}

func types(evs []map[string]any) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e["type"].(string))
	}
	return out
}

func tone(hz float64, ms int) []int16 {
	pcm := make([]int16, ms*rate/1000)
	for i := range pcm {
		pcm[i] = int16(10000 * math.Sin(2*math.Pi*hz*float64(i)/rate))
	}
	return pcm
}

func b64(pcm []int16) string {
	b := make([]byte, 2*len(pcm))
	for i, v := range pcm {
		b[2*i], b[2*i+1] = byte(v), byte(uint16(v)>>8)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func unb64(t *testing.T, s string) []int16 {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	pcm := make([]int16, len(b)/2)
	for i := range pcm {
		pcm[i] = int16(uint16(b[2*i]) | uint16(b[2*i+1])<<8)
	}
	return pcm
}

// appendAudio sends pcm in 20 ms appends, as a streaming client does.
func (c *client) appendAudio(pcm []int16) {
	for len(pcm) > 0 {
		n := min(len(pcm), rate/50)
		c.send(map[string]any{"type": "input_audio_buffer.append", "audio": b64(pcm[:n])})
		pcm = pcm[n:]
	}
}

// names are the event names of one protocol flavour.
type names struct {
	beta                                                bool
	itemAdded, itemDone, audioDelta, audioDone, trDelta string
}

var flavours = []names{
	{false, "conversation.item.added", "conversation.item.done", "response.output_audio.delta", "response.output_audio.done", "response.output_audio_transcript.delta"},
	{true, "conversation.item.created", "conversation.item.created", "response.audio.delta", "response.audio.done", "response.audio_transcript.delta"},
}

func flavourName(n names) string {
	if n.beta {
		return "beta"
	}
	return "ga"
}

// reply collects a response's audio and its closing response.done.
func reply(t *testing.T, c *client, n names) (audio []int16, done map[string]any, seen []string) {
	t.Helper()
	for {
		m := c.next()
		typ := m["type"].(string)
		seen = append(seen, typ)
		switch typ {
		case n.audioDelta:
			audio = append(audio, unb64(t, m["delta"].(string))...)
		case "response.done":
			return audio, m, seen
		case "error":
			t.Fatalf("error event %v", m)
		}
	}
}

func TestSessionCreatedAndUpdate(t *testing.T) {
	for _, n := range flavours {
		t.Run(flavourName(n), func(t *testing.T) {
			srv := reftest.Start(t, refserver.Config{Beta: n.beta})
			c := dial(t, srv, nil)
			created := c.next()
			if created["type"] != "session.created" {
				t.Fatalf("first event %v", created["type"])
			}
			sess := created["session"].(map[string]any)
			if sess["model"] != "test-model" {
				t.Errorf("model %v", sess["model"])
			}
			if n.beta {
				if sess["input_audio_format"] != "pcm16" || sess["turn_detection"] == nil {
					t.Errorf("beta session %v", sess)
				}
				c.send(map[string]any{"type": "session.update", "session": map[string]any{"input_audio_format": "opus"}}) // G.711 is taken (g711.go)
			} else {
				f := sess["audio"].(map[string]any)["input"].(map[string]any)["format"].(map[string]any)
				if f["type"] != "audio/pcm" || f["rate"] != float64(rate) {
					t.Errorf("GA input format %v", f)
				}
				// GA requires session.type.
				c.send(map[string]any{"type": "session.update", "event_id": "ev1", "session": map[string]any{"instructions": "x"}})
				if e := c.next(); e["type"] != "error" || e["error"].(map[string]any)["param"] != "session.type" || e["error"].(map[string]any)["event_id"] != "ev1" {
					t.Errorf("update without type: %v", e)
				}
				c.send(map[string]any{"type": "session.update", "session": map[string]any{"type": "realtime",
					"audio": map[string]any{"input": map[string]any{"format": map[string]any{"type": "audio/pcm", "rate": 16000}}}}})
			}
			if e := c.next(); e["type"] != "error" || e["error"].(map[string]any)["code"] != "invalid_value" {
				t.Errorf("unsupported format: %v", e)
			}
			upd := map[string]any{"instructions": "be brief", "turn_detection": nil}
			if !n.beta {
				upd = map[string]any{"type": "realtime", "instructions": "be brief", "audio": map[string]any{"input": map[string]any{"turn_detection": nil}}}
			}
			c.send(map[string]any{"type": "session.update", "session": upd})
			updated := c.next()
			if updated["type"] != "session.updated" {
				t.Fatalf("got %v", updated)
			}
			s := updated["session"].(map[string]any)
			if s["instructions"] != "be brief" {
				t.Errorf("instructions not applied: %v", s)
			}
			if !n.beta && s["audio"].(map[string]any)["input"].(map[string]any)["format"] == nil {
				t.Errorf("merge dropped the input format: %v", s)
			}
		})
	}
}

// TestServerVADTurn: silence, a 1 s tone and silence make speech_started,
// speech_stopped, a commit and a parrot reply of the committed audio.
func TestServerVADTurn(t *testing.T) {
	for _, n := range flavours {
		t.Run(flavourName(n), func(t *testing.T) {
			srv := reftest.Start(t, refserver.Config{Beta: n.beta})
			c := dial(t, srv, nil)
			c.next() // session.created
			input := append(append(make([]int16, 600*rate/1000), tone(440, 1000)...), make([]int16, 700*rate/1000)...)
			c.appendAudio(input)
			started := c.until("input_audio_buffer.speech_started")
			ss := started[len(started)-1]
			if ms := ss["audio_start_ms"].(float64); ms < 290 || ms > 310 { // onset 600 - prefix 300
				t.Errorf("audio_start_ms %v, want 300", ms)
			}
			stopped := c.next()
			if stopped["type"] != "input_audio_buffer.speech_stopped" || stopped["item_id"] != ss["item_id"] {
				t.Fatalf("got %v", stopped)
			}
			if ms := stopped["audio_end_ms"].(float64); ms < 2090 || ms > 2120 { // tone end 1600 + 500 silence
				t.Errorf("audio_end_ms %v, want ≈2100", ms)
			}
			committed := c.next()
			if committed["type"] != "input_audio_buffer.committed" || committed["item_id"] != ss["item_id"] {
				t.Fatalf("got %v", committed)
			}
			if a := c.next(); a["type"] != n.itemAdded {
				t.Fatalf("got %v, want %s", a["type"], n.itemAdded)
			}
			audio, done, seen := reply(t, c, n)
			resp := done["response"].(map[string]any)
			if resp["status"] != "completed" {
				t.Errorf("status %v", resp["status"])
			}
			// The parrot replies with the committed audio: from audio_start_ms to the stop.
			want := input[300*rate/1000 : 2100*rate/1000]
			if d := len(audio) - len(want); d < -rate/50 || d > rate/50 {
				t.Errorf("reply %d samples, want %d", len(audio), len(want))
			}
			for i := range min(len(audio), len(want)) {
				if audio[i] != want[i] {
					t.Fatalf("reply differs from the committed audio at sample %d", i)
				}
			}
			if !contains(seen, n.trDelta) || !contains(seen, n.audioDone) || !contains(seen, "response.output_item.added") ||
				!contains(seen, "response.content_part.added") || contains(seen, "conversation.item.done") == n.beta {
				t.Errorf("response events %v", seen)
			}
			sess := srv.Sessions()[0]
			_ = sess.Wait(context.Background(), func(st *refserver.State) bool { return len(st.Responses) == 1 && st.Responses[0].Status == "completed" })
		})
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestManualCommitCancelTruncate(t *testing.T) {
	for _, n := range flavours {
		t.Run(flavourName(n), func(t *testing.T) {
			srv := reftest.Start(t, refserver.Config{Beta: n.beta, Speed: 2})
			c := dial(t, srv, nil)
			c.next()
			off := map[string]any{"turn_detection": nil}
			if !n.beta {
				off = map[string]any{"type": "realtime", "audio": map[string]any{"input": map[string]any{"turn_detection": nil}}}
			}
			c.send(map[string]any{"type": "session.update", "session": off})
			c.until("session.updated")

			c.appendAudio(tone(440, 60))
			c.send(map[string]any{"type": "input_audio_buffer.commit", "event_id": "c1"})
			if e := c.next(); e["error"].(map[string]any)["code"] != "input_audio_buffer_commit_empty" {
				t.Errorf("short commit: %v", e)
			}
			c.appendAudio(tone(440, 2000))
			c.send(map[string]any{"type": "input_audio_buffer.commit"})
			c.until(n.itemDone)
			c.send(map[string]any{"type": "response.cancel"})
			if e := c.next(); e["error"].(map[string]any)["code"] != "response_cancel_not_active" {
				t.Errorf("idle cancel: %v", e)
			}

			// A reply of 2 s at twice real time: cancel it after its first delta.
			c.send(map[string]any{"type": "response.create"})
			c.until(n.audioDelta)
			c.send(map[string]any{"type": "response.cancel"})
			_, done, _ := reply(t, c, n)
			resp := done["response"].(map[string]any)
			details, _ := resp["status_details"].(map[string]any)
			if resp["status"] != "cancelled" || details["reason"] != "client_cancelled" {
				t.Fatalf("cancelled response %v", resp)
			}
			sess := srv.Sessions()[0]
			var itemID string
			var sent int
			_ = sess.Wait(context.Background(), func(st *refserver.State) bool {
				r := st.Responses[len(st.Responses)-1]
				itemID, sent = r.ItemID, r.Samples
				return r.Status == "cancelled"
			})
			if sent >= 2*rate {
				t.Errorf("cancel sent all %d samples", sent)
			}

			// Truncate what was sent: past its end is an error.
			c.send(map[string]any{"type": "conversation.item.truncate", "item_id": itemID, "content_index": 0, "audio_end_ms": sent*1000/rate + 100})
			if e := c.next(); e["type"] != "error" {
				t.Errorf("truncate past the end: %v", e)
			}
			c.send(map[string]any{"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 0})
			if e := c.next(); e["error"].(map[string]any)["code"] != "item_not_found" {
				t.Errorf("truncate unknown item: %v", e)
			}
			c.send(map[string]any{"type": "conversation.item.truncate", "item_id": itemID, "content_index": 0, "audio_end_ms": 50})
			if e := c.next(); e["type"] != "conversation.item.truncated" || e["audio_end_ms"] != 50.0 || e["item_id"] != itemID {
				t.Errorf("truncate: %v", e)
			}
			_ = sess.Wait(context.Background(), func(st *refserver.State) bool { return len(st.Truncated) == 1 })
		})
	}
}

// TestBargeIn: speech while a reply plays cancels it (turn_detected).
func TestBargeIn(t *testing.T) {
	srv := reftest.Start(t, refserver.Config{Speed: 1})
	c := dial(t, srv, nil)
	c.next()
	c.send(map[string]any{"type": "response.create"}) // no audio yet: a 1 s tone
	c.until("response.output_audio.delta")
	c.appendAudio(tone(300, 200))
	_, done, _ := reply(t, c, flavours[0])
	details, _ := done["response"].(map[string]any)["status_details"].(map[string]any)
	if details["reason"] != "turn_detected" {
		t.Errorf("barge-in: %v", done["response"])
	}
}

func TestMalformedAndUnknownEvents(t *testing.T) {
	srv := reftest.Start(t, refserver.Config{})
	c := dial(t, srv, nil)
	c.next()
	for _, tc := range []struct{ raw, code string }{
		{`{"type": "session.update", `, "invalid_json"},
		{`[1,2]`, "invalid_json"},
		{`{"type": "no.such.event"}`, "invalid_value"},
		{`{"event_id": "x"}`, "missing_required_parameter"},
		{`{"type": "input_audio_buffer.append", "audio": "!!"}`, "invalid_value"},
	} {
		if err := c.conn.Write(context.Background(), websocket.MessageText, []byte(tc.raw)); err != nil {
			t.Fatal(err)
		}
		e := c.next()
		if e["type"] != "error" || e["error"].(map[string]any)["code"] != tc.code || e["error"].(map[string]any)["type"] != "invalid_request_error" {
			t.Errorf("%s: got %v, want code %s", tc.raw, e, tc.code)
		}
	}
	c.send(map[string]any{"type": "input_audio_buffer.clear"})
	if e := c.next(); e["type"] != "input_audio_buffer.cleared" {
		t.Errorf("session broken after errors: %v", e)
	}
}

func TestAuth(t *testing.T) {
	srv := reftest.Start(t, refserver.Config{APIKey: "sk-test"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, h := range []http.Header{nil, {"Authorization": {"Bearer wrong"}}} {
		_, resp, err := websocket.Dial(ctx, srv.URL(), &websocket.DialOptions{HTTPHeader: h})
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("header %v: err %v resp %v", h, err, resp)
		}
	}
	c := dial(t, srv, http.Header{"Authorization": {"Bearer sk-test"}})
	if e := c.next(); e["type"] != "session.created" {
		t.Errorf("got %v", e)
	}
	conn, _, err := websocket.Dial(ctx, srv.URL(), &websocket.DialOptions{Subprotocols: []string{"realtime", "openai-insecure-api-key.sk-test"}})
	if err != nil {
		t.Fatalf("subprotocol key: %v", err)
	}
	_ = conn.CloseNow()
}

// TestToolCall: a session with tools answers a turn by calling its first
// tool (function_call item, arguments delta and done); after the client
// creates the function_call_output and asks for a response, the reply is
// audio again, and the output is recorded.
func TestToolCall(t *testing.T) {
	srv := reftest.Start(t, refserver.Config{})
	c := dial(t, srv, nil)
	c.until("session.created")
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"type": "realtime",
		"tools": []any{map[string]any{"type": "function", "name": "lookup", "parameters": map[string]any{"type": "object"}}}}})
	c.until("session.updated")
	c.send(map[string]any{"type": "response.create"})
	evs := c.until("response.done")
	var call map[string]any
	for _, ev := range evs {
		if ev["type"] == "response.function_call_arguments.done" {
			call = ev
		}
	}
	if call == nil || call["name"] != "lookup" || call["call_id"] == "" || call["arguments"] != `{"turn_ms":0}` {
		t.Fatalf("no call of the tool: %v", types(evs))
	}
	for _, ev := range evs {
		if ev["type"] == "response.output_audio.delta" {
			t.Fatalf("a tool call with audio: %v", types(evs))
		}
	}
	c.send(map[string]any{"type": "conversation.item.create", "item": map[string]any{"type": "function_call_output", "call_id": call["call_id"], "output": `{"ok":true}`}})
	c.send(map[string]any{"type": "response.create"})
	evs = c.until("response.done")
	if !contains(types(evs), "response.output_audio.delta") {
		t.Fatalf("after the tool's output, no audio reply: %v", types(evs))
	}
	sess := srv.Sessions()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sess.Wait(ctx, func(st *refserver.State) bool {
		return len(st.ToolOutputs) == 1 && st.ToolOutputs[0].CallID == call["call_id"] && st.ToolOutputs[0].Output == `{"ok":true}` &&
			len(st.Responses) == 2 && st.Responses[0].ToolCall == "lookup" && st.Responses[1].ToolCall == ""
	}); err != nil {
		t.Fatal(err)
	}
}
