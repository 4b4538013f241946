package netsim

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// packet is a datagram waiting in a delay line. Values, not pointers, sit in
// the heap so queueing allocates nothing.
type packet struct {
	due  time.Duration // since the line's epoch (monotonic clock)
	seq  uint64        // arrival order: ties leave in the order they came
	buf  *[]byte       // pooled; the line returns it after delivery
	n    int
	flow *udpFlow
}

// delayLine is one direction of a UDP link: arriving packets get a due time
// and wait in a min-heap; one goroutine (run) sleeps on a timer until the
// earliest is due and hands it to deliver. Without jitter due times grow
// with arrival, so order is kept; with jitter packets leave by due time.
type delayLine struct {
	// Static after construction.
	cfg       LinkConfig // Loss is read from loss instead
	limit     int
	epoch     time.Time
	partition *atomic.Bool // the link's switch
	deliver   func(p *packet) error
	wake      chan struct{} // capacity 1: "the head changed"

	loss  atomic.Uint64 // math.Float64bits of the current loss ratio
	extra atomic.Int64  // nanoseconds added to every delay from now on (setExtra)

	mu   sync.Mutex
	draw drawer   // guarded by mu
	heap []packet // guarded by mu
	seq  uint64   // guarded by mu

	forwarded, bytes atomic.Uint64
	dropped          [NumDropReasons]atomic.Uint64
}

func newDelayLine(cfg LinkConfig, salt uint64, partition *atomic.Bool, deliver func(*packet) error) *delayLine {
	d := &delayLine{
		cfg: cfg, limit: cfg.queue(), epoch: time.Now(), partition: partition, deliver: deliver,
		wake: make(chan struct{}, 1), draw: newDrawer(cfg.Seed, salt),
	}
	d.loss.Store(math.Float64bits(cfg.Loss))
	return d
}

func (d *delayLine) setLoss(p float64) { d.loss.Store(math.Float64bits(p)) }

func (d *delayLine) setExtra(x time.Duration) { d.extra.Store(int64(x)) }

func (d *delayLine) drop(r DropReason) { d.dropped[r].Add(1) }

// push queues a packet whose buffer the line now owns. It never blocks: a
// full queue drops the arriving packet, as a router's tail-drop queue would,
// so the head keeps its place and its timing.
func (d *delayLine) push(buf *[]byte, n int, f *udpFlow) {
	if d.partition.Load() {
		d.drop(DropPartition)
		putBuf(buf)
		return
	}
	loss := math.Float64frombits(d.loss.Load())
	d.mu.Lock()
	if d.draw.lose(loss) {
		d.mu.Unlock()
		d.drop(DropLoss)
		putBuf(buf)
		return
	}
	if len(d.heap) >= d.limit {
		d.mu.Unlock()
		d.drop(DropQueueFull)
		putBuf(buf)
		return
	}
	due := time.Since(d.epoch) + d.draw.delay(&d.cfg) + time.Duration(d.extra.Load())
	d.seq++
	d.heap = append(d.heap, packet{due: due, seq: d.seq, buf: buf, n: n, flow: f})
	d.up(len(d.heap) - 1)
	head := d.heap[0].seq == d.seq
	d.mu.Unlock()
	if head {
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

// run releases packets when they are due until done is closed, then frees
// what is still queued. Timers never fire early, so no packet leaves before
// its due time; how late it leaves is the timer's resolution (about 1 ms at
// worst with Go's netpoller-driven timers, typically tens of µs).
func (d *delayLine) run(done <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	const batchMax = 64
	batch := make([]packet, 0, batchMax)
	for {
		d.mu.Lock()
		now := time.Since(d.epoch)
		for len(d.heap) > 0 && d.heap[0].due <= now && len(batch) < batchMax {
			batch = append(batch, d.pop())
		}
		wait := time.Duration(-1)
		if len(d.heap) > 0 {
			wait = d.heap[0].due - now
		}
		d.mu.Unlock()
		for i := range batch {
			d.send(&batch[i])
			batch[i] = packet{}
		}
		full := len(batch) == batchMax
		batch = batch[:0]
		if full || wait == 0 {
			continue
		}
		if wait > 0 {
			timer.Reset(wait)
		}
		select {
		case <-done:
			d.free()
			return
		case <-d.wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}

func (d *delayLine) send(p *packet) {
	switch {
	case d.partition.Load():
		// Packets already "on the wire" when the partition started are
		// lost too: nothing crosses a partitioned link.
		d.drop(DropPartition)
	case d.deliver(p) != nil:
		d.drop(DropWriteError)
	default:
		d.forwarded.Add(1)
		d.bytes.Add(uint64(p.n))
	}
	putBuf(p.buf)
}

func (d *delayLine) free() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.heap {
		putBuf(d.heap[i].buf)
	}
	d.heap = nil
}

func (d *delayLine) stats() DirectionStats {
	s := DirectionStats{Forwarded: d.forwarded.Load(), Bytes: d.bytes.Load()}
	for i := range d.dropped {
		s.Dropped[i] = d.dropped[i].Load()
	}
	d.mu.Lock()
	s.Queued = len(d.heap)
	d.mu.Unlock()
	return s
}

// The heap is hand-written rather than container/heap, whose interface
// boxes every pushed value into an allocation.

func (d *delayLine) less(i, j int) bool {
	a, b := &d.heap[i], &d.heap[j]
	return a.due < b.due || (a.due == b.due && a.seq < b.seq)
}

func (d *delayLine) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !d.less(i, p) {
			return
		}
		d.heap[i], d.heap[p] = d.heap[p], d.heap[i]
		i = p
	}
}

func (d *delayLine) pop() packet {
	h := d.heap
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h[last] = packet{}
	d.heap = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && d.less(l, m) {
			m = l
		}
		if r < last && d.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		d.heap[i], d.heap[m] = d.heap[m], d.heap[i]
		i = m
	}
	return top
}
