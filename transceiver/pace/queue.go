package pace

// One call's queue of reply frames: what the backend pushes, what the
// scheduler (pace.go) sends from it each round, and the turn's events and
// barge-in that change it.

import (
	"sync"
	"time"
)

// Queue is one call's outgoing audio: the frames its backend wrote and not
// yet sent, and the response items they belong to. Push, BeginItem,
// EndResponse, SpeechStopped and Clear may be called from any goroutine;
// the scheduler sends. All state is guarded by mu.
type Queue struct {
	// Static after NewQueue.
	sh       *shard
	out      Output
	c        Counters
	max      int // frames
	maxBytes int // buffer bytes of the queued frames
	now      func() time.Time

	// The frames and items, guarded by mu: pushed by the backend's
	// writer, sent by the shard's loop, cleared by a barge-in.
	mu        sync.Mutex
	ring      []frame // frames from ring[head], n of them; only queued frames hold a buffer
	head, n   int
	held      int      // the capacity of the queued frames' buffers
	bufs      [][]byte // buffers of sent frames, for the next pushes: at most maxFreeBytes
	bufBytes  int      // their capacity
	items     []*item  // items with frames queued or not yet stopped, oldest first; at most maxItems
	free      []*item  // recycled items
	cur       *item    // the item new frames belong to; nil: frames of no item (echo)
	discard   bool     // the current item was cleared: its late frames are dropped
	scheduled bool     // on the wheel
	idle      int      // empty rounds while scheduled
	closed    bool
	sendBuf   []byte // the frame being sent; swapped with a ring buffer under mu, read by send after it
	encBuf    []byte // sendBuf encoded (PushRaw); owned by the shard's loop (send), no lock

	// The turn's state, guarded by mu.

	startWait   chan struct{} // closed when an item starts, is cleared or the queue closes (AwaitStart)
	lastStarted string        // the last response whose start was reported
	lastStopped string        // the last response whose stop was reported
	stoppedAt   time.Time     // the caller's speech ended (SpeechStopped); zero: none pending
	lastReply   time.Time     // when the last frame of an item was sent
}

type frame struct {
	buf []byte
	d   time.Duration
	it  *item
	enc Encoder // nil: buf is the payload
}

// Encoder turns a frame pushed raw (PushRaw) into the payload the caller
// is sent, appended to dst: the Realtime connector's Opus encoder (a
// backend.FrameEncoder). The scheduler calls it when it sends the frame,
// one frame at a time per queue, in the order pushed; frames a Clear drops
// are never encoded.
type Encoder interface {
	EncodeFrame(dst, frame []byte) ([]byte, error)
}

// item is one response item's audio.
type item struct {
	responseID, itemID string
	queued             int           // frames in the ring
	sent               time.Duration // audio sent to the caller
	started, ended     bool          // a frame was sent; the response ended (no more audio comes)
	evicted            bool          // forgotten with frames queued (evictLocked): they report nothing
}

// Push queues one frame of the current item (BeginItem), or of no item. A
// full queue drops the frame; a frame of a cleared item is dropped. Neither
// is an error: both are counted.
func (q *Queue) Push(payload []byte, d time.Duration) error {
	return q.push(payload, d, nil)
}

// PushRaw is Push for a frame that enc encodes when the scheduler sends it
// (raw PCM for an Opus encoder): audio a barge-in clears costs no encode,
// and the encoder's state follows what the caller was sent. A frame enc
// fails on goes out empty (it advances the RTP clock only); enc counts it.
func (q *Queue) PushRaw(frame []byte, d time.Duration, enc Encoder) error {
	return q.push(frame, d, enc)
}

func (q *Queue) push(payload []byte, d time.Duration, enc Encoder) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if q.discard || q.n >= q.max || q.held+len(payload) > q.maxBytes {
		q.mu.Unlock()
		q.c.Dropped.Add(d.Seconds())
		return nil
	}
	if q.n == len(q.ring) {
		q.growLocked()
	}
	f := &q.ring[(q.head+q.n)%len(q.ring)]
	f.buf = append(q.takeBufLocked(len(payload)), payload...)
	q.held += cap(f.buf)
	f.d, f.it, f.enc = d, q.cur, enc
	if q.cur != nil {
		q.cur.queued++
	}
	q.n++
	add := !q.scheduled
	q.scheduled, q.idle = true, 0
	q.mu.Unlock()
	q.c.Generated.Add(d.Seconds())
	if add {
		q.sh.add(q)
	}
	return nil
}

// Buffer recycling: a queue keeps the buffers of sent frames for the next
// pushes, up to maxFreeBytes of buffers of at most maxKeptBuf each (a
// 20 ms frame is under 2 KiB, raw PCM16 at 48 kHz included), so a call
// that keeps up allocates nothing, and one that held a long reply, or
// odd-sized frames, gives that memory back once they are sent.
const (
	maxKeptBuf   = 4 << 10
	maxFreeBytes = 64 << 10
	// initialRing is a new queue's ring; a drained queue's ring shrinks
	// back to it.
	initialRing = 8
)

// takeBufLocked returns an empty buffer for n bytes: a recycled one if it
// fits, else a new one.
func (q *Queue) takeBufLocked(n int) []byte {
	if k := len(q.bufs); k > 0 {
		b := q.bufs[k-1]
		q.bufs[k-1] = nil
		q.bufs = q.bufs[:k-1]
		q.bufBytes -= cap(b)
		if cap(b) >= n {
			return b
		}
	}
	return make([]byte, 0, n)
}

// putBufLocked recycles b, if it is small enough and the queue keeps few
// enough.
func (q *Queue) putBufLocked(b []byte) {
	if b == nil || cap(b) > maxKeptBuf || q.bufBytes+cap(b) > maxFreeBytes {
		return
	}
	q.bufs = append(q.bufs, b[:0])
	q.bufBytes += cap(b)
}

// dropHeadLocked removes the head frame and returns its buffer, which is
// the caller's now.
func (q *Queue) dropHeadLocked() []byte {
	f := &q.ring[q.head]
	b := f.buf
	q.held -= cap(b)
	*f = frame{}
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	if q.n == 0 && len(q.ring) > initialRing {
		q.ring, q.head = make([]frame, initialRing), 0 // a long reply's ring is not the call's to keep
	}
	return b
}

// growLocked doubles the ring (up to max frames), keeping the order.
func (q *Queue) growLocked() {
	ring := make([]frame, min(2*len(q.ring), max(q.max, len(q.ring)+1)))
	for i := range q.n {
		ring[i] = q.ring[(q.head+i)%len(q.ring)]
	}
	q.ring, q.head = ring, 0
}

// BeginItem makes the frames pushed from now on item itemID of response
// responseID (a backend calls it before the item's first audio). It ends a
// clear's discarding.
func (q *Queue) BeginItem(responseID, itemID string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.discard = false
	if q.cur != nil && q.cur.itemID == itemID && q.cur.responseID == responseID {
		return
	}
	if len(q.items) >= maxItems {
		q.evictLocked()
	}
	var it *item
	if n := len(q.free); n > 0 {
		it, q.free = q.free[n-1], q.free[:n-1]
		*it = item{}
	} else {
		it = &item{}
	}
	it.responseID, it.itemID = responseID, itemID
	q.items = append(q.items, it)
	q.cur = it
}

// maxItems bounds the items a queue tracks. A reply is one or two audio
// items, and an item leaves the list once its response ended and its
// frames were sent; a backend that begins item after item and never ends
// a response (fresh IDs on every delta) would otherwise grow the list
// with every delta.
const maxItems = 64

// evictLocked makes room for an item: it forgets the oldest one (its
// queued frames still go out, as frames of an item no longer tracked:
// they report no started or stopped). Counted as Evicted.
func (q *Queue) evictLocked() {
	it := q.items[0]
	copy(q.items, q.items[1:])
	q.items[len(q.items)-1] = nil
	q.items = q.items[:len(q.items)-1]
	if it.queued == 0 {
		q.free = append(q.free, it) // no frame points to it
	} else {
		it.evicted = true
	}
	if it == q.cur {
		q.cur = nil
	}
	q.c.Evicted.Add(1)
}

// EndResponse says response responseID has no more audio: once its queued
// frames are sent, Output.Stopped reports it (at once if they are).
func (q *Queue) EndResponse(responseID string) {
	q.mu.Lock()
	for _, it := range q.items {
		if it.responseID == responseID {
			it.ended = true
		}
	}
	if q.cur != nil && q.cur.responseID == responseID {
		q.cur = nil
	}
	stopped := q.reapLocked()
	q.mu.Unlock()
	if stopped != "" {
		q.out.Stopped(stopped)
	}
}

// SpeechStopped records that the caller's speech ended at t: the next
// response to start reports the delay (Output.Started).
func (q *Queue) SpeechStopped(t time.Time) {
	q.mu.Lock()
	q.stoppedAt = t
	q.mu.Unlock()
}

// reapLocked drops the ended items whose frames have all been sent and
// returns the response to report stopped (one per call; a later one is
// reported by the next reap).
func (q *Queue) reapLocked() string {
	stopped := ""
	for len(q.items) > 0 {
		it := q.items[0]
		if !it.ended || it.queued > 0 || (stopped != "" && it.started && it.responseID != stopped) {
			break
		}
		if it.started && it.responseID != q.lastStopped {
			stopped, q.lastStopped = it.responseID, it.responseID
		}
		q.free = append(q.free, it)
		q.items = append(q.items[:0], q.items[1:]...)
	}
	return stopped
}

// send sends the head frame, if any; it reports whether the queue stays on
// the wheel. Called by the queue's shard only.
func (q *Queue) send(now time.Time) bool {
	q.mu.Lock()
	if q.closed || q.n == 0 {
		q.idle++
		keep := !q.closed && q.idle < idleRounds
		q.scheduled = keep
		q.mu.Unlock()
		return keep
	}
	f := &q.ring[q.head]
	d, it, enc := f.d, f.it, f.enc
	q.putBufLocked(q.sendBuf) // the last frame this queue sent is done with
	q.sendBuf = q.dropHeadLocked()
	payload := q.sendBuf
	q.idle = 0
	started, delay := "", time.Duration(-1)
	var stopped string
	if it != nil && it.evicted {
		it = nil
	}
	if it != nil {
		it.queued--
		it.sent += d
		q.lastReply = now
		if !it.started {
			it.started = true
			q.wakeStartLocked()
			if it.responseID != q.lastStarted {
				started, q.lastStarted = it.responseID, it.responseID
				if !q.stoppedAt.IsZero() {
					delay, q.stoppedAt = now.Sub(q.stoppedAt), time.Time{}
				}
			}
		}
		stopped = q.reapLocked()
	}
	q.mu.Unlock()
	if enc != nil {
		var err error
		if q.encBuf, err = enc.EncodeFrame(q.encBuf[:0], payload); err != nil {
			q.encBuf = q.encBuf[:0]
		}
		payload = q.encBuf
	}
	if started != "" {
		q.out.Started(started, delay)
	}
	q.out.SendFrame(payload, d)
	q.c.Sent.Add(d.Seconds())
	if stopped != "" {
		q.out.Stopped(stopped)
	}
	return true
}

// AwaitStart returns once no frame of response responseID waits to be the
// response's first one sent (it started, was cleared, or has no audio
// queued), or after max.
func (q *Queue) AwaitStart(responseID string, max time.Duration) {
	var timer *time.Timer
	for {
		q.mu.Lock()
		waiting := false
		for _, it := range q.items {
			if it.responseID == responseID && it.queued > 0 && !it.started {
				waiting = true
				break
			}
		}
		if !waiting || q.closed {
			q.mu.Unlock()
			break
		}
		if q.startWait == nil {
			q.startWait = make(chan struct{})
		}
		ch := q.startWait
		q.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(max)
			defer timer.Stop()
		}
		select {
		case <-ch:
		case <-timer.C:
			return
		}
	}
}

// wakeStartLocked releases AwaitStart's waiters; mu held.
func (q *Queue) wakeStartLocked() {
	if q.startWait != nil {
		close(q.startWait)
		q.startWait = nil
	}
}

// Playing reports whether a response item is playing or queued: what
// Clear would report Active.
func (q *Queue) Playing() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range q.items {
		if !(it.started && it.queued == 0 && it.ended) {
			return true
		}
	}
	return false
}

// Cleared is what Clear dropped and what the caller had been sent.
type Cleared struct {
	// Active: a response item was playing or queued (the caller was
	// hearing a reply, or one was about to start).
	Active     bool
	ResponseID string
	ItemID     string
	// Played is the audio of ItemID sent to the caller: the audio_end_ms
	// of a conversation.item.truncate.
	Played time.Duration
	// Dropped is the queued audio dropped.
	Dropped time.Duration
	// LastReply is when the last frame of any item was sent.
	LastReply time.Time
}

// Clear drops every queued frame now (the frame being sent, if any, is the
// last one the caller gets) and reports the item that was playing: the
// oldest item not yet stopped. Until the next BeginItem, frames pushed are
// dropped (the backend's audio in flight for the cleared item).
func (q *Queue) Clear() Cleared {
	q.mu.Lock()
	var c Cleared
	for _, it := range q.items {
		if it.started && it.queued == 0 && it.ended {
			continue // played to its end
		}
		c.Active, c.ResponseID, c.ItemID, c.Played = true, it.responseID, it.itemID, it.sent
		break
	}
	for q.n > 0 {
		c.Dropped += q.ring[q.head].d
		q.putBufLocked(q.dropHeadLocked())
	}
	q.free = append(q.free, q.items...)
	clear(q.items)
	q.items = q.items[:0]
	q.discard = c.Active && q.cur != nil
	q.cur = nil
	if c.Active {
		// No stopped event for what was cleared: the caller gets
		// output_audio_buffer.cleared instead.
		q.lastStopped = c.ResponseID
	}
	c.LastReply = q.lastReply
	q.wakeStartLocked()
	q.mu.Unlock()
	if c.Dropped > 0 {
		q.c.Dropped.Add(c.Dropped.Seconds())
	}
	return c
}

// Close drops the queue's frames and takes it off the wheel (at its next
// slot); Push fails after it.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.ring, q.n, q.head, q.items, q.cur, q.sendBuf = nil, 0, 0, nil, nil, nil
	q.bufs, q.bufBytes, q.held = nil, 0, 0
	q.wakeStartLocked()
	q.mu.Unlock()
}
