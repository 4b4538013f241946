package refserver_test

import (
	"encoding/base64"
	"math"
	"testing"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/backend/realtime/reftest"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// goertzel is the power of pcm (at sample rate sr) at hz, normalised by
// its length.
func goertzel(pcm []int16, hz, sr float64) float64 {
	w := 2 * math.Cos(2*math.Pi*hz/sr)
	var s1, s2 float64
	for _, x := range pcm {
		s1, s2 = float64(x)+w*s1-s2, s1
	}
	return (s1*s1 + s2*s2 - w*s1*s2) / float64(len(pcm)*len(pcm))
}

// TestG711Session: a session set to G.711 (audio/pcmu or audio/pcma in
// GA, g711_ulaw or g711_alaw in beta) takes G.711 appends, 8 kHz and a
// byte a sample, and answers with G.711 deltas: a tone appended comes
// back as the same tone, 20 ms of audio per 160 bytes; the session and
// the response say the format.
func TestG711Session(t *testing.T) {
	for _, n := range flavours {
		for _, law := range []g711.Law{g711.PCMU, g711.PCMA} {
			t.Run(flavourName(n)+"/"+law.Name(), func(t *testing.T) {
				srv := reftest.Start(t, refserver.Config{Beta: n.beta})
				c := dial(t, srv, nil)
				c.until("session.created")
				ga, beta := map[string]any{"type": "audio/pcmu"}, "g711_ulaw"
				if law == g711.PCMA {
					ga, beta = map[string]any{"type": "audio/pcma"}, "g711_alaw"
				}
				upd := map[string]any{"input_audio_format": beta, "output_audio_format": beta, "turn_detection": nil}
				if !n.beta {
					upd = map[string]any{"type": "realtime", "audio": map[string]any{
						"input": map[string]any{"format": ga, "turn_detection": nil}, "output": map[string]any{"format": ga}}}
				}
				c.send(map[string]any{"type": "session.update", "session": upd})
				s := c.until("session.updated")
				sess := s[len(s)-1]["session"].(map[string]any)
				if n.beta && (sess["input_audio_format"] != beta || sess["output_audio_format"] != beta) {
					t.Errorf("beta session formats: %v", sess)
				}
				if !n.beta && sess["audio"].(map[string]any)["output"].(map[string]any)["format"].(map[string]any)["type"] != ga["type"] {
					t.Errorf("GA session formats: %v", sess["audio"])
				}
				// One second of a 700 Hz tone at 8 kHz, in 20 ms appends of 160 bytes.
				pcm := make([]int16, g711.ClockRate)
				for i := range pcm {
					pcm[i] = int16(8000 * math.Sin(2*math.Pi*700*float64(i)/g711.ClockRate))
				}
				code := law.Encode(nil, pcm)
				for i := 0; i < len(code); i += 160 {
					c.send(map[string]any{"type": "input_audio_buffer.append", "audio": base64.StdEncoding.EncodeToString(code[i : i+160])})
				}
				c.send(map[string]any{"type": "input_audio_buffer.commit"})
				c.send(map[string]any{"type": "response.create"})
				var got []byte
				var done map[string]any
				for done == nil {
					m := c.next()
					switch m["type"] {
					case n.audioDelta:
						b, err := base64.StdEncoding.DecodeString(m["delta"].(string))
						if err != nil {
							t.Fatal(err)
						}
						got = append(got, b...)
					case "response.done":
						done = m
					case "error":
						t.Fatalf("error event %v", m)
					}
				}
				if len(got) != len(code) {
					t.Errorf("reply of %d bytes (%d ms at 8 kHz), want %d", len(got), len(got)/8, len(code))
				}
				back := law.Decode(nil, got)
				mid := back[len(back)/4 : 3*len(back)/4]
				if on, off := goertzel(mid, 700, g711.ClockRate), goertzel(mid, 1500, g711.ClockRate); on < 100*off || on < 1e5 {
					t.Errorf("reply at 700 Hz: power %.0f, at 1500 Hz %.0f", on, off)
				}
				resp := done["response"].(map[string]any)
				if n.beta && resp["output_audio_format"] != beta {
					t.Errorf("beta response format %v", resp["output_audio_format"])
				}
				if !n.beta && resp["audio"].(map[string]any)["output"].(map[string]any)["format"].(map[string]any)["type"] != ga["type"] {
					t.Errorf("GA response format %v", resp["audio"])
				}
			})
		}
	}
}
