package realtime

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// frameDur is the Opus frame toward the caller.
const frameDur = 20 * time.Millisecond

// pacer plays one call's reply audio to the caller at real time, however
// fast the server sends it: a PCM queue and a goroutine that encodes and
// writes one 20 ms frame per tick. It sends output_audio_buffer.started
// before a response's first frame and output_audio_buffer.stopped after
// its last, as OpenAI's WebRTC endpoint does. (Issue 28 replaces it with a
// pod-level pacer and barge-in.)
type pacer struct {
	enc   *opus.Encoder // owned by run
	out   backend.Sink
	m     *metrics
	frame int // samples per frame
	max   int // samples the queue holds at most

	mu    sync.Mutex
	pcm   []int16       // guarded by mu: queued samples, from pcm[head]
	head  int           // guarded by mu
	resps []*paced      // guarded by mu: the responses with queued audio, in order
	free  []*paced      // guarded by mu: recycled entries
	wake  chan struct{} // cap 1: audio was queued
	quit  chan struct{}
	done  chan struct{}

	started bool // run was started: close waits for it

	// owned by run
	pkt []byte
	buf []int16
}

// paced is one response's audio in the queue.
type paced struct {
	id      string
	queued  int  // samples in the queue
	ended   bool // response.done seen: no more audio comes
	started bool // output_audio_buffer.started sent
}

func newPacer(enc *opus.Encoder, out backend.Sink, m *metrics, maxQueued time.Duration) *pacer {
	p := &pacer{enc: enc, out: out, m: m, frame: enc.FrameSamples(),
		max:  int(int64(enc.Rate()) * int64(maxQueued) / int64(time.Second)),
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		pkt: make([]byte, opus.MaxPacket)}
	p.buf = make([]int16, p.frame)
	return p
}

// start runs the pacer's goroutine until close.
func (p *pacer) start() {
	p.started = true
	go p.run()
}

// push queues reply audio of response id.
func (p *pacer) push(id []byte, pcm []int16) {
	p.mu.Lock()
	if n := len(p.pcm) - p.head; n+len(pcm) > p.max {
		p.m.dropped[dropPacerFull].Inc()
		pcm = pcm[:max(0, p.max-n)]
	}
	if p.head > 0 && p.head >= len(p.pcm)/2 { // compact: steady state needs no new memory
		p.pcm = p.pcm[:copy(p.pcm, p.pcm[p.head:])]
		p.head = 0
	}
	p.pcm = append(p.pcm, pcm...)
	r := p.lastLocked(id)
	r.queued += len(pcm)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// lastLocked is the queue entry of response id, added at the end if it is
// not the last one.
func (p *pacer) lastLocked(id []byte) *paced {
	if n := len(p.resps); n > 0 && p.resps[n-1].id == string(id) && !p.resps[n-1].ended {
		return p.resps[n-1]
	}
	var r *paced
	if n := len(p.free); n > 0 {
		r, p.free = p.free[n-1], p.free[:n-1]
		*r = paced{}
	} else {
		r = &paced{}
	}
	r.id = string(id)
	p.resps = append(p.resps, r)
	return r
}

// end marks response id complete: once its audio has played, the caller
// gets output_audio_buffer.stopped.
func (p *pacer) end(id []byte) {
	p.mu.Lock()
	for _, r := range p.resps {
		if r.id == string(id) {
			r.ended = true
		}
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// clear drops the queued audio (the caller's output_audio_buffer.clear)
// and tells the caller.
func (p *pacer) clear() {
	p.mu.Lock()
	var id string
	for _, r := range p.resps {
		if r.started && id == "" {
			id = r.id
		}
		p.free = append(p.free, r)
	}
	p.resps = p.resps[:0]
	p.pcm, p.head = p.pcm[:0], 0
	p.mu.Unlock()
	if id != "" {
		p.event("output_audio_buffer.cleared", id)
	}
}

func (p *pacer) event(typ, id string) {
	b, _ := json.Marshal(map[string]string{"type": typ, "event_id": "event_rtcedge_" + typ, "response_id": id})
	if p.out.SendEvent(b) != nil {
		p.m.dropped[dropSink].Inc()
	}
	p.m.eventsFrom.Inc()
}

// run sends a frame every 20 ms while there is audio, on a clock that
// does not drift (each deadline is the previous one plus 20 ms), and
// sleeps on wake when there is none.
func (p *pacer) run() {
	defer close(p.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var next time.Time
	for {
		if p.step() {
			if next.IsZero() || time.Since(next) > frameDur { // (re)start the clock
				next = time.Now()
			}
			next = next.Add(frameDur)
			timer.Reset(time.Until(next))
			select {
			case <-timer.C:
			case <-p.quit:
				return
			}
			continue
		}
		next = time.Time{}
		select {
		case <-p.wake:
		case <-p.quit:
			return
		}
	}
}

// step sends the next frame, if a whole one is queued (or the end of an
// ended response, padded with silence); it reports whether it sent one.
func (p *pacer) step() bool {
	p.mu.Lock()
	var started, stopped string
	// Drop ended responses whose audio has all played.
	for len(p.resps) > 0 && p.resps[0].ended && p.resps[0].queued == 0 {
		r := p.resps[0]
		if r.started {
			stopped = r.id
		}
		p.free = append(p.free, r)
		p.resps = append(p.resps[:0], p.resps[1:]...)
	}
	if len(p.resps) == 0 || (p.resps[0].queued < p.frame && !p.resps[0].ended) {
		p.mu.Unlock()
		if stopped != "" {
			p.event("output_audio_buffer.stopped", stopped)
		}
		return false
	}
	r := p.resps[0]
	n := copy(p.buf, p.pcm[p.head:p.head+min(p.frame, r.queued)])
	clear(p.buf[n:])
	p.head += n
	r.queued -= n
	if !r.started {
		r.started, started = true, r.id
	}
	p.mu.Unlock()
	if stopped != "" {
		p.event("output_audio_buffer.stopped", stopped)
	}
	if started != "" {
		p.event("output_audio_buffer.started", started)
	}
	size, err := p.enc.Encode(p.buf, p.pkt)
	if err != nil {
		p.m.dropped[dropEncode].Inc()
		return true
	}
	if p.out.WriteAudio(p.pkt[:size], frameDur) != nil {
		p.m.dropped[dropSink].Inc()
	}
	p.m.audioFrom.Add(frameDur.Seconds())
	return true
}

// close stops the pacer and waits for it; queued audio is dropped.
func (p *pacer) close() {
	close(p.quit)
	if p.started {
		<-p.done
	}
}
