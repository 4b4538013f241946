package transceiver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/datachannel"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/sdpcheck"
)

func TestMediaPathSupported(t *testing.T) {
	// Fails when a Pion upgrade renames or retypes the DTLS transport's
	// connection field: the pod would fall back to Pion's media path and
	// cost twice the CPU per session (TestPodCPUPerSession also fails then).
	if !mediaPathSupported() {
		t.Fatalf("webrtc.DTLSTransport has no field %q of type *dtls.Conn: the pod's media path cannot get the SRTP keys", dtlsConnField)
	}
}

// audioRecorder is a Handler that keeps the audio it is given.
type audioRecorder struct {
	mu     sync.Mutex
	frames [][]byte
	durs   []time.Duration
}

func (a *audioRecorder) Audio(p []byte, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.frames = append(a.frames, bytes.Clone(p))
	a.durs = append(a.durs, d)
}
func (a *audioRecorder) Event([]byte) {}
func (a *audioRecorder) Close() error { return nil }

func (a *audioRecorder) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.frames)
}

// overlapHandler counts Audio calls that began while another was running.
type overlapHandler struct {
	audioRecorder
	in, overlaps atomic.Int32
}

func (h *overlapHandler) Audio(p []byte, d time.Duration) {
	if h.in.Add(1) > 1 {
		h.overlaps.Add(1)
	}
	runtime.Gosched() // widen the window another caller could enter
	h.audioRecorder.Audio(p, d)
	h.in.Add(-1)
}

// TestSessionAudioOneAtATime: while a session switches to its media path,
// Pion's track reader and the pod's socket reader both deliver frames; the
// backend must still get one Audio call at a time, and none once it is
// closed.
func TestSessionAudioOneAtATime(t *testing.T) {
	h := &overlapHandler{}
	s := &session{handler: h}
	var wg sync.WaitGroup
	const calls = 2000
	for range 2 { // Pion's track reader and a pod socket reader
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				s.audio([]byte{1}, 20*time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if n := h.overlaps.Load(); n != 0 {
		t.Errorf("%d Audio calls overlapped another", n)
	}
	s.closeAudio()
	s.audio([]byte{2}, 20*time.Millisecond)
	if n := h.count(); n != 2*calls {
		t.Errorf("backend got %d frames, want %d and none after closeAudio", n, 2*calls)
	}
}

// TestNonceIndexBounded: every ICE restart gives a session another routing
// token; the index keeps the first and the latest ones only, so a client
// restarting all day does not grow it.
func TestNonceIndexBounded(t *testing.T) {
	var x nonceIndex
	s := &session{}
	for i := range 1000 {
		x.add([6]byte{byte(i), byte(i >> 8), 1}, s)
	}
	if len(x.m) != maxNoncesPerSession || len(s.nonces) != maxNoncesPerSession {
		t.Fatalf("%d nonces indexed, %d kept by the session, want %d", len(x.m), len(s.nonces), maxNoncesPerSession)
	}
	first, last := [6]byte{0, 0, 1}, [6]byte{byte(999 & 0xff), byte(999 >> 8), 1}
	if x.get(first) != s || x.get(last) != s {
		t.Error("the first or the latest token no longer finds the session")
	}
	x.remove(s)
	if len(x.m) != 0 {
		t.Errorf("%d nonces left after remove", len(x.m))
	}
}

// TestCreateErrorWords: a client whose offer is refused sees sdpcheck's
// own words or a fixed sentence, never what Pion said about its internals.
func TestCreateErrorWords(t *testing.T) {
	tr := &Transceiver{log: quiet}
	for _, c := range []struct {
		err        error
		code, want string
	}{
		{fmt.Errorf("%w: %w", ErrBadOffer, &sdpcheck.Error{Code: sdpcheck.CodeNoOpus, Msg: "no audio section offers Opus"}), sdpcheck.CodeNoOpus, "no audio section offers Opus"},
		{fmt.Errorf("%w: create answer: unable to populate media section, RTPSender created with no codecs", ErrBadOffer), sdpcheck.CodeInvalidSDP, "the offer cannot be answered"},
	} {
		rec := httptest.NewRecorder()
		tr.writeCreateError(rec, c.err)
		var body struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != http.StatusBadRequest || body.Error.Code != c.code || body.Error.Message != c.want {
			t.Errorf("%v: %d %+v, want 400 %s %q", c.err, rec.Code, body.Error, c.code, c.want)
		}
	}
}

// backlogChannel is an events channel whose client reads nothing.
type backlogChannel struct {
	datachannel.ReadWriteCloser
	buffered uint64
	written  int
}

func (c *backlogChannel) BufferedAmount() uint64 { return c.buffered }
func (c *backlogChannel) WriteDataChannel(p []byte, _ bool) (int, error) {
	c.written++
	c.buffered += uint64(len(p))
	return len(p), nil
}

// Pion's detached channel is what SendEvent measures.
var _ interface{ BufferedAmount() uint64 } = (*datachannel.DataChannel)(nil)

// TestSendEventBacklog: events toward a client that reads none are dropped
// once maxEventBacklog bytes wait, and counted; before that they go out.
func TestSendEventBacklog(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := &backlogChannel{}
	s := &session{t: &Transceiver{m: m}, events: ch}
	ev := bytes.Repeat([]byte("x"), 64<<10)
	var dropped int
	for range 40 {
		if err := s.SendEvent(ev); errors.Is(err, errEventsBacklog) {
			dropped++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if ch.written != 16 || dropped != 24 || ch.buffered > maxEventBacklog {
		t.Errorf("%d written (%d bytes waiting), %d dropped; want 16 of 64 KiB (1 MiB) and 24 dropped", ch.written, ch.buffered, dropped)
	}
	if d := (&pod{reg: reg}).counter(t, "rtcedge_transceiver_dropped_packets_total", "reason", "event_backlog"); d != 24 {
		t.Errorf("event_backlog drops = %v, want 24", d)
	}
}
