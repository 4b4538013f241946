//go:build cgo && !noopus

package opus

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/audiotest"
)

// roundTrip encodes pcm (at enc's rate) frame by frame and decodes every
// packet with dec, returning the decoded signal.
func roundTrip(t testing.TB, enc *Encoder, dec *Decoder, pcm []int16) []int16 {
	t.Helper()
	var out []int16
	pkt := make([]byte, MaxPacket)
	buf := make([]int16, dec.Rate()*120/1000)
	fs := enc.FrameSamples()
	for i := 0; i+fs <= len(pcm); i += fs {
		n, err := enc.Encode(pcm[i:i+fs], pkt)
		if err != nil {
			t.Fatalf("encode frame %d: %v", i/fs, err)
		}
		m, err := dec.Decode(pkt[:n], buf)
		if err != nil {
			t.Fatalf("decode frame %d (%d bytes): %v", i/fs, n, err)
		}
		if m != dec.Rate()/50 {
			t.Fatalf("frame %d decoded to %d samples, want %d", i/fs, m, dec.Rate()/50)
		}
		out = append(out, buf[:m]...)
	}
	return out
}

// newPair makes the edge's encoder (NewEncoder) at encRate and a decoder at
// decRate.
func newPair(t testing.TB, encRate, decRate int) (*Encoder, *Decoder) {
	t.Helper()
	return pairWith(t, NewEncoder, encRate, decRate)
}

// newCallerPair makes a browser's encoder (NewVoIPEncoder) at encRate and a
// decoder at decRate.
func newCallerPair(t testing.TB, encRate, decRate int) (*Encoder, *Decoder) {
	t.Helper()
	return pairWith(t, NewVoIPEncoder, encRate, decRate)
}

func pairWith(t testing.TB, newEnc func(int) (*Encoder, error), encRate, decRate int) (*Encoder, *Decoder) {
	t.Helper()
	enc, err := newEnc(encRate)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(enc.Close)
	dec, err := NewDecoder(decRate)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dec.Close)
	return enc, dec
}

// TestRoundTripTone: tones encoded at 48 kHz as a browser does and decoded
// at 24 or 16 kHz (the caller's direction), and encoded at 24 or 16 kHz by
// the edge and decoded at 48 kHz (the model's), keep their frequency, level
// and length: libopus converts between the rates itself, no resampler
// needed.
func TestRoundTripTone(t *testing.T) {
	for _, c := range []struct{ enc, dec int }{{48000, 24000}, {24000, 48000}, {48000, 16000}, {16000, 48000}} {
		for _, freq := range []float64{440, 1000} {
			enc, dec := newPair(t, c.enc, c.dec)
			if c.enc == 48000 {
				enc, dec = newCallerPair(t, c.enc, c.dec)
			}
			in := audiotest.Tone(c.enc, freq, 0.5, time.Second)
			out := roundTrip(t, enc, dec, in)
			name := fmt.Sprintf("%g Hz %d→%d Hz", freq, c.enc, c.dec)
			if len(out) != c.dec {
				t.Errorf("%s: %d samples out, want %d", name, len(out), c.dec)
			}
			frame := c.dec / 50
			if v, n := audiotest.VoicedFrames(out, frame, 0.01), len(out)/frame; v < n*95/100 {
				t.Errorf("%s: %d of %d frames carry the tone, want ≥ 95 %%", name, v, n)
			}
			// Past the codec's start-up (its first frames ramp up).
			tail := out[len(out)/4:]
			if f := audiotest.DominantFrequency(tail, c.dec); math.Abs(f-freq) > 0.01*freq {
				t.Errorf("%s: dominant frequency %.1f Hz, want %g ± 1 %%", name, f, freq)
			}
			if r, want := audiotest.RMS(tail), audiotest.RMS(in); math.Abs(r-want) > 0.1*want {
				t.Errorf("%s: RMS %.3f, want %.3f ± 10 %%", name, r, want)
			}
		}
	}
}

// speechText is what the speech tests have espeak-ng say: about 7 s with
// pauses between phrases.
const speechText = "The quick brown fox jumps over the lazy dog. Please call me back at five thirty, I will be waiting near the station."

// checkSpeech compares got, decoded speech, with ref, the same speech as
// espeak-ng and sox made it at got's rate: what was voiced is heard,
// the spectrum keeps its peak, and after the codec's delay the waveform
// and spectral envelope stay close (bounds a few points under what libopus
// measures, docs/benchmarks.md).
func checkSpeech(t *testing.T, name string, ref, got []int16, rate int, minCorr float64) {
	t.Helper()
	frame := rate / 50
	lag, corr := audiotest.Align(ref, got, rate/25)
	got = got[lag:]
	vr, vg := audiotest.VoicedFrames(ref, frame, 0.01), audiotest.VoicedFrames(got, frame, 0.01)
	heard := audiotest.HeardFrames(ref, got, frame, 0.01)
	fr, fg, sameDominant := audiotest.SameDominant(ref, got, rate)
	lsd := audiotest.SpectralDistance(ref, got, rate, frame)
	t.Logf("%s: delay %.2f ms, correlation %.3f, SNR %.1f dB, spectral distance %.2f dB, voiced frames %d/%d, heard %.1f %%, dominant %.1f/%.1f Hz",
		name, float64(lag)*1000/float64(rate), corr, audiotest.SNR(ref, got), lsd, vg, vr, 100*heard, fg, fr)
	if heard < 0.95 {
		t.Errorf("%s: %.1f %% of the voiced frames heard, want ≥ 95 %%", name, 100*heard)
	}
	if !sameDominant {
		t.Errorf("%s: dominant frequency %.1f Hz, want %.1f ± 5 %% (or a harmonic within 3 dB of it)", name, fg, fr)
	}
	if corr < minCorr {
		t.Errorf("%s: correlation %.3f after alignment, want ≥ %.2f", name, corr, minCorr)
	}
	if lsd > 7 {
		t.Errorf("%s: spectral distance %.2f dB, want ≤ 7", name, lsd)
	}
}

// TestRoundTripSpeech: espeak-ng speech through the codec both ways, and
// through the whole edge (the caller's 48 kHz Opus, as a browser encodes
// it, decoded at 24 kHz, encoded again from 24 kHz by the edge, decoded at
// 48 kHz as the caller's browser does), and at 16 kHz.
func TestRoundTripSpeech(t *testing.T) {
	s48 := audiotest.Speech(t, speechText, 48000)
	for _, rate := range []int{24000, 16000} {
		sr := audiotest.Speech(t, speechText, rate)
		enc, dec := newCallerPair(t, 48000, rate)
		up := roundTrip(t, enc, dec, s48)
		checkSpeech(t, fmt.Sprintf("caller 48k→%d", rate), sr, up, rate, 0.9)

		enc, dec = newPair(t, rate, 48000)
		down := roundTrip(t, enc, dec, sr)
		checkSpeech(t, fmt.Sprintf("model %d→48k", rate), s48, down, 48000, 0.9)

		enc, dec = newPair(t, rate, 48000)
		edge := roundTrip(t, enc, dec, up)
		checkSpeech(t, fmt.Sprintf("edge 48k→%d→48k", rate), s48, edge, 48000, 0.8)
	}
}

// TestEdgeEncoderMode: the edge's encoder sends CELT-only packets (TOC
// configurations 16–31, RFC 6716 3.1) with 2.5 ms of delay, where a
// browser's VoIP encoder sends SILK or hybrid with 6.5 ms: the CELT path is
// what makes the model's direction cheap (docs/codec.md).
func TestEdgeEncoderMode(t *testing.T) {
	s24 := audiotest.Speech(t, speechText, 24000)
	s48 := audiotest.Speech(t, speechText, 48000)
	for _, c := range []struct {
		name    string
		newEnc  func(int) (*Encoder, error)
		celt    bool
		delayMs float64
	}{{"edge", NewEncoder, true, 2.5}, {"voip", NewVoIPEncoder, false, 6.5}} {
		enc, dec := pairWith(t, c.newEnc, 24000, 48000)
		pkt := make([]byte, MaxPacket)
		pcm := make([]int16, 48000*120/1000)
		var out []int16
		celt := 0
		for i := 0; i+480 <= len(s24); i += 480 {
			n, err := enc.Encode(s24[i:i+480], pkt)
			if err != nil {
				t.Fatal(err)
			}
			if pkt[0]>>3 >= 16 {
				celt++
			}
			m, err := dec.Decode(pkt[:n], pcm)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, pcm[:m]...)
		}
		frames := len(s24) / 480
		if c.celt && celt != frames || !c.celt && celt != 0 {
			t.Errorf("%s encoder: %d of %d packets CELT-only, want %v", c.name, celt, frames, c.celt)
		}
		lag, _ := audiotest.Align(s48, out, 48000/25)
		if d := float64(lag) / 48; math.Abs(d-c.delayMs) > 0.5 {
			t.Errorf("%s encoder: delay %.2f ms, want %.1f", c.name, d, c.delayMs)
		}
	}
}

// TestInactive: Inactive reads a browser's VAD flags. Speech frames (SILK
// at 16 kHz, hybrid at 48 kHz) are active, the digital silence after them
// inactive once the encoder's VAD has let go; the edge's CELT packets, DTX
// packets, stereo and garbage are told apart. The silence-filled decode of
// the call's path (quietHang frames decoded, then zeros) stays within the
// noise floor of the full decode.
func TestInactive(t *testing.T) {
	for _, rate := range []int{48000, 16000} {
		speech := audiotest.Speech(t, speechText, rate)
		in := append(append([]int16(nil), speech...), make([]int16, rate)...) // then 1 s of silence
		enc, err := NewVoIPEncoder(rate)
		if err != nil {
			t.Fatal(err)
		}
		defer enc.Close()
		pkt := make([]byte, MaxPacket)
		fs := enc.FrameSamples()
		var active, quietTail, tail int
		voiced := 0
		for i := 0; i+fs <= len(in); i += fs {
			n, err := enc.Encode(in[i:i+fs], pkt)
			if err != nil {
				t.Fatal(err)
			}
			if cfg := pkt[0] >> 3; rate == 16000 && cfg >= 12 || rate == 48000 && (cfg < 12 || cfg >= 16) {
				t.Fatalf("%d Hz: TOC config %d: not the mode this test reads", rate, cfg)
			}
			inactive := Inactive(pkt[:n])
			if i < len(speech) && audiotest.RMS(in[i:i+fs]) > 0.05 {
				voiced++
				if !inactive {
					active++
				}
			}
			if i >= len(speech)+rate/5 { // 200 ms into the silence
				tail++
				if inactive {
					quietTail++
				}
			}
		}
		if active < voiced*98/100 {
			t.Errorf("%d Hz: %d of %d loud speech frames active, want ≥ 98 %%", rate, active, voiced)
		}
		if quietTail != tail || tail == 0 {
			t.Errorf("%d Hz: %d of the last %d silent frames inactive, want all", rate, quietTail, tail)
		}
	}
	celt, _ := newPair(t, 24000, 24000)
	pkt := make([]byte, MaxPacket)
	n, err := celt.Encode(make([]int16, celt.FrameSamples()), pkt)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"CELT silence", pkt[:n], false},
		{"empty", nil, false},
		{"DTX (TOC only)", []byte{0x08}, true},
		{"DTX (2 bytes)", []byte{0x08, 0x00}, true},
		{"stereo SILK", []byte{0x0c, 0x00, 0x00, 0x00}, false},
		{"two frames", []byte{0x09, 0x00, 0x00, 0x00}, false},
		{"CELT-only, zero payload", []byte{0x80, 0x00, 0x00, 0x00}, false},
		{"SILK, flags clear", []byte{0x08, 0x00, 0x00, 0x00}, true},
		{"SILK, VAD set", []byte{0x08, 0xff, 0xff, 0xff}, false},
	} {
		if got := Inactive(c.pkt); got != c.want {
			t.Errorf("Inactive(%s %x) = %v, want %v", c.name, c.pkt, got, c.want)
		}
	}
}

// TestSilenceFill: speech with a noise floor, as a microphone gives it, from
// a browser's encoder, decoded as the connector does (after quietHang
// inactive frames that decoded quiet, zeros instead of a decode) keeps the
// full decode's waveform: within 200 RMS (−44 dBFS) in every frame, and
// correlated 0.99. (backend/realtime's TestCallRoundTrip checks that a held
// tone the VAD learns as background is still decoded.)
func TestSilenceFill(t *testing.T) {
	const hang = 3 // backend/realtime's quietHang
	s48 := audiotest.Speech(t, speechText, 48000)
	in := make([]int16, len(s48))
	for i := range in {
		in[i] = s48[i] + int16(100*math.Sin(float64(i)*0.37)*math.Sin(float64(i)*0.0011)) // a low hum
	}
	enc, full := newCallerPair(t, 48000, 24000)
	_, filled := newCallerPair(t, 48000, 24000)
	pkt := make([]byte, MaxPacket)
	a, b := make([]int16, 480), make([]int16, 480)
	var fa, fb []int16
	quiet, skipped := 0, 0
	for i := 0; i+960 <= len(in); i += 960 {
		n, err := enc.Encode(in[i:i+960], pkt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := full.Decode(pkt[:n], a); err != nil {
			t.Fatal(err)
		}
		fa = append(fa, a...)
		inactive := Inactive(pkt[:n])
		if inactive && quiet >= hang {
			skipped++
			fb = append(fb, make([]int16, 480)...)
			continue
		}
		if _, err := filled.Decode(pkt[:n], b); err != nil {
			t.Fatal(err)
		}
		if inactive && Quiet(b) {
			quiet++
		} else {
			quiet = 0
		}
		fb = append(fb, b...)
	}
	if skipped == 0 {
		t.Fatal("no frame skipped: the pauses were not inactive")
	}
	for i := 0; i+480 <= len(fa); i += 480 {
		var e float64
		for j := i; j < i+480; j++ {
			d := float64(fa[j]) - float64(fb[j])
			e += d * d
		}
		if rms := math.Sqrt(e / 480); rms > 200 {
			t.Errorf("frame %d: %.0f RMS from the full decode", i/480, rms)
		}
	}
	if c := audiotest.Correlation(fa, fb); c < 0.99 {
		t.Errorf("correlation with the full decode %.3f, want ≥ 0.99", c)
	}
	t.Logf("%d of %d frames filled with silence", skipped, len(fa)/480)
}

// TestLoss: a lost caller packet is concealed with a frame that carries on
// the tone, and the next packet's in-band FEC (a browser's VoIP encoder
// sends it) recovers it.
func TestLoss(t *testing.T) {
	enc, dec := newCallerPair(t, 24000, 24000)
	in := audiotest.Tone(24000, 440, 0.5, time.Second)
	pkt := make([]byte, MaxPacket)
	pcm := make([]int16, 24000*120/1000)
	fs := enc.FrameSamples()
	var next []byte
	for i := 0; i+fs <= len(in); i += fs {
		n, err := enc.Encode(in[i:i+fs], pkt)
		if err != nil {
			t.Fatal(err)
		}
		if i/fs == 30 { // lost: conceal it, keep the next packet for FEC
			m, err := dec.Conceal(pcm[:fs])
			if err != nil || m != fs {
				t.Fatalf("Conceal = %d, %v, want %d", m, err, fs)
			}
			if r := audiotest.RMS(pcm[:m]); r < 0.05 {
				t.Errorf("concealed frame RMS %.3f: silence, not concealment", r)
			}
			continue
		}
		if i/fs == 31 {
			next = append([]byte(nil), pkt[:n]...)
		}
		if _, err := dec.Decode(pkt[:n], pcm); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh decoder recovers frame 30 from packet 31's FEC data after
	// hearing frames 0..29.
	_, dec2 := newPair(t, 24000, 24000)
	enc2, _ := newCallerPair(t, 24000, 24000)
	for i := 0; i < 30*fs; i += fs {
		n, _ := enc2.Encode(in[i:i+fs], pkt)
		if _, err := dec2.Decode(pkt[:n], pcm); err != nil {
			t.Fatal(err)
		}
	}
	m, err := dec2.DecodeFEC(next, pcm[:fs])
	if err != nil || m != fs {
		t.Fatalf("DecodeFEC = %d, %v, want %d", m, err, fs)
	}
	if f := audiotest.DominantFrequency(pcm[:m], 24000); math.Abs(f-440) > 22 {
		t.Errorf("recovered frame's dominant frequency %.1f Hz, want 440 ± 5 %%", f)
	}
}

// TestErrors: what a caller can get wrong is refused with the documented
// sentinel, and the decoder keeps working after a bad packet.
func TestErrors(t *testing.T) {
	enc, dec := newPair(t, 16000, 16000)
	pcm := make([]int16, 16000*120/1000)
	pkt := make([]byte, MaxPacket)
	if _, err := enc.Encode(pcm[:100], pkt); !errors.Is(err, ErrBadArg) {
		t.Errorf("Encode of 100 samples: %v, want ErrBadArg", err)
	}
	n, err := enc.Encode(pcm[:enc.FrameSamples()], pkt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dec.Decode(nil, pcm); !errors.Is(err, ErrInvalidPacket) {
		t.Errorf("Decode of no packet: %v, want ErrInvalidPacket", err)
	}
	// TOC code 3 (arbitrary frame count) with no count byte.
	if _, err := dec.Decode([]byte{0x03}, pcm); !errors.Is(err, ErrInvalidPacket) {
		t.Errorf("Decode of a truncated packet: %v, want ErrInvalidPacket", err)
	}
	if _, err := dec.Decode(pkt[:n], pcm[:10]); !errors.Is(err, ErrBufferTooSmall) {
		t.Errorf("Decode into 10 samples: %v, want ErrBufferTooSmall", err)
	}
	if _, err := dec.Conceal(pcm[:41]); !errors.Is(err, ErrBadArg) {
		t.Errorf("Conceal of 41 samples: %v, want ErrBadArg", err)
	}
	if m, err := dec.Decode(pkt[:n], pcm); err != nil || m != 320 {
		t.Errorf("Decode after errors = %d, %v, want 320", m, err)
	}
	if err := enc.SetComplexity(11); err == nil {
		t.Error("SetComplexity(11) accepted")
	}
	dec.Close()
	if _, err := dec.Decode(pkt[:n], pcm); !errors.Is(err, ErrClosed) {
		t.Errorf("Decode after Close: %v, want ErrClosed", err)
	}
}
