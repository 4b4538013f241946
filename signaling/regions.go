package signaling

import (
	"encoding/json"
	"net/http"

	"github.com/rtcedge/rtcedge/geo"
)

// RegionsResponse is the JSON answer of GET /v1/regions.
type RegionsResponse struct {
	DefaultRegion string          `json:"default_region"`
	Regions       []RegionSummary `json:"regions"`
}

// RegionSummary is one region with its clusters' health.
type RegionSummary struct {
	Name     string           `json:"name"`
	Location geo.Point        `json:"location"`
	Clusters []ClusterSummary `json:"clusters"`
	POPs     []POPSummary     `json:"pops"`
}

// ClusterSummary is one cluster as signaling sees it.
type ClusterSummary struct {
	ID       uint16 `json:"id"`
	Name     string `json:"name"`
	Known    bool   `json:"known"` // gossip has reported on it
	Healthy  bool   `json:"healthy"`
	Draining bool   `json:"draining"`
	Load     int    `json:"load"`
	Capacity int    `json:"capacity"`
}

// POPSummary is one relay POP.
type POPSummary struct {
	ID   uint16 `json:"id"`
	Name string `json:"name"`
	VIP  string `json:"vip"`
	Up   bool   `json:"up"`
}

func (s *Server) handleRegions(w http.ResponseWriter, _ *http.Request) {
	out := RegionsResponse{DefaultRegion: s.cfg.CatalogueData.DefaultRegion}
	for _, rg := range s.cfg.CatalogueData.Regions {
		rs := RegionSummary{Name: rg.Name, Location: rg.Location}
		for _, c := range rg.Clusters {
			cs := ClusterSummary{ID: c.ID, Name: c.Name, Healthy: true}
			if s.cfg.Health != nil {
				if st, ok := s.cfg.Health(c.ID); ok {
					cs.Known, cs.Healthy, cs.Draining, cs.Load, cs.Capacity = true, st.Healthy, st.Draining, st.Load, st.Capacity
				}
			}
			rs.Clusters = append(rs.Clusters, cs)
		}
		for _, p := range rg.POPs {
			up := s.cfg.POPUp == nil || s.cfg.POPUp(p.ID)
			rs.POPs = append(rs.POPs, POPSummary{ID: p.ID, Name: p.Name, VIP: p.VIP.String(), Up: up})
		}
		out.Regions = append(out.Regions, rs)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
