package pace

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
	sh  *shard
	out Output
	c   Counters
	max int
	now func() time.Time

	mu        sync.Mutex
	ring      []frame // frames from ring[head], n of them; each keeps its buffer
	head, n   int
	items     []*item // items with frames queued or not yet stopped, oldest first
	free      []*item // recycled items
	cur       *item   // the item new frames belong to; nil: frames of no item (echo)
	discard   bool    // the current item was cleared: its late frames are dropped
	scheduled bool    // on the wheel
	idle      int     // empty rounds while scheduled
	closed    bool
	sendBuf   []byte // the frame being sent; swapped with a ring buffer, never copied
	encBuf    []byte // sendBuf encoded (PushRaw); the scheduler's only

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
	if q.discard || q.n >= q.max {
		q.mu.Unlock()
		q.c.Dropped.Add(d.Seconds())
		return nil
	}
	if q.n == len(q.ring) {
		q.growLocked()
	}
	f := &q.ring[(q.head+q.n)%len(q.ring)]
	f.buf = append(f.buf[:0], payload...)
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
	q.sendBuf, f.buf = f.buf, q.sendBuf[:0]
	payload, d, it, enc := q.sendBuf, f.d, f.it, f.enc
	f.it, f.enc = nil, nil
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	q.idle = 0
	started, delay := "", time.Duration(-1)
	var stopped string
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
		f := &q.ring[q.head]
		c.Dropped += f.d
		f.it, f.enc = nil, nil
		q.head = (q.head + 1) % len(q.ring)
		q.n--
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
	q.wakeStartLocked()
	q.mu.Unlock()
}
