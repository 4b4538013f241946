package globalrelay

// The cluster directory: which cluster relays exist, of which cluster,
// and which of them get flows. Clusters is rebuilt whole from the global
// gossip pool by FollowClusters (or set by a test) and read lock-free on
// the packet path; RelayFor picks a flow's relay by rendezvous hashing so
// that a replica leaving moves only its own clients. Whether a relay still
// answers is not the directory's business: failover.go watches each
// flow's relay and asks the directory to skip the ones it avoids.

import (
	"context"
	"hash/maphash"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// ClusterDirectory answers the global relay's questions about cluster
// relays. Lookups are on the packet path: cheap and allocation-free.
type ClusterDirectory interface {
	// RelayFor picks a healthy, non-draining cluster relay replica of the
	// cluster for a client. The choice is stable for a client while the set
	// of replicas is unchanged, and when a replica leaves only its clients
	// move (rendezvous hashing).
	RelayFor(cluster uint16, client netip.AddrPort) (netip.AddrPort, bool)
	// ClusterOf reports whether addr is a known cluster relay (alive,
	// draining or not) and of which cluster. Only such a sender may restore
	// a flow from a to-client header.
	ClusterOf(addr netip.AddrPort) (uint16, bool)
	// Generation changes whenever the directory's content changes, so a
	// flow can cache its relay and re-pick only after a change.
	Generation() uint64
}

// Replica is one cluster relay as the directory knows it.
type Replica struct {
	Cluster  uint16
	Addr     netip.AddrPort
	Draining bool // known, still trusted for return traffic, but gets no flows
}

// Clusters is a ClusterDirectory replaced whole with Set by a membership
// watcher or a test.
type Clusters struct {
	// Replaced whole by Set (under mu), read lock-free on the packet path.
	snap atomic.Pointer[clusterSnapshot]
	gen  atomic.Uint64

	mu       sync.Mutex                        // serialises Set and follow
	watchers []func(map[netip.AddrPort]uint16) // guarded by mu
}

type clusterSnapshot struct {
	gen      uint64
	replicas []Replica // sorted; what Set was given, to detect no-op updates
	usable   map[uint16][]netip.AddrPort
	known    map[netip.AddrPort]uint16
}

var hashSeed = maphash.MakeSeed()

// NewClusters returns a directory holding replicas.
func NewClusters(replicas []Replica) *Clusters {
	c := &Clusters{}
	c.Set(replicas)
	return c
}

// Set replaces the directory's content. Setting the same content again
// (gossip reports every load change) keeps the generation, so flows do not
// re-pick their relay for nothing. When every replica of a cluster is
// draining, the draining ones stay usable: they still forward, and a
// rollout without surge must not strand the cluster's calls.
func (c *Clusters) Set(replicas []Replica) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sorted := slices.Clone(replicas)
	slices.SortFunc(sorted, func(a, b Replica) int {
		if a.Cluster != b.Cluster {
			return int(a.Cluster) - int(b.Cluster)
		}
		if d := a.Addr.Compare(b.Addr); d != 0 {
			return d
		}
		switch {
		case a.Draining == b.Draining:
			return 0
		case a.Draining:
			return 1
		}
		return -1
	})
	if old := c.snap.Load(); old != nil && slices.Equal(old.replicas, sorted) {
		return
	}
	s := &clusterSnapshot{gen: c.gen.Add(1), replicas: sorted, usable: map[uint16][]netip.AddrPort{}, known: map[netip.AddrPort]uint16{}}
	draining := map[uint16][]netip.AddrPort{}
	for _, r := range sorted {
		s.known[r.Addr] = r.Cluster
		if r.Draining {
			draining[r.Cluster] = append(draining[r.Cluster], r.Addr)
		} else {
			s.usable[r.Cluster] = append(s.usable[r.Cluster], r.Addr)
		}
	}
	for cl, rs := range draining {
		if len(s.usable[cl]) == 0 {
			s.usable[cl] = rs
		}
	}
	c.snap.Store(s)
	for _, f := range c.watchers {
		f(s.known)
	}
}

// follow calls f with every cluster relay known (address → cluster) now
// and after every change (the fast path's copy in the kernel). f must
// not keep or change the map.
func (c *Clusters) follow(f func(map[netip.AddrPort]uint16)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchers = append(c.watchers, f)
	f(c.snap.Load().known)
}

// Generation implements ClusterDirectory.
func (c *Clusters) Generation() uint64 { return c.snap.Load().gen }

// RelayFor implements ClusterDirectory with rendezvous hashing over the
// cluster's usable replicas.
func (c *Clusters) RelayFor(cluster uint16, client netip.AddrPort) (netip.AddrPort, bool) {
	rs := c.snap.Load().usable[cluster]
	switch len(rs) {
	case 0:
		return netip.AddrPort{}, false
	case 1:
		return rs[0], true
	}
	var best netip.AddrPort
	var bestScore uint64
	for _, r := range rs {
		if s := score(client, r); s >= bestScore {
			best, bestScore = r, s
		}
	}
	return best, true
}

func score(client, relay netip.AddrPort) uint64 {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	a, b := client.Addr().As16(), relay.Addr().As16()
	_, _ = h.Write(a[:])
	_, _ = h.Write(b[:])
	var p [4]byte
	p[0], p[1] = byte(client.Port()>>8), byte(client.Port())
	p[2], p[3] = byte(relay.Port()>>8), byte(relay.Port())
	_, _ = h.Write(p[:])
	return h.Sum64()
}

// Len returns the number of known replicas.
func (c *Clusters) Len() int { return len(c.snap.Load().known) }

// ClusterOf implements ClusterDirectory.
func (c *Clusters) ClusterOf(addr netip.AddrPort) (uint16, bool) {
	id, ok := c.snap.Load().known[addr]
	return id, ok
}

// live counts the non-draining replicas of cluster (0: of any cluster).
func (c *Clusters) live(cluster uint16) int {
	s := c.snap.Load()
	if s == nil {
		return 0
	}
	k := 0
	for _, r := range s.replicas {
		if !r.Draining && (cluster == 0 || r.Cluster == cluster) {
			k++
		}
	}
	return k
}

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

// avoidingDirectory is implemented by directories that can skip relays
// and tell whether a relay is still usable (Clusters does); with another
// directory, flows only follow gossip.
type avoidingDirectory interface {
	relayForAvoiding(cluster uint16, client netip.AddrPort, avoid func(netip.AddrPort) bool) (addr netip.AddrPort, ok, exhausted bool)
	Usable(cluster uint16, relay netip.AddrPort) bool
}

// RelayForAvoiding is RelayFor over the cluster's usable replicas for
// which avoid is false; when avoid rules out all of them, it is RelayFor.
func (c *Clusters) RelayForAvoiding(cluster uint16, client netip.AddrPort, avoid func(netip.AddrPort) bool) (netip.AddrPort, bool) {
	addr, ok, _ := c.relayForAvoiding(cluster, client, avoid)
	return addr, ok
}

// relayForAvoiding is RelayForAvoiding, also reporting whether avoid
// ruled out every usable replica.
func (c *Clusters) relayForAvoiding(cluster uint16, client netip.AddrPort, avoid func(netip.AddrPort) bool) (netip.AddrPort, bool, bool) {
	var best netip.AddrPort
	var bestScore uint64
	found := false
	for _, r := range c.snap.Load().usable[cluster] {
		if avoid(r) {
			continue
		}
		if s := score(client, r); !found || s >= bestScore {
			best, bestScore, found = r, s, true
		}
	}
	if found {
		return best, true, false
	}
	addr, ok := c.RelayFor(cluster, client)
	return addr, ok, true
}

// Usable reports whether relay is one of the cluster's replicas that get
// flows (alive and not draining, or draining when all of them are).
func (c *Clusters) Usable(cluster uint16, relay netip.AddrPort) bool {
	return slices.Contains(c.snap.Load().usable[cluster], relay)
}
