package realtime_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/realtime"
	"github.com/rtcedge/rtcedge/internal/heaptest"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
)

// hostileServer is a model server that sends each connection what script
// writes, reads (and ignores) what the connector sends, and ends its
// handler when the connection closes.
func hostileServer(t *testing.T, script func(ctx context.Context, c *websocket.Conn)) string {
	t.Helper()
	var wg sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		wg.Add(1)
		defer wg.Done()
		defer c.CloseNow()
		c.SetReadLimit(-1)
		ctx, cancel := context.WithCancel(context.Background())
		read := make(chan struct{})
		go func() {
			defer close(read)
			defer cancel()
			for {
				if _, _, err := c.Read(ctx); err != nil {
					return
				}
			}
		}()
		script(ctx, c)
		<-read
	}))
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/realtime"
}

// countSink is the pod's side of a call that keeps nothing: it counts the
// frames written and waits for one event type.
type countSink struct {
	frames atomic.Int64
	mu     sync.Mutex
	ended  string
	events []string
	marked chan struct{} // closed on the first event of type mark
	mark   string
}

func newCountSink(mark string) *countSink { return &countSink{mark: mark, marked: make(chan struct{})} }

func (s *countSink) WriteAudio([]byte, time.Duration) error { s.frames.Add(1); return nil }
func (s *countSink) WriteRaw(_ []byte, _ time.Duration, _ backend.FrameEncoder) error {
	s.frames.Add(1)
	return nil
}

func (s *countSink) SendEvent(data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, string(data[:min(len(data), 200)]))
	if strings.Contains(string(data), `"type":"`+s.mark+`"`) {
		select {
		case <-s.marked:
		default:
			close(s.marked)
		}
	}
	return nil
}

func (s *countSink) End(reason string) {
	s.mu.Lock()
	s.ended = reason
	s.mu.Unlock()
	select {
	case <-s.marked:
	default:
		close(s.marked)
	}
}

func (s *countSink) await(t *testing.T) {
	t.Helper()
	select {
	case <-s.marked:
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s within 30s", s.mark)
	}
}

// delta is an audio delta of samples samples (PCM16 at 24 kHz) padded to
// exactly size bytes with whitespace, as a server may send it.
func delta(samples int, item string) []byte {
	return []byte(`{"type":"response.output_audio.delta","response_id":"resp_1","item_id":"` + item + `","delta":"` +
		base64.StdEncoding.EncodeToString(make([]byte, 2*samples)) + `"}`)
}

// TestOversizedEvent: an event over MaxMessage ends the call with
// backend_oversized: an error event to the caller, End, the metric.
func TestOversizedEvent(t *testing.T) {
	url := hostileServer(t, func(ctx context.Context, c *websocket.Conn) {
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"session.created","pad":"`+strings.Repeat("x", 64<<10)+`"}`))
	})
	reg := prometheus.NewRegistry()
	b, err := realtime.New(realtime.Config{URL: url, MaxMessage: 64 << 10, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	out := newCountSink("session.created")
	h, err := b.Open(context.Background(), backend.SessionInfo{ID: "rtc_big"}, out)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	out.await(t)
	out.mu.Lock()
	ended, events := out.ended, out.events
	out.mu.Unlock()
	if ended != realtime.ReasonOversized {
		t.Fatalf("ended %q, events %v; want %s", ended, events, realtime.ReasonOversized)
	}
	if len(events) != 1 || !strings.Contains(events[0], `"code":"backend_oversized"`) {
		t.Errorf("caller events %v, want one error backend_oversized", events)
	}
	if m := testmetrics.Take(t, reg); m["rtcedge_realtime_sessions_failed_total,reason=backend_oversized"] != 1 {
		t.Errorf("metrics %v", m)
	}
	if _, err := realtime.New(realtime.Config{URL: url, MaxMessage: 1000}); err == nil {
		t.Error("a max message of 1000 bytes was accepted")
	}
}

// TestBigDeltasReleased floods calls with audio deltas near the message
// bound (each over 16 s of audio), then measures what the calls still
// hold against as many quiet calls: the read buffer of an outsized event
// is released after it, and a delta is decoded a chunk at a time, so a
// flooded call holds no more than a quiet one. A larger bound
// (MaxMessage) takes larger deltas and releases them the same way.
func TestBigDeltasReleased(t *testing.T) {
	const calls = 6
	for _, tc := range []struct {
		name       string
		maxMessage int
		deltas     int
	}{{"default", 0, 4}, {"4MiB", 4 << 20, 1}} {
		deltas := tc.deltas
		t.Run(tc.name, func(t *testing.T) {
			max := tc.maxMessage
			if max == 0 {
				max = realtime.DefaultMaxMessage
			}
			samples := (max - 200) / 4 * 3 / 2 // a delta just under the bound
			big := delta(samples, "item_1")
			if len(big) > max {
				t.Fatalf("delta of %d bytes over the bound", len(big))
			}
			flood := func(ctx context.Context, c *websocket.Conn) {
				for range deltas {
					if c.Write(ctx, websocket.MessageText, big) != nil {
						return
					}
				}
				_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"rtcedge.test.done"}`))
			}
			quiet := func(ctx context.Context, c *websocket.Conn) {
				_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"rtcedge.test.done"}`))
			}
			open := func(script func(context.Context, *websocket.Conn)) ([]*countSink, func()) {
				b, err := realtime.New(realtime.Config{URL: hostileServer(t, script), MaxMessage: tc.maxMessage,
					StallTimeout: time.Minute}) // a loaded machine decodes slowly under -race
				if err != nil {
					t.Fatal(err)
				}
				var sinks []*countSink
				var hs []backend.Handler
				for i := range calls {
					s := newCountSink("rtcedge.test.done")
					h, err := b.Open(context.Background(), backend.SessionInfo{ID: fmt.Sprint("rtc_", i)}, s)
					if err != nil {
						t.Fatal(err)
					}
					sinks, hs = append(sinks, s), append(hs, h)
				}
				for _, s := range sinks {
					s.await(t)
				}
				return sinks, func() {
					for _, h := range hs {
						_ = h.Close()
					}
				}
			}
			_, closeQuiet := open(quiet)
			base := heaptest.Live()
			closeQuiet()
			sinks, closeFlood := open(flood)
			defer closeFlood()
			flooded := heaptest.Live()
			wantFrames := int64(deltas * samples / 480)
			for _, s := range sinks {
				if n := s.frames.Load(); n < wantFrames {
					t.Fatalf("a flooded call played %d frames, want %d", n, wantFrames)
				}
				if s.ended != "" {
					t.Fatalf("a flooded call ended: %s", s.ended)
				}
			}
			per := (flooded - base) / calls
			t.Logf("a flooded call holds %d KiB more than a quiet one (deltas of %d KiB)", per>>10, len(big)>>10)
			if per > 256<<10 {
				t.Errorf("a flooded call holds %d KiB more than a quiet one; want ≤ 256 KiB", per>>10)
			}
		})
	}
}
