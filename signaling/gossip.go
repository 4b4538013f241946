package signaling

import (
	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/membership"
)

// GossipHealth derives cluster and POP health from the global pool.
//
// Once the pool knows any member besides signaling itself, gossip is
// authoritative: a cluster with no alive, non-draining cluster relay is
// unhealthy, and a POP with no alive global relay is down. Before that (a
// pool still joining, or none) everything counts as up, so a catalogue works
// without gossip.
//
// With Check set (metacheck.New over the catalogue), members whose
// metadata it refuses are ignored, as if absent; a pool built with the same
// check as its Config.CheckMeta already leaves them out.
type GossipHealth struct {
	Pool  *membership.Pool
	Check func(membership.Meta) error
}

// Authoritative reports whether gossip currently decides health (it knows
// at least one relay). Exported as rtcedge_signaling_gossip_authoritative:
// a replica cut off from the pool falls back to "everything healthy" once
// the dead relays are forgotten, and on-call should see that.
func (g GossipHealth) Authoritative() bool {
	_, ok := g.members()
	return ok
}

func (g GossipHealth) members() ([]membership.Member, bool) {
	ms := g.vetted()
	for _, m := range ms {
		if m.Meta.Role == membership.RoleClusterRelay || m.Meta.Role == membership.RoleGlobalRelay {
			return ms, true
		}
	}
	return nil, false
}

// Cluster implements geo.HealthFunc: the aggregate of the cluster's alive
// relays (each publishes the same aggregate; the highest capacity wins, so
// a replica that has not caught up yet cannot make a cluster look full).
func (g GossipHealth) Cluster(id uint16) (geo.ClusterState, bool) {
	ms, ok := g.members()
	if !ok {
		return geo.ClusterState{}, false
	}
	var st geo.ClusterState
	for _, m := range ms {
		if m.State != membership.StateAlive || m.Meta.Role != membership.RoleClusterRelay || m.Meta.Cluster != id || m.Meta.Draining {
			continue
		}
		st.Healthy = true
		if m.Meta.Capacity >= st.Capacity {
			st.Capacity, st.Load = m.Meta.Capacity, m.Meta.Load
		}
	}
	if st.Healthy && st.Capacity == 0 {
		// No ready pod behind the relays: nothing can take a call.
		st.Healthy = false
	}
	return st, true
}

// POPUp reports whether a POP has an alive global relay.
func (g GossipHealth) POPUp(pop uint16) bool {
	ms, ok := g.members()
	if !ok {
		return true
	}
	for _, m := range ms {
		if m.State == membership.StateAlive && m.Meta.Role == membership.RoleGlobalRelay && m.Meta.POP == pop && !m.Meta.Draining {
			return true
		}
	}
	return false
}

// SessionAPIs lists the session API fronts of a cluster's alive,
// non-draining cluster relays.
func (g GossipHealth) SessionAPIs(cluster uint16) []string {
	var out []string
	for _, m := range g.vetted() {
		if m.State == membership.StateAlive && m.Meta.Role == membership.RoleClusterRelay &&
			m.Meta.Cluster == cluster && !m.Meta.Draining && m.Meta.API != "" {
			out = append(out, m.Meta.API)
		}
	}
	return out
}

// vetted returns the pool's members that pass Check.
func (g GossipHealth) vetted() []membership.Member {
	ms := g.Pool.Members()
	if g.Check == nil {
		return ms
	}
	out := ms[:0]
	for _, m := range ms {
		if g.Check(m.Meta) == nil {
			out = append(out, m)
		}
	}
	return out
}

// FanOut sends msg to every other alive signaling member of the pool,
// best effort.
func (g GossipHealth) FanOut(msg []byte) {
	self := g.Pool.Name()
	for _, m := range g.vetted() {
		if m.State == membership.StateAlive && m.Meta.Role == membership.RoleSignaling && m.Name != self {
			_ = g.Pool.Send(m.Name, msg)
		}
	}
}
