// The pod's own hangup reaching the carrier (docs/sip.md, "Hangup from
// rtcedge's side"). A pod ends a phone call on its own — RTP timeout, its
// backend ending the call, a DELETE of the session (the app's
// /v1/realtime/calls/{id}/hangup through signaling), its shutdown — and
// the carrier must hear BYE. The front placed the call through the
// cluster's session API, so it watches the call's end there, on the path
// and under the credential it already uses: GET .../{id}/ended, which the
// pod holds until the call ends (sessionapi.CallEndedHold, then 204 and
// the front asks again). A 404 session_not_found is a call its pod no
// longer holds: it ended, or the pod is gone. Either way the front sends
// BYE and frees the dialog; the watch of a dialog ended otherwise (the
// carrier's BYE, CANCEL, the front's drain) is cancelled.

package sipfront

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// watchRetry is the pause after a watch the cluster did not answer (or
// answered with what the front cannot use) before it asks again; the
// call goes on meanwhile.
const watchRetry = 2 * time.Second

// byeTimeout bounds the BYE of a call the pod ended (sipgo's transaction
// ends it earlier on a final answer or 64*T1).
const byeTimeout = 32 * time.Second

// Reasons a pod ended a call, the "reason" label of
// rtcedge_sipfront_pod_hangups_total: the pod's own (its
// sessions_ended_total reasons), "gone" (404: the pod no longer holds the
// call), "other" for any reason the front does not know (a label set
// bounded whatever a pod says).
var podEndReasons = []string{"rtp_timeout", "backend_closed", "deleted", "shutdown", "drain_deadline", "gone", "other"}

// watch starts the watch of an answered dialog's call. It is not started
// for a dialog that ended meanwhile or once the front is closing.
func (f *Front) watch(d *dialog) {
	ctx, cancel := context.WithCancel(context.Background())
	d.mu.Lock()
	if d.state == stateEnded || d.unwatch != nil {
		d.mu.Unlock()
		cancel()
		return
	}
	d.unwatch = cancel
	session, cluster := d.session, d.cluster
	d.mu.Unlock()
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		cancel()
		return
	}
	f.calls.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.calls.Done()
		defer cancel()
		reason, ended := f.awaitEnd(ctx, session, cluster)
		if !ended {
			return
		}
		f.m.podHangups.WithLabelValues(reason).Inc()
		bctx, bcancel := context.WithTimeout(context.Background(), byeTimeout)
		defer bcancel()
		f.hangup(bctx, d)
	}()
}

// stopWatch cancels the dialog's watch, if any; finish calls it.
func (d *dialog) stopWatch() {
	d.mu.Lock()
	stop := d.unwatch
	d.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// awaitEnd asks the call's cluster for the call's end until it comes, and
// returns its reason label; ended is false when ctx ended first.
func (f *Front) awaitEnd(ctx context.Context, session string, cluster geo.Cluster) (reason string, ended bool) {
	retry := time.NewTimer(0)
	defer retry.Stop()
	<-retry.C
	for {
		status, body, err := f.deps.Clusters.ExchangeWithin(ctx, sessionapi.CallEndedHold+f.deps.Clusters.Timeout,
			cluster, http.MethodGet, sessionapi.CallEndedPath(session), nil, 4<<10)
		switch {
		case ctx.Err() != nil:
			return "", false
		case err == nil && status == http.StatusOK:
			var e sessionapi.CallEnded
			_ = json.Unmarshal(body, &e) // an unreadable reason is "other"
			return podEndReason(e.Reason), true
		case err == nil && status == http.StatusNotFound && bytes.Contains(body, []byte(`"session_not_found"`)):
			return "gone", true
		case err == nil && status == http.StatusNoContent:
			continue
		}
		f.m.watchErrors.Inc()
		retry.Reset(watchRetry)
		select {
		case <-ctx.Done():
			return "", false
		case <-retry.C:
		}
	}
}

func podEndReason(r string) string {
	for _, known := range podEndReasons {
		if r == known {
			return r
		}
	}
	return "other"
}
