package refserver

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"
)

// TestScanAppend: the fast path takes an append exactly as json.Unmarshal
// reads it, and leaves everything it is not sure of to json.Unmarshal.
func TestScanAppend(t *testing.T) {
	audio := base64.StdEncoding.EncodeToString([]byte{1, 2, 3, 4})
	cases := []struct {
		msg  string
		fast bool
	}{
		{`{"type":"input_audio_buffer.append","audio":"` + audio + `"}`, true},
		{` { "event_id" : "e1" , "audio":"` + audio + `", "type":"input_audio_buffer.append" } `, true},
		{`{"type":"input_audio_buffer.append","audio":null}`, true},
		{`{"type":"input_audio_buffer.append"}`, true},
		{`{"type":"input_audio_buffer.append","audio":"!!"}`, true},
		{`{"audio":"` + audio + `"}`, false},                                                // no type
		{`{"type":"input_audio_buffer.commit"}`, false},                                     // another event
		{`{"type":"input_audio_buffer.append","audio":"a\u0041"}`, false},                   // an escape
		{`{"type":"input_audio_buffer.append","Audio":"` + audio + `"}`, false},             // json's case-insensitive keys
		{`{"type":"input_audio_buffer.append","audio":"x","audio":"` + audio + `"}`, false}, // a repeated key
		{`{"type":"input_audio_buffer.append","extra":1}`, false},
		{`{"type":"input_audio_buffer.append","audio":"` + audio + `"}x`, false}, // trailing data
		{`{"type":"input_audio_buffer.append","audio":"` + audio + `"`, false},   // truncated
		{`{"type":"input_audio_buffer.append",}`, false},
		{`{"type":"input_audio_buffer.append","event_id":null}`, false},
		{`{"type":"input_audio_buffer.append","audio":"é"}`, false},
	}
	for _, tc := range cases {
		ev, ok := scanAppend([]byte(tc.msg))
		if ok != tc.fast {
			t.Errorf("%s: fast path %v, want %v", tc.msg, ok, tc.fast)
			continue
		}
		if !ok {
			continue
		}
		var want clientEvent
		if err := json.Unmarshal([]byte(tc.msg), &want); err != nil {
			t.Errorf("%s: the fast path took what json rejects: %v", tc.msg, err)
			continue
		}
		if want.Type != appendType || string(ev.eventID) != want.EventID || ev.hasAudio != (want.Audio != nil) ||
			(want.Audio != nil && string(ev.audio) != *want.Audio) {
			t.Errorf("%s: fast %q %q %v, json %+v", tc.msg, ev.eventID, ev.audio, ev.hasAudio, want)
		}
	}
}

// TestAppendDelta: a delta event is byte for byte what send would marshal.
func TestAppendDelta(t *testing.T) {
	h := &Handler{}
	pcm := []byte{0, 1, 2, 3, 250, 251, 252}
	for _, n := range []uint64{0, 7, 999999, 1000000, 12345678} {
		id := appendID(nil, "event", n)
		if want := fmt.Sprintf("%s_%06d", "event", n); string(id) != want {
			t.Fatalf("appendID %q, want %q", id, want)
		}
		m := map[string]any{"response_id": "resp_000001", "item_id": "item_000002", "output_index": 0, "content_index": 0,
			"type": "response.output_audio.delta", "delta": base64.StdEncoding.EncodeToString(pcm), "event_id": string(id)}
		want, _ := json.Marshal(m)
		got := appendDelta(nil, "response.output_audio.delta", "resp_000001", "item_000002", id, pcm)
		if string(got) != string(want) {
			t.Fatalf("appendDelta\n%s\nwant\n%s", got, want)
		}
	}
	if id := h.id("sess"); id != "sess_000001" {
		t.Fatalf("id %q", id)
	}
}

// BenchmarkAppend: one input_audio_buffer.append of 20 ms at 24 kHz,
// decoded and appended (the session's hot path).
func BenchmarkAppend(b *testing.B) {
	h, err := NewHandler(Config{RecordMs: 1})
	if err != nil {
		b.Fatal(err)
	}
	s := &Session{h: h, changed: make(chan struct{})}
	s.st.Config = s.defaultConfig()
	msg := []byte(`{"type":"input_audio_buffer.append","audio":"` + base64.StdEncoding.EncodeToString(make([]byte, 960)) + `"}`)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.handle(msg)
		if i%100 == 0 {
			s.mu.Lock()
			s.buf, s.st.Received = s.buf[:0], s.st.Received[:0]
			s.mu.Unlock()
		}
	}
}
