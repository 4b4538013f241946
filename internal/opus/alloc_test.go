//go:build cgo && !noopus && !race

package opus

import (
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/audiotest"
)

// TestNoAllocs: a frame each way (decode the caller's packet, encode the
// model's frame) and a concealed frame allocate nothing once the codecs
// exist. (Without -race, which adds allocations of its own.)
func TestNoAllocs(t *testing.T) {
	enc48, _ := newCallerPair(t, 48000, 24000)
	enc, dec := newPair(t, 24000, 24000)
	tone48, tone24 := audiotest.Tone(48000, 440, 0.5, time.Second), audiotest.Tone(24000, 440, 0.5, time.Second)
	pkt, out := make([]byte, MaxPacket), make([]byte, MaxPacket)
	pcm := make([]int16, 24000*120/1000)
	n, err := enc48.Encode(tone48[:960], pkt)
	if err != nil {
		t.Fatal(err)
	}
	fs := enc.FrameSamples()
	var b []byte
	if a := testing.AllocsPerRun(200, func() {
		if _, err := dec.Decode(pkt[:n], pcm); err != nil {
			t.Fatal(err)
		}
		if _, err := enc.Encode(tone24[:fs], out); err != nil {
			t.Fatal(err)
		}
		if _, err := dec.Conceal(pcm[:fs]); err != nil {
			t.Fatal(err)
		}
		if Inactive(pkt[:n]) {
			t.Fatal("a tone frame read as inactive")
		}
		b = AppendPCM16LE(b[:0], pcm[:fs])
		DecodePCM16LE(b, pcm)
	}); a != 0 {
		t.Errorf("%v allocations per frame", a)
	}
}
