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
// stable. POPs are chosen with ChoosePOPs(client, 2, nil). Choose ignores
// the catalogue's steering overrides; ChooseFor applies them.
func (c *Catalogue) Choose(client Point, health HealthFunc) Choice {
	return c.choose(client, nil, health)
}

// ChooseFor is Choose for a located client with the catalogue's steering
// overrides applied: when Steering names regions for the client's country
// (or, failing that, its continent), clusters and POPs of those regions
// come first, in the listed order, each region's nearest first; everything
// else follows by distance. Health and capacity still apply: an override
// never sends a call to an unusable cluster. Without a country or an
// override the result is Choose's.
func (c *Catalogue) ChooseFor(loc Location, health HealthFunc) Choice {
	return c.choose(loc.Point, c.Steering.Preferred(loc.Country), health)
}

func (c *Catalogue) choose(client Point, prefs []string, health HealthFunc) Choice {
	var out Choice
	rank := map[string]int{} // region -> preference rank
	for _, r := range c.Regions {
		rank[r.Name] = preference(prefs, r.Name)
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
		return cmp.Or(cmp.Compare(rank[a.Region], rank[b.Region]),
			cmp.Compare(a.DistanceKm, b.DistanceKm), cmp.Compare(a.Cluster.ID, b.Cluster.ID))
	})
	out.POPs = c.choosePOPs(client, prefs, choosePOPCount, nil)
	return out
}

// preference is a region's rank under prefs: its index, or len(prefs) for
// a region not listed (they all rank after the listed ones, by distance).
func preference(prefs []string, region string) int {
	if i := slices.Index(prefs, region); i >= 0 {
		return i
	}
	return len(prefs)
}

// ChoosePOPs returns up to n POPs nearest to the client, nearest first, ties
// broken by the lower POP ID. POPs for which up returns false are skipped; a
// nil up means all POPs are up. n <= 0 returns every POP that is up.
// ChoosePOPs ignores the steering overrides; ChoosePOPsFor applies them.
func (c *Catalogue) ChoosePOPs(client Point, n int, up func(popID uint16) bool) []POP {
	return c.choosePOPs(client, nil, n, up)
}

// ChoosePOPsFor is ChoosePOPs for a located client with the steering
// overrides applied as in ChooseFor: POPs of the preferred regions first.
func (c *Catalogue) ChoosePOPsFor(loc Location, n int, up func(popID uint16) bool) []POP {
	return c.choosePOPs(loc.Point, c.Steering.Preferred(loc.Country), n, up)
}

func (c *Catalogue) choosePOPs(client Point, prefs []string, n int, up func(popID uint16) bool) []POP {
	type ranked struct {
		pop  POP
		pref int
		km   float64
	}
	var all []ranked
	for _, r := range c.Regions {
		pref := preference(prefs, r.Name)
		for _, p := range r.POPs {
			if up != nil && !up(p.ID) {
				continue
			}
			all = append(all, ranked{p, pref, DistanceKm(client, p.Location)})
		}
	}
	slices.SortFunc(all, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(a.pref, b.pref), cmp.Compare(a.km, b.km), cmp.Compare(a.pop.ID, b.pop.ID))
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
