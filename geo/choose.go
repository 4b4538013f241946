package geo

import (
	"cmp"
	"slices"
)

// ClusterState is a cluster's aggregate state as published over gossip by its
// cluster relays.
type ClusterState struct {
	Healthy  bool
	Draining bool
	// Load is the number of sessions in the cluster; Capacity the most it
	// accepts. Capacity 0 means unlimited.
	Load, Capacity int
}

// usable reports whether a cluster in this state may receive a new session.
func (s ClusterState) usable() bool {
	return s.Healthy && !s.Draining && (s.Capacity <= 0 || s.Load < s.Capacity)
}

// HealthFunc reports a cluster's state as gossip knows it. It is called
// from the goroutine running Choose and must be safe for concurrent use if
// Choose is.
//
// ok=false means gossip has no word on the cluster (yet); such a cluster is
// treated as healthy so that a catalogue works without gossip, and so that a
// signaling front that has just started does not refuse every session. A nil
// HealthFunc means every cluster is healthy.
type HealthFunc func(clusterID uint16) (state ClusterState, ok bool)

// Choice is the outcome of Choose.
type Choice struct {
	// Clusters holds every usable cluster, nearest first; signaling tries
	// them in order. Empty when no cluster is usable.
	Clusters []ClusterChoice
	// POPs holds the nearest POP and a backup (at most two), nearest first.
	POPs []POP
}

// ClusterChoice is one candidate cluster with its distance to the client.
type ClusterChoice struct {
	Cluster    Cluster
	Region     string
	DistanceKm float64
}

// choosePOPCount is nearest + backup: the answer advertises two relay VIPs so
// ICE can fall back to the second if the first is unreachable.
const choosePOPCount = 2

// Choose ranks the clusters usable for a client at the given point by
// great-circle distance and picks the nearest POPs. Clusters that health
// reports as unhealthy, draining, or full (Capacity > 0 && Load >= Capacity)
// are skipped. Ties are broken by the lower cluster ID so the order is
// stable. POPs are chosen with ChoosePOPs(client, 2, nil).
func (c *Catalogue) Choose(client Point, health HealthFunc) Choice {
	var out Choice
	for _, r := range c.Regions {
		for _, cl := range r.Clusters {
			if health != nil {
				if st, ok := health(cl.ID); ok && !st.usable() {
					continue
				}
			}
			out.Clusters = append(out.Clusters, ClusterChoice{
				Cluster:    cl,
				Region:     r.Name,
				DistanceKm: DistanceKm(client, cl.Location),
			})
		}
	}
	slices.SortFunc(out.Clusters, func(a, b ClusterChoice) int {
		return cmp.Or(cmp.Compare(a.DistanceKm, b.DistanceKm), cmp.Compare(a.Cluster.ID, b.Cluster.ID))
	})
	out.POPs = c.ChoosePOPs(client, choosePOPCount, nil)
	return out
}

// ChoosePOPs returns up to n POPs nearest to the client, nearest first, ties
// broken by the lower POP ID. POPs for which up returns false are skipped; a
// nil up means all POPs are up. n <= 0 returns every POP that is up.
func (c *Catalogue) ChoosePOPs(client Point, n int, up func(popID uint16) bool) []POP {
	type ranked struct {
		pop POP
		km  float64
	}
	var all []ranked
	for _, r := range c.Regions {
		for _, p := range r.POPs {
			if up != nil && !up(p.ID) {
				continue
			}
			all = append(all, ranked{p, DistanceKm(client, p.Location)})
		}
	}
	slices.SortFunc(all, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(a.km, b.km), cmp.Compare(a.pop.ID, b.pop.ID))
	})
	if n > 0 && len(all) > n {
		all = all[:n]
	}
	if len(all) == 0 {
		return nil
	}
	out := make([]POP, len(all))
	for i, a := range all {
		out[i] = a.pop
	}
	return out
}
