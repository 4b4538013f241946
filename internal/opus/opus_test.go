//go:build cgo && !noopus

package opus

import (
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

func newPair(t testing.TB, encRate, decRate int) (*Encoder, *Decoder) {
	t.Helper()
	enc, err := NewEncoder(encRate)
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

// TestRoundTripTone: a 1 kHz tone encoded at 48 kHz and decoded at 24 kHz
// (the caller's direction), and encoded at 24 kHz and decoded at 48 kHz
// (the model's), keeps its frequency, level and length: libopus converts
// between the rates itself.
func TestRoundTripTone(t *testing.T) {
	for _, c := range []struct{ enc, dec int }{{48000, 24000}, {24000, 48000}, {48000, 16000}, {16000, 48000}} {
		enc, dec := newPair(t, c.enc, c.dec)
		in := audiotest.Tone(c.enc, 1000, 0.5, time.Second)
		out := roundTrip(t, enc, dec, in)
		if want := c.dec; len(out) != want {
			t.Errorf("%d→%d Hz: %d samples out, want %d", c.enc, c.dec, len(out), want)
		}
		// Skip the codec's start-up (its first frames ramp up).
		tail := out[len(out)/2:]
		if f := audiotest.DominantFrequency(tail, c.dec); math.Abs(f-1000) > 10 {
			t.Errorf("%d→%d Hz: dominant frequency %.1f Hz, want 1000", c.enc, c.dec, f)
		}
		if r, want := audiotest.RMS(tail), audiotest.RMS(in); math.Abs(r-want) > 0.1*want {
			t.Errorf("%d→%d Hz: RMS %.3f, want %.3f ± 10 %%", c.enc, c.dec, r, want)
		}
	}
}
