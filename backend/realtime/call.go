package realtime

// The call's shape and lifecycle: what it holds and who owns each part,
// how it starts, watches the server (pingLoop), fails and closes. Its
// jobs live beside it: uplink.go (caller audio and events toward the
// server), downlink.go (server events toward the caller, reply audio
// toward the pod), turn.go (barge-in and the turn's events), policy.go
// (the session configuration and the events the caller and the sideband
// may send).

import (
	"context"
	"encoding/base64"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/internal/readbuf"
	"github.com/rtcedge/rtcedge/backend/oaievents"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// closeWait bounds the close handshake with the server.
const closeWait = time.Second

// call is one session's WebSocket: the media path (Audio) and the data
// channel (Event) feed a bounded queue that one writer drains (uplink.go);
// one reader hands server events to the caller and the reply audio to the
// pod in 20 ms frames, which the pod paces (backend.Player) and encodes to
// Opus as it sends them (backend.RawWriter) (downlink.go); the turn's
// events and the caller's barge-in drive the pod's output (turn.go); the
// session configuration and the events from the caller and the sideband
// are shaped by the call's policy (policy.go); a pinger watches for a
// stalled server.
//
// Lock order: mu (read) is taken alone. omu is held while calling into
// the pod (Player.BeginItem, RawWriter.WriteRaw, Sink.WriteAudio, which
// take pace.Queue's mu) and into enc (replyEncoder.mu), never the other
// way round: bargeIn calls Player.Clear before it takes omu, and
// the pacer calls enc.EncodeFrame and its Output with its queue's mu
// released (transceiver/pace's TestQueueCallsOutWithoutItsLock).
type call struct {
	// Static after newCall.
	b      *Backend
	out    backend.Sink
	play   backend.Player       // out's, or nil: frames go out as they are encoded
	rawOut backend.RawWriter    // out's, or nil: the reader encodes each frame
	await  backend.StartAwaiter // out's, or nil
	conn   *websocket.Conn
	log    *slog.Logger
	enc    *replyEncoder // closed with the call; guarded by its own mu
	format audioFormat   // the call's audio toward the server and back (g711.go)
	// caller translates the caller's events with the call's policy; it
	// keeps the call's session (the first session.update's, with the
	// top-level fields of every sideband session.update since laid over
	// it). Safe for concurrent use (its own lock).
	caller *oaievents.Caller

	// The reply path, guarded by omu: the reader writes it (audio deltas,
	// response.created/done), and bargeIn resets it from whichever
	// goroutine saw the barge-in (the reader on speech_started, the
	// pod's data-channel reader on the caller's clear, a sideband's reader
	// on the app's).
	omu       sync.Mutex
	opcm      []byte // reply audio (PCM16LE) not yet a whole frame; cap: one frame
	pkt       []byte // an encoded frame, without RawWriter
	active    string // the response in progress (response.created to response.done)
	cancelled string // the response cleared by a barge-in: its late deltas are dropped
	curItem   string // the item the pod was last told of (BeginItem)
	curResp   string // curItem's response: a barge-in while it plays cancels it

	// Owned by Audio (the pod's audio path calls it one frame at a time),
	// under mu.RLock so that Close does not free dec under it.
	dec           *opus.Decoder // nil for a G.711 call
	pcm           []int16       // decoded frame
	batch         []int16       // decoded audio not yet sent
	g711          []byte        // a G.711 call's audio not yet sent (g711.go)
	raw           []byte        // batch as PCM16LE
	batchSamples  int           // appendMs of samples; static
	steadySamples int           // steadyAppendMs of samples; static
	quiet         int           // inactive caller frames in a row that decoded quiet
	inactive      bool          // the last frame's opus.Inactive
	held          time.Duration // how long inactive has held, up to promptMs
	// bufs is how many append buffers exist (made on demand, at most
	// queueLen, so a call that keeps up holds one or two, not queueLen);
	// bufSize is each one's capacity (static).
	bufs, bufSize int

	// The queue toward the server: sent on by Audio and toServer under
	// mu.RLock, closed by Close under mu, drained by writeLoop.
	queue  chan msg    // toward the server
	free   chan []byte // the append buffers not in queue
	queued atomic.Int64

	// Owned by the reader (readLoop): the event read (released when it
	// grew over readbuf.Keep), one chunk of a delta's decoded PCM, and
	// what the session's events said of barge-in.
	rbuf readbuf.Buffer
	dbuf []byte
	// noInterrupt: the session's turn detection has interrupt_response
	// false (from session.created/updated): the caller's speech does not
	// stop the reply.
	noInterrupt bool

	// Lifecycle.
	mu        sync.RWMutex // guards sends on queue against its close, and dec
	closed    bool         // guarded by mu
	closeOnce sync.Once
	failOnce  sync.Once
	ctx       context.Context // ends with Close: stops the pinger
	cancel    context.CancelFunc
	wg        sync.WaitGroup // the writer, the reader and the pinger
}

// A call takes the caller's audio and events (backend.Handler) and the
// sideband's (backend.ServerEvents).
var (
	_ backend.Handler      = (*call)(nil)
	_ backend.ServerEvents = (*call)(nil)
)

// newCall makes the call over an open WebSocket; start starts its loops.
func newCall(b *Backend, info backend.SessionInfo, out backend.Sink, conn *websocket.Conn, format audioFormat, dec *opus.Decoder, enc *opus.Encoder) *call {
	rate := format.rate
	c := &call{b: b, out: out, conn: conn, format: format, dec: dec, enc: newReplyEncoder(enc, b.m),
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
	c.opcm = make([]byte, 0, format.frameBytes())
	if format.law != nil {
		c.g711 = make([]byte, 0, cap(c.batch))
	}
	c.dbuf = make([]byte, deltaChunk/4*3)
	return c
}

// start starts the writer, the reader and the pinger; Close waits for them.
func (c *call) start() {
	c.wg.Add(3)
	go c.writeLoop()
	go c.readLoop()
	go c.pingLoop()
}

// pingLoop pings the server every StallTimeout/3; a ping unanswered for
// StallTimeout ends the call (ReasonStalled).
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
		if c.dec != nil {
			c.dec.Close()
		}
		c.enc.close() // the pod's pacer may still hold frames: they fail to encode

	})
	return nil
}
