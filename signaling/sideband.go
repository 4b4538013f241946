package signaling

import (
	"context"
	"net/http"
	"strings"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// The sideband (OpenAI's server-side controls, docs/sideband.md): the app
// server opens GET /v1/realtime?call_id=ID as a WebSocket with the API key
// that placed the call or minted the client secret that placed it (or, for
// an anonymous call, with none). It sees every server event the caller
// gets, and its own events go to the model as the app's, never to the
// caller.
//
// Who may attach is decided here, from the call ID alone (callMinter.
// sidebandOwner, or owner for a key with SidebandTenant): no state, so any
// replica of any region decides alike, and before anything is asked of a
// cluster. To every other credential the call does not exist: the same 404
// and body as for an unknown or ended call. A client secret, even the one
// that placed the call, gets 401 api_key_required whatever the call ID.
// Then this replica dials the sideband of the session's cluster front with
// the cluster's session API secret, the front dials the pod's, and each hop
// relays messages (sessionapi.Relays).

// Results of an attach, the "result" label of sideband_attaches_total.
const (
	attachOK          = "attached"
	attachNotFound    = "not_found"
	attachSecret      = "client_secret"
	attachUnreachable = "cluster_unreachable"
	attachError       = "cluster_error"
	attachUpgrade     = "upgrade_failed"
	attachTooMany     = "too_many"
)

var attachResults = []string{attachOK, attachNotFound, attachSecret, attachTooMany, attachUnreachable, attachError, attachUpgrade}

func (s *Server) handleSideband(w http.ResponseWriter, r *http.Request) {
	_, cred, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	callID := r.URL.Query().Get("call_id")
	if callID == "" {
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "missing_call_id",
			"this endpoint attaches to a WebRTC call: GET /v1/realtime?call_id=ID, the ID from the call's Location", "call_id")
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "websocket_required", "open this endpoint as a WebSocket", 0)
		return
	}
	if cred.kind == credSecret {
		s.m.sidebandAttaches.WithLabelValues(attachSecret).Inc()
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "api_key_required",
			"a sideband attaches with the API key that placed the call (or minted its client secret), not with a client secret", 0)
		return
	}
	raw, id, ok := s.calls.sidebandOwner(callID, cred)
	if !ok && cred.kind == credAPIKey && s.keys[cred.key].SidebandTenant {
		raw, id, ok = s.calls.owner(callID, cred)
	}
	c, _, known := s.cfg.CatalogueData.Cluster(id.Cluster)
	if !ok || !known {
		s.m.sidebandAttaches.WithLabelValues(attachNotFound).Inc()
		sessionNotFound(w)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ClusterTimeout)
	up, status, body, err := sessionapi.DialSideband(ctx, s.cfg.HTTPClient, s.sessionAPI(c)+sessionapi.SidebandPath(raw), s.cfg.SessionAPISecrets[c.ID])
	cancel()
	switch status {
	case http.StatusSwitchingProtocols:
	case 0:
		s.m.sidebandAttaches.WithLabelValues(attachUnreachable).Inc()
		s.unreachable(w, "sideband", c, err)
		return
	case http.StatusNotFound:
		// The call ended (or its pod is gone): as for any other ID.
		s.m.sidebandAttaches.WithLabelValues(attachNotFound).Inc()
		sessionNotFound(w)
		return
	case http.StatusConflict:
		// The call has as many sidebands as it takes: the owner may know.
		s.m.sidebandAttaches.WithLabelValues(attachTooMany).Inc()
		apierr.Write(w, http.StatusConflict, apierr.TypeInvalidRequest, "too_many_sidebands", "the call has as many sidebands as it takes", 0)
		return
	default:
		s.m.sidebandAttaches.WithLabelValues(attachError).Inc()
		s.log.Warn("sideband: the cluster refused", "cluster", c.ID, "status", status, "body", string(body))
		clusterAnswered(w, status)
		return
	}
	down, err := sessionapi.AcceptSideband(w, r)
	if err != nil {
		s.m.sidebandAttaches.WithLabelValues(attachUpgrade).Inc()
		_ = up.CloseNow()
		return
	}
	s.m.sidebandAttaches.WithLabelValues(attachOK).Inc()
	s.m.sidebands.Inc()
	defer s.m.sidebands.Dec()
	s.relays.Relay(down, up)
}
