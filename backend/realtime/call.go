package realtime

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/oaievents"
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
	// keepReadBuffer is the largest read buffer a call keeps from one
	// server event to the next: a larger event (up to Config.MaxMessage)
	// gets a buffer of its own, released after it. Events of a turn are
	// a few KiB; a session's echo tens.
	keepReadBuffer = 64 << 10
	// deltaChunk is the base64 an audio delta is decoded by (a multiple
	// of 4): a delta of any size costs the call deltaChunk*3/4 bytes of
	// decoded PCM, not a buffer the size of its audio.
	deltaChunk = 4 << 10
	// maxIDLen bounds the item and response IDs of an audio delta the pod
	// keeps (OpenAI's are under 40 bytes): every item is a pacer entry
	// and its IDs are kept with it.
	maxIDLen = 128
	// closeWait bounds the close handshake with the server.
	closeWait = time.Second
	// frameDur is the Opus frame toward the caller.
	frameDur = 20 * time.Millisecond
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

// call is one session's WebSocket: the media path (Audio) and the data
// channel (Event) feed a bounded queue that one writer drains; one reader
// hands server events to the caller and the reply audio to the pod in
// 20 ms frames, which the pod paces (backend.Player) and encodes to Opus
// as it sends them (backend.RawWriter); a pinger watches for a stalled
// server.
type call struct {
	b      *Backend
	out    backend.Sink
	play   backend.Player       // out's, or nil: frames go out as they are encoded
	rawOut backend.RawWriter    // out's, or nil: the reader encodes each frame
	await  backend.StartAwaiter // out's, or nil
	conn   *websocket.Conn
	log    *slog.Logger
	enc    *replyEncoder // closed with the call

	// The reply path: owned by the reader, under omu (a barge-in from the
	// data channel resets it).
	omu       sync.Mutex
	opcm      []byte // reply audio (PCM16LE) not yet a whole frame; cap: one frame
	pkt       []byte // an encoded frame, without RawWriter
	active    string // the response in progress (response.created to response.done)
	cancelled string // the response cleared by a barge-in: its late deltas are dropped
	curItem   string // the item the pod was last told of (BeginItem)
	curResp   string
	// noInterrupt: the session's turn detection has interrupt_response
	// false (from session.created/updated): the caller's speech does not
	// stop the reply. Set by the reader.
	noInterrupt atomic.Bool
	// caller translates the caller's events with the call's policy; it
	// keeps the call's session (the first session.update's, with the
	// top-level fields of every sideband session.update since laid over
	// it).
	caller *oaievents.Caller

	// Owned by Audio (the pod's reader, one call at a time), under mu.RLock.
	dec           *opus.Decoder
	pcm           []int16       // decoded frame
	batch         []int16       // decoded audio not yet sent
	raw           []byte        // batch as PCM16LE
	batchSamples  int           // appendMs of samples
	steadySamples int           // steadyAppendMs of samples
	quiet         int           // inactive caller frames in a row that decoded quiet
	inactive      bool          // the last frame's opus.Inactive
	held          time.Duration // how long inactive has held, up to promptMs

	queue chan msg    // toward the server; closed by Close under mu
	free  chan []byte // the append buffers not in queue
	// bufs is how many append buffers exist (made on demand, at most
	// queueLen, so a call that keeps up holds one or two, not queueLen);
	// bufSize is each one's capacity. Guarded by the Audio caller (one
	// at a time per session).
	bufs, bufSize int
	queued        atomic.Int64

	// Owned by the reader: the event read (released when it grew over
	// keepReadBuffer) and one chunk of a delta's decoded PCM.
	rbuf []byte
	dbuf []byte

	mu        sync.RWMutex // guards sends on queue against its close, and dec
	closed    bool         // guarded by mu
	closeOnce sync.Once
	failOnce  sync.Once
	ctx       context.Context // ends with Close: stops the pinger
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// msg is one message toward the server.
type msg struct {
	b       []byte
	samples int  // caller audio it carries
	pooled  bool // b goes back to free
}

func newCall(b *Backend, info backend.SessionInfo, out backend.Sink, conn *websocket.Conn, dec *opus.Decoder, enc *opus.Encoder) *call {
	rate := b.cfg.Rate
	c := &call{b: b, out: out, conn: conn, dec: dec, enc: newReplyEncoder(enc, b.m),
		caller:        oaievents.NewCaller(oaievents.Policy{SessionFields: info.ClientSessionFields, SealedWins: info.SealedWins}, info.Config),
		log:           b.log.With("session", info.ID),
		pcm:           make([]int16, rate*120/1000), // the longest Opus packet
		batchSamples:  rate * appendMs / 1000,
		steadySamples: rate * steadyAppendMs / 1000,
		queue:         make(chan msg, queueLen),
		free:          make(chan []byte, queueLen),
	}
	c.batch = make([]int16, 0, c.steadySamples+len(c.pcm))
	c.raw = make([]byte, 0, 2*cap(c.batch))
	c.bufSize = len(appendPrefix) + base64.StdEncoding.EncodedLen(cap(c.raw)) + len(appendSuffix)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.play, _ = out.(backend.Player)
	c.rawOut, _ = out.(backend.RawWriter)
	c.await, _ = out.(backend.StartAwaiter)
	c.opcm = make([]byte, 0, 2*enc.FrameSamples())
	c.dbuf = make([]byte, deltaChunk/4*3)
	return c
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

func newReplyEncoder(enc *opus.Encoder, m *metrics) *replyEncoder {
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

// sendSession sends the first session.update: the call's config shaped for
// the server, with the audio formats the edge transcodes to.
func (c *call) sendSession(config []byte) error {
	cfg := map[string]any{}
	if len(bytes.TrimSpace(config)) > 0 && !bytes.Equal(bytes.TrimSpace(config), []byte("null")) {
		if err := json.Unmarshal(config, &cfg); err != nil || cfg == nil {
			return fmt.Errorf("realtime: session config is not a JSON object: %v", err)
		}
	}
	ev, err := sessionEvent("", shapeSession(cfg, c.b.cfg.Protocol == ProtocolBeta, c.b.cfg.Rate))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.b.cfg.DialTimeout)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, ev); err != nil {
		return fmt.Errorf("realtime: send session.update to %s: %w", c.b.host, err)
	}
	c.b.m.eventsTo.Inc()
	return nil
}

func (c *call) start() {
	c.wg.Add(3)
	go c.writeLoop()
	go c.readLoop()
	go c.pingLoop()
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
	want := min(len(c.pcm), int(int64(c.b.cfg.Rate)*int64(d)/int64(time.Second)))
	inactive := opus.Inactive(payload)
	changed := inactive != c.inactive
	if changed {
		c.inactive, c.held = inactive, 0
	} else if c.held < promptMs*time.Millisecond {
		c.held += d
	}
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

// flushFull flushes the batch if it is full or the caller's voice activity
// just changed; mu.RLock must be held.
func (c *call) flushFull(changed bool) {
	limit := c.batchSamples
	if c.held >= promptMs*time.Millisecond {
		limit = c.steadySamples
	}
	if changed || len(c.batch) >= limit {
		c.flushLocked()
	}
}

// flushLocked queues the batch as one append; mu.RLock must be held.
func (c *call) flushLocked() {
	samples := len(c.batch)
	var buf []byte
	select {
	case buf = <-c.free:
	default:
		if c.bufs == queueLen {
			c.b.m.dropped[dropQueueFull].Inc()
			c.batch = c.batch[:0]
			return
		}
		c.bufs++
		buf = make([]byte, 0, c.bufSize)
	}
	c.raw = opus.AppendPCM16LE(c.raw[:0], c.batch)
	c.batch = c.batch[:0]
	buf = append(buf[:0], appendPrefix...)
	buf = base64.StdEncoding.AppendEncode(buf, c.raw)
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

// Event implements backend.Handler: a caller's data-channel event,
// translated (backend/oaievents): read strictly, checked against the
// allow-list and the call's policy, re-encoded. The server gets only
// what the translation gives; the caller gets its one error event for a
// refusal (or for the refused part of a session.update).
func (c *call) Event(data []byte) {
	res := c.caller.Translate(data)
	switch res.Action {
	case oaievents.Drop:
		c.b.m.dropped[dropAppendEvent].Inc() // audio comes by media only
		return
	case oaievents.Clear: // WebRTC-only: the edge holds the output buffer
		c.bargeIn(backend.ClearClient)
		return
	case oaievents.Refuse:
		c.b.m.refused.WithLabelValues(res.Reason).Inc()
		c.toCaller(res.Error)
		return
	}
	ev := res.Event
	if res.Session {
		var err error
		if ev, err = c.shapeSession(ev); err != nil {
			c.b.m.refused.WithLabelValues(oaievents.ReasonMalformed).Inc()
			return
		}
	}
	if res.Error != nil {
		c.b.m.refused.WithLabelValues(res.Reason).Inc()
		c.toCaller(res.Error)
	}
	c.toServer(ev)
}

// shapeSession shapes a translated session.update (the pod's own encoding
// of it) for the server: the audio formats forced, GA or beta names.
func (c *call) shapeSession(ev []byte) ([]byte, error) {
	var u struct {
		EventID string         `json:"event_id"`
		Session map[string]any `json:"session"`
	}
	if err := json.Unmarshal(ev, &u); err != nil {
		return nil, fmt.Errorf("realtime: translated session.update: %w", err)
	}
	if u.Session == nil {
		u.Session = map[string]any{}
	}
	return sessionEvent(u.EventID, shapeSession(u.Session, c.b.cfg.Protocol == ProtocolBeta, c.b.cfg.Rate))
}

// ServerEvent implements backend.ServerEvents: an event from the call's
// sideband (the app server), read strictly and re-encoded by the pod
// (transceiver/sideband.go), goes to the server as it came, never to the
// caller. A session.update passes unfiltered — the caller's policy applies
// to the caller only — shaped for the server (audio formats forced: the
// edge transcodes), and its fields become the call's (so a caller's
// update that "repeats the call's value" repeats the app's latest, not
// what the app replaced). output_audio_buffer.clear clears the edge's
// buffer as the caller's does (output_audio_buffer.cleared then goes to
// the caller and the sidebands: the caller's audio stopped).
func (c *call) ServerEvent(data []byte) {
	var ev struct {
		Type    string         `json:"type"`
		EventID string         `json:"event_id"`
		Session map[string]any `json:"session"`
	}
	_ = json.Unmarshal(data, &ev) // a malformed event goes as it came: the server answers it
	switch ev.Type {
	case "output_audio_buffer.clear":
		c.bargeIn(backend.ClearClient)
		return
	case "session.update":
		if ev.Session != nil {
			c.caller.Sealed(ev.Session)
			var err error
			if data, err = sessionEvent(ev.EventID, shapeSession(ev.Session, c.b.cfg.Protocol == ProtocolBeta, c.b.cfg.Rate)); err != nil {
				return
			}
			break
		}
		data = bytes.Clone(data)
	default:
		data = bytes.Clone(data)
	}
	c.toServer(data)
}

func (c *call) toCaller(ev []byte) {
	if c.out.SendEvent(ev) != nil {
		c.b.m.dropped[dropSink].Inc()
		return
	}
	c.b.m.eventsFrom.Inc()
}

func (c *call) writeLoop() {
	defer c.wg.Done()
	sec := 1 / float64(c.b.cfg.Rate)
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

func (c *call) readLoop() {
	defer c.wg.Done()
	for {
		_, r, err := c.conn.Reader(context.Background())
		if err == nil {
			err = c.readMessage(r)
		}
		if err != nil {
			reason := ReasonClosed
			if errors.Is(err, websocket.ErrMessageTooBig) {
				reason = ReasonOversized
			}
			c.fail(reason, err)
			return
		}
		c.handle(c.rbuf)
		if cap(c.rbuf) > keepReadBuffer {
			c.rbuf = nil // an outsized event: its buffer is not the call's to keep
		}
	}
}

// readMessage reads one message into rbuf, reusing its memory.
func (c *call) readMessage(r io.Reader) error {
	c.rbuf = c.rbuf[:0]
	for {
		if len(c.rbuf) == cap(c.rbuf) {
			c.rbuf = growReadBuffer(c.rbuf, c.b.cfg.MaxMessage)
		}
		n, err := r.Read(c.rbuf[len(c.rbuf):cap(c.rbuf)])
		c.rbuf = c.rbuf[:len(c.rbuf)+n]
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// growReadBuffer makes room in a full read buffer: doubling up to
// keepReadBuffer, then four times over, and to the largest event (limit,
// plus the byte the WebSocket's limit reads past it) once that is within
// reach. Growing by append would end up to a quarter over the event, and
// its last step holds the old buffer and the new one, both near the
// limit, at once.
func growReadBuffer(b []byte, limit int) []byte {
	n := max(2*cap(b), 4<<10)
	if n > keepReadBuffer {
		n = 4 * cap(b)
		if 2*n > limit {
			n = max(limit+1, cap(b)+1)
		}
	}
	return slices.Grow(b, n-len(b))
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
		c.noInterrupt.Store(!interrupts(data))
	case bytes.Equal(f.typ, evSpeechStarted):
		if !c.noInterrupt.Load() {
			c.bargeIn(backend.ClearBackend)
		}
	case bytes.Equal(f.typ, evSpeechStopped):
		if c.play != nil {
			c.play.SpeechStopped()
		}
	}
}

// responseID is the response.id of a response event, "" if it has none.
func responseID(data []byte) string {
	var ev struct {
		Response struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &ev) != nil || len(ev.Response.ID) > maxIDLen {
		return "" // a longer one is not the pod's to keep: its deltas are dropped (long_id)
	}
	return ev.Response.ID
}

// interrupts reports whether a session event's turn detection lets the
// caller's speech interrupt a reply: interrupt_response is true unless set
// to false (GA audio.input.turn_detection or beta turn_detection).
func interrupts(data []byte) bool {
	var ev struct {
		Session struct {
			TurnDetection *struct {
				InterruptResponse *bool `json:"interrupt_response"`
			} `json:"turn_detection"`
			Audio struct {
				Input struct {
					TurnDetection *struct {
						InterruptResponse *bool `json:"interrupt_response"`
					} `json:"turn_detection"`
				} `json:"input"`
			} `json:"audio"`
		} `json:"session"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return true
	}
	for _, td := range []*struct {
		InterruptResponse *bool `json:"interrupt_response"`
	}{ev.Session.TurnDetection, ev.Session.Audio.Input.TurnDetection} {
		if td != nil && td.InterruptResponse != nil && !*td.InterruptResponse {
			return false
		}
	}
	return true
}

// ownEventPrefix starts the event_id of the events the connector makes
// itself (a barge-in's cancel and truncate): the server's errors about
// them (a response the server's VAD cancelled already) are not the
// caller's business.
const ownEventPrefix = "event_rtcedge_"

func ownError(data []byte) bool {
	var ev struct {
		Error struct {
			EventID string `json:"event_id"`
		} `json:"error"`
	}
	return json.Unmarshal(data, &ev) == nil && strings.HasPrefix(ev.Error.EventID, ownEventPrefix)
}

// audioDelta decodes a delta's base64 PCM16LE, deltaChunk at a time, and
// writes the whole frames it completes to the pod, which paces them and
// encodes each as it sends it (or encodes them first, without
// backend.RawWriter). A delta that is not whole base64 of whole samples is
// dropped; one with a bad character mid-way plays up to the chunk that
// holds it (counted as bad_delta either way).
func (c *call) audioDelta(responseID, itemID, delta []byte) {
	if len(delta)%4 != 0 || decodedLen(delta)%2 != 0 {
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
	clear(c.opcm[n:])
	c.writeFrameLocked(c.opcm)
	c.opcm = c.opcm[:0]
}

// writeFrameLocked writes one frame of PCM16LE to the pod: raw, for the pod
// to encode when it sends it, or encoded here. omu must be held.
func (c *call) writeFrameLocked(frame []byte) {
	var err error
	if c.rawOut != nil {
		err = c.rawOut.WriteRaw(frame, frameDur, c.enc)
	} else {
		if c.pkt, err = c.enc.EncodeFrame(c.pkt[:0], frame); err != nil {
			return // counted
		}
		err = c.out.WriteAudio(c.pkt, frameDur)
	}
	if err != nil {
		c.b.m.dropped[dropSink].Inc()
		return
	}
	c.b.m.audioFrom.Add(frameDur.Seconds())
}

// bargeIn stops the reply: the pod drops what it has queued (the caller
// gets output_audio_buffer.cleared from it), the server gets
// response.cancel for a response in progress and conversation.item.truncate
// with the audio the caller was actually sent, and the cancelled
// response's late deltas are dropped.
func (c *call) bargeIn(source string) {
	var itemID string
	var played time.Duration
	var playing bool
	if c.play != nil {
		itemID, played, playing = c.play.Clear(source)
	}
	c.omu.Lock()
	resp := c.active
	if resp == "" && playing {
		resp = c.curResp // done generating, still playing
	}
	if resp != "" {
		c.cancelled = resp
	}
	c.opcm = c.opcm[:0]
	c.curItem, c.curResp = "", ""
	active := c.active != ""
	c.omu.Unlock()
	if active {
		c.toServer(fmt.Appendf(nil, `{"type":"response.cancel","event_id":"%scancel_%d","response_id":%q}`, ownEventPrefix, c.b.ids.Add(1), resp))
	}
	if playing && itemID != "" {
		c.toServer(fmt.Appendf(nil, `{"type":"conversation.item.truncate","event_id":"%struncate_%d","item_id":%q,"content_index":0,"audio_end_ms":%d}`,
			ownEventPrefix, c.b.ids.Add(1), itemID, played.Milliseconds()))
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

func (c *call) pingLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.b.cfg.StallTimeout / 3)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.b.cfg.StallTimeout)
		start := time.Now()
		err := c.conn.Ping(ctx)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.fail(ReasonStalled, err)
			}
			return
		}
		c.b.m.rtt.Observe(time.Since(start).Seconds())
	}
}

// failMessages are what the caller reads: no URL, no key.
var failMessages = map[string]string{
	ReasonClosed:    "The model backend closed the session.",
	ReasonStalled:   "The model backend stopped responding.",
	ReasonOversized: "The model backend sent an event larger than the edge accepts.",
}

// fail ends the call from the backend's side, once: an error event to the
// caller, a metric, and Ender.End. A call being closed is not failing.
func (c *call) fail(reason string, err error) {
	c.failOnce.Do(func() {
		c.mu.RLock()
		closing := c.closed
		c.mu.RUnlock()
		if closing {
			return
		}
		_ = c.conn.CloseNow() // unblocks the other loops
		c.b.m.failed.WithLabelValues(reason).Inc()
		c.log.Info("backend ended the call", "reason", reason, "err", redactErr(err, c.b.cfg.URL))
		c.toCaller(errorEvent("server_error", reason, "", failMessages[reason], ""))
		if e, ok := c.out.(backend.Ender); ok {
			go e.End(reason) // End closes this handler: not from its own loop
		}
	})
}

// Close implements backend.Handler.
func (c *call) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		close(c.queue)
		c.mu.Unlock()
		done := make(chan struct{})
		go func() {
			_ = c.conn.Close(websocket.StatusNormalClosure, "call ended")
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(closeWait):
			_ = c.conn.CloseNow()
			<-done
		}
		c.cancel()
		c.wg.Wait()
		c.dec.Close()
		c.enc.close() // the pod's pacer may still hold frames: they fail to encode

	})
	return nil
}
