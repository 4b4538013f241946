package transceiver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/testsdp"
)

// sinkBackend hands the test each session's Sink and the sideband events
// its handler gets.
type sinkBackend struct {
	sinks  chan backend.Sink
	events chan []byte
}

func (b *sinkBackend) Open(_ context.Context, _ backend.SessionInfo, out backend.Sink) (backend.Handler, error) {
	b.sinks <- out
	return sinkHandler{b}, nil
}

type sinkHandler struct{ b *sinkBackend }

func (sinkHandler) Audio([]byte, time.Duration) {}
func (sinkHandler) Event([]byte)                {}
func (sinkHandler) Close() error                { return nil }
func (h sinkHandler) ServerEvent(data []byte)   { h.b.events <- bytes.Clone(data) }

const testAPISecret = "pod-session-api-secret"

// sidebandPod runs a pod with a sinkBackend behind its session API (with
// a secret) and creates one session; it returns the API's URL, the
// session's ID and Sink.
func sidebandPod(t *testing.T) (*pod, *sinkBackend, string, string, backend.Sink) {
	t.Helper()
	be := &sinkBackend{sinks: make(chan backend.Sink, 1), events: make(chan []byte, 16)}
	p := newPod(t, Config{Backend: be, SessionAPISecret: testAPISecret})
	srv := httptest.NewServer(p.t.Handler())
	t.Cleanup(srv.Close)
	offer, _ := json.Marshal(testsdp.Offer(t))
	req, _ := http.NewRequest(http.MethodPost, srv.URL+SessionsPath, strings.NewReader(`{"offer":`+string(offer)+`,"pops":[{"id":1,"vip":"127.0.0.2:3478"}]}`))
	sessionapi.Authorize(req, testAPISecret)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out APICreateResponse
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	return p, be, srv.URL, out.ID, <-be.sinks
}

// reader counts a sideband's events and checks their sequence numbers.
type reader struct {
	mu   sync.Mutex
	seqs []int
	err  error
	done chan struct{}
}

func readSideband(conn *websocket.Conn) *reader {
	r := &reader{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			_, data, err := conn.Read(context.Background())
			r.mu.Lock()
			if err != nil {
				r.err = err
				r.mu.Unlock()
				return
			}
			seq := -1
			if rest, ok := bytes.CutPrefix(data, []byte(`{"type":"test.event","seq":`)); ok {
				if i := bytes.IndexByte(rest, ','); i > 0 {
					_, _ = fmt.Sscan(string(rest[:i]), &seq)
				}
			}
			r.seqs = append(r.seqs, seq)
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *reader) got() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.seqs...)
}

func event(seq, pad int) []byte {
	return fmt.Appendf(nil, `{"type":"test.event","seq":%d,"pad":"%s"}`, seq, strings.Repeat("x", pad))
}

// TestSidebandAuthReplayAndEvents: the pod's sideband needs the session
// API secret (401 without or with another, before the session is looked
// up); an unknown session is 404. A sideband that attaches late gets the
// last replayEvents events, then the live ones, without gap or repeat;
// what it sends reaches the backend's ServerEvent; the session's end
// closes it with CloseCallEnded.
func TestSidebandAuthReplayAndEvents(t *testing.T) {
	p, be, url, id, sink := sidebandPod(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, secret := range []string{"", "another-secret"} {
		if _, st, _, _ := sessionapi.DialSideband(ctx, http.DefaultClient, url+sessionapi.SidebandPath(id), secret); st != http.StatusUnauthorized {
			t.Errorf("sideband with secret %q: %d, want 401", secret, st)
		}
	}
	if _, st, _, _ := sessionapi.DialSideband(ctx, http.DefaultClient, url+sessionapi.SidebandPath("rtc_unknown"), testAPISecret); st != http.StatusNotFound {
		t.Errorf("unknown session: %d, want 404", st)
	}

	const before, after = 40, 5
	for i := range before {
		_ = sink.SendEvent(event(i, 10))
	}
	conn, st, _, err := sessionapi.DialSideband(ctx, http.DefaultClient, url+sessionapi.SidebandPath(id), testAPISecret)
	if err != nil {
		t.Fatalf("attach: %d %v", st, err)
	}
	defer conn.CloseNow()
	r := readSideband(conn)
	// The 101 comes before the pod attaches the sideband: wait for it, so
	// the live events below come after the replay (else they would be in
	// it).
	eventually(t, "attached", func() bool {
		return p.counter(t, "rtcedge_transceiver_sideband_attaches_total", "result", sbAttached) == 1
	})
	for i := before; i < before+after; i++ {
		_ = sink.SendEvent(event(i, 10))
	}
	eventually(t, "the replay and the live events", func() bool { return len(r.got()) >= replayEvents+after })
	got := r.got()
	for i, seq := range got {
		if want := before - replayEvents + i; seq != want {
			t.Fatalf("sideband events %v: at %d seq %d, want %d", got, i, seq, want)
		}
	}

	// An event two parsers could read differently goes nowhere (the
	// sideband gets an error); the next reaches the backend as the pod
	// re-encoded it.
	for _, ev := range []string{
		`{"type":"response.create","TYPE":"session.update","session":{"instructions":"y"}}`,
		` { "type":"session.update", "session":{"instructions":"\u0078"}} `,
	} {
		if err := conn.Write(ctx, websocket.MessageText, []byte(ev)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ev := <-be.events:
		if string(ev) != `{"type":"session.update","session":{"instructions":"x"}}` {
			t.Errorf("backend got %s", ev)
		}
	case <-ctx.Done():
		t.Fatal("the sideband's event never reached the backend")
	}

	if err := p.t.EndSession(id); err != nil {
		t.Fatal(err)
	}
	<-r.done
	if websocket.CloseStatus(r.err) != sessionapi.CloseCallEnded {
		t.Errorf("sideband ended with %v, want status %d", r.err, sessionapi.CloseCallEnded)
	}
	eventually(t, "the close counted", func() bool {
		return p.counter(t, "rtcedge_transceiver_sideband_closes_total", "reason", sbCloseEnded) == 1
	})
	if n := p.counter(t, "rtcedge_transceiver_sideband_events_total", "direction", "refused"); n != 1 {
		t.Errorf("%v sideband events refused, want 1", n)
	}
}

// TestSlowSidebandDoesNotStallTheCall: one sideband reads nothing. The
// session's SendEvent never waits for it (each call returns within a
// loose bound however far behind it is); once its queue is full it is
// closed and counted as slow, while a second sideband, which keeps up
// (the test sends the next event once it has the last), gets every event
// in order.
func TestSlowSidebandDoesNotStallTheCall(t *testing.T) {
	p, _, url, id, sink := sidebandPod(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() *websocket.Conn {
		conn, st, _, err := sessionapi.DialSideband(ctx, http.DefaultClient, url+sessionapi.SidebandPath(id), testAPISecret)
		if err != nil {
			t.Fatalf("attach: %d %v", st, err)
		}
		t.Cleanup(func() { _ = conn.CloseNow() })
		return conn
	}
	slow := dial() // never read
	fast := readSideband(dial())
	eventually(t, "both attached", func() bool {
		return p.counter(t, "rtcedge_transceiver_sideband_attaches_total", "result", sbAttached) == 2
	})

	// Events of 48 KiB: the slow sideband's queue (sidebandBytes) and
	// the socket buffers on the way fill within a few hundred; the loop
	// is bounded in count and time.
	const maxEvents, pad = 1000, 48 << 10
	sent, worst := 0, time.Duration(0)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for sent < maxEvents && ctx.Err() == nil {
			start := time.Now()
			_ = sink.SendEvent(event(sent, pad))
			worst = max(worst, time.Since(start))
			sent++
			for len(fast.got()) < sent && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			if sent%20 == 0 && p.counter(t, "rtcedge_transceiver_sideband_closes_total", "reason", sbCloseSlow) == 1 {
				return
			}
		}
	}()
	select {
	case <-finished:
	case <-ctx.Done():
		t.Fatal("SendEvent stalled behind the slow sideband")
	}
	if n := p.counter(t, "rtcedge_transceiver_sideband_closes_total", "reason", sbCloseSlow); n != 1 {
		t.Fatalf("after %d events the slow sideband was not closed (closes{slow} = %v)", sent, n)
	}
	if worst > time.Second {
		t.Errorf("a SendEvent took %v", worst)
	}
	t.Logf("slow sideband closed after %d events of %d KiB; slowest SendEvent %v", sent, pad>>10, worst)
	eventually(t, "the fast sideband got every event", func() bool { return len(fast.got()) == sent })
	for i, seq := range fast.got() {
		if seq != i {
			t.Fatalf("fast sideband: event %d has seq %d", i, seq)
		}
	}
	_ = slow
}
