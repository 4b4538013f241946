package netbackend

// The pod's side of the protocol: the Backend that dials the inference
// backend once per session, and the session's handler, whose writer drains
// a bounded queue toward it and whose reader hands its audio, events and
// controls to the pod.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/oaievents"
	"github.com/rtcedge/rtcedge/internal/config"
)

// Backend is a backend.Backend that reaches the inference backend at
// Addr: one TCP connection per session.
type Backend struct {
	Addr        string        // host:port of the backend
	DialTimeout time.Duration // default 2s
	// QueueLen bounds the frames waiting to be written to the backend; a
	// full queue drops audio (counted) rather than stall the media path.
	QueueLen int // default 256 (about 5 s of 20 ms frames)
	Logger   *slog.Logger

	dropped atomic.Uint64
	refused atomic.Uint64
}

// Dropped returns how many frames were dropped because a session's queue
// toward the backend was full.
func (b *Backend) Dropped() uint64 { return b.dropped.Load() }

// Refused returns how many caller events (or, for session.update, parts
// of one) the pod's translation refused (backend/oaievents): the caller
// got an error event, the backend nothing.
func (b *Backend) Refused() uint64 { return b.refused.Load() }

// Open implements backend.Backend.
func (b *Backend) Open(ctx context.Context, info backend.SessionInfo, out backend.Sink) (backend.Handler, error) {
	timeout := b.DialTimeout
	config.Default(&timeout, 2*time.Second)
	qlen := b.QueueLen
	config.Default(&qlen, 256)
	log := b.Logger
	config.Default(&log, slog.Default())
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", b.Addr)
	if err != nil {
		return nil, fmt.Errorf("dial backend %s: %w", b.Addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // 20 ms frames must not wait for Nagle
	}
	hello, err := json.Marshal(Hello{Session: info.ID, Cluster: info.Cluster, Pod: info.Pod, Config: info.Config})
	if err != nil {
		conn.Close()
		return nil, err
	}
	frame, _ := appendFrame(nil, FrameHello, hello)
	_ = conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := conn.Write(frame); err != nil {
		conn.Close()
		return nil, fmt.Errorf("backend hello: %w", err)
	}
	_ = conn.SetWriteDeadline(time.Time{})
	h := &handler{b: b, conn: conn, out: out, queue: make(chan []byte, qlen), log: log.With("component", "netbackend", "session", info.ID),
		caller: oaievents.NewCaller(oaievents.Policy{SessionFields: info.ClientSessionFields, SealedWins: info.SealedWins}, info.Config)}
	h.wg.Add(2)
	go h.writeLoop()
	go h.readLoop()
	return h, nil
}

// handler is one session's connection. Audio and Event enqueue; one
// goroutine writes, one reads replies and hands them to the Sink.
// The backend reports its readiness (backend.Ready); a session's handler
// takes the sideband's events (backend.ServerEvents) and the edge's
// barge-in (backend.Interrupter): the inference backend has no VAD of its
// own to stop a reply.
var (
	_ backend.Ready        = (*Backend)(nil)
	_ backend.Handler      = (*handler)(nil)
	_ backend.ServerEvents = (*handler)(nil)
	_ backend.Interrupter  = (*handler)(nil)
	_ backend.DTMFHandler  = (*handler)(nil)
)

type handler struct {
	// Static after Open.
	b    *Backend
	conn net.Conn
	out  backend.Sink
	log  *slog.Logger
	// caller translates the caller's events (safe for concurrent use).
	caller *oaievents.Caller

	// The queue toward the backend: sent on under mu.RLock, closed by
	// Close under mu, drained by writeLoop.
	queue chan []byte
	// queued is the bytes of the frames in queue or being written: the
	// queue is bounded in frames, and an event may be 256 KiB.
	queued atomic.Int64

	// Lifecycle.
	closeOnce sync.Once
	mu        sync.RWMutex // guards sends on queue against its close
	closed    bool         // guarded by mu
	wg        sync.WaitGroup
}

func (h *handler) enqueue(typ byte, parts ...[]byte) {
	n := 4
	for _, p := range parts {
		n += len(p)
	}
	frame, err := appendFrame(make([]byte, 0, n), typ, parts...)
	if err != nil {
		h.b.dropped.Add(1)
		return
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return
	}
	if h.queued.Add(int64(len(frame))) > maxQueuedBytes {
		h.queued.Add(-int64(len(frame)))
		h.b.dropped.Add(1)
		return
	}
	select {
	case h.queue <- frame:
	default:
		h.queued.Add(-int64(len(frame)))
		h.b.dropped.Add(1)
	}
}

// maxQueuedBytes bounds what one session holds toward a backend that is
// slow or stalled: with events of up to 256 KiB, the frame bound alone
// let one client make the pod hold tens of MiB.
const maxQueuedBytes = 1 << 20

// Audio implements backend.Handler.
func (h *handler) Audio(payload []byte, d time.Duration) {
	var dur [4]byte
	binary.BigEndian.PutUint32(dur[:], uint32(d/time.Microsecond))
	h.enqueue(FrameAudio, dur[:], payload)
}

// Event implements backend.Handler: the caller's event, translated
// (backend/oaievents), goes to the backend as the pod re-encoded it; a
// refusal answers the caller with its error event. The caller's
// output_audio_buffer.clear is the pod's to act on (it holds the output
// buffer): the backend gets a cleared control frame instead; appends are
// dropped (audio comes by media).
func (h *handler) Event(data []byte) {
	res := h.caller.Translate(data)
	switch res.Action {
	case oaievents.Drop:
		h.b.dropped.Add(1)
		return
	case oaievents.Clear:
		if p, ok := h.out.(backend.Player); ok {
			if item, played, playing := p.Clear(backend.ClearClient); playing {
				h.Interrupted(backend.ClearClient, item, played)
			}
		}
		return
	case oaievents.Refuse:
		h.b.refused.Add(1)
		_ = h.out.SendEvent(res.Error)
		return
	}
	if res.Error != nil {
		h.b.refused.Add(1)
		_ = h.out.SendEvent(res.Error)
	}
	h.enqueue(FrameEvent, res.Event)
}

// Interrupted implements backend.Interrupter: the backend hears of the
// barge-in the pod acted on, with the audio the caller was sent.
func (h *handler) Interrupted(source, itemID string, played time.Duration) {
	h.control(Control{Type: ControlCleared, Source: source, ItemID: itemID, AudioEndMs: played.Milliseconds()})
}

// SpeechStopped implements backend.Interrupter.
func (h *handler) SpeechStopped() { h.control(Control{Type: ControlSpeechStopped}) }

// DTMF implements backend.DTMFHandler: a phone call's digit goes to the
// backend as a "dtmf" control frame.
func (h *handler) DTMF(digit byte) { h.control(Control{Type: ControlDTMF, Digits: string(digit)}) }

func (h *handler) control(c Control) {
	b, err := json.Marshal(c)
	if err != nil {
		return
	}
	h.enqueue(FrameControl, b)
}

// onControl acts on a backend's control frame through the pod's Player;
// with a Sink that is not one, control frames are ignored.
func (h *handler) onControl(payload []byte) {
	var c Control
	if json.Unmarshal(payload, &c) != nil {
		return
	}
	if c.Type == ControlSendDTMF {
		if s, ok := h.out.(backend.DTMFSender); ok {
			_ = s.SendDTMF(c.Digits) // the pod counts a refusal
		}
		return
	}
	p, ok := h.out.(backend.Player)
	if !ok {
		return
	}
	switch c.Type {
	case ControlItem:
		p.BeginItem(c.ResponseID, c.ItemID)
	case ControlResponseDone:
		p.EndResponse(c.ResponseID)
	case ControlSpeechStopped:
		p.SpeechStopped()
	case ControlClear:
		if item, played, playing := p.Clear(backend.ClearBackend); playing {
			h.Interrupted(backend.ClearBackend, item, played)
		}
	}
}

// ServerEvent implements backend.ServerEvents: the sideband's event goes
// to the backend as a FrameServerEvent, which a backend that predates it
// skips. The pod never echoes it to the caller; the backend decides what
// (if anything) to answer, and its answer reaches the caller and the
// sidebands like every event it sends.
// A session.update's fields become the call's, as a caller's update that
// repeats the call's value is judged against them.
func (h *handler) ServerEvent(data []byte) {
	if bytes.Contains(data, []byte(`"session.update"`)) {
		var ev struct {
			Type    string         `json:"type"`
			Session map[string]any `json:"session"`
		}
		if json.Unmarshal(data, &ev) == nil && ev.Type == "session.update" && ev.Session != nil {
			h.caller.Sealed(ev.Session)
		}
	}
	h.enqueue(FrameServerEvent, data)
}

func (h *handler) writeLoop() {
	defer h.wg.Done()
	for frame := range h.queue {
		_, err := h.conn.Write(frame)
		h.queued.Add(-int64(len(frame)))
		if err != nil {
			h.log.Debug("write to backend", "err", err)
			_ = h.conn.Close()
			for range h.queue { // drain until Close closes the queue
			}
			return
		}
	}
}

func (h *handler) readLoop() {
	defer h.wg.Done()
	var buf []byte
	for {
		typ, payload, nb, err := readFrame(h.conn, buf)
		buf = nb
		if err != nil {
			h.mu.RLock()
			closing := h.closed
			h.mu.RUnlock()
			if !closing {
				// The backend went away: end the call rather than leave
				// the caller talking to nobody.
				h.log.Info("backend closed the session", "err", err)
				if e, ok := h.out.(backend.Ender); ok {
					go e.End("backend_closed") // End tears down this handler; not from its own loop
				}
			}
			return
		}
		switch typ {
		case FrameAudio:
			if us, opus, ok := audioPayload(payload); ok {
				_ = h.out.WriteAudio(opus, time.Duration(us)*time.Microsecond)
			}
		case FrameEvent:
			_ = h.out.SendEvent(payload)
		case FrameControl:
			h.onControl(payload)
		}
		if cap(buf) > keepReadBuffer {
			buf = nil // a large frame's buffer is not the call's to keep
		}
	}
}

// keepReadBuffer is the largest read buffer a session keeps from one frame
// to the next: audio frames and events are far smaller, and a frame of up
// to MaxPayload gets a buffer of its own, released after it.
const keepReadBuffer = 64 << 10

// Close implements backend.Handler: it stops both loops and closes the
// connection, which tells the backend the session is over.
func (h *handler) Close() error {
	h.closeOnce.Do(func() {
		h.mu.Lock()
		h.closed = true
		close(h.queue)
		h.mu.Unlock()
		_ = h.conn.Close()
		h.wg.Wait()
	})
	return nil
}
