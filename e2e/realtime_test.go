package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"
	"github.com/pion/webrtc/v4/pkg/media"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/backend/realtime/reftest"
	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/opus"
	"github.com/rtcedge/rtcedge/transceiver"
)

// startRefServer runs a Realtime reference server on a loopback port for
// the test.
func startRefServer(t *testing.T, cfg refserver.Config) *refserver.Server {
	cfg.Logger = testLogger()
	return reftest.Start(t, cfg)
}

// realtimeWorld is a dev world whose pods all talk to one reference
// server, GA or beta.
func realtimeWorld(t *testing.T, beta bool) (*devworld.World, *refserver.Server) {
	t.Helper()
	srv := startRefServer(t, refserver.Config{Beta: beta})
	protocol := "ga"
	if beta {
		protocol = "beta"
	}
	return startWorld(t, devworld.Config{BackendURL: srv.URL() + "?model=ref", BackendProtocol: protocol}), srv
}

// voiceCall is a Pion client that talks real Opus: it sends PCM (48 kHz)
// as 20 ms Opus frames at real time and keeps every audio payload and
// data-channel event it receives.
type voiceCall struct {
	pc    *webrtc.PeerConnection
	track *webrtc.TrackLocalStaticSample
	dc    *webrtc.DataChannel

	mu       sync.Mutex
	payloads [][]byte    // guarded by mu: received Opus payloads, in arrival order
	arrivals []time.Time // guarded by mu: when each payload arrived
	events   []string    // guarded by mu: received event types, in order
	eventAt  []time.Time // guarded by mu: when each event arrived
	raw      [][]byte    // guarded by mu: the events as received
	// location is the call's URL (its last segment the call ID).
	location string
	changed  chan struct{}
	readers  sync.WaitGroup
}

// dialVoice places a call through signaling and returns once it is
// connected and its data channel open.
func dialVoice(ctx context.Context, t *testing.T, signalingURL string) *voiceCall {
	t.Helper()
	return dialVoiceAs(ctx, t, signalingURL, "")
}

// dialVoiceAs is dialVoice placing the call with a bearer credential.
func dialVoiceAs(ctx context.Context, t *testing.T, signalingURL, bearer string) *voiceCall {
	t.Helper()
	se := webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	me := &webrtc.MediaEngine{}
	if err := me.RegisterDefaultCodecs(); err != nil {
		t.Fatal(err)
	}
	pc, err := webrtc.NewAPI(webrtc.WithSettingEngine(se), webrtc.WithMediaEngine(me)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	c := &voiceCall{pc: pc, changed: make(chan struct{}, 1)}
	t.Cleanup(func() { _ = pc.Close(); c.readers.Wait() })
	if c.track, err = webrtc.NewTrackLocalStaticSample(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "voice"); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.AddTrack(c.track); err != nil {
		t.Fatal(err)
	}
	if c.dc, err = pc.CreateDataChannel(transceiver.EventsLabel, nil); err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	c.dc.OnOpen(func() { close(open) })
	c.dc.OnMessage(func(m webrtc.DataChannelMessage) {
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(m.Data, &ev)
		c.mu.Lock()
		c.events = append(c.events, ev.Type)
		c.eventAt = append(c.eventAt, time.Now())
		c.raw = append(c.raw, slices.Clone(m.Data))
		c.mu.Unlock()
		c.notify()
	})
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		c.readers.Add(1)
		defer c.readers.Done()
		for {
			pkt, _, err := tr.ReadRTP()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.payloads = append(c.payloads, slices.Clone(pkt.Payload))
			c.arrivals = append(c.arrivals, time.Now())
			c.mu.Unlock()
			c.notify()
		}
	})
	res, answer := negotiateAs(ctx, t, pc, signalingURL, bearer)
	c.location = res.Header.Get("Location")
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-open:
	case <-ctx.Done():
		t.Fatal("the call did not connect with its data channel open")
	}
	return c
}

func (c *voiceCall) notify() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// await waits until cond holds over what the call received (checked
// whenever a packet or event arrives).
func (c *voiceCall) await(t *testing.T, d time.Duration, what string, cond func(payloads [][]byte, events []string) bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ok := cond(c.payloads, c.events)
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.changed:
		case <-deadline.C:
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Fatalf("after %v: no %s (%d audio packets, events %v)", d, what, len(c.payloads), c.events)
		}
	}
}

// talk sends pcm (48 kHz mono) as 20 ms Opus frames paced at real time.
func (c *voiceCall) talk(t *testing.T, pcm []int16) {
	t.Helper()
	if err := c.talkFrames(pcm); err != nil {
		t.Fatal(err)
	}
}

// talkFrames is talk for any goroutine: it returns the error.
func (c *voiceCall) talkFrames(pcm []int16) error {
	enc, err := opus.NewVoIPEncoder(48000)
	if err != nil {
		return err
	}
	defer enc.Close()
	frame := enc.FrameSamples()
	pkt := make([]byte, opus.MaxPacket)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i+frame <= len(pcm); i += frame {
		n, err := enc.Encode(pcm[i:i+frame], pkt)
		if err != nil {
			return err
		}
		if err := c.track.WriteSample(media.Sample{Data: pkt[:n], Duration: 20 * time.Millisecond}); err != nil {
			return err
		}
		<-tick.C
	}
	return nil
}

// heard decodes the audio received so far at rate.
func (c *voiceCall) heard(t *testing.T, rate int) []int16 {
	t.Helper()
	c.mu.Lock()
	payloads := slices.Clone(c.payloads)
	c.mu.Unlock()
	return reftest.DecodeOpus(t, payloads, rate)
}

// decimate takes 48 kHz to 24 kHz for comparisons with the server's input
// (every other sample: the signals here have nothing above 12 kHz that
// matters to a dominant frequency).
func decimate(pcm []int16) []int16 {
	out := make([]int16, len(pcm)/2)
	for i := range out {
		out[i] = pcm[2*i]
	}
	return out
}

// voicedMs is how long pcm at rate is above -34 dBFS, in 20 ms frames.
func voicedMs(pcm []int16, rate int) int {
	return 20 * audiotest.VoicedFrames(pcm, rate/50, 0.02)
}

// sameSpectrum checks got's dominant frequency against ref's (both at
// rate): audiotest.SameDominant; lsd, the mean log-spectral distance after
// aligning got with ref, is returned for the log.
func sameSpectrum(ref, got []int16, rate int) (wantHz, gotHz, lsd float64, ok bool) {
	wantHz, gotHz, ok = audiotest.SameDominant(ref, got, rate)
	got = aligned(ref, got, rate)
	lsd = audiotest.SpectralDistance(ref, got, rate, rate/50)
	return wantHz, gotHz, lsd, ok
}

// aligned returns got from where it lines up with ref. got may lack the
// first frames (sent before the pod's decoder ran), so it is padded first:
// Align looks for a delay only.
func aligned(ref, got []int16, rate int) []int16 {
	pad := rate / 5
	padded := append(make([]int16, pad), got...)
	lag, _ := audiotest.Align(ref, padded, 2*pad)
	return padded[lag:]
}

// TestRealtimeCallThroughRelays: a Pion client calls through global relay →
// cluster relay → pod → Realtime connector → reference server, GA and beta,
// and talks real Opus: a 440 Hz tone and espeak-ng speech, each followed by
// a pause that ends the turn at the server's VAD. The server hears ≥ 95 %
// of what was sent (its duration, and of its voiced frames) with its
// dominant frequency within 5 % (sameSpectrum: for speech, or the other of
// two tied harmonics); the client hears ≥ 95 % of the parrot reply with
// the same frequency, and gets the server's events and the edge's
// output_audio_buffer.started/stopped on the data channel.
func TestRealtimeCallThroughRelays(t *testing.T) {
	signals := []struct {
		name string
		pcm  func(t *testing.T) []int16 // 48 kHz
	}{
		{"tone440", func(*testing.T) []int16 { return audiotest.Tone(48000, 440, 0.3, 1500*time.Millisecond) }},
		{"speech", func(t *testing.T) []int16 {
			return audiotest.Speech(t, "Hello from the edge. This call goes through both relay tiers.", 48000)
		}},
	}
	const rate = 24000 // the reference server's
	for _, fl := range []struct {
		name string
		beta bool
	}{{"ga", false}, {"beta", true}} {
		t.Run(fl.name, func(t *testing.T) {
			w, srv := realtimeWorld(t, fl.beta)
			calls := 0
			for _, sig := range signals {
				t.Run(sig.name, func(t *testing.T) {
					calls++
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					voice := sig.pcm(t)
					input := append(append(make([]int16, 48000/5), voice...), make([]int16, 48000*9/10)...)
					call := dialVoice(ctx, t, w.SignalingURL)
					sess, err := srv.NextSession(ctx)
					if err != nil {
						t.Fatalf("the reference server got no session: %v", err)
					}
					call.await(t, 10*time.Second, "session.created", func(_ [][]byte, evs []string) bool {
						return slices.Contains(evs, "session.created")
					})
					start := time.Now()
					call.talk(t, input)
					t.Logf("sent %v of audio in %v", time.Duration(len(input))*time.Second/48000, time.Since(start).Round(time.Millisecond))

					// The server heard it.
					sent := int64(len(input) / 2)
					var st refserver.State
					if err := sess.Wait(ctx, func(s *refserver.State) bool {
						st = refserver.State{InputSamples: s.InputSamples, Input: slices.Clone(s.Input), Responses: slices.Clone(s.Responses),
							SpeechStarted: slices.Clone(s.SpeechStarted), SpeechStopped: slices.Clone(s.SpeechStopped)}
						return s.InputSamples >= sent*95/100 && len(s.Responses) > 0 && s.Responses[0].Status == "completed"
					}); err != nil {
						t.Fatalf("server: heard %d of %d samples, responses %+v: %v", st.InputSamples, sent, st.Responses, err)
					}
					ref := decimate(voice)
					wantHz, gotHz, lsd, sameHeard := sameSpectrum(ref, st.Input, rate)
					heard := audiotest.HeardFrames(ref, aligned(ref, st.Input, rate), rate/50, 0.01)
					t.Logf("server heard %d ms of %d ms sent, %.1f %% of the voiced frames, dominant %.1f Hz (sent %.1f Hz), spectral distance %.1f dB, VAD start %v stop %v ms",
						st.InputSamples*1000/rate, sent*1000/rate, 100*heard, gotHz, wantHz, lsd, st.SpeechStarted, st.SpeechStopped)
					if heard < 0.95 {
						t.Errorf("server heard %.1f %% of the voiced frames sent", 100*heard)
					}
					if !sameHeard {
						t.Errorf("server heard dominant %.1f Hz, sent %.1f Hz", gotHz, wantHz)
					}
					if len(st.SpeechStarted) != 1 || len(st.SpeechStopped) != 1 {
						t.Errorf("VAD: speech started at %v, stopped at %v ms; want one turn", st.SpeechStarted, st.SpeechStopped)
					}

					// The client heard the parrot reply, paced by the edge.
					replySamples := st.Responses[0].Samples
					defer func() {
						if t.Failed() { // where frames went missing
							t.Logf("connector drops %v, pod drops %v, realtime audio to callers %.2f s",
								metricSum(t, w.Registry, "rtcedge_realtime_dropped_total", nil),
								metricSum(t, w.Registry, "rtcedge_transceiver_dropped_packets_total", nil),
								metricSum(t, w.Registry, "rtcedge_realtime_audio_seconds_total", map[string]string{"direction": "to_caller"}))
						}
					}()
					call.await(t, 30*time.Second, "the whole reply", func(payloads [][]byte, evs []string) bool {
						return len(payloads)*rate/50 >= replySamples*95/100 && slices.Contains(evs, "output_audio_buffer.stopped")
					})
					reply := call.heard(t, rate)
					_, replyHz, replyLSD, sameReply := sameSpectrum(ref, reply, rate)
					t.Logf("client heard %d ms of a %d ms reply, dominant %.1f Hz, spectral distance %.1f dB", len(reply)*1000/rate, replySamples*1000/rate, replyHz, replyLSD)
					if len(reply) < replySamples*95/100 {
						t.Errorf("client heard %d samples of a %d-sample reply", len(reply), replySamples)
					}
					if !sameReply {
						t.Errorf("reply dominant %.1f Hz, want %.1f Hz", replyHz, wantHz)
					}
					call.mu.Lock()
					evs := slices.Clone(call.events)
					call.mu.Unlock()
					last := -1
					for _, typ := range []string{"session.created", "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
						"output_audio_buffer.started", "response.done", "output_audio_buffer.stopped"} {
						i := slices.Index(evs, typ)
						if i <= last {
							t.Errorf("event %s at %d, after %d: %v", typ, i, last, evs)
						}
						last = max(last, i)
					}
					for _, typ := range evs {
						if strings.Contains(typ, "audio.delta") {
							t.Errorf("the client got an audio delta event: %v", evs)
							break
						}
					}
				})
			}
			if n := metricSum(t, w.Registry, "rtcedge_realtime_sessions_opened_total", nil); n != float64(calls) {
				t.Errorf("realtime sessions opened = %v, want %d", n, calls)
			}
			// Every turn's reply delay, by the POP of the call's path.
			if n := metricSum(t, w.Registry, "rtcedge_turn_reply_delay_seconds", nil); n != float64(calls) {
				t.Errorf("rtcedge_turn_reply_delay_seconds observed %v turns, want %d", n, calls)
			}
			if n := metricSum(t, w.Registry, "rtcedge_turn_reply_delay_seconds", map[string]string{"pop": "0"}); n != 0 {
				t.Errorf("%v turns counted with no POP", n)
			}
			if n := metricSum(t, w.Registry, "rtcedge_realtime_sessions_failed_total", nil); n != 0 {
				t.Errorf("realtime sessions failed = %v", n)
			}
			for _, m := range []struct{ name, dir string }{
				{"rtcedge_globalrelay_packets_total", "to_cluster"},
				{"rtcedge_globalrelay_packets_total", "to_client"},
				{"rtcedge_clusterrelay_packets_total", "to_pod"},
				{"rtcedge_clusterrelay_packets_total", "to_client"},
			} {
				if v := metricSum(t, w.Registry, m.name, map[string]string{"direction": m.dir}); v < 100 {
					t.Errorf("%s{direction=%q} = %v: the call did not go through both tiers", m.name, m.dir, v)
				}
			}
		})
	}
}
