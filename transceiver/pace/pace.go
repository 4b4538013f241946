// Package pace plays each call's outgoing audio to the caller at real time,
// however fast its backend produces it: a Queue per call holds the Opus
// frames the backend wrote, and a pod-wide Scheduler sends one frame per
// call every 20 ms on a steady clock. Because the pod is what sends the
// RTP, it is the one component that knows how much of each response item
// the caller has been sent: a barge-in (Queue.Clear) drops what is queued
// within one frame and reports how many milliseconds of the item went out.
//
// The Scheduler runs a few goroutines for the whole pod (one per shard), not
// one per call: each shard keeps its queues on a timing wheel of slotDur
// slots, so a pod of 1,600 calls wakes a handful of goroutines every few
// milliseconds instead of 1,600 timers every 20 ms (docs/architecture.md,
// "Paced output"; BenchmarkPacing).
package pace

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/internal/opus"
)

// The wheel: a round of opus.FrameDuration is nslots slots. A queue that has
// audio again sends its first frame within one slot; after that it sends
// on its slot every opus.FrameDuration.
const (
	slotDur = 5 * time.Millisecond
	nslots  = int(opus.FrameDuration / slotDur)
)

// idleRounds is how many empty rounds a queue keeps its slot: one. A
// queue found empty at its slot leaves the wheel, and its next frame
// re-enters it on the next slot (within slotDur), so a backend that writes
// at real time with some jitter (echo, a streaming model) has each frame
// sent within 5 ms of its arrival. Keeping the slot for longer kept the
// phase of the call's first frame: a frame that arrived just after its
// slot waited a whole round, and from then on every frame did (a standing
// backlog of one frame: echo RTT 42 ms instead of 23–28 in the
// simulation). Frames still go out at most one per round while the queue
// holds any.
const idleRounds = 1

// DefaultMaxQueued bounds the audio one call holds (a backend that sends a
// whole minute of reply at once); frames beyond it are dropped and counted.
const DefaultMaxQueued = 60 * time.Second

// DefaultMaxQueuedBytes bounds the bytes one call's queued frames hold: 768
// KiB is 16 s of raw 24 kHz PCM16 (the Realtime connector's frames; the
// audio of one delta of its largest event, 1 MiB) and minutes of Opus.
// With the connector's read buffer it keeps what a model server that sends
// faster than real time can make the pod hold per call under 2 MiB
// (docs/operations.md, "Per-call bounds").
const DefaultMaxQueuedBytes = 768 << 10

// ErrClosed is returned by Push after Close.
var ErrClosed = errors.New("pace: queue closed")

// Output is where a Queue's frames and its response events go: the
// session. Its methods are called from a scheduler goroutine, one at a
// time per queue, and must not block for long (they hold up the shard's
// other calls).
type Output interface {
	// SendFrame sends one frame to the caller; payload is valid only
	// during the call. An empty payload is a frame of silence that was not
	// sent (it only advances the RTP clock).
	SendFrame(payload []byte, d time.Duration)
	// Started reports that the first frame of response responseID was
	// sent. replyDelay is the time since the caller's speech ended
	// (Queue.SpeechStopped), or negative when no end of speech is pending.
	Started(responseID string, replyDelay time.Duration)
	// Stopped reports that the last frame of the ended response
	// responseID was sent.
	Stopped(responseID string)
}

// Batcher holds the pod's outgoing datagrams between Cork and Uncork and
// sends them together at Uncork (podnet.Socket: one sendmmsg instead of a
// system call per frame). Calls may nest and come from any goroutine.
type Batcher interface {
	Cork()
	Uncork()
}

// Counter is the part of a Prometheus counter the scheduler adds to.
type Counter interface{ Add(float64) }

// Counters are the seconds of reply audio a scheduler's queues were
// written (Generated), sent to callers (Sent) and dropped (Dropped: by a
// clear, a full queue, or audio of a cleared item), and the items a queue
// forgot to stay within its bound (Evicted). Nil fields count nothing.
type Counters struct {
	Generated, Sent, Dropped Counter
	Evicted                  Counter
}

type nopCounter struct{}

func (nopCounter) Add(float64) {}

// Scheduler sends the frames of every Queue it made. Run drives it; a
// Scheduler that is not running only queues (up to each queue's bound).
type Scheduler struct {
	// Static after New.
	shards   []*shard
	batch    Batcher // nil: frames go out one by one
	c        Counters
	max      int // frames a queue holds
	maxBytes int // bytes a queue's frames hold
	now      func() time.Time

	next atomic.Uint32 // round-robin shard of the next queue
}

// Config configures a Scheduler.
type Config struct {
	// Shards is the number of scheduler goroutines; default 2. Each sends
	// the frames of its share of the calls (SRTP and the socket write).
	Shards int
	// MaxQueued bounds the audio a queue holds; default DefaultMaxQueued.
	MaxQueued time.Duration
	// MaxQueuedBytes bounds the bytes of a queue's frames; default
	// DefaultMaxQueuedBytes.
	MaxQueuedBytes int
	Counters       Counters
	// Batch, if set, is corked while a shard sends one slot's frames, so
	// every call due in the slot leaves in one batch of system calls.
	Batch Batcher
}

// New returns a scheduler; nothing is sent until Run.
func New(cfg Config) *Scheduler {
	if cfg.Shards <= 0 {
		cfg.Shards = 2
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.MaxQueuedBytes <= 0 {
		cfg.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	for _, c := range []*Counter{&cfg.Counters.Generated, &cfg.Counters.Sent, &cfg.Counters.Dropped, &cfg.Counters.Evicted} {
		if *c == nil {
			*c = nopCounter{}
		}
	}
	s := &Scheduler{c: cfg.Counters, max: int(cfg.MaxQueued / opus.FrameDuration), maxBytes: cfg.MaxQueuedBytes, now: time.Now}
	for range cfg.Shards {
		s.shards = append(s.shards, &shard{wake: make(chan struct{}, 1), now: s.now, batch: cfg.Batch})
	}
	return s
}

// Run sends frames until stop is closed; it returns when every shard's
// goroutine has ended.
func (s *Scheduler) Run(stop <-chan struct{}) {
	var wg sync.WaitGroup
	for _, sh := range s.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh.run(stop)
		}()
	}
	wg.Wait()
}

// NewQueue returns an empty queue whose frames go to out.
func (s *Scheduler) NewQueue(out Output) *Queue {
	sh := s.shards[int(s.next.Add(1))%len(s.shards)]
	return &Queue{sh: sh, out: out, c: s.c, max: s.max, maxBytes: s.maxBytes, now: s.now, ring: make([]frame, initialRing)}
}

// shard is one scheduler goroutine's wheel.
type shard struct {
	// Static after the Scheduler made it.
	now   func() time.Time
	batch Batcher       // nil: none
	wake  chan struct{} // cap 1: a queue was added to an idle wheel

	mu     sync.Mutex
	slots  [nslots][]*Queue // guarded by mu, except slots[cur] while run sends it (add never touches it)
	cur    int              // guarded by mu: the slot being sent or last sent
	active int              // guarded by mu: queues on the wheel
}

// add puts q on the next slot: its first frame goes within slotDur.
func (sh *shard) add(q *Queue) {
	sh.mu.Lock()
	i := (sh.cur + 1) % nslots
	sh.slots[i] = append(sh.slots[i], q)
	sh.active++
	idle := sh.active == 1
	sh.mu.Unlock()
	if idle {
		select {
		case sh.wake <- struct{}{}:
		default:
		}
	}
}

// run sends one slot every slotDur while the wheel holds queues, on a clock
// that does not drift (each deadline is the previous one plus slotDur), and
// sleeps on wake when it holds none.
func (sh *shard) run(stop <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var next time.Time
	for {
		sh.mu.Lock()
		idle := sh.active == 0
		sh.mu.Unlock()
		if idle {
			next = time.Time{}
			select {
			case <-sh.wake:
				continue
			case <-stop:
				return
			}
		}
		if now := sh.now(); next.IsZero() || now.Sub(next) > opus.FrameDuration {
			next = now // (re)start the clock: idle, or far behind
		}
		sh.tick()
		next = next.Add(slotDur)
		timer.Reset(time.Until(next))
		select {
		case <-timer.C:
		case <-stop:
			timer.Stop()
			return
		}
	}
}

// tick advances the wheel one slot and sends that slot's queues one frame
// each, corked (Config.Batch) so they leave together; queues that are done
// leave the wheel.
func (sh *shard) tick() {
	sh.mu.Lock()
	sh.cur = (sh.cur + 1) % nslots
	list := sh.slots[sh.cur]
	sh.mu.Unlock()
	now := sh.now()
	kept := list[:0]
	if sh.batch != nil && len(list) > 0 {
		sh.batch.Cork()
	}
	for _, q := range list {
		if q.send(now) {
			kept = append(kept, q)
		}
	}
	if sh.batch != nil && len(list) > 0 {
		sh.batch.Uncork()
	}
	clear(list[len(kept):]) // no stale pointers to ended calls
	sh.mu.Lock()
	sh.active -= len(list) - len(kept)
	sh.slots[sh.cur] = kept
	sh.mu.Unlock()
}
