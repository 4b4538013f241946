package transceiver

// The pod's part in the cluster's gossip: it publishes its load and
// state, and follows the relays it may send through.

import (
	"context"
	"net/netip"
	"time"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// publishInterval bounds how stale the load a pod gossips can be; changes of
// the draining flag are published at once.
const publishInterval = time.Second

// Publish keeps the pod's node metadata in the cluster pool current (load,
// capacity, draining) until ctx ends. The pool's static fields (role,
// cluster, pod, data and API addresses) are set by whoever created it.
func (t *Transceiver) Publish(ctx context.Context, pool *membership.Pool) {
	tick := time.NewTicker(publishInterval)
	defer tick.Stop()
	var last membership.Meta
	first := true
	for {
		cur := pool.LocalMeta()
		cur.Load, cur.Capacity, cur.Draining = t.Sessions(), t.cfg.MaxSessions, t.Draining()
		if first || cur.Load != last.Load || cur.Capacity != last.Capacity || cur.Draining != last.Draining {
			err := pool.UpdateMeta(func(m *membership.Meta) {
				m.Load, m.Capacity, m.Draining = cur.Load, cur.Capacity, cur.Draining
			})
			if err != nil {
				t.log.Debug("publish pod state", "err", err)
			}
			last, first = cur, false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.stateChanged:
		case <-tick.C:
		}
	}
}

// notifyState wakes Publish after a change that others must learn quickly.
func (t *Transceiver) notifyState() {
	select {
	case t.stateChanged <- struct{}{}:
	default:
	}
}

// FollowRelays keeps relays in step with the alive cluster relays of the
// pod's cluster in its cluster pool, until ctx ends.
func FollowRelays(ctx context.Context, pool *membership.Pool, cluster uint16, relays *RelaySet) {
	pool.Watch(ctx, func(members []membership.Member) {
		var addrs []netip.AddrPort
		for _, m := range members {
			if m.State == membership.StateAlive && m.Meta.Role == membership.RoleClusterRelay && m.Meta.Cluster == cluster && m.Meta.Data.IsValid() {
				addrs = append(addrs, m.Meta.Data)
			}
		}
		relays.Set(addrs)
	})
}
