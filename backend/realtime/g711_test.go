package realtime_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/realtime"
	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// TestG711Passthrough: a phone call's G.711 session (SessionInfo.G711,
// Config.G711) asks the server for that format both ways; the caller's
// G.711 reaches it as it was sent (a tone at its frequency), and the
// reply comes to the pod as 20 ms G.711 frames of 160 bytes, one item of
// the response, the tone intact; no codec runs (no frame written raw).
func TestG711Passthrough(t *testing.T) {
	for _, fl := range flavours {
		for _, law := range []g711.Law{g711.PCMU, g711.PCMA} {
			format, beta := backend.AudioPCMU, "g711_ulaw"
			if law == g711.PCMA {
				format, beta = backend.AudioPCMA, "g711_alaw"
			}
			t.Run(fl.name+"/"+law.Name(), func(t *testing.T) {
				f := openSession(t, fl.beta, func(c *realtime.Config) { c.G711 = true },
					func(i *backend.SessionInfo) { i.G711 = format })
				// The server's session takes the format once it has applied
				// the connector's session.update, which is not when it
				// records the event: wait for the format, not the event.
				var in string
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := f.sess.Wait(ctx, func(st *refserver.State) bool {
					in, _ = st.Config["input_audio_format"].(string)
					if !fl.beta {
						in = nestedString(st.Config, "audio", "input", "format", "type")
					} else if in != beta {
						in = "beta " + in
					} else {
						in = format
					}
					return in == format
				})
				cancel()
				if err != nil {
					t.Fatalf("server's input format %q, want %s", in, format)
				}
				// 200 ms of silence, 1 s of a 700 Hz tone, 800 ms of silence.
				pcm := make([]int16, g711.ClockRate*2)
				for i := g711.ClockRate / 5; i < g711.ClockRate*6/5; i++ {
					pcm[i] = int16(8000 * math.Sin(2*math.Pi*700*float64(i)/g711.ClockRate))
				}
				code := law.Encode(nil, pcm)
				tick := time.NewTicker(10 * time.Millisecond) // twice real time
				for i := 0; i < len(code); i += 160 {
					f.h.Audio(code[i:i+160], 20*time.Millisecond)
					<-tick.C
				}
				tick.Stop()
				f.waitServer(t, "completed reply", func(st *refserver.State) bool {
					return len(st.Responses) == 1 && st.Responses[0].Status == "completed"
				})
				var heard []int16
				_ = f.sess.Wait(context.Background(), func(st *refserver.State) bool { heard = append([]int16(nil), st.Input...); return true })
				if got := audiotest.DominantFrequency(heard, rate); math.Abs(got-700) > 35 {
					t.Errorf("server heard dominant %.1f Hz, sent 700 Hz", got)
				}
				f.out.wait(t, "the response's end", func(s *sink) bool {
					return len(s.player) > 0 && strings.HasPrefix(s.player[len(s.player)-1], "end ")
				})
				f.out.mu.Lock()
				frames, rawFrames := f.out.frames, f.out.rawFrames
				f.out.mu.Unlock()
				var reply []int16
				for _, fr := range frames {
					if len(fr) != 160 {
						t.Fatalf("reply frame of %d bytes, want 160", len(fr))
					}
					reply = law.Decode(reply, fr)
				}
				if rawFrames != 0 {
					t.Errorf("%d frames written raw: a codec ran", rawFrames)
				}
				if len(reply) < g711.ClockRate {
					t.Errorf("reply of %d samples, want ≥ 1 s", len(reply))
				}
				if got := audiotest.DominantFrequency(reply, g711.ClockRate); math.Abs(got-700) > 35 {
					t.Errorf("reply dominant %.1f Hz, want 700", got)
				}
				m := testmetrics.Take(t, f.reg)
				if s := m["rtcedge_realtime_audio_seconds_total,direction=to_backend"]; s < 1.9 {
					t.Errorf("audio to the server %.2f s, want ≥ 1.9 s", s)
				}
			})
		}
	}
}

// TestG711NotTaken: a connector not configured for G.711 says so
// (backend.G711Taker) and refuses a G.711 session rather than sending
// the server a format it may not speak.
func TestG711NotTaken(t *testing.T) {
	b, err := realtime.New(realtime.Config{URL: "ws://127.0.0.1:1/v1/realtime"})
	if err != nil {
		t.Fatal(err)
	}
	if b.TakesG711() {
		t.Error("TakesG711 without Config.G711")
	}
	if _, err := b.Open(context.Background(), backend.SessionInfo{G711: backend.AudioPCMU}, newSink()); err == nil || !strings.Contains(err.Error(), "not configured") {
		t.Errorf("Open of a G.711 session: %v", err)
	}
}

// nestedString is the string at path in m, "" where any step is missing.
func nestedString(m map[string]any, path ...string) string {
	for _, k := range path[:len(path)-1] {
		next, _ := m[k].(map[string]any)
		if next == nil {
			return ""
		}
		m = next
	}
	v, _ := m[path[len(path)-1]].(string)
	return v
}
