package transceiver

import (
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/opus"
)

// TestIntakeBound: whatever a caller's frames claim and however fast they
// come, the audio admitted over any second of wall clock is at most 1.5 s;
// a caller at real time, even one whose network holds its packets for
// 400 ms and then delivers them at once, loses nothing.
func TestIntakeBound(t *testing.T) {
	type arrival struct {
		at time.Duration // since the start
		d  time.Duration
	}
	frames := func(n int, every, d time.Duration) []arrival {
		var a []arrival
		for i := range n {
			a = append(a, arrival{time.Duration(i) * every, d})
		}
		return a
	}
	stalls := func() []arrival { // 60 s at real time, every 5 s a 400 ms stall delivered at once
		var a []arrival
		for i := range 3000 {
			at := time.Duration(i) * 20 * time.Millisecond
			if k := at % (5 * time.Second); k < 400*time.Millisecond {
				at += 400*time.Millisecond - k
			}
			a = append(a, arrival{at, 20 * time.Millisecond})
		}
		return a
	}
	for _, tc := range []struct {
		name     string
		frames   []arrival
		dropNone bool
	}{
		{"real time", frames(3000, 20*time.Millisecond, 20*time.Millisecond), true},
		{"stalls", stalls(), true},
		{"38x voiced", frames(1350, 20*time.Millisecond/38, 20*time.Millisecond), false},      // 27 s in 0.7 s
		{"234x silence", frames(2000, 120*time.Millisecond/234, 120*time.Millisecond), false}, // 120 ms claims
		{"all at once", frames(5000, 0, 20*time.Millisecond), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in intake
			start := time.Unix(1000, 0)
			var ok []arrival
			for _, f := range tc.frames {
				if in.admit(start.Add(f.at), f.d) {
					ok = append(ok, f)
				}
			}
			if tc.dropNone && len(ok) != len(tc.frames) {
				t.Errorf("admitted %d of %d frames, want all", len(ok), len(tc.frames))
			}
			worst := time.Duration(0)
			for i := range ok { // every window of a second that starts at a frame
				sum := time.Duration(0)
				for j := i; j < len(ok) && ok[j].at < ok[i].at+intakeWindow; j++ {
					sum += ok[j].d
				}
				worst = max(worst, sum)
			}
			t.Logf("admitted %d of %d frames; at most %v in a second", len(ok), len(tc.frames), worst)
			if worst > 1500*time.Millisecond {
				t.Errorf("%v admitted within a second, want ≤ 1.5 s", worst)
			}
		})
	}
}

// TestFrameAudio: a frame costs what its Opus packet holds when its RTP
// timestamps claim less.
func TestFrameAudio(t *testing.T) {
	celt20x3 := []byte{31<<3 | 3, 3, 0, 0} // CELT 20 ms, code 3, three frames
	silk60 := []byte{3 << 3, 0}            // SILK 60 ms, one frame
	for _, tc := range []struct {
		p    []byte
		d    time.Duration
		want time.Duration
	}{
		{celt20x3, 20 * time.Millisecond, 60 * time.Millisecond},
		{silk60, 20 * time.Millisecond, 60 * time.Millisecond},
		{silk60, 100 * time.Millisecond, 100 * time.Millisecond},
		{nil, 20 * time.Millisecond, 20 * time.Millisecond},
	} {
		if got := frameAudio(tc.p, tc.d); got != tc.want {
			t.Errorf("frameAudio(% x, %v) = %v, want %v (packet %v)", tc.p, tc.d, got, tc.want, opus.PacketDuration(tc.p))
		}
	}
}
