package clusterrelay

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// PodInfo is one transceiver pod as the cluster pool describes it.
type PodInfo struct {
	ID       uint16
	Data     netip.AddrPort // pod socket: where the relay forwards
	API      string         // session API base URL
	Load     int            // sessions
	Capacity int
	Draining bool
}

// Ready reports whether the pod takes new sessions.
func (p PodInfo) Ready() bool {
	return !p.Draining && p.API != "" && (p.Capacity == 0 || p.Load < p.Capacity)
}

// Directory is the cluster relay's view of its pods: the packet path reads
// its Pods (every live pod, draining ones included, since their calls go on);
// the session API front and the load publisher read PodInfos.
type Directory struct {
	*Pods // the addresses, for the packet path
	// infos is replaced whole by FollowPods (its one writer) and read by
	// the front and the aggregate publisher; the slice is immutable.
	infos atomic.Pointer[[]PodInfo]
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	d := &Directory{Pods: NewPods(nil)}
	d.infos.Store(&[]PodInfo{})
	return d
}

// SetPods replaces the directory's content.
func (d *Directory) SetPods(infos []PodInfo) {
	m := make(map[uint16]netip.AddrPort, len(infos))
	for _, p := range infos {
		m[p.ID] = p.Data
	}
	cp := slices.Clone(infos)
	d.infos.Store(&cp)
	d.Pods.Set(m)
}

// PodInfos returns the pods (do not modify the slice).
func (d *Directory) PodInfos() []PodInfo { return *d.infos.Load() }

// Aggregate sums the load and capacity of the pods taking new sessions, and
// counts them. Full and draining pods are left out of both sums: a full pod
// beside an idle one must not make the cluster look full.
func (d *Directory) Aggregate() (load, capacity, ready int) {
	for _, p := range d.PodInfos() {
		if p.Ready() {
			load += p.Load
			capacity += p.Capacity
			ready++
		}
	}
	return load, capacity, ready
}

// FollowPods rebuilds dir from the cluster pool on every membership change
// until ctx ends: alive transceivers of the cluster, draining or not. A pod
// ID claimed by more than one member goes to the member that held it
// before, or to none (podInfos); log hears of every such claim.
func FollowPods(ctx context.Context, pool *membership.Pool, cluster uint16, dir *Directory, log *slog.Logger) {
	holders := map[uint16]string{}
	pool.Watch(ctx, func(members []membership.Member) {
		infos, refused := podInfos(members, cluster, holders)
		for _, m := range refused {
			log.Warn("pod ID claimed by more than one member; refusing the newcomer", "pod", m.Meta.Pod, "member", m.Name, "data", m.Meta.Data, "holder", holders[m.Meta.Pod])
		}
		dir.SetPods(infos)
	})
}

// podInfos is the directory of members, sorted by pod ID, and the members
// refused. Every member of the pool holds its key, a compromised pod too,
// and a second member claiming a live pod's ID would otherwise take that
// pod's calls (the last claim won): an ID claimed twice stays with its
// holder (holders, updated here: the member that had the ID when it was
// last unique), and goes to nobody when its holder is not among the
// claimants, until one claim is left.
func podInfos(members []membership.Member, cluster uint16, holders map[uint16]string) (infos []PodInfo, refused []membership.Member) {
	claims := map[uint16][]membership.Member{}
	for _, m := range members {
		if m.State != membership.StateAlive || m.Meta.Role != membership.RoleTransceiver || m.Meta.Cluster != cluster || !m.Meta.Data.IsValid() {
			continue
		}
		claims[m.Meta.Pod] = append(claims[m.Meta.Pod], m)
	}
	for id := range holders {
		if _, ok := claims[id]; !ok {
			delete(holders, id) // the pod is gone: its ID is free
		}
	}
	for id, cs := range claims {
		pick := -1
		if len(cs) == 1 {
			pick = 0
		} else {
			for i, m := range cs {
				if m.Name == holders[id] {
					pick = i
				}
			}
		}
		for i, m := range cs {
			if i != pick {
				refused = append(refused, m)
				continue
			}
			holders[id] = m.Name
			infos = append(infos, PodInfo{ID: id, Data: m.Meta.Data, API: m.Meta.API,
				Load: m.Meta.Load, Capacity: m.Meta.Capacity, Draining: m.Meta.Draining})
		}
		if pick < 0 {
			delete(holders, id)
		}
	}
	slices.SortFunc(infos, func(a, b PodInfo) int { return int(a.ID) - int(b.ID) })
	slices.SortFunc(refused, func(a, b membership.Member) int { return strings.Compare(a.Name, b.Name) })
	return infos, refused
}

// RepublishInterval is how often PublishAggregate announces an unchanged
// aggregate again.
const RepublishInterval = 10 * time.Second

// PublishAggregate keeps this replica's metadata in the global pool current
// with the cluster's aggregate load and capacity, so that global relays
// and signaling can skip a full or empty cluster. The replica also reports
// itself draining while it knows no ready pod — a relay that has just
// started and not yet heard from its cluster pool must not be handed flows
// it cannot deliver — and once stopping reports true.
func PublishAggregate(ctx context.Context, global *membership.Pool, dir *Directory, stopping func() bool) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	first := true
	var last membership.Meta
	var published time.Time
	for {
		load, capacity, ready := dir.Aggregate()
		draining := ready == 0 || (stopping != nil && stopping())
		// Unchanged state is announced again every RepublishInterval: a
		// broadcast lost under load would otherwise wait for the global
		// pool's push-pull (60 s with WAN timings), and global relays would
		// meanwhile not use this replica.
		if first || load != last.Load || capacity != last.Capacity || draining != last.Draining || time.Since(published) >= RepublishInterval {
			_ = global.UpdateMeta(func(m *membership.Meta) { m.Load, m.Capacity, m.Draining = load, capacity, draining })
			last.Load, last.Capacity, last.Draining, first = load, capacity, draining, false
			published = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
