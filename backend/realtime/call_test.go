package realtime

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// TestAppendBatching: the caller's audio goes in 40 ms appends for a
// second after each change of its voice activity (the change itself at
// once), and in 100 ms appends while the activity holds longer.
func TestAppendBatching(t *testing.T) {
	bk, err := New(Config{URL: "ws://127.0.0.1:1/v1/realtime"})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := opus.NewDecoder(bk.cfg.Rate)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := opus.NewEncoder(bk.cfg.Rate)
	if err != nil {
		t.Fatal(err)
	}
	c := newCall(bk, backend.SessionInfo{ID: "batching"}, discard{}, nil, audioFormat{rate: bk.cfg.Rate}, dec, enc)
	defer func() { dec.Close(); enc.Close() }()

	// A voiced frame and a silent one, as a browser sends them.
	e48, err := opus.NewVoIPEncoder(48000)
	if err != nil {
		t.Fatal(err)
	}
	defer e48.Close()
	tone := make([]int16, 960)
	for i := range tone {
		tone[i] = int16(8000 * math.Sin(2*math.Pi*440*float64(i)/48000))
	}
	buf := make([]byte, opus.MaxPacket)
	n, err := e48.Encode(tone, buf)
	if err != nil {
		t.Fatal(err)
	}
	voiced := slices.Clone(buf[:n])
	for range 10 { // past the encoder's VAD hangover
		if n, err = e48.Encode(make([]int16, 960), buf); err != nil {
			t.Fatal(err)
		}
	}
	silent := slices.Clone(buf[:n])
	if opus.Inactive(voiced) || !opus.Inactive(silent) {
		t.Fatal("test frames: want one active, one inactive")
	}

	// ms is the audio of each append queued so far.
	var ms []int
	drain := func() {
		for {
			select {
			case m := <-c.queue:
				c.queued.Add(-int64(len(m.b)))
				c.free <- m.b
				ms = append(ms, m.samples*1000/bk.cfg.Rate)
			default:
				return
			}
		}
	}
	send := func(p []byte, frames int) {
		for range frames {
			c.Audio(p, 20*time.Millisecond)
			drain()
		}
	}
	send(voiced, 100) // 2 s of speech
	speech := slices.Clone(ms)
	ms = ms[:0]
	send(silent, 1) // the pause starts: sent at once
	if len(ms) != 1 || len(c.batch) != 0 {
		t.Fatalf("the first inactive frame: appends %v, %d samples left in the batch; want it sent at once", ms, len(c.batch))
	}
	send(silent, 99)
	pause := slices.Clone(ms[1:])

	for _, run := range []struct {
		name string
		ms   []int
	}{{"speech", speech}, {"pause", pause}} {
		// 1 s of 40 ms appends, then 100 ms ones.
		var prompt, steady int
		for i, m := range run.ms {
			switch {
			case m == 40 && steady == 0:
				prompt++
			case m == 100:
				steady++
			default:
				t.Errorf("%s: append %d of %v: %d ms", run.name, i, run.ms, m)
			}
		}
		if prompt < 23 || prompt > 26 || steady < 9 {
			t.Errorf("%s: %d appends of 40 ms then %d of 100 ms (%v); want about 25, then the rest", run.name, prompt, steady, run.ms)
		}
	}
}
