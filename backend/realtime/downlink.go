package realtime

// The downlink: the server's events read one at a time (readLoop), routed
// (handle: audio deltas to the pod, the rest to the caller as they came),
// and the reply audio cut into 20 ms frames for the pod (audioDelta), which
// paces them and has them encoded by the call's replyEncoder as it sends
// them. Everything here runs on the reader's goroutine; the reply path it
// shares with bargeIn is guarded by omu.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"sync"

	"github.com/coder/websocket"
	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/opus"
)

const (
	// deltaChunk is the base64 an audio delta is decoded by (a multiple
	// of 4): a delta of any size costs the call deltaChunk*3/4 bytes of
	// decoded PCM, not a buffer the size of its audio.
	deltaChunk = 4 << 10
	// maxIDLen bounds the item and response IDs of an audio delta the pod
	// keeps (OpenAI's are under 40 bytes): every item is a pacer entry
	// and its IDs are kept with it.
	maxIDLen = 128
)

// readLoop reads the server's events one at a time into the call's read
// buffer and hands each to handle; a read error ends the call (fail).
func (c *call) readLoop() {
	defer c.wg.Done()
	for {
		_, r, err := c.conn.Reader(context.Background())
		var data []byte
		if err == nil {
			data, err = c.rbuf.Read(r, c.b.cfg.MaxMessage)
		}
		if err != nil {
			reason := ReasonClosed
			if errors.Is(err, websocket.ErrMessageTooBig) {
				reason = ReasonOversized
			}
			c.fail(reason, err)
			return
		}
		c.handle(data)
		c.rbuf.Release()
	}
}

// handle routes one server event: audio deltas to the pod as Opus frames,
// the rest to the caller as they came; the events of a turn also drive the
// pod's output (items, response ends, barge-in).
func (c *call) handle(data []byte) {
	var f fields
	ok := scanEvent(data, &f)
	if ok && f.escaped {
		ok = f.unescape(data)
	}
	if ok && isAudioDelta(f.typ) {
		c.audioDelta(f.responseID, f.itemID, f.delta)
		return
	}
	if ok && bytes.Equal(f.typ, evError) && ownError(data) {
		c.b.m.dropped[dropOwnError].Inc() // the answer to the edge's own cancel or truncate
		return
	}
	// response.done goes to the caller after the pod started playing the
	// response (output_audio_buffer.started), as from OpenAI: the reply's
	// last partial frame is written first, then the pod is waited for.
	var done string
	if ok && bytes.Equal(f.typ, evResponseDone) {
		if done = responseID(data); done != "" {
			c.omu.Lock()
			if c.active == done {
				c.active = ""
			}
			if c.cancelled != done {
				c.flushReplyLocked()
			}
			c.omu.Unlock()
			if c.await != nil {
				c.await.AwaitStart(done)
			}
		}
	}
	c.toCaller(data)
	if !ok {
		return
	}
	switch {
	case bytes.Equal(f.typ, evResponseCreated):
		if id := responseID(data); id != "" {
			c.omu.Lock()
			c.active = id
			c.omu.Unlock()
		}
	case bytes.Equal(f.typ, evResponseDone):
		if done != "" && c.play != nil {
			c.play.EndResponse(done)
		}
	case bytes.Equal(f.typ, evSessionCreated), bytes.Equal(f.typ, evSessionUpdated):
		c.noInterrupt = !interrupts(data)
	case bytes.Equal(f.typ, evSpeechStarted):
		if !c.noInterrupt {
			c.bargeIn(backend.ClearBackend)
		}
	case bytes.Equal(f.typ, evSpeechStopped):
		if c.play != nil {
			c.play.SpeechStopped()
		}
	}
}

// audioDelta decodes a delta's base64 PCM16LE, deltaChunk at a time, and
// writes the whole frames it completes to the pod, which paces them and
// encodes each as it sends it (or encodes them first, without
// backend.RawWriter). A delta that is not whole base64 of whole samples is
// dropped; one with a bad character mid-way plays up to the chunk that
// holds it (counted as bad_delta either way).
func (c *call) audioDelta(responseID, itemID, delta []byte) {
	if len(delta)%4 != 0 || decodedLen(delta)%c.format.sampleBytes() != 0 {
		c.b.m.dropped[dropBadDelta].Inc()
		return
	}
	if len(itemID) > maxIDLen || len(responseID) > maxIDLen {
		c.b.m.dropped[dropLongID].Inc()
		return
	}
	c.omu.Lock()
	defer c.omu.Unlock()
	if c.cancelled != "" && c.cancelled == string(responseID) { // no allocation: compared in place
		return // in flight when the caller barged in
	}
	if c.play != nil && (c.curItem != string(itemID) || c.curResp != string(responseID)) {
		c.flushReplyLocked() // the previous item's tail
		c.curItem, c.curResp = string(itemID), string(responseID)
		c.play.BeginItem(c.curResp, c.curItem)
	}
	fs := cap(c.opcm)
	for len(delta) > 0 {
		k := min(len(delta), deltaChunk)
		n, err := base64.StdEncoding.Decode(c.dbuf, delta[:k])
		if err != nil {
			c.b.m.dropped[dropBadDelta].Inc()
			return
		}
		delta = delta[k:]
		for pcm := c.dbuf[:n]; len(pcm) > 0; {
			k := min(len(pcm), fs-len(c.opcm))
			c.opcm = append(c.opcm, pcm[:k]...)
			pcm = pcm[k:]
			if len(c.opcm) == fs {
				c.writeFrameLocked(c.opcm)
				c.opcm = c.opcm[:0]
			}
		}
	}
}

// decodedLen is the length of padded base64 b decoded, len(b) a multiple
// of 4.
func decodedLen(b []byte) int {
	n := len(b) / 4 * 3
	for i := len(b) - 1; i >= 0 && i >= len(b)-2 && b[i] == '='; i-- {
		n--
	}
	return n
}

// flushReplyLocked sends the reply's last partial frame, padded with
// silence; omu must be held.
func (c *call) flushReplyLocked() {
	if len(c.opcm) == 0 {
		return
	}
	n := len(c.opcm)
	c.opcm = c.opcm[:cap(c.opcm)]
	c.format.silence(c.opcm[n:])
	c.writeFrameLocked(c.opcm)
	c.opcm = c.opcm[:0]
}

// writeFrameLocked writes one frame of PCM16LE to the pod: raw, for the pod
// to encode when it sends it, or encoded here. omu must be held.
func (c *call) writeFrameLocked(frame []byte) {
	var err error
	if c.format.law != nil { // G.711 as the server sent it: what the carrier is sent
		err = c.out.WriteAudio(frame, opus.FrameDuration)
	} else if c.rawOut != nil {
		err = c.rawOut.WriteRaw(frame, opus.FrameDuration, c.enc)
	} else {
		if c.pkt, err = c.enc.EncodeFrame(c.pkt[:0], frame); err != nil {
			return // counted
		}
		err = c.out.WriteAudio(c.pkt, opus.FrameDuration)
	}
	if err != nil {
		c.b.m.dropped[dropSink].Inc()
		return
	}
	c.b.m.audioFrom.Add(opus.FrameDuration.Seconds())
}

// replyEncoder is a call's Opus encoder toward the caller, a
// backend.FrameEncoder: the pod's pacer calls it as it sends each frame
// (PCM16LE in), and the call closes it. mu orders the two.
type replyEncoder struct {
	m   *metrics
	mu  sync.Mutex
	enc *opus.Encoder // nil after close
	pcm []int16       // one frame
}

var _ backend.FrameEncoder = (*replyEncoder)(nil)

func newReplyEncoder(enc *opus.Encoder, m *metrics) *replyEncoder {
	if enc == nil { // a G.711 call: its frames go out as they are
		return &replyEncoder{m: m}
	}
	return &replyEncoder{m: m, enc: enc, pcm: make([]int16, enc.FrameSamples())}
}

// EncodeFrame implements backend.FrameEncoder: one frame of PCM16LE at the
// backend's rate to an Opus packet appended to dst. A failure is counted.
func (e *replyEncoder) EncodeFrame(dst, frame []byte) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.enc == nil {
		return dst, opus.ErrClosed
	}
	if len(frame) != 2*len(e.pcm) {
		e.m.dropped[dropEncode].Inc()
		return dst, opus.ErrBadArg
	}
	opus.DecodePCM16LE(frame, e.pcm)
	n := len(dst)
	dst = slices.Grow(dst, opus.MaxPacket)
	size, err := e.enc.Encode(e.pcm, dst[n:n+opus.MaxPacket])
	if err != nil {
		e.m.dropped[dropEncode].Inc()
		return dst[:n], err
	}
	return dst[:n+size], nil
}

func (e *replyEncoder) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.enc != nil {
		e.enc.Close()
		e.enc = nil
	}
}
