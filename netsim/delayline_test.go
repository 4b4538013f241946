package netsim

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestDelayLineNoAlloc guards the queue's hot path: pushing and releasing a
// packet allocates nothing once the heap has grown.
func TestDelayLineNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	var part atomic.Bool
	d := newDelayLine(LinkConfig{Delay: time.Millisecond, Jitter: time.Millisecond, Loss: 0.1}, 1, &part, func(*packet) error { return nil })
	f := &udpFlow{}
	for range 64 {
		d.push(getBuf(), 100, f)
	}
	for len(d.heap) > 0 {
		p := d.pop()
		d.send(&p)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		d.push(getBuf(), 100, f)
		if len(d.heap) > 0 {
			p := d.pop()
			d.send(&p)
		}
	})
	if allocs != 0 {
		t.Errorf("push + release allocates %.1f times per packet", allocs)
	}
}

// TestDelayLineOrder releases packets by due time, ties in arrival order.
func TestDelayLineOrder(t *testing.T) {
	var part atomic.Bool
	d := newDelayLine(LinkConfig{Delay: time.Second, Jitter: 500 * time.Millisecond, Seed: 9}, 1, &part, nil)
	for range 500 {
		d.push(getBuf(), 1, nil)
	}
	var last packet
	for i := 0; len(d.heap) > 0; i++ {
		p := d.pop()
		if i > 0 && (p.due < last.due || (p.due == last.due && p.seq < last.seq)) {
			t.Fatalf("packet %d (due %v, seq %d) after (due %v, seq %d)", i, p.due, p.seq, last.due, last.seq)
		}
		last = p
		putBuf(p.buf)
	}
}
