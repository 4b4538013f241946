package globalrelay

import (
	"hash/maphash"
	"net/netip"
	"slices"
	"sync/atomic"
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
	snap atomic.Pointer[clusterSnapshot]
	gen  atomic.Uint64
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
