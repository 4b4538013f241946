package globalrelay

import (
	"context"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// FollowClusters rebuilds clusters from the global pool on every membership
// change until ctx ends. Alive cluster relays get flows unless draining;
// suspect or dead ones get none, so their flows move to another replica of
// the same cluster at the next packet (cluster relays hold no flow state).
func FollowClusters(ctx context.Context, pool *membership.Pool, clusters *Clusters) {
	pool.Watch(ctx, func(members []membership.Member) {
		var rs []Replica
		for _, m := range members {
			if m.State != membership.StateAlive || m.Meta.Role != membership.RoleClusterRelay || !m.Meta.Data.IsValid() || m.Meta.Cluster == 0 {
				continue
			}
			rs = append(rs, Replica{Cluster: m.Meta.Cluster, Addr: m.Meta.Data, Draining: m.Meta.Draining})
		}
		clusters.Set(rs)
	})
}
