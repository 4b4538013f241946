package refserver

// The reference server's server_vad: an energy detector over the appended
// audio with OpenAI's parameters (threshold, prefix padding, silence
// duration), which starts and stops the caller's turn.

import "math"

// VAD timing: speech starts after startMs over the threshold and stops
// after the session's silence_duration_ms under it, measured in 10 ms
// windows of the input.
const (
	startMs          = 80
	defaultSilenceMs = 500
	defaultPrefixMs  = 300
)

// turnDetection is the effective server VAD configuration.
type turnDetection struct {
	thresholdDB    float64 // window RMS in dBFS over which it is speech
	prefixMs       int
	silenceMs      int
	createResponse bool
	interrupt      bool
}

// vad is the energy detector's state over the session's input.
type vad struct {
	pos      int64   // samples analysed
	sum      float64 // sum of squares of the current window
	n        int     // samples in the current window
	above    int     // consecutive windows over the threshold
	below    int     // consecutive windows under it while speaking
	speaking bool
	onset    int64  // sample position of the first loud window
	itemID   string // the item the current speech will become
	startMs  int    // the audio_start_ms sent
}

func (v *vad) reset() {
	pos := v.pos
	*v = vad{pos: pos}
}

// threshold maps OpenAI's threshold (0..1, default 0.5) to a level: 0.5 is
// -40 dBFS, each 0.1 is 6 dB.
func threshold(t float64) float64 { return -70 + 60*t }

// vadLocked runs the detector over newly appended samples and sends the
// speech events (and the commit) they cause.
func (s *Session) vadLocked(pcm []int16, td *turnDetection) {
	rate := int64(s.h.cfg.Rate)
	win := int(rate / 100)
	v := &s.vad
	for _, x := range pcm {
		f := float64(x) / 32768
		v.sum += f * f
		v.n++
		v.pos++
		if v.n < win {
			continue
		}
		db := 10 * math.Log10(v.sum/float64(v.n)+1e-12)
		v.sum, v.n = 0, 0
		loud := db > td.thresholdDB
		if !v.speaking {
			if !loud {
				v.above = 0
				continue
			}
			if v.above == 0 {
				v.onset = v.pos - int64(win)
			}
			v.above++
			if v.above*10 < startMs {
				continue
			}
			v.speaking, v.below = true, 0
			v.itemID = s.h.id("item")
			v.startMs = int(max(0, v.onset*1000/rate-int64(td.prefixMs)))
			s.st.SpeechStarted = append(s.st.SpeechStarted, v.startMs)
			s.send(map[string]any{"type": "input_audio_buffer.speech_started", "audio_start_ms": v.startMs, "item_id": v.itemID})
			if r := s.active; r != nil && td.interrupt {
				s.cancelLocked(r, "turn_detected")
			}
			continue
		}
		if loud {
			v.below = 0
			continue
		}
		v.below++
		if v.below*10 < td.silenceMs {
			continue
		}
		end := int(v.pos * 1000 / rate)
		s.st.SpeechStopped = append(s.st.SpeechStopped, end)
		s.send(map[string]any{"type": "input_audio_buffer.speech_stopped", "audio_end_ms": end, "item_id": v.itemID})
		// The committed item starts at audio_start_ms; the buffer holds
		// everything since the last commit.
		s.commitLocked(int64(v.startMs)*rate/1000, v.itemID, true)
		v.reset()
	}
}
