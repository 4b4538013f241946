package pace

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/opus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is an Output that keeps what it was sent and when.
type recorder struct {
	mu      sync.Mutex
	at      []time.Time
	sizes   []int
	events  []string
	delays  []time.Duration
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) SendFrame(p []byte, _ time.Duration) {
	r.mu.Lock()
	r.at = append(r.at, time.Now())
	r.sizes = append(r.sizes, len(p))
	r.mu.Unlock()
	r.notify()
}

func (r *recorder) Started(id string, d time.Duration) {
	r.mu.Lock()
	r.events = append(r.events, "started "+id)
	r.delays = append(r.delays, d)
	r.mu.Unlock()
	r.notify()
}

func (r *recorder) Stopped(id string) {
	r.mu.Lock()
	r.events = append(r.events, "stopped "+id)
	r.mu.Unlock()
	r.notify()
}

func (r *recorder) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) await(t *testing.T, d time.Duration, what string, cond func(r *recorder) bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		r.mu.Lock()
		ok := cond(r)
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("after %v: %s (%d frames, events %v)", d, what, len(r.at), r.events)
		}
	}
}

func running(t *testing.T, cfg Config) *Scheduler {
	s := New(cfg)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); s.Run(stop) }()
	t.Cleanup(func() { close(stop); <-done })
	return s
}

// gapAt is the pct-th percentile of the gaps between successive times.
func gapAt(at []time.Time, pct int) time.Duration {
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	slices.Sort(gaps)
	return gaps[len(gaps)*pct/100]
}

// TestBurstIsPaced: 3 s of reply written at once goes out over ≥ 2.85 s,
// one frame per 20 ms (median gap), framed by started and stopped. The
// p99 gap is logged: it is the scheduler goroutine's wake-up latency,
// which a loaded machine stretches (the p99 goal is checked end
// to end by e2e's TestPacedReplyThroughRelays).
func TestBurstIsPaced(t *testing.T) {
	s := running(t, Config{})
	r := newRecorder()
	q := s.NewQueue(r)
	defer q.Close()
	q.BeginItem("resp_1", "item_1")
	for range 150 {
		if err := q.Push([]byte{0xf8, 0xff, 0xfe}, opus.FrameDuration); err != nil {
			t.Fatal(err)
		}
	}
	q.EndResponse("resp_1")
	r.await(t, 10*time.Second, "all frames and stopped", func(r *recorder) bool {
		return len(r.at) == 150 && slices.Contains(r.events, "stopped resp_1")
	})
	span, p50, p99 := r.at[149].Sub(r.at[0]), gapAt(r.at, 50), gapAt(r.at, 99)
	t.Logf("150 frames over %v, gaps p50 %v p99 %v", span, p50, p99)
	if span < 2850*time.Millisecond || p50 < 15*time.Millisecond || p50 > 25*time.Millisecond {
		t.Errorf("150 frames over %v, median gap %v: want ≥ 2.85 s, 20 ms", span, p50)
	}
	if want := []string{"started resp_1", "stopped resp_1"}; !slices.Equal(r.events, want) {
		t.Errorf("events %v, want %v", r.events, want)
	}
}

// TestClearStopsWithinAFrame: a clear drops what is queued: at most one
// more frame is sent (the one being sent), and it reports how much of the
// item went out; late frames of the cleared item are dropped until the
// next item begins.
func TestClearStopsWithinAFrame(t *testing.T) {
	s := running(t, Config{})
	r := newRecorder()
	q := s.NewQueue(r)
	defer q.Close()
	q.BeginItem("resp_1", "item_1")
	for range 100 {
		_ = q.Push([]byte{1, 2, 3}, opus.FrameDuration)
	}
	r.await(t, 5*time.Second, "10 frames", func(r *recorder) bool { return len(r.at) >= 10 })
	c := q.Clear()
	at := time.Now()
	r.mu.Lock()
	sentAtClear := len(r.at)
	r.mu.Unlock()
	_ = q.Push([]byte{1, 2, 3}, opus.FrameDuration) // late audio of the cleared item
	time.Sleep(5 * opus.FrameDuration)              // nothing to await: the absence of frames is the point
	r.mu.Lock()
	after := len(r.at) - sentAtClear
	var last time.Time
	if len(r.at) > 0 {
		last = r.at[len(r.at)-1]
	}
	r.mu.Unlock()
	if !c.Active || c.ItemID != "item_1" || c.ResponseID != "resp_1" {
		t.Fatalf("cleared %+v", c)
	}
	if after > 1 || last.Sub(at) > opus.FrameDuration {
		t.Errorf("%d frames sent after the clear, the last %v after it", after, last.Sub(at))
	}
	if d := c.Played - time.Duration(sentAtClear)*opus.FrameDuration; d < -opus.FrameDuration || d > opus.FrameDuration {
		t.Errorf("played %v, %d frames were sent", c.Played, sentAtClear)
	}
	if c.Dropped < time.Duration(100-sentAtClear-1)*opus.FrameDuration {
		t.Errorf("dropped %v", c.Dropped)
	}
	// A new item plays again.
	q.BeginItem("resp_2", "item_2")
	_ = q.Push([]byte{1, 2, 3}, opus.FrameDuration)
	q.EndResponse("resp_2")
	r.await(t, 5*time.Second, "the next response", func(r *recorder) bool { return slices.Contains(r.events, "stopped resp_2") })
	if slices.Contains(r.events, "stopped resp_1") {
		t.Errorf("a cleared response reported stopped: %v", r.events)
	}
}

// TestReplyDelay: the first frame of the response after SpeechStopped
// reports the delay since it, once.
func TestReplyDelay(t *testing.T) {
	s := running(t, Config{})
	r := newRecorder()
	q := s.NewQueue(r)
	defer q.Close()
	q.SpeechStopped(time.Now().Add(-300 * time.Millisecond))
	for i, id := range []string{"resp_1", "resp_2"} {
		q.BeginItem(id, "item")
		_ = q.Push([]byte{1}, opus.FrameDuration)
		q.EndResponse(id)
		r.await(t, 5*time.Second, "stopped", func(r *recorder) bool { return len(r.events) == 2*(i+1) })
	}
	if len(r.delays) != 2 || r.delays[0] < 300*time.Millisecond || r.delays[0] > time.Second || r.delays[1] >= 0 {
		t.Errorf("delays %v: want one of about 300 ms, then none", r.delays)
	}
}

// TestFramesOfNoItem: a backend that never names items (echo) is paced
// with no events, and a full queue drops.
func TestFramesOfNoItem(t *testing.T) {
	s := running(t, Config{MaxQueued: 200 * time.Millisecond})
	r := newRecorder()
	q := s.NewQueue(r)
	for range 20 {
		_ = q.Push([]byte{1}, opus.FrameDuration)
	}
	r.await(t, 5*time.Second, "10 frames", func(r *recorder) bool { return len(r.at) == 10 })
	if c := q.Clear(); c.Active || len(r.events) > 0 {
		t.Errorf("clear %+v, events %v", c, r.events)
	}
	q.Close()
	if err := q.Push([]byte{1}, opus.FrameDuration); err != ErrClosed {
		t.Errorf("push after close: %v", err)
	}
}

// TestNoAllocsPerFrame: pushing and sending a frame, and a barge-in's
// clear, allocate nothing once the queue has its buffers.
func TestNoAllocsPerFrame(t *testing.T) {
	s := New(Config{Shards: 1})
	q := s.NewQueue(nopOutput{})
	q.BeginItem("resp_1", "item_1")
	payload := make([]byte, 80)
	now := time.Now()
	frame := func() {
		_ = q.Push(payload, opus.FrameDuration)
		q.send(now)
	}
	for range 100 {
		frame()
	}
	if n := testing.AllocsPerRun(1000, frame); n != 0 {
		t.Errorf("%v allocations per frame", n)
	}
	enc := &countingEncoder{}
	raw := func() {
		_ = q.PushRaw(payload, opus.FrameDuration, enc)
		q.send(now)
	}
	for range 100 {
		raw()
	}
	if n := testing.AllocsPerRun(1000, raw); n != 0 {
		t.Errorf("%v allocations per raw frame", n)
	}
	bargeIn := func() {
		for range 5 {
			_ = q.Push(payload, opus.FrameDuration)
		}
		q.Clear()
		q.BeginItem("resp_1", "item_1")
	}
	for range 10 {
		bargeIn()
	}
	if n := testing.AllocsPerRun(1000, bargeIn); n != 0 {
		t.Errorf("%v allocations per barge-in", n)
	}
}

type nopOutput struct{}

func (nopOutput) SendFrame([]byte, time.Duration) {}
func (nopOutput) Started(string, time.Duration)   {}
func (nopOutput) Stopped(string)                  {}

// corkCounter is a Batcher that counts its depth; corkedOutput records
// whether each frame was sent while corked.
type corkCounter struct {
	mu           sync.Mutex
	depth, corks int
	sentUncorked int
	sentCorked   int
}

func (c *corkCounter) Cork() {
	c.mu.Lock()
	c.depth++
	c.corks++
	c.mu.Unlock()
}

func (c *corkCounter) Uncork() {
	c.mu.Lock()
	c.depth--
	c.mu.Unlock()
}

type corkedOutput struct {
	nopOutput
	c *corkCounter
}

func (o corkedOutput) SendFrame([]byte, time.Duration) {
	o.c.mu.Lock()
	if o.c.depth > 0 {
		o.c.sentCorked++
	} else {
		o.c.sentUncorked++
	}
	o.c.mu.Unlock()
}

// TestSlotIsCorked: the frames of every call due in one slot are sent
// between one Cork and Uncork of Config.Batch (the pod socket then sends
// them in one sendmmsg).
func TestSlotIsCorked(t *testing.T) {
	c := &corkCounter{}
	s := New(Config{Shards: 1, Batch: c})
	const calls = 10
	for range calls {
		q := s.NewQueue(corkedOutput{c: c})
		_ = q.Push([]byte{1}, opus.FrameDuration) // all on the next slot
	}
	s.shards[0].tick()
	if c.sentCorked != calls || c.sentUncorked != 0 || c.corks != 1 || c.depth != 0 {
		t.Errorf("%d frames sent corked, %d uncorked, %d corks, depth %d after the slot; want %d, 0, 1, 0",
			c.sentCorked, c.sentUncorked, c.corks, c.depth, calls)
	}
}

// countingEncoder "encodes" a frame by prefixing 'e'; it counts its calls.
type countingEncoder struct{ n int }

func (e *countingEncoder) EncodeFrame(dst, frame []byte) ([]byte, error) {
	e.n++
	return append(append(dst, 'e'), frame...), nil
}

// payloadRecorder keeps the payloads it was sent.
type payloadRecorder struct {
	nopOutput
	got *[]string
}

func (o payloadRecorder) SendFrame(p []byte, _ time.Duration) { *o.got = append(*o.got, string(p)) }

// TestRawFramesEncodedAtSend: a frame pushed raw is encoded when it is
// sent, so the frames a barge-in clears are never encoded.
func TestRawFramesEncodedAtSend(t *testing.T) {
	s := New(Config{Shards: 1})
	var got []string
	q := s.NewQueue(payloadRecorder{got: &got})
	enc := &countingEncoder{}
	q.BeginItem("resp_1", "item_1")
	for i := range 10 {
		if err := q.PushRaw([]byte{'0' + byte(i)}, opus.FrameDuration, enc); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	for range 3 {
		q.send(now)
	}
	if c := q.Clear(); c.Dropped != 7*opus.FrameDuration {
		t.Errorf("clear dropped %v, want 7 frames", c.Dropped)
	}
	q.send(now)
	if enc.n != 3 || !slices.Equal(got, []string{"e0", "e1", "e2"}) {
		t.Errorf("%d encodes, sent %q; want 3 encodes of the 3 frames sent", enc.n, got)
	}
}

// TestAwaitStart: AwaitStart returns at once for a response with no audio
// queued, waits while its first frame is unsent and returns when it is
// sent, and gives up after its bound.
func TestAwaitStart(t *testing.T) {
	s := New(Config{Shards: 1})
	q := s.NewQueue(nopOutput{})
	start := time.Now()
	q.AwaitStart("resp_1", time.Minute) // nothing queued
	q.BeginItem("resp_1", "item_1")
	_ = q.Push([]byte{1}, opus.FrameDuration)
	_ = q.Push([]byte{2}, opus.FrameDuration)
	q.AwaitStart("resp_1", 10*time.Millisecond) // never sent: the bound
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.AwaitStart("resp_1", time.Minute)
	}()
	select {
	case <-done:
		t.Fatal("AwaitStart returned before the response's first frame was sent")
	case <-time.After(20 * time.Millisecond):
	}
	q.send(time.Now())
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("AwaitStart still waiting after the first frame was sent")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}
