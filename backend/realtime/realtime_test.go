package realtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/realtime"
	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/backend/realtime/reftest"
	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/opus"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rate = 24000

// sink is the caller's side of a call: what the pod would send by RTP and
// on the data channel. As a backend.Player it records the items and
// clears, and plays every frame at once (the pod's pacing is
// transceiver/pace's); as a backend.RawWriter it encodes each frame as it
// is written (the pod encodes it when it sends it).
type sink struct {
	mu     sync.Mutex
	player []string       // BeginItem, EndResponse, SpeechStopped and Clear calls, in order
	item   string         // the current item
	played map[string]int // frames written per item
	// clearedMs is what the last Clear reported played.
	clearedMs int
	frames    [][]byte
	rawFrames int                  // frames written raw (WriteRaw)
	enc       backend.FrameEncoder // the last WriteRaw's
	times     []time.Time
	events    []map[string]any
	raw       []string
	ended     string
	changed   chan struct{}
}

func newSink() *sink { return &sink{changed: make(chan struct{})} }

func (s *sink) notify() { close(s.changed); s.changed = make(chan struct{}) }

func (s *sink) BeginItem(resp, item string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.player = append(s.player, "begin "+resp+" "+item)
	s.item = item
	s.notify()
}

func (s *sink) EndResponse(resp string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.player = append(s.player, "end "+resp)
	s.notify()
}

func (s *sink) SpeechStopped() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.player = append(s.player, "speech_stopped")
	s.notify()
}

func (s *sink) Clear(source string) (string, time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.player = append(s.player, "clear "+source)
	s.notify()
	s.clearedMs = s.played[s.item] * 20
	return s.item, time.Duration(s.clearedMs) * time.Millisecond, s.item != ""
}

func (s *sink) WriteRaw(frame []byte, d time.Duration, enc backend.FrameEncoder) error {
	p, err := enc.EncodeFrame(nil, frame)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.rawFrames++
	s.enc = enc
	s.mu.Unlock()
	return s.WriteAudio(p, d)
}

func (s *sink) WriteAudio(p []byte, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.played == nil {
		s.played = map[string]int{}
	}
	s.played[s.item]++
	s.frames = append(s.frames, append([]byte(nil), p...))
	s.times = append(s.times, time.Now())
	s.notify()
	return nil
}

func (s *sink) SendEvent(data []byte) error {
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		panic("caller got bad JSON: " + string(data))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, m)
	s.raw = append(s.raw, string(data))
	s.notify()
	return nil
}

func (s *sink) End(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = reason
	s.notify()
}

func (s *sink) wait(t *testing.T, what string, cond func(*sink) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		s.mu.Lock()
		ok, ch := cond(s), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("caller: no %s within 20s", what)
		}
	}
}

// index is the position of the first event of type typ, or -1.
func (s *sink) index(typ string) int {
	for i, e := range s.events {
		if e["type"] == typ {
			return i
		}
	}
	return -1
}

type fixture struct {
	srv  *refserver.Server
	b    *realtime.Backend
	reg  *prometheus.Registry
	out  *sink
	h    backend.Handler
	sess *refserver.Session
}

// open starts a reference server and opens one call through the connector.
func open(t *testing.T, beta bool, mod func(*realtime.Config)) *fixture {
	t.Helper()
	return openSession(t, beta, mod, nil)
}

// openSession is open with the session's info changed by modInfo.
func openSession(t *testing.T, beta bool, mod func(*realtime.Config), modInfo func(*backend.SessionInfo)) *fixture {
	t.Helper()
	f := &fixture{reg: prometheus.NewRegistry(), out: newSink()}
	f.srv = reftest.Start(t, refserver.Config{Beta: beta, APIKey: "sk-test"})
	cfg := realtime.Config{URL: f.srv.URL() + "?model=ref", APIKey: "sk-test", Registerer: f.reg}
	if beta {
		cfg.Protocol = realtime.ProtocolBeta
	}
	if mod != nil {
		mod(&cfg)
	}
	var err error
	if f.b, err = realtime.New(cfg); err != nil {
		t.Fatal(err)
	}
	info := backend.SessionInfo{ID: "rtc_test", Config: []byte(`{"model":"app-model","instructions":"be a parrot","audio":{"output":{"voice":"marin"}}}`)}
	if modInfo != nil {
		modInfo(&info)
	}
	if f.h, err = f.b.Open(context.Background(), info, f.out); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if f.sess, err = f.srv.NextSession(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) waitServer(t *testing.T, what string, cond func(*refserver.State) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.sess.Wait(ctx, cond); err != nil {
		t.Fatalf("server: no %s: %v", what, err)
	}
}

// talk sends pcm (48 kHz) as 20 ms Opus frames through Handler.Audio, at
// twice real time (the queue toward the server holds 2.5 s).
func talk(t *testing.T, h backend.Handler, pcm []int16) {
	t.Helper()
	enc, err := opus.NewVoIPEncoder(48000)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	frame := enc.FrameSamples()
	pkt := make([]byte, opus.MaxPacket)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i+frame <= len(pcm); i += frame {
		n, err := enc.Encode(pcm[i:i+frame], pkt)
		if err != nil {
			t.Fatal(err)
		}
		h.Audio(pkt[:n], 20*time.Millisecond)
		<-tick.C
	}
}

var flavours = []struct {
	name string
	beta bool
}{{"ga", false}, {"beta", true}}

// TestCallRoundTrip: the caller's signal, as Opus frames, reaches the
// server with its duration and spectrum; the parrot reply comes back as
// paced Opus frames; events flow both ways, for GA and beta servers.
func TestCallRoundTrip(t *testing.T) {
	signals := []struct {
		name string
		pcm  func(t *testing.T) []int16 // at 48 kHz
	}{
		{"tone440", func(t *testing.T) []int16 { return audiotest.Tone(48000, 440, 0.3, time.Second) }},
		{"held", func(t *testing.T) []int16 { return audiotest.Tone(48000, 440, 0.05, 2500*time.Millisecond) }},
		{"speech", func(t *testing.T) []int16 { return audiotest.Speech(t, "Hello, this is the edge speaking.", 48000) }},
	}
	for _, fl := range flavours {
		for _, sig := range signals {
			t.Run(fl.name+"/"+sig.name, func(t *testing.T) {
				f := open(t, fl.beta, nil)
				voice := sig.pcm(t)
				silence := make([]int16, 48000*800/1000)
				input := append(append(append([]int16(nil), silence[:48000/5]...), voice...), silence...)

				// The server got the call's config with the edge's formats.
				f.waitServer(t, "session.update", func(st *refserver.State) bool { return len(st.Received) > 0 })
				f.sess.Wait(context.Background(), func(st *refserver.State) bool {
					if st.Received[0] != "session.update" || st.Config["instructions"] != "be a parrot" || st.Config["model"] != "ref" {
						t.Errorf("first event %v, config %v", st.Received[0], st.Config)
					}
					return true
				})

				talk(t, f.h, input)
				f.waitServer(t, "completed reply", func(st *refserver.State) bool {
					return len(st.Responses) == 1 && st.Responses[0].Status == "completed"
				})
				var heard []int16
				var replySamples int
				var received int64
				f.sess.Wait(context.Background(), func(st *refserver.State) bool {
					heard, replySamples, received = append([]int16(nil), st.Input...), st.Responses[0].Samples, st.InputSamples
					return true
				})
				// ≥ 95 % of the duration sent (the last partial batch may wait).
				if sent := int64(len(input)) / 2; received < sent*95/100 {
					t.Errorf("server heard %d samples of %d", received, sent)
				}
				// Every voiced frame heard: a held tone too, which the
				// caller's VAD calls inactive after about 1.4 s.
				if v, w := audiotest.VoicedFrames(heard, rate/50, 0.01), audiotest.VoicedFrames(decimate(voice), rate/50, 0.01); v < w*95/100 {
					t.Errorf("server heard %d voiced frames of %d", v, w)
				}
				want := audiotest.DominantFrequency(decimate(voice), rate)
				if got := audiotest.DominantFrequency(heard, rate); math.Abs(got-want) > 0.05*want {
					t.Errorf("server heard dominant %.1f Hz, sent %.1f Hz", got, want)
				}

				// The reply: its frames as one item of the response, then the
				// response's end (the pod paces them and frames them with
				// output_audio_buffer.started/stopped: transceiver/pace and
				// e2e's tests).
				f.out.wait(t, "the response's end", func(s *sink) bool {
					return len(s.player) > 0 && strings.HasPrefix(s.player[len(s.player)-1], "end ")
				})
				f.out.mu.Lock()
				frames, player := f.out.frames, slices.Clone(f.out.player)
				evs := f.out.events
				f.out.mu.Unlock()
				// The turn's speech_started is a barge-in (with nothing playing).
				if len(player) != 4 || player[0] != "clear backend" || player[1] != "speech_stopped" || !strings.HasPrefix(player[2], "begin ") || strings.Fields(player[2])[1] != strings.Fields(player[3])[1] {
					t.Errorf("player calls %v: want the barge-in, the end of speech, one item, then the end of its response", player)
				}
				reply := reftest.DecodeOpus(t, frames, rate)
				if len(reply) < replySamples*95/100 {
					t.Errorf("caller heard %d samples of a %d-sample reply", len(reply), replySamples)
				}
				if got := audiotest.DominantFrequency(reply, rate); math.Abs(got-want) > 0.05*want {
					t.Errorf("reply dominant %.1f Hz, want %.1f", got, want)
				}
				order := []string{"session.created", "session.updated", "input_audio_buffer.speech_started", "input_audio_buffer.committed",
					"response.created", "response.content_part.added", "response.done"}
				f.out.mu.Lock()
				last := -1
				for _, typ := range order {
					i := f.out.index(typ)
					if i <= last {
						t.Errorf("event %s at %d, after %d: %v", typ, i, last, types(evs))
					}
					last = i
				}
				for _, e := range evs {
					if typ := e["type"].(string); strings.Contains(typ, "audio.delta") {
						t.Errorf("caller got an audio delta event")
					}
				}
				f.out.mu.Unlock()
				// The pod encodes the frames (backend.RawWriter), with an
				// encoder that fails once the call is closed.
				f.out.mu.Lock()
				rawFrames, enc := f.out.rawFrames, f.out.enc
				f.out.mu.Unlock()
				if rawFrames != len(frames) {
					t.Errorf("%d of %d reply frames written raw", rawFrames, len(frames))
				}
				m := testmetrics.Take(t, f.reg)
				_ = f.h.Close()
				if enc == nil {
					t.Error("no frame written raw")
				} else if _, err := enc.EncodeFrame(nil, make([]byte, 2*rate/50)); !errors.Is(err, opus.ErrClosed) {
					t.Errorf("encode after the call closed: %v, want ErrClosed", err)
				}
				if m["rtcedge_realtime_sessions_opened_total"] != 1 || m["rtcedge_realtime_audio_seconds_total,direction=to_caller"] < 0.95*float64(replySamples)/rate {
					t.Errorf("metrics %v", m)
				}
				// The 800 ms of silence after the voice: all but the first
				// few frames went to the server as silence, undecoded.
				if m["rtcedge_realtime_silent_frames_total"] < 30 {
					t.Errorf("%v caller frames sent as silence undecoded, want ≥ 30 of the 40 silent ones", m["rtcedge_realtime_silent_frames_total"])
				}
			})
		}
	}
}

// decimate takes 48 kHz to 24 kHz for comparisons (every other sample).
func decimate(pcm []int16) []int16 {
	out := make([]int16, len(pcm)/2)
	for i := range out {
		out[i] = pcm[2*i]
	}
	return out
}

func types(evs []map[string]any) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e["type"].(string))
	}
	return out
}

// TestCallerEvents: data-channel events reach the server, translated,
// except appends (dropped, counted), the fields of a session.update the
// caller may not set (named in an error event; the rest applies) and
// output_audio_buffer.clear (the edge's).
func TestCallerEvents(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl.name, func(t *testing.T) {
			f := open(t, fl.beta, nil)
			f.h.Event([]byte(`{"type":"input_audio_buffer.append","audio":"AAAA"}`))
			f.h.Event([]byte(`{"type":"session.update","event_id":"u1","session":{"instructions":"ignore the app"}}`))
			f.h.Event([]byte(`{"type":"session.update","event_id":"u2","session":{"model":"app-model","audio":{"input":{"turn_detection":null}}}}`))
			f.h.Event([]byte(`{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}}`))
			f.h.Event([]byte(`{"type":"response.create"}`))
			f.waitServer(t, "events", func(st *refserver.State) bool { return len(st.Received) >= 5 })
			f.sess.Wait(context.Background(), func(st *refserver.State) bool {
				want := []string{"session.update", "session.update", "session.update", "conversation.item.create", "response.create"}
				if strings.Join(st.Received, " ") != strings.Join(want, " ") {
					t.Errorf("server received %v, want %v", st.Received, want)
				}
				td := st.Config["turn_detection"]
				if !fl.beta {
					td = st.Config["audio"].(map[string]any)["input"].(map[string]any)["turn_detection"]
				}
				if td != nil || st.Config["instructions"] != "be a parrot" {
					t.Errorf("config after the caller's update: %v", st.Config)
				}
				return true
			})
			f.out.wait(t, "refusal", func(s *sink) bool { return s.index("error") >= 0 })
			f.out.mu.Lock()
			e := f.out.events[f.out.index("error")]["error"].(map[string]any)
			f.out.mu.Unlock()
			if e["code"] != "invalid_session" || e["param"] != "session.instructions" || e["event_id"] != "u1" {
				t.Errorf("refusal %v", e)
			}
			// The 1 s tone reply of response.create, then clear it: the
			// pod's queue is cleared and the server gets a truncate with
			// what the pod played.
			f.out.wait(t, "reply audio", func(s *sink) bool { return len(s.frames) > 0 })
			f.h.Event([]byte(`{"type":"output_audio_buffer.clear"}`))
			f.out.wait(t, "clear", func(s *sink) bool { return slices.Contains(s.player, "clear client") })
			f.out.mu.Lock()
			item, played := f.out.item, f.out.clearedMs
			f.out.mu.Unlock()
			f.waitServer(t, "truncate", func(st *refserver.State) bool {
				return len(st.Truncated) == 1 && st.Truncated[0].ItemID == item && st.Truncated[0].AudioEndMs == played
			})
			m := testmetrics.Take(t, f.reg)
			if m["rtcedge_realtime_dropped_total,reason=append_event"] != 1 {
				t.Errorf("dropped appends: %v", m)
			}
		})
	}
}

// TestServerFailures: a server that refuses fails Open; one that closes or
// stalls ends the call with an error event and a metric, and neither the
// URL nor the key reaches the caller.
func TestServerFailures(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		srv := reftest.Start(t, refserver.Config{APIKey: "sk-right"})
		reg := prometheus.NewRegistry()
		b, err := realtime.New(realtime.Config{URL: srv.URL(), APIKey: "sk-wrong", Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Open(context.Background(), backend.SessionInfo{ID: "x"}, newSink()); err == nil || strings.Contains(err.Error(), "sk-") {
			t.Fatalf("Open: %v", err)
		}
		if m := testmetrics.Take(t, reg); m["rtcedge_realtime_sessions_failed_total,reason=backend_refused"] != 1 {
			t.Errorf("metrics %v", m)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close()
		reg := prometheus.NewRegistry()
		b, _ := realtime.New(realtime.Config{URL: "ws://" + addr + "/v1/realtime", Registerer: reg})
		if _, err := b.Open(context.Background(), backend.SessionInfo{ID: "x"}, newSink()); err == nil {
			t.Fatal("Open succeeded")
		}
		if m := testmetrics.Take(t, reg); m["rtcedge_realtime_sessions_failed_total,reason=backend_unreachable"] != 1 {
			t.Errorf("metrics %v", m)
		}
	})
	for _, tc := range []struct {
		name, reason string
		do           func(*refserver.Session)
	}{
		{"killed", realtime.ReasonClosed, (*refserver.Session).Kill},
		{"closed", realtime.ReasonClosed, func(s *refserver.Session) { s.CloseWith(1001, "going away") }},
		{"stalled", realtime.ReasonStalled, (*refserver.Session).Stall},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := open(t, false, func(c *realtime.Config) { c.StallTimeout = 300 * time.Millisecond })
			f.waitServer(t, "session.update", func(st *refserver.State) bool { return len(st.Received) > 0 })
			tc.do(f.sess)
			f.out.wait(t, "End", func(s *sink) bool { return s.ended != "" })
			f.out.mu.Lock()
			defer f.out.mu.Unlock()
			if f.out.ended != tc.reason {
				t.Errorf("ended with %q, want %q", f.out.ended, tc.reason)
			}
			i := f.out.index("error")
			if i < 0 || f.out.events[i]["error"].(map[string]any)["code"] != tc.reason {
				t.Fatalf("no error event %s: %v", tc.reason, f.out.raw)
			}
			addr := strings.TrimPrefix(f.srv.URL(), "ws://")
			for _, raw := range f.out.raw {
				if strings.Contains(raw, addr) || strings.Contains(raw, "sk-test") {
					t.Errorf("the caller saw the backend's address or key: %s", raw)
				}
			}
			if m := testmetrics.Take(t, f.reg); m["rtcedge_realtime_sessions_failed_total,reason="+tc.reason] != 1 {
				t.Errorf("metrics %v", m)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	for _, u := range []string{"http://h/v1/realtime", "ws://", "wss://user:pw@h/v1/realtime", "::"} {
		if _, err := realtime.New(realtime.Config{URL: u}); err == nil {
			t.Errorf("URL %q accepted", u)
		}
	}
	if _, err := realtime.New(realtime.Config{URL: "ws://h/x", Protocol: "v2"}); err == nil {
		t.Error("protocol v2 accepted")
	}
	if _, err := realtime.New(realtime.Config{URL: "ws://h/x", Rate: 22050}); err == nil {
		t.Error("rate 22050 accepted")
	}
	b, err := realtime.FromURL("wss://h/v1/realtime?model=m", "beta", func(k string) string {
		if k != realtime.APIKeyEnv {
			t.Errorf("read %s", k)
		}
		return "sk"
	}, nil, nil)
	if err != nil || b == nil {
		t.Fatal(err)
	}
}

// TestServerEvents: a sideband's events (backend.ServerEvents) reach the
// server unfiltered — instructions and tools, which the caller may not
// set — and never the caller; the app's instructions become the call's, so
// a caller's update repeating the app's first instructions is refused
// while one repeating the current ones passes.
func TestServerEvents(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl.name, func(t *testing.T) {
			f := open(t, fl.beta, nil)
			se, ok := f.h.(backend.ServerEvents)
			if !ok {
				t.Fatal("the connector's handler takes no sideband events")
			}
			se.ServerEvent([]byte(`{"type":"session.update","event_id":"app1","session":{"instructions":"from the app","tools":[{"type":"function","name":"lookup"}]}}`))
			f.waitServer(t, "the app's update", func(st *refserver.State) bool {
				tools, _ := st.Config["tools"].([]any)
				return st.Config["instructions"] == "from the app" && len(tools) == 1
			})
			f.h.Event([]byte(`{"type":"session.update","event_id":"u1","session":{"instructions":"be a parrot"}}`))
			f.h.Event([]byte(`{"type":"session.update","event_id":"u2","session":{"instructions":"from the app"}}`))
			f.waitServer(t, "the caller's repeat", func(st *refserver.State) bool { return len(st.Received) >= 4 })
			f.out.wait(t, "the refusal", func(s *sink) bool { return s.index("error") >= 0 })
			f.out.mu.Lock()
			defer f.out.mu.Unlock()
			if e := f.out.events[f.out.index("error")]["error"].(map[string]any); e["event_id"] != "u1" {
				t.Errorf("refused %v, want the caller's repeat of the replaced instructions", e)
			}
			for _, raw := range f.out.raw {
				if strings.Contains(raw, `"app1"`) {
					t.Errorf("the caller got the app's event: %s", raw)
				}
			}
		})
	}
}

// TestSealedFieldsWin: with the call's policy saying sealed fields win
// (signaling's sealed_fields_win), the update OpenAI's Agents SDK sends on
// connect — its own instructions, model, tools and output modalities
// with its audio (voice, semantic VAD, transcription) — then
// {tracing: "auto"}, raise no error: the caller's voice and turn detection
// apply, the sealed instructions stay and no tool is added.
func TestSealedFieldsWin(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl.name, func(t *testing.T) {
			f := openSession(t, fl.beta, nil, func(info *backend.SessionInfo) { info.SealedWins = true })
			f.h.Event([]byte(`{"type":"session.update","event_id":"sdk1","session":{"type":"realtime","instructions":"You are a helpful assistant.","model":"gpt-realtime",` +
				`"output_modalities":["audio"],"audio":{"input":{"format":{"type":"audio/pcm","rate":24000},"noise_reduction":null,"transcription":{"model":"gpt-4o-mini-transcribe"},` +
				`"turn_detection":{"type":"semantic_vad"}},"output":{"format":{"type":"audio/pcm","rate":24000},"voice":"ash","speed":1}},` +
				`"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"tool_choice":"auto"}}`))
			f.h.Event([]byte(`{"type":"session.update","event_id":"sdk2","session":{"tracing":"auto"}}`))
			f.waitServer(t, "the SDK's updates", func(st *refserver.State) bool { return len(st.Received) >= 3 })
			f.sess.Wait(context.Background(), func(st *refserver.State) bool {
				voice, td := st.Config["voice"], st.Config["turn_detection"]
				if !fl.beta {
					audio := st.Config["audio"].(map[string]any)
					voice = audio["output"].(map[string]any)["voice"]
					td = audio["input"].(map[string]any)["turn_detection"]
				}
				if tools, _ := st.Config["tools"].([]any); st.Config["instructions"] != "be a parrot" || len(tools) != 0 || voice != "ash" {
					t.Errorf("config after the SDK's updates: %v", st.Config)
				}
				if m, _ := td.(map[string]any); m["type"] != "semantic_vad" {
					t.Errorf("turn detection %v", td)
				}
				return true
			})
			f.out.mu.Lock()
			defer f.out.mu.Unlock()
			if i := f.out.index("error"); i >= 0 {
				t.Errorf("the caller got an error: %v", f.out.events[i])
			}
		})
	}
}

// dtmfSink is a phone call's sink: it records the digits it is asked to
// send.
type dtmfSink struct {
	*sink
	mu     sync.Mutex
	digits string
}

func (s *dtmfSink) SendDTMF(digits string) error {
	if digits == "" || strings.Trim(digits, "0123456789*#ABCD") != "" {
		return backend.ErrDTMFDigits
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.digits += digits
	return nil
}

// TestDTMF: a phone call's digit reaches the app as OpenAI's
// input_audio_buffer.dtmf_event_received and never the model server; a
// sideband's rtcedge.dtmf.send reaches the pod's DTMFSender and not the
// server, and a refused one is answered with an error naming it.
func TestDTMF(t *testing.T) {
	f := open(t, false, nil)
	d, ok := f.h.(backend.DTMFHandler)
	if !ok {
		t.Fatal("the connector's handler takes no DTMF")
	}
	before := time.Now().Unix()
	d.DTMF('7')
	f.out.wait(t, "the digit's event", func(s *sink) bool { return s.index(backend.EventDTMFReceived) >= 0 })
	f.out.mu.Lock()
	ev := f.out.events[f.out.index(backend.EventDTMFReceived)]
	f.out.mu.Unlock()
	if at, _ := ev["received_at"].(float64); ev["event"] != "7" || int64(at) < before || !strings.HasPrefix(ev["event_id"].(string), backend.EventIDPrefix) {
		t.Errorf("digit event %v", ev)
	}

	// The same call with a phone call's sink.
	ds := &dtmfSink{sink: newSink()}
	g := &fixture{srv: f.srv, b: f.b, out: ds.sink}
	var err error
	if g.h, err = f.b.Open(context.Background(), backend.SessionInfo{ID: "rtc_phone"}, ds); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if g.sess, err = f.srv.NextSession(ctx); err != nil {
		t.Fatal(err)
	}
	se := g.h.(backend.ServerEvents)
	se.ServerEvent([]byte(`{"type":"rtcedge.dtmf.send","event_id":"app_d1","digits":"12#"}`))
	se.ServerEvent([]byte(`{"type":"rtcedge.dtmf.send","event_id":"app_d2","digits":"x"}`))
	se.ServerEvent([]byte(`{"type":"session.update","event_id":"app_u","session":{"instructions":"after the digits"}}`))
	g.waitServer(t, "the app's update", func(st *refserver.State) bool { return st.Config["instructions"] == "after the digits" })
	g.out.wait(t, "the refusal", func(s *sink) bool { return s.index("error") >= 0 })
	ds.mu.Lock()
	if ds.digits != "12#" {
		t.Errorf("digits sent %q, want 12#", ds.digits)
	}
	ds.mu.Unlock()
	g.out.mu.Lock()
	if e := g.out.events[g.out.index("error")]["error"].(map[string]any); e["event_id"] != "app_d2" || e["code"] != "dtmf_refused" {
		t.Errorf("refusal %v", e)
	}
	g.out.mu.Unlock()
	// g's server has had the update sent after the digits (the connector
	// writes in order): no DTMF event among what either server got.
	for _, s := range []*fixture{f, g} {
		s.waitServer(t, "no DTMF", func(st *refserver.State) bool {
			for _, r := range st.Received {
				if strings.Contains(r, "dtmf") {
					t.Errorf("the model server got %s", r)
				}
			}
			return true
		})
	}
}
