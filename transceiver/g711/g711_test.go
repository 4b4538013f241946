package g711

import (
	"math"
	"testing"
)

// Every code but μ-law's negative zero decodes to a sample that encodes
// back to it: the encoder and the decoder agree segment by segment.
func TestRoundTripCodes(t *testing.T) {
	for _, l := range []Law{PCMU, PCMA} {
		for c := range 256 {
			if l == PCMU && c == 0x7f {
				continue // −0: encodes as +0 (0xff)
			}
			pcm := l.Decode(nil, []byte{byte(c)})
			if got := l.Encode(nil, pcm); got[0] != byte(c) {
				t.Errorf("%s: code %#02x decodes to %d, which encodes to %#02x", l.Name(), c, pcm[0], got[0])
			}
		}
	}
}

// Known points of the recommendation's tables.
func TestKnownValues(t *testing.T) {
	for _, tc := range []struct {
		l    Law
		code byte
		pcm  int16
	}{
		{PCMU, 0xff, 0}, {PCMU, 0x80, 32124}, {PCMU, 0x00, -32124},
		{PCMA, 0xd5, 8}, {PCMA, 0x55, -8}, {PCMA, 0xaa, 32256}, {PCMA, 0x2a, -32256},
	} {
		if got := tc.l.Decode(nil, []byte{tc.code})[0]; got != tc.pcm {
			t.Errorf("%s %#02x: %d, want %d", tc.l.Name(), tc.code, got, tc.pcm)
		}
	}
}

// A tone through either law comes back within G.711's quantisation noise
// (signal to noise above 30 dB, the recommendation gives about 38).
func TestToneSNR(t *testing.T) {
	pcm := make([]int16, ClockRate)
	for i := range pcm {
		pcm[i] = int16(10000 * math.Sin(2*math.Pi*440*float64(i)/ClockRate))
	}
	for _, l := range []Law{PCMU, PCMA} {
		got := l.Decode(nil, l.Encode(nil, pcm))
		var sig, noise float64
		for i := range pcm {
			d := float64(got[i]) - float64(pcm[i])
			sig += float64(pcm[i]) * float64(pcm[i])
			noise += d * d
		}
		if snr := 10 * math.Log10(sig/noise); snr < 30 {
			t.Errorf("%s: SNR %.1f dB", l.Name(), snr)
		}
	}
}

func TestNoAllocs(t *testing.T) {
	pcm := make([]int16, 0, 160)
	code := make([]byte, 160)
	out := make([]byte, 0, 160)
	for _, l := range []Law{PCMU, PCMA} {
		if n := testing.AllocsPerRun(100, func() {
			pcm = l.Decode(pcm[:0], code)
			out = l.Encode(out[:0], pcm)
		}); n != 0 {
			t.Errorf("%s: %v allocations per frame", l.Name(), n)
		}
	}
}
