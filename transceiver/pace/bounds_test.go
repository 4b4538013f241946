package pace

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/heaptest"
	"github.com/rtcedge/rtcedge/internal/opus"
)

type count struct{ n atomic.Int64 }

func (c *count) Add(v float64) { c.n.Add(int64(v * 1000)) }

// TestBytesBound: a backend that writes raw 24 kHz frames far faster than
// real time fills a queue up to MaxQueuedBytes, not to its minute of
// frames; the rest is dropped and counted. Once the queue has sent them,
// it holds its small ring and at most maxFreeBytes of recycled buffers.
func TestBytesBound(t *testing.T) {
	var dropped count
	s := New(Config{Shards: 1, Counters: Counters{Dropped: &dropped}})
	const calls = 8
	frame := make([]byte, 960) // 20 ms of PCM16 at 24 kHz
	base := heaptest.Live()
	var qs []*Queue
	for range calls {
		q := s.NewQueue(nopOutput{})
		q.BeginItem("resp_1", "item_1")
		for range 3000 { // 60 s
			if err := q.Push(frame, opus.FrameDuration); err != nil {
				t.Fatal(err)
			}
		}
		qs = append(qs, q)
	}
	full := (heaptest.Live() - base) / calls
	t.Logf("a full queue holds %d KiB", full>>10)
	if full > DefaultMaxQueuedBytes+256<<10 {
		t.Errorf("a full queue holds %d KiB, want ≤ %d KiB and its ring", full>>10, (DefaultMaxQueuedBytes+256<<10)>>10)
	}
	q := qs[0]
	q.mu.Lock()
	n, held := q.n, q.held
	q.mu.Unlock()
	if held > DefaultMaxQueuedBytes || n != DefaultMaxQueuedBytes/len(frame) {
		t.Errorf("%d frames of %d bytes queued (%d held), want %d", n, len(frame), held, DefaultMaxQueuedBytes/len(frame))
	}
	if want := int64(calls * (3000 - n) * 20); dropped.n.Load() != want {
		t.Errorf("dropped %d ms, want %d", dropped.n.Load(), want)
	}
	now := time.Now()
	for _, q := range qs {
		for q.send(now) {
			if q.n == 0 {
				break
			}
		}
	}
	drained := (heaptest.Live() - base) / calls
	t.Logf("a drained queue holds %d KiB", drained>>10)
	if drained > maxFreeBytes+16<<10 {
		t.Errorf("a drained queue holds %d KiB, want ≤ %d KiB", drained>>10, (maxFreeBytes+16<<10)>>10)
	}
	for _, q := range qs {
		q.Close()
	}
}

// TestItemsBounded: one-sample deltas, each of a fresh item and none of
// an ended response, make one frame per item; the queue tracks at most
// maxItems of them (the oldest forgotten and counted), so its memory does
// not grow with the deltas. The frames all still go out.
func TestItemsBounded(t *testing.T) {
	var evicted count
	s := New(Config{Shards: 1, Counters: Counters{Evicted: &evicted}})
	var out countOutput
	q := s.NewQueue(&out)
	defer q.Close()
	frame := make([]byte, 960)
	now := time.Now()
	const items = 20000
	step := func(i int) {
		q.BeginItem("resp_1", fmt.Sprint("item_", i))
		_ = q.Push(frame, opus.FrameDuration)
		if i%2 == 1 { // half of them still queued when the next begins
			q.send(now)
			q.send(now)
		}
	}
	for i := range 1000 {
		step(i)
	}
	base := heaptest.Live()
	for i := 1000; i < items; i++ {
		step(i)
	}
	grown := heaptest.Live() - base
	q.mu.Lock()
	tracked, free := len(q.items), len(q.free)
	q.mu.Unlock()
	t.Logf("%d items tracked, %d recycled, heap grew %d KiB over %d items", tracked, free, grown>>10, items-1000)
	if tracked > maxItems || free > maxItems {
		t.Errorf("%d items tracked, %d recycled: want ≤ %d", tracked, free, maxItems)
	}
	if grown > 64<<10 {
		t.Errorf("the heap grew %d KiB over %d items", grown>>10, items-1000)
	}
	if got := evicted.n.Load() / 1000; got != items-maxItems {
		t.Errorf("%d items evicted, want %d", got, items-maxItems)
	}
	if sent := out.frames.Load(); sent != items {
		t.Errorf("%d frames sent, want %d", sent, items)
	}
}

// countOutput counts the frames sent and keeps nothing.
type countOutput struct {
	nopOutput
	frames atomic.Int64
}

func (o *countOutput) SendFrame([]byte, time.Duration) { o.frames.Add(1) }
