package signaling

import (
	"context"
	"fmt"
	"net/http"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
)

// sessionAPI returns the base URL to reach a cluster's session API
// (placement.Clusters.Base).
func (s *Server) sessionAPI(c geo.Cluster) string { return s.clusters.Base(c) }

// exchange is placement.Clusters.Exchange: one request to c's session API.
func (s *Server) exchange(ctx context.Context, c geo.Cluster, method, path string, body []byte, limit int64) (int, []byte, error) {
	return s.clusters.Exchange(ctx, c, method, path, body, limit)
}

// handleDelete hangs up a call (DELETE of its URL, or POST .../hangup).
// Only the credential that placed the call, or an API key of its tenant,
// may: the call ID carries a MAC binding it to them (callMinter). Any other
// caller, like an unknown call, gets 404.
func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	_, cred, ok := s.precheck(w, r, true)
	if !ok {
		return
	}
	raw, c, ok := s.sessionCluster(w, r, cred)
	if !ok {
		return
	}
	status, _, err := s.exchange(r.Context(), c, http.MethodDelete, "/"+raw, nil, 64<<10)
	switch status {
	case 0:
		s.unreachable(w, "delete", c, err)
	case http.StatusNoContent, http.StatusOK:
		w.WriteHeader(http.StatusNoContent)
	case http.StatusNotFound:
		sessionNotFound(w)
	default:
		clusterAnswered(w, status)
	}
}

// unreachable answers 502 for a session's cluster that did not answer.
func (s *Server) unreachable(w http.ResponseWriter, what string, c geo.Cluster, err error) {
	s.log.Warn(what+": cluster session API failed", "cluster", c.ID, "err", err)
	apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_unreachable", "the session's cluster did not answer", 0)
}

// clusterAnswered answers 502 for a session's cluster that answered an
// unexpected status.
func clusterAnswered(w http.ResponseWriter, status int) {
	apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_error", fmt.Sprintf("the session's cluster answered %d", status), 0)
}
