package echo

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend"
)

type sink struct {
	audio  [][]byte
	events [][]byte
}

func (s *sink) WriteAudio(p []byte, _ time.Duration) error {
	s.audio = append(s.audio, append([]byte(nil), p...))
	return nil
}

func (s *sink) SendEvent(b []byte) error {
	s.events = append(s.events, b)
	return nil
}

func TestEcho(t *testing.T) {
	out := &sink{}
	h, err := Backend{}.Open(context.Background(), backend.SessionInfo{ID: "rtc_x"}, out)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.Audio([]byte{1, 2, 3}, 20*time.Millisecond)
	if len(out.audio) != 1 || string(out.audio[0]) != "\x01\x02\x03" {
		t.Fatalf("audio not echoed unchanged: %v", out.audio)
	}
	h.Event([]byte(`{"type":"response.create"}`))
	h.Event([]byte("plain text"))
	if len(out.events) != 2 {
		t.Fatalf("got %d replies, want 2", len(out.events))
	}
	var r1, r2 Reply
	if err := json.Unmarshal(out.events[0], &r1); err != nil || r1.Type != "rtcedge.echo" || r1.Session != "rtc_x" || string(r1.Echo) != `{"type":"response.create"}` {
		t.Errorf("JSON event reply %s (%v)", out.events[0], err)
	}
	if err := json.Unmarshal(out.events[1], &r2); err != nil || r2.Text != "plain text" || r2.Echo != nil {
		t.Errorf("text event reply %s (%v)", out.events[1], err)
	}
}
