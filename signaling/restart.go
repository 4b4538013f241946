package signaling

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// ContentTypeSDPFrag is the media type of ICE restarts and trickled
// candidates (RFC 8840), the body of a PATCH of a session.
const ContentTypeSDPFrag = "application/trickle-ice-sdpfrag"

// handleRestart serves PATCH of a session resource, the WHIP way of
// restarting ICE (RFC 9725 section 4.4.1): the body is an SDP fragment with
// the client's new ICE credentials; the answer (200) is a fragment with the
// server's new credentials and an ETag. Like a DELETE it needs no state
// here: the call ID names the cluster, whose session API forwards to the
// pod, and only the call's owner may restart it (as for DELETE). A fragment with the credentials already in use (trickled
// candidates, which an ICE-lite server does not need) gets 204.
func (s *Server) handleRestart(w http.ResponseWriter, r *http.Request) {
	_, cred, ok := s.precheck(w, r, true)
	if !ok {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != ContentTypeSDPFrag {
		unsupportedMediaType(w, "Content-Type must be "+ContentTypeSDPFrag)
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	raw, c, ok := s.sessionCluster(w, r, cred)
	if !ok {
		return
	}
	reqBody, ok := s.encodeForCluster(w, sessionapi.RestartRequest{Fragment: string(body), IfMatch: r.Header.Get("If-Match")}, "fragment")
	if !ok {
		return
	}
	status, data, err := s.exchange(r.Context(), c, http.MethodPatch, "/"+raw, reqBody, 64<<10)
	switch status {
	case 0:
		s.unreachable(w, "ICE restart", c, err)
	case http.StatusOK:
		var out sessionapi.RestartResponse
		if err := json.Unmarshal(data, &out); err != nil {
			apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_error", "the session's cluster sent a bad answer", 0)
			return
		}
		if out.ETag != "" {
			w.Header().Set("ETag", out.ETag)
		}
		if !out.Restarted {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", ContentTypeSDPFrag)
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, out.Fragment)
	case http.StatusNotFound:
		sessionNotFound(w)
	case http.StatusBadRequest, http.StatusPreconditionFailed:
		if !json.Valid(data) {
			apierr.Write(w, status, apierr.TypeInvalidRequest, "invalid_ice_fragment", "the ICE fragment was refused", 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(data)
	default:
		clusterAnswered(w, status)
	}
}

func sessionNotFound(w http.ResponseWriter) {
	apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
}

// sessionCluster returns the session ID inside the call ID of the
// request's path and the cluster it names, or answers 404. Only the
// credential that placed the call, or an API key of its tenant, owns it
// (callMinter.owner); to anyone else the call does not exist.
func (s *Server) sessionCluster(w http.ResponseWriter, r *http.Request, cred credential) (string, geo.Cluster, bool) {
	raw, id, ok := s.calls.owner(r.PathValue("id"), cred)
	if !ok {
		sessionNotFound(w)
		return "", geo.Cluster{}, false
	}
	c, _, ok := s.cfg.CatalogueData.Cluster(id.Cluster)
	if !ok {
		sessionNotFound(w)
		return "", geo.Cluster{}, false
	}
	return raw, c, true
}
