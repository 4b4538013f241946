package realtime

// The uplink: the caller's audio decoded, batched and queued as
// input_audio_buffer.append (Audio, on the pod's audio path), the events
// queued for the server (toServer, from any goroutine), and the one
// writer that drains the queue onto the WebSocket (writeLoop). Sends on
// the queue hold mu.RLock so that Close cannot close it under them.

import (
	"context"
	"encoding/base64"
	"time"

	"github.com/coder/websocket"
	"github.com/rtcedge/rtcedge/internal/opus"
)

const (
	// appendMs is the caller audio in one input_audio_buffer.append near a
	// change in the caller's voice activity (opus.Inactive): 40 ms (two
	// Opus frames) adds at most 20 ms to what the server has heard, at 25
	// messages a second per call. A change itself is sent at once. Once
	// the activity has held for promptMs, steadyAppendMs batches the rest
	// of the stretch: the server's VAD decides on the audio around a
	// change (speech starting; the silence_duration_ms after it ends,
	// 200–500 ms on the servers docs/backends.md names), and a message
	// costs a WebSocket write, most of the connector's cost after the
	// codec (docs/benchmarks.md, "Transcoding capacity").
	appendMs       = 40
	steadyAppendMs = 100
	promptMs       = 1000
	// queueLen bounds the messages waiting for the server (about 2.5 s of
	// appends); maxQueuedBytes bounds their bytes, as events may be big.
	queueLen       = 64
	maxQueuedBytes = 1 << 20
	// quietHang is how many of the caller's inactive frames (opus.Inactive:
	// its encoder's VAD heard no speech) are decoded, and must decode to
	// quiet (opus.Quiet, under −40 dBFS), before the rest of the pause goes
	// to the server as silence without decoding: the first frames of a
	// pause carry the end of a word, the decoder stays in step with the
	// encoder over a short pause, and a loud sound the VAD has learnt as
	// background (a held tone) keeps being decoded. At 3 (60 ms) the
	// silence-filled decode matches the full one within the noise floor
	// (docs/codec.md); the decode it saves is most of a caller's CPU in
	// the pauses.
	quietHang = 3
)

var (
	appendPrefix = []byte(`{"type":"input_audio_buffer.append","audio":"`)
	appendSuffix = []byte(`"}`)
)

// msg is one message toward the server.
type msg struct {
	b       []byte
	samples int  // caller audio it carries
	pooled  bool // b goes back to free
}

// Audio implements backend.Handler: decode, batch, and queue an append
// every appendMs, or steadyAppendMs once the caller's voice activity has
// held for promptMs; a change of activity goes at once. An inactive frame
// after quietHang inactive quiet ones is not decoded: its duration goes as
// silence. It never blocks: a full queue drops the batch (counted).
func (c *call) Audio(payload []byte, d time.Duration) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return
	}
	if c.format.law != nil {
		c.audioG711(payload, d)
		return
	}
	want := min(len(c.pcm), int(int64(c.format.rate)*int64(d)/int64(time.Second)))
	inactive := opus.Inactive(payload)
	changed := c.activity(inactive, d)
	if inactive && c.quiet >= quietHang {
		c.b.m.silent.Inc()
		c.batch = append(c.batch, make([]int16, want)...) // appends zeros without allocating
		c.flushFull(changed)
		return
	}
	n, err := c.dec.Decode(payload, c.pcm)
	if err != nil {
		c.b.m.dropped[dropDecode].Inc()
		// Keep the server's clock: conceal the lost frame.
		if n, err = c.dec.Conceal(c.pcm[:want]); err != nil {
			return
		}
	}
	if inactive && opus.Quiet(c.pcm[:n]) {
		c.quiet++
	} else {
		c.quiet = 0
	}
	c.batch = append(c.batch, c.pcm[:n]...)
	c.flushFull(changed)
}

// activity takes a frame's voice activity (inactive: no speech) of
// duration d and reports whether it changed; mu.RLock must be held.
func (c *call) activity(inactive bool, d time.Duration) (changed bool) {
	changed = inactive != c.inactive
	if changed {
		c.inactive, c.held = inactive, 0
	} else if c.held < promptMs*time.Millisecond {
		c.held += d
	}
	return changed
}

// flushFull flushes the batch if it is full or the caller's voice activity
// just changed; mu.RLock must be held.
func (c *call) flushFull(changed bool) {
	limit := c.batchSamples
	if c.held >= promptMs*time.Millisecond {
		limit = c.steadySamples
	}
	if changed || len(c.batch)+len(c.g711) >= limit {
		c.flushLocked()
	}
}

// flushLocked queues the batch as one append; mu.RLock must be held.
func (c *call) flushLocked() {
	samples := len(c.batch) + len(c.g711)
	var buf []byte
	select {
	case buf = <-c.free:
	default:
		if c.bufs == queueLen {
			c.b.m.dropped[dropQueueFull].Inc()
			c.batch, c.g711 = c.batch[:0], c.g711[:0]
			return
		}
		c.bufs++
		buf = make([]byte, 0, c.bufSize)
	}
	raw := c.g711 // a G.711 call's audio goes as the carrier sent it
	if c.format.law == nil {
		c.raw = opus.AppendPCM16LE(c.raw[:0], c.batch)
		raw = c.raw
	}
	c.batch, c.g711 = c.batch[:0], c.g711[:0]
	buf = append(buf[:0], appendPrefix...)
	buf = base64.StdEncoding.AppendEncode(buf, raw)
	buf = append(buf, appendSuffix...)
	if !c.enqueueLocked(msg{b: buf, samples: samples, pooled: true}) {
		c.free <- buf
	}
}

func (c *call) enqueueLocked(m msg) bool {
	if c.queued.Add(int64(len(m.b))) > maxQueuedBytes {
		c.queued.Add(-int64(len(m.b)))
		c.b.m.dropped[dropQueueFull].Inc()
		return false
	}
	select {
	case c.queue <- m:
		return true
	default:
		c.queued.Add(-int64(len(m.b)))
		c.b.m.dropped[dropQueueFull].Inc()
		return false
	}
}

func (c *call) writeLoop() {
	defer c.wg.Done()
	sec := 1 / float64(c.format.rate)
	for m := range c.queue {
		// No context: one with a deadline costs an allocation per write;
		// Close and a failure end a blocked write by closing the conn.
		err := c.conn.Write(context.Background(), websocket.MessageText, m.b)
		c.queued.Add(-int64(len(m.b)))
		if m.pooled {
			c.free <- m.b
		}
		if err != nil {
			c.fail(ReasonClosed, err)
			for m := range c.queue { // until Close closes it
				if m.pooled {
					c.free <- m.b
				}
			}
			return
		}
		if m.samples > 0 {
			c.b.m.audioTo.Add(float64(m.samples) * sec)
		}
	}
}

// toServer queues one event for the server (the caller's, the
// sideband's or one the connector makes; owned by the call from here),
// unless the call has closed.
func (c *call) toServer(ev []byte) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return
	}
	if c.enqueueLocked(msg{b: ev}) {
		c.b.m.eventsTo.Inc()
	}
}
