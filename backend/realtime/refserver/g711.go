package refserver

// G.711 sessions, as OpenAI's Realtime API takes them: an input or output
// format of type audio/pcmu or audio/pcma (GA; beta: g711_ulaw,
// g711_alaw), 8 kHz, a byte a sample, no rate field. The session keeps its
// audio at the server's rate whatever the format: G.711 input is decoded
// and upsampled as it is appended (linear interpolation), the reply is
// downsampled (the mean of each group of samples) and encoded per delta.

import (
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

var (
	pcmu, pcma = g711.PCMU, g711.PCMA
	// gaLaws and betaLaws name the G.711 formats of each protocol.
	gaLaws   = map[string]*g711.Law{"audio/pcmu": &pcmu, "audio/pcma": &pcma}
	betaLaws = map[string]*g711.Law{"g711_ulaw": &pcmu, "g711_alaw": &pcma}
)

// lawsLocked reads the session's input and output formats from its
// effective configuration: a G.711 law, or nil for PCM16. mu held.
func (s *Session) lawsLocked() (in, out *g711.Law) {
	if s.h.cfg.Beta {
		i, _ := s.st.Config["input_audio_format"].(string)
		o, _ := s.st.Config["output_audio_format"].(string)
		return betaLaws[i], betaLaws[o]
	}
	typ := func(dir string) string {
		v, _ := lookup(s.st.Config, "audio", dir, "format", "type")
		t, _ := v.(string)
		return t
	}
	return gaLaws[typ("input")], gaLaws[typ("output")]
}

// upsample decodes G.711 bytes and raises them to the server's rate,
// interpolating from the last sample appended before them (run's
// goroutine; the result is valid until the next call).
func (s *Session) upsample(code []byte) []int16 {
	f := s.h.cfg.Rate / g711.ClockRate
	if need := len(code) * f; cap(s.pcm) < need {
		s.pcm = make([]int16, need)
	}
	out := s.pcm[:len(code)*f]
	s.in8 = s.inLaw.Decode(s.in8[:0], code)
	for i, x := range s.in8 {
		for j := range f {
			out[i*f+j] = int16(int(s.lastIn) + (int(x)-int(s.lastIn))*(j+1)/f)
		}
		s.lastIn = x
	}
	return out
}

// deltaAudio is one delta's audio as the session's output format wants
// it, in buf (which holds PCM16 of the chunk): PCM16LE, or G.711 of the
// mean of each group of samples (law non-nil).
func (s *Session) deltaAudio(buf []byte, pcm []int16, law *g711.Law) []byte {
	if law == nil {
		b := buf[:2*len(pcm)]
		for i, v := range pcm {
			b[2*i], b[2*i+1] = byte(v), byte(uint16(v)>>8)
		}
		return b
	}
	f := s.h.cfg.Rate / g711.ClockRate
	var one [1]int16
	b := buf[:0]
	for i := 0; i < len(pcm); i += f {
		sum := 0
		grp := pcm[i:min(i+f, len(pcm))]
		for _, v := range grp {
			sum += int(v)
		}
		one[0] = int16(sum / len(grp))
		b = law.Encode(b, one[:])
	}
	return b
}

// gaFormat is an output format as a GA response carries it.
func gaFormat(law *g711.Law, rate int) map[string]any {
	switch {
	case law == nil:
		return map[string]any{"type": "audio/pcm", "rate": rate}
	case *law == g711.PCMA:
		return map[string]any{"type": "audio/pcma"}
	}
	return map[string]any{"type": "audio/pcmu"}
}

// betaName is an output format as a beta response names it.
func betaName(law *g711.Law) string {
	switch {
	case law == nil:
		return "pcm16"
	case *law == g711.PCMA:
		return "g711_alaw"
	}
	return "g711_ulaw"
}
