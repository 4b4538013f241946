package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend/netbackend"
	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// burstCall starts a burstWorld, places a Pion call into it and waits for
// its session.created; it returns the world, the call and the reference
// server's side of the session.
func burstCall(ctx context.Context, t *testing.T, toneMs int) (*devworld.World, *voiceCall, *refserver.Session) {
	t.Helper()
	w, srv := burstWorld(t, toneMs)
	call := dialVoice(ctx, t, w.SignalingURL)
	sess, err := srv.NextSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	call.await(t, 10*time.Second, "session.created", func(_ [][]byte, evs []string) bool { return slices.Contains(evs, "session.created") })
	return w, call, sess
}

// burstWorld is a dev world whose reference server answers a
// response.create with a tone of toneMs sent 30 times faster than real
// time (3 s of reply in 100 ms), and never answers a turn of its own.
func burstWorld(t *testing.T, toneMs int) (*devworld.World, *refserver.Server) {
	t.Helper()
	srv := startRefServer(t, refserver.Config{Speed: 30, ToneMs: toneMs, DeltaMs: 100})
	return startWorld(t, devworld.Config{BackendURL: srv.URL() + "?model=ref", BackendProtocol: "ga"}), srv
}

func (c *voiceCall) send(t *testing.T, ev map[string]any) {
	t.Helper()
	b, _ := json.Marshal(ev)
	if err := c.dc.SendText(string(b)); err != nil {
		t.Fatal(err)
	}
}

// noAutoResponse turns the server VAD's own responses off, so that a
// barge-in is the only thing that happens to the reply.
var noAutoResponse = map[string]any{"type": "session.update", "session": map[string]any{"type": "realtime",
	"audio": map[string]any{"input": map[string]any{"turn_detection": map[string]any{"type": "server_vad", "create_response": false}}}}}

// TestPacedReplyThroughRelays: the server sends 3 s of reply in 100 ms; the
// caller, through both relay tiers, receives it over ≥ 2.85 s, a frame
// about every 20 ms (median) and never in a burst, between
// output_audio_buffer.started and stopped. (The goal's p99 inter-arrival
// of ≤ 30 ms is measured on a quiet machine, docs/benchmarks.md.)
func TestPacedReplyThroughRelays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, call, sess := burstCall(ctx, t, 3000)
	call.send(t, map[string]any{"type": "response.create"})
	var sent time.Duration
	if err := sess.Wait(ctx, func(s *refserver.State) bool {
		if len(s.Responses) > 0 && s.Responses[0].Status == "completed" {
			sent = time.Duration(s.Responses[0].Samples) * time.Second / 24000
			return true
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	call.await(t, 15*time.Second, "the whole reply", func(p [][]byte, evs []string) bool {
		return len(p) >= 150 && slices.Contains(evs, "output_audio_buffer.stopped")
	})
	call.mu.Lock()
	at := slices.Clone(call.arrivals)
	call.mu.Unlock()
	span, p99 := at[len(at)-1].Sub(at[0]), p99Gap(at)
	t.Logf("server sent %v of reply; the caller got %d frames over %v, inter-arrival p99 %v", sent, len(at), span, p99)
	if span < 2850*time.Millisecond {
		t.Errorf("3 s of reply arrived over %v, want ≥ 2.85 s", span)
	}
	// The goal is p99 ≤ 30 ms, met on a quiet machine (docs/benchmarks.md,
	// "Paced output"); the bound here is loose, as the scheduler's wake-ups
	// wait for a core on a loaded one. Frames sent in bunches (two per
	// 40 ms round) keep the span but move the median gap off 20 ms.
	gaps := make([]time.Duration, 0, len(at))
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	slices.Sort(gaps)
	if med := gaps[len(gaps)/2]; med < 15*time.Millisecond || med > 25*time.Millisecond {
		t.Errorf("median inter-arrival %v, want 20 ms ± 5", med)
	}
	// No bursts: at most 25 frames (2.5 times the paced 10) reach the caller
	// within any 200 ms, where an unpaced hop delivers all 150 within
	// 100 ms. The p99 itself is not bounded here: on a loaded machine a
	// wake-up that waits 60 ms for a core is the scheduler's, not the
	// pacer's (the goal's figure is measured on a quiet one).
	if n, from := densestWindow(at, 200*time.Millisecond); n > 25 {
		t.Errorf("%d frames arrived within 200 ms from frame #%d, want ≤ 25 (paced: 10)", n, from)
	}
	if p99 > 30*time.Millisecond {
		var long []string
		for i := 1; i < len(at); i++ {
			if g := at[i].Sub(at[i-1]); g > 30*time.Millisecond {
				long = append(long, fmt.Sprintf("#%d %v", i, g.Round(time.Millisecond)))
			}
		}
		t.Logf("inter-arrival p99 %v, over the goal's 30 ms (loaded machine?); gaps over 30 ms: %v", p99, long)
	}
	if v := metricSum(t, w.Registry, "rtcedge_reply_audio_seconds_total", map[string]string{"state": "sent"}); v < 2.9 {
		t.Errorf("rtcedge_reply_audio_seconds_total{state=sent} = %v", v)
	}
}

// TestBargeInThroughRelays: while a burst reply of 10 s plays (all of it
// queued at the pod), the caller speaks; on the server's speech_started
// the reply stops reaching the caller within 60 ms, the caller gets
// output_audio_buffer.cleared, and the server gets
// conversation.item.truncate with an audio_end_ms within 40 ms of what
// the caller received.
func TestBargeInThroughRelays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, call, sess := burstCall(ctx, t, 10000)
	call.send(t, noAutoResponse)
	call.await(t, 10*time.Second, "session.updated", func(_ [][]byte, evs []string) bool { return slices.Contains(evs, "session.updated") })
	call.send(t, map[string]any{"type": "response.create"})
	call.await(t, 10*time.Second, "a second of reply", func(p [][]byte, _ []string) bool { return len(p) >= 50 })
	talked := make(chan struct{})
	go func() { // the caller speaks over it
		defer close(talked)
		call.talkFrames(audiotest.Tone(48000, 300, 0.3, 600*time.Millisecond))
	}()
	defer func() { <-talked }()
	call.await(t, 10*time.Second, "speech_started and cleared", func(_ [][]byte, evs []string) bool {
		return slices.Contains(evs, "input_audio_buffer.speech_started") && slices.Contains(evs, "output_audio_buffer.cleared")
	})
	var tr []refserver.Truncation
	if err := sess.Wait(ctx, func(s *refserver.State) bool { tr = slices.Clone(s.Truncated); return len(tr) > 0 }); err != nil {
		t.Fatalf("the server got no truncate: %v", err)
	}
	// Nothing more comes: wait a little beyond the bound, then look.
	time.Sleep(300 * time.Millisecond)
	call.mu.Lock()
	started := call.eventAt[slices.Index(call.events, "input_audio_buffer.speech_started")]
	at := slices.Clone(call.arrivals)
	call.mu.Unlock()
	last := at[len(at)-1]
	receivedMs := len(at) * 20
	t.Logf("caller received %d ms of reply, the last frame %v after speech_started; truncated at %d ms",
		receivedMs, last.Sub(started).Round(time.Millisecond), tr[0].AudioEndMs)
	if last.Sub(started) > 60*time.Millisecond {
		t.Errorf("reply audio reached the caller %v after speech_started, want ≤ 60 ms", last.Sub(started))
	}
	if d := tr[0].AudioEndMs - receivedMs; d < -40 || d > 40 {
		t.Errorf("audio_end_ms %d, the caller received %d ms", tr[0].AudioEndMs, receivedMs)
	}
	if receivedMs > 9000 {
		t.Errorf("the caller received %d ms: the reply was not cut", receivedMs)
	}
	if v := metricSum(t, w.Registry, "rtcedge_bargeins_total", map[string]string{"source": "backend"}); v != 1 {
		t.Errorf("rtcedge_bargeins_total{source=backend} = %v", v)
	}
	call.mu.Lock()
	defer call.mu.Unlock()
	if slices.Contains(call.events, "error") {
		t.Errorf("the caller got an error event: %v", call.events)
	}
}

// p99Gap is the 99th percentile of the gaps between successive times.
func p99Gap(at []time.Time) time.Duration {
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	slices.Sort(gaps)
	return gaps[len(gaps)*99/100]
}

// TestEdgeBargeInThroughRelays: a network backend (no VAD of its own) sends
// a 10 s reply item at once; while it plays, the caller speaks. The
// edge's detector clears the reply: it stops reaching the caller within
// the detector's delay (3 frames, 60 ms) + 60 ms of the caller's first
// voiced frame, the caller gets output_audio_buffer.cleared, and the
// backend gets a cleared control frame whose audio_end_ms is within 40 ms
// of what the caller received.
func TestEdgeBargeInThroughRelays(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cleared := make(chan netbackend.Control, 1)
	sctx, scancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- netbackend.Serve(sctx, ln, testLogger(), func(_ context.Context, c *netbackend.Conn) {
			reply := encode48k(t, audiotest.Tone(48000, 440, 0.3, 10*time.Second))
			for {
				typ, p, _, err := c.Read()
				if err != nil {
					return
				}
				switch typ {
				case netbackend.FrameEvent: // the caller's response.create
					_ = c.WriteControl(netbackend.Control{Type: netbackend.ControlItem, ResponseID: "resp_1", ItemID: "item_1"})
					for _, f := range reply {
						_ = c.WriteAudio(f, 20*time.Millisecond)
					}
					_ = c.WriteControl(netbackend.Control{Type: netbackend.ControlResponseDone, ResponseID: "resp_1"})
				case netbackend.FrameControl:
					if ctl, err := netbackend.ParseControl(p); err == nil && ctl.Type == netbackend.ControlCleared {
						select {
						case cleared <- ctl:
						default:
						}
					}
				}
			}
		})
	}()
	t.Cleanup(func() {
		scancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	w := startWorld(t, devworld.Config{BackendAddr: ln.Addr().String()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	call := dialVoice(ctx, t, w.SignalingURL)
	call.send(t, map[string]any{"type": "response.create"})
	call.await(t, 10*time.Second, "a second of reply", func(p [][]byte, _ []string) bool { return len(p) >= 50 })
	talked := make(chan struct{})
	start := time.Now() // the first voiced frame leaves now
	go func() {
		defer close(talked)
		_ = call.talkFrames(audiotest.Tone(48000, 300, 0.3, 600*time.Millisecond))
	}()
	defer func() { <-talked }()
	call.await(t, 10*time.Second, "output_audio_buffer.cleared", func(_ [][]byte, evs []string) bool {
		return slices.Contains(evs, "output_audio_buffer.cleared")
	})
	var ctl netbackend.Control
	select {
	case ctl = <-cleared:
	case <-ctx.Done():
		t.Fatal("the backend got no cleared control frame")
	}
	time.Sleep(300 * time.Millisecond) // nothing more may come: the absence is the point
	call.mu.Lock()
	at := slices.Clone(call.arrivals)
	evs := slices.Clone(call.events)
	call.mu.Unlock()
	last := at[len(at)-1]
	receivedMs := int64(len(at) * 20)
	t.Logf("caller received %d ms of reply, the last frame %v after it started speaking; backend told %+v; events %v",
		receivedMs, last.Sub(start).Round(time.Millisecond), ctl, evs)
	if last.Sub(start) > 120*time.Millisecond {
		t.Errorf("reply audio reached the caller %v after it started speaking, want ≤ 60 ms + the detector's 60 ms", last.Sub(start))
	}
	if ctl.Source != "edge" || ctl.ItemID != "item_1" || ctl.AudioEndMs-receivedMs < -40 || ctl.AudioEndMs-receivedMs > 40 {
		t.Errorf("backend told %+v, the caller received %d ms", ctl, receivedMs)
	}
	if v := metricSum(t, w.Registry, "rtcedge_bargeins_total", map[string]string{"source": "edge"}); v != 1 {
		t.Errorf("rtcedge_bargeins_total{source=edge} = %v", v)
	}
}

// encode48k encodes 48 kHz PCM into 20 ms Opus frames.
func encode48k(t *testing.T, pcm []int16) [][]byte {
	enc, err := opus.NewVoIPEncoder(48000)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer enc.Close()
	var out [][]byte
	buf := make([]byte, opus.MaxPacket)
	for i := 0; i+960 <= len(pcm); i += 960 {
		n, err := enc.Encode(pcm[i:i+960], buf)
		if err != nil {
			t.Error(err)
			return nil
		}
		out = append(out, slices.Clone(buf[:n]))
	}
	return out
}

// densestWindow is the most arrivals within any window of length d, and
// the index of the first of them.
func densestWindow(at []time.Time, d time.Duration) (most, from int) {
	j := 0
	for i := range at {
		for at[i].Sub(at[j]) >= d {
			j++
		}
		if n := i - j + 1; n > most {
			most, from = n, j
		}
	}
	return most, from
}
