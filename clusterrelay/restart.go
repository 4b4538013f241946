package clusterrelay

import (
	"io"
	"net/http"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// restart forwards an ICE restart (PATCH of a session, see
// sessionapi.RestartRequest) to the pod named in the session ID, as delete
// does: the session lives only there.
func (f *Front) restart(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCreateBody))
	if err != nil {
		apierr.Write(w, http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large", "request body too large", 0)
		return
	}
	f.toSessionPod(w, r, http.MethodPatch, body)
}

// toSessionPod forwards a request about one session to the pod its ID
// names and copies the answer back; 404 when the ID names another cluster
// or a pod that is gone (its sessions went with it).
func (f *Front) toSessionPod(w http.ResponseWriter, r *http.Request, method string, body []byte) {
	f.toSessionPodWithin(w, r, f.cfg.Timeout, method, "", body)
}

// callEnded forwards the SIP front's watch of a phone call's end to the
// call's pod, which holds it up to sessionapi.CallEndedHold.
func (f *Front) callEnded(w http.ResponseWriter, r *http.Request) {
	f.toSessionPodWithin(w, r, sessionapi.CallEndedHold+f.cfg.Timeout, http.MethodGet, "/ended", nil)
}

// toSessionPodWithin is toSessionPod for the path suffix under the
// session's resource, with its own bound on the pod's answer.
func (f *Front) toSessionPodWithin(w http.ResponseWriter, r *http.Request, timeout time.Duration, method, suffix string, body []byte) {
	raw, pod, api, live, ok := f.sessionPod(w, r)
	if !ok {
		return
	}
	status, hdr, resp, err := f.forwardWithin(r.Context(), timeout, pod, method, api+sessionapi.SessionsPath+"/"+raw+suffix, body, "")
	switch {
	case err != nil && !live:
		// Gossip had dropped the pod and it does not answer: it is gone,
		// and its sessions with it.
		sessionNotFound(w)
	case err != nil:
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "pod_unreachable", "the session's pod did not answer", 0)
	default:
		copyResponse(w, status, hdr, resp)
	}
}

// sessionPod returns the session ID of the request's path, the pod it
// names and that pod's session API (live: gossip lists the pod now), or
// answers 404 for an ID of another cluster or of a pod that is gone.
func (f *Front) sessionPod(w http.ResponseWriter, r *http.Request) (raw string, pod uint16, api string, live, ok bool) {
	raw = r.PathValue("id")
	id, err := sessionid.Parse(raw)
	if err != nil || id.Cluster != f.cfg.Cluster {
		sessionNotFound(w)
		return "", 0, "", false, false
	}
	api, live = f.placer.podAPI(f.cfg.Pods.PodInfos(), id.Pod)
	if api == "" {
		sessionNotFound(w)
		return "", 0, "", false, false
	}
	return raw, id.Pod, api, live, true
}

func sessionNotFound(w http.ResponseWriter) {
	apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
}
