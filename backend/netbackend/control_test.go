package netbackend

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend"
)

// player is a sink that is also the pod's backend.Player: it records the
// calls it gets.
type player struct {
	*sink
	pmu   sync.Mutex
	calls []string
}

func (p *player) record(s string) {
	p.pmu.Lock()
	p.calls = append(p.calls, s)
	p.pmu.Unlock()
	p.got <- struct{}{}
}

func (p *player) BeginItem(resp, item string) { p.record("begin " + resp + " " + item) }
func (p *player) EndResponse(resp string)     { p.record("end " + resp) }
func (p *player) SpeechStopped()              { p.record("speech_stopped") }
func (p *player) Clear(source string) (string, time.Duration, bool) {
	p.record("clear " + source)
	return "item_1", 420 * time.Millisecond, true
}

// TestControlFrames: a backend's item and response_done frames reach the
// pod's Player around the audio; a barge-in the pod acted on (the edge's,
// or the caller's output_audio_buffer.clear, which is not forwarded) and
// the edge's end of speech reach the backend as control frames.
func TestControlFrames(t *testing.T) {
	got := make(chan Control, 10)
	addr := startServer(t, func(_ context.Context, c *Conn) {
		_ = c.WriteControl(Control{Type: ControlItem, ResponseID: "resp_1", ItemID: "item_1"})
		_ = c.WriteAudio([]byte{0xf8, 1, 2}, 20*time.Millisecond)
		_ = c.WriteControl(Control{Type: ControlResponseDone, ResponseID: "resp_1"})
		for {
			typ, p, _, err := c.Read()
			if err != nil {
				return
			}
			if typ == FrameEvent {
				t.Errorf("the backend got event %s", p)
			}
			if typ == FrameControl {
				ctl, err := ParseControl(p)
				if err != nil {
					t.Error(err)
				}
				got <- ctl
			}
		}
	})
	p := &player{sink: newSink()}
	b := &Backend{Addr: addr, Logger: slog.Default()}
	h, err := b.Open(context.Background(), backend.SessionInfo{ID: "s1"}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p.wait(t, 3) // begin, audio, end
	p.pmu.Lock()
	if want := []string{"begin resp_1 item_1", "end resp_1"}; !slices.Equal(p.calls, want) {
		t.Errorf("player calls %v, want %v", p.calls, want)
	}
	p.pmu.Unlock()

	in, ok := h.(backend.Interrupter)
	if !ok {
		t.Fatal("the network backend's handler is not an Interrupter: it gets no edge barge-in")
	}
	in.Interrupted(backend.ClearEdge, "item_1", 420*time.Millisecond)
	in.SpeechStopped()
	h.Event([]byte(`{"type":"output_audio_buffer.clear"}`))
	want := []Control{
		{Type: ControlCleared, Source: "edge", ItemID: "item_1", AudioEndMs: 420},
		{Type: ControlSpeechStopped},
		{Type: ControlCleared, Source: "client", ItemID: "item_1", AudioEndMs: 420},
	}
	for _, w := range want {
		select {
		case c := <-got:
			if c != w {
				t.Errorf("backend got %+v, want %+v", c, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the backend got no %+v", w)
		}
	}
}

// dtmfSink is a phone call's sink: it records the digits it is asked to
// send.
type dtmfSink struct {
	*sink
	digits chan string
}

func (s *dtmfSink) SendDTMF(digits string) error {
	s.digits <- digits
	return nil
}

// TestDTMFControl: a phone call's digit reaches the network backend as a
// "dtmf" control frame, and the reference echo backend's "send_dtmf"
// answer reaches the pod's DTMFSender, for each of the 16 keys.
func TestDTMFControl(t *testing.T) {
	addr := startServer(t, EchoHandler)
	s := &dtmfSink{sink: newSink(), digits: make(chan string, 16)}
	b := &Backend{Addr: addr, Logger: slog.Default()}
	h, err := b.Open(context.Background(), backend.SessionInfo{ID: "s1"}, s)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	d, ok := h.(backend.DTMFHandler)
	if !ok {
		t.Fatal("the network backend's handler takes no DTMF")
	}
	const keys = "0123456789*#ABCD"
	for i := 0; i < len(keys); i++ {
		d.DTMF(keys[i])
	}
	for i := 0; i < len(keys); i++ {
		select {
		case got := <-s.digits:
			if got != keys[i:i+1] {
				t.Errorf("digit %d sent back as %q, want %q", i, got, keys[i:i+1])
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("digit %c was not sent back", keys[i])
		}
	}
}
