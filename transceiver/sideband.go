package transceiver

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/oaievents"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// The pod's side of a call's sideband (docs/sideband.md): the app server's
// WebSocket, authenticated by signaling and relayed by the cluster's front
// (GET SessionsPath/{id}/sideband, behind the session API secret like every
// other path here). The session hands it every event that goes to the
// caller's oai-events channel — everything through SendEvent, in the order
// SendEvent takes them — and hands what it sends to the backend as the
// app's own events (backend.ServerEvents), never to the caller.
//
// A sideband that attaches first gets a replay of the call's most recent
// events (replayEvents / replayBytes: from session.created on for one that
// attaches as the call starts), then every event as the caller gets it,
// with no gap and no repeat: the replay is copied and the sideband added
// under the lock SendEvent holds.
//
// Each sideband has a bounded queue (sidebandQueue events, sidebandBytes
// bytes) drained by its own writer: SendEvent never waits for it. A
// sideband whose queue is full is closed with sessionapi.CloseSlow and
// counted; the call goes on.

const (
	// maxSidebands bounds the sidebands of one call.
	maxSidebands = 4
	// sidebandQueue and sidebandBytes bound the events waiting for one
	// sideband's writer.
	sidebandQueue = 512
	sidebandBytes = 1 << 20
	// replayEvents and replayBytes bound the recent events a session
	// keeps for a sideband that attaches later.
	replayEvents = 32
	replayBytes  = 64 << 10
	// sidebandCloseWait bounds the close handshake with a sideband, and
	// how long a stopped sideband's blocked write may go on.
	sidebandCloseWait = sessionapi.CloseWait
)

// Close reasons, the "reason" label of sideband_closes_total.
const (
	sbCloseSlow    = "slow"
	sbCloseEnded   = "call_ended"
	sbCloseApp     = "closed" // the app server closed it, or its connection failed
	sbCloseTooMany = "too_many"
)

var sbCloseReasons = []string{sbCloseSlow, sbCloseEnded, sbCloseApp, sbCloseTooMany}

// Attach results, the "result" label of sideband_attaches_total.
const (
	sbAttached = "attached"
	sbNotFound = "not_found"
	sbTooMany  = "too_many"
	sbUpgrade  = "upgrade_failed"
)

var sbAttachResults = []string{sbAttached, sbNotFound, sbTooMany, sbUpgrade}

// errReadOnly is what a sideband hears when it sends an event to a backend
// that takes none from it.
var errReadOnly = oaievents.ErrorEvent("invalid_request_error", "sideband_read_only", "",
	"This call's backend takes no events from a sideband; it only sees the call's events.", "")

// sidebands is a session's attached sidebands and its replay of recent
// events; guarded by session.sendMu.
type sidebands struct {
	list   []*sideband
	closed bool // the session ended: no more attaches
	wg     sync.WaitGroup
	replay replay
}

// replay holds the most recent events, at most replayEvents and
// replayBytes, oldest first; it reuses the buffers it evicts, so keeping
// it costs no allocation per event once warm.
type replay struct {
	ev    [][]byte
	bytes int
	spare []byte
}

func (r *replay) add(data []byte) {
	if len(data) > replayBytes {
		// A contiguous suffix or nothing: never a replay with a hole.
		r.ev, r.bytes = r.ev[:0], 0
		return
	}
	for len(r.ev) > 0 && (len(r.ev) == replayEvents || r.bytes+len(data) > replayBytes) {
		old := r.ev[0]
		r.bytes -= len(old)
		copy(r.ev, r.ev[1:])
		r.ev = r.ev[:len(r.ev)-1]
		r.spare = old
	}
	buf := append(r.spare[:0], data...)
	r.spare = nil
	r.ev = append(r.ev, buf)
	r.bytes += len(data)
}

// sideband is one attached WebSocket: one reader goroutine hands the app's
// events to the backend, one writer (runSideband) drains queue.
type sideband struct {
	// Static after newSideband.
	conn   *websocket.Conn
	ctx    context.Context // ends the reads and a blocked write
	cancel context.CancelFunc

	// Filled by offer under session.sendMu, drained by the writer.
	queue  chan []byte
	queued atomic.Int64 // bytes in queue: added by offer, taken by the writer

	// Written once by stop, before stopped closes; read after it.
	stopOnce sync.Once
	stopped  chan struct{} // closed by stop
	reason   string
	code     websocket.StatusCode
	timer    *time.Timer // ends a write still blocked sidebandCloseWait after stop
}

func newSideband(conn *websocket.Conn) *sideband {
	sb := &sideband{conn: conn, queue: make(chan []byte, sidebandQueue), stopped: make(chan struct{})}
	sb.ctx, sb.cancel = context.WithCancel(context.Background())
	return sb
}

// stop ends the sideband with reason (the first one given wins); its
// writer closes the WebSocket with code.
func (sb *sideband) stop(code websocket.StatusCode, reason string) {
	sb.stopOnce.Do(func() {
		sb.code, sb.reason = code, reason
		sb.timer = time.AfterFunc(sidebandCloseWait, sb.cancel)
		close(sb.stopped)
	})
}

func (sb *sideband) isStopped() bool {
	select {
	case <-sb.stopped:
		return true
	default:
		return false
	}
}

// offer queues a copy of data, or stops a sideband that is too far behind.
// Called under session.sendMu (fanOut, attach's replay, toSideband), so
// the bytes bound's check-then-add is never raced.
func (sb *sideband) offer(data []byte) {
	if sb.isStopped() {
		return
	}
	if sb.queued.Load()+int64(len(data)) > sidebandBytes {
		sb.stop(sessionapi.CloseSlow, sbCloseSlow)
		return
	}
	select {
	case sb.queue <- bytes.Clone(data):
		sb.queued.Add(int64(len(data)))
	default:
		sb.stop(sessionapi.CloseSlow, sbCloseSlow)
	}
}

// toSideband answers one sideband alone (an error about the event it
// sent), in order with the call's events.
func (s *session) toSideband(sb *sideband, ev []byte) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	sb.offer(ev)
}

// fanOut hands an event to the replay and every sideband; sendMu held.
func (s *session) fanOut(data []byte) {
	s.sb.replay.add(data)
	for _, sb := range s.sb.list {
		sb.offer(data)
	}
}

// attach adds sb after queueing the replay for it; false when the session
// ended or has maxSidebands already.
func (s *session) attach(sb *sideband) (string, bool) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.sb.closed {
		return sbCloseEnded, false
	}
	if len(s.sb.list) >= maxSidebands {
		return sbCloseTooMany, false
	}
	for _, ev := range s.sb.replay.ev {
		sb.offer(ev)
	}
	s.sb.list = append(s.sb.list, sb)
	s.sb.wg.Add(1)
	return "", true
}

func (s *session) detach(sb *sideband) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	for i, x := range s.sb.list {
		if x == sb {
			s.sb.list = append(s.sb.list[:i], s.sb.list[i+1:]...)
			break
		}
	}
}

// sidebandCount is how many sidebands are attached.
func (s *session) sidebandCount() int {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return len(s.sb.list)
}

// closeSidebands stops every sideband of an ending session and waits for
// them: no sideband outlives teardown, and none calls the backend after
// it is closed.
func (s *session) closeSidebands(reason string) {
	s.sendMu.Lock()
	s.sb.closed = true
	for _, sb := range s.sb.list {
		sb.stop(sessionapi.CloseCallEnded, reason)
	}
	s.sendMu.Unlock()
	s.sb.wg.Wait()
}

// handleSideband serves GET SessionsPath/{id}/sideband: 404 for a session
// this pod does not hold, else the WebSocket, attached until either side
// ends it.
func (t *Transceiver) handleSideband(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	s := t.sessions[r.PathValue("id")]
	t.mu.Unlock()
	if s == nil {
		t.m.sidebandAttaches.WithLabelValues(sbNotFound).Inc()
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
		return
	}
	if s.sidebandCount() >= maxSidebands {
		t.m.sidebandAttaches.WithLabelValues(sbTooMany).Inc()
		apierr.Write(w, http.StatusConflict, apierr.TypeInvalidRequest, "too_many_sidebands", "the call has as many sidebands as it takes", 0)
		return
	}
	conn, err := sessionapi.AcceptSideband(w, r)
	if err != nil {
		t.m.sidebandAttaches.WithLabelValues(sbUpgrade).Inc()
		return
	}
	sb := newSideband(conn)
	defer sb.cancel()
	if reason, ok := s.attach(sb); !ok {
		res := sbNotFound
		if reason == sbCloseTooMany {
			res = sbTooMany
		}
		t.m.sidebandAttaches.WithLabelValues(res).Inc()
		t.m.sidebandCloses.WithLabelValues(reason).Inc()
		sessionapi.CloseWithin(conn, sessionapi.CloseCallEnded, reason, sidebandCloseWait)
		return
	}
	defer s.sb.wg.Done()
	t.m.sidebandAttaches.WithLabelValues(sbAttached).Inc()
	t.m.sidebands.Inc()
	defer t.m.sidebands.Dec()
	s.runSideband(sb)
}

// runSideband reads the app's events in a goroutine and writes the call's
// events here until the sideband stops; then it detaches, closes with the
// reason and counts it.
func (s *session) runSideband(sb *sideband) {
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			typ, data, err := sb.conn.Read(sb.ctx)
			if err != nil {
				sb.stop(websocket.StatusNormalClosure, sbCloseApp)
				return
			}
			if typ != websocket.MessageText {
				s.t.m.sidebandEvents.WithLabelValues("dropped").Inc()
				continue
			}
			h, ok := s.handler.(backend.ServerEvents)
			if !ok {
				s.t.m.sidebandEvents.WithLabelValues("from_sideband").Inc()
				s.toSideband(sb, errReadOnly)
				continue
			}
			// The app's events are trusted in what they say, not in how:
			// the backend gets the pod's own encoding of one strictly read
			// object, so it cannot read the event otherwise than the pod.
			ev, _, err := oaievents.Canonical(data)
			if err != nil {
				s.t.m.sidebandEvents.WithLabelValues("refused").Inc()
				s.toSideband(sb, oaievents.ErrorEvent("invalid_request_error", "invalid_event", "", "The event was refused: "+err.Error()+".", ""))
				continue
			}
			s.t.m.sidebandEvents.WithLabelValues("from_sideband").Inc()
			h.ServerEvent(ev)
		}
	}()
loop:
	for {
		select {
		case ev := <-sb.queue:
			sb.queued.Add(-int64(len(ev)))
			if err := sb.conn.Write(sb.ctx, websocket.MessageText, ev); err != nil {
				sb.stop(websocket.StatusGoingAway, sbCloseApp)
				break loop
			}
			s.t.m.sidebandEvents.WithLabelValues("to_sideband").Inc()
		case <-sb.stopped:
			break loop
		}
	}
	<-sb.stopped // set when the loop broke for any reason
	s.detach(sb)
	sessionapi.CloseWithin(sb.conn, sb.code, sb.reason, sidebandCloseWait)
	sb.cancel()
	<-read
	sb.timer.Stop()
	s.t.m.sidebandCloses.WithLabelValues(sb.reason).Inc()
}
