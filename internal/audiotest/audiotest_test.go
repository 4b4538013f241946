package audiotest

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"
	"time"
)

func TestToneMeasures(t *testing.T) {
	for _, rate := range []int{16000, 24000, 48000} {
		for _, f := range []float64{200, 440, 1000, 3150} {
			pcm := Tone(rate, f, 0.5, 500*time.Millisecond)
			if len(pcm) != rate/2 {
				t.Fatalf("%d Hz: %d samples for 500 ms", rate, len(pcm))
			}
			if got := DominantFrequency(pcm, rate); math.Abs(got-f) > 0.005*f {
				t.Errorf("%g Hz at %d: dominant %.2f Hz", f, rate, got)
			}
			if r := RMS(pcm); math.Abs(r-0.5/math.Sqrt2) > 0.001 {
				t.Errorf("%g Hz at %d: RMS %.4f, want %.4f", f, rate, r, 0.5/math.Sqrt2)
			}
			if on, off := Goertzel(pcm, rate, f), Goertzel(pcm, rate, 1.5*f); on < 100*off || math.Abs(on-0.0625) > 0.01 {
				t.Errorf("%g Hz at %d: Goertzel %.4f at the tone, %.6f beside it", f, rate, on, off)
			}
		}
	}
	if f := DominantFrequency(make([]int16, 1000), 8000); f != 0 {
		t.Errorf("dominant frequency of silence: %v", f)
	}
}

func TestLevelsAndAlignment(t *testing.T) {
	rate := 16000
	speechLike := append(Tone(rate, 300, 0.3, 200*time.Millisecond), make([]int16, rate/5)...)
	speechLike = append(speechLike, Tone(rate, 900, 0.3, 200*time.Millisecond)...)
	frame := rate / 50
	if v := VoicedFrames(speechLike, frame, 0.01); v != 20 {
		t.Errorf("VoicedFrames = %d, want 20", v)
	}
	delayed := append(make([]int16, 77), speechLike...)
	lag, corr := Align(speechLike, delayed, 200)
	if lag != 77 || corr < 0.999 {
		t.Errorf("Align = %d, %.4f, want 77, 1", lag, corr)
	}
	if h := HeardFrames(speechLike, delayed[lag:], frame, 0.01); h != 1 {
		t.Errorf("HeardFrames of the same signal = %v", h)
	}
	if h := HeardFrames(speechLike, speechLike[:len(speechLike)/2], frame, 0.01); math.Abs(h-0.5) > 0.01 {
		t.Errorf("HeardFrames of half the signal = %v, want 0.5", h)
	}
	if d := SpectralDistance(speechLike, speechLike, rate, frame); d != 0 {
		t.Errorf("SpectralDistance of a signal to itself = %v", d)
	}
	if snr := SNR(speechLike, speechLike); !math.IsInf(snr, 1) {
		t.Errorf("SNR of a signal to itself = %v", snr)
	}
	half := make([]int16, len(speechLike))
	for i, s := range speechLike {
		half[i] = s / 2
	}
	if c := Correlation(speechLike, half); c < 0.9999 {
		t.Errorf("Correlation at half the gain = %v, want 1", c)
	}
}

func TestParseWAV(t *testing.T) {
	pcm := []int16{1, -2, 300, -32768}
	b := []byte("RIFF\x00\x00\x00\x00WAVEfmt ")
	b = binary.LittleEndian.AppendUint32(b, 16)
	b = binary.LittleEndian.AppendUint16(b, 1)     // PCM
	b = binary.LittleEndian.AppendUint16(b, 1)     // mono
	b = binary.LittleEndian.AppendUint32(b, 22050) // rate
	b = binary.LittleEndian.AppendUint32(b, 44100) // byte rate
	b = binary.LittleEndian.AppendUint16(b, 2)     // block align
	b = binary.LittleEndian.AppendUint16(b, 16)    // bits
	b = append(b, "data"...)
	b = binary.LittleEndian.AppendUint32(b, 0xFFFFFFFF) // unknown: to the end
	for _, s := range pcm {
		b = binary.LittleEndian.AppendUint16(b, uint16(s))
	}
	got, rate, err := ParseWAV(b)
	if err != nil || rate != 22050 || !slices.Equal(got, pcm) {
		t.Fatalf("ParseWAV = %v, %d, %v", got, rate, err)
	}
	if _, _, err := ParseWAV([]byte("RIFF....WAVE")); err == nil {
		t.Error("a WAVE without chunks parsed")
	}
}

// TestSpeech: espeak-ng and sox are there (scripts/test-deps.sh) and make
// a few seconds of voiced audio at the asked rate.
func TestSpeech(t *testing.T) {
	pcm := Speech(t, "Hello from the edge.", 16000)
	if d := float64(len(pcm)) / 16000; d < 0.8 || d > 4 {
		t.Errorf("%.2f s of speech", d)
	}
	if v, n := VoicedFrames(pcm, 320, 0.01), len(pcm)/320; v < n/2 {
		t.Errorf("%d of %d frames voiced", v, n)
	}
}
