package clusterrelay

import (
	"context"
	"net/http"
	"strings"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// sideband relays a session's sideband WebSocket (sessionapi.SidebandPath)
// to the pod its ID names, as toSessionPod does for a request: it dials the
// pod's sideband with the credential the pod accepts (podSecret) and, once the pod upgraded,
// accepts signaling's and relays messages both ways until either side
// closes or the front closes. The pod's refusal is passed on (404 for an
// ended session); a pod refusing our secret is a 502 here, never a 401
// that signaling would take for its own.
func (f *Front) sideband(w http.ResponseWriter, r *http.Request) {
	raw, pod, api, live, ok := f.sessionPod(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), f.cfg.Timeout)
	up, status, body, err := sessionapi.DialSideband(ctx, f.cfg.HTTPClient, strings.TrimSuffix(api, "/")+sessionapi.SidebandPath(raw), f.podSecret(pod))
	cancel()
	switch {
	case status == http.StatusSwitchingProtocols:
	case status == 0 && !live:
		sessionNotFound(w)
		return
	case status == 0:
		f.log.Warn("pod sideband failed", "err", err)
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "pod_unreachable", "the session's pod did not answer", 0)
		return
	case status == http.StatusUnauthorized:
		f.log.Warn("pod refused the cluster's session API secret")
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "pod_error", "the session's pod refused the front", 0)
		return
	default:
		copyResponse(w, status, http.Header{"Content-Type": []string{"application/json"}}, body)
		return
	}
	down, err := sessionapi.AcceptSideband(w, r)
	if err != nil {
		_ = up.CloseNow()
		return
	}
	f.relays.Relay(down, up)
}

// Close ends the sideband relays and waits for them.
func (f *Front) Close() { f.relays.Close() }
