// A phone call's end, told to the SIP front (docs/sip.md, "Hangup from
// rtcedge's side"). The front placed the call through the cluster's
// session API and watches its end there: GET SessionsPath/{id}/ended,
// held until the call ends (RTP timeout, the backend, a DELETE such as
// /v1/realtime/calls/{id}/hangup, the pod's shutdown) and answered with
// the reason, whereupon the front sends the carrier BYE. The path needs no
// credential of its own: it is the session API's, which the front already
// holds and the pod already checks.

package transceiver

import (
	"net/http"
	"sync"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// callEnd is the end of a call, for its watchers.
type callEnd struct {
	mu     sync.Mutex
	ch     chan struct{} // closed when the call ends; made by the first watcher or the end
	reason string        // why it ended, once ch is closed
	ended  bool
}

// wait is a channel closed when the call ends.
func (e *callEnd) wait() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch == nil {
		e.ch = make(chan struct{})
		if e.ended {
			close(e.ch)
		}
	}
	return e.ch
}

// fire records the call's end and wakes its watchers; once.
func (e *callEnd) fire(reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return
	}
	e.ended, e.reason = true, reason
	if e.ch != nil {
		close(e.ch)
	}
}

func (e *callEnd) why() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reason
}

// handleCallEnded serves GET SessionsPath/{id}/ended: 200 with the reason
// once the phone call ends, 204 after hold, 404 for a call the pod does
// not hold (ended and forgotten, or never its).
func (t *Transceiver) handleCallEnded(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	c := t.calls[r.PathValue("id")]
	t.mu.Unlock()
	if c == nil {
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
		return
	}
	hold := time.NewTimer(sessionapi.CallEndedHold)
	defer hold.Stop()
	select {
	case <-c.ended.wait():
		writeJSON(w, http.StatusOK, sessionapi.CallEnded{Reason: c.ended.why()})
	case <-hold.C:
		w.WriteHeader(http.StatusNoContent)
	case <-r.Context().Done():
	}
}

// Calls returns the IDs of the phone calls the pod holds.
func (t *Transceiver) Calls() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := make([]string, 0, len(t.calls))
	for id := range t.calls {
		ids = append(ids, id)
	}
	return ids
}

// PacketState is what the pod's socket holds for calls: its routes to
// clients and carriers, and its phone calls' registrations (0 and 0 once
// every call ended and its routes idled out or were removed).
func (t *Transceiver) PacketState() (routes, rtpCalls int) {
	return t.sock.Routes(), t.sock.RTPCalls()
}
