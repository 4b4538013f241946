package globalrelay

import (
	"hash/maphash"
	"net/netip"
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
	gen    uint64
	usable map[uint16][]netip.AddrPort
	known  map[netip.AddrPort]uint16
}

var hashSeed = maphash.MakeSeed()

// NewClusters returns a directory holding replicas.
func NewClusters(replicas []Replica) *Clusters {
	c := &Clusters{}
	c.Set(replicas)
	return c
}

// Set replaces the directory's content.
func (c *Clusters) Set(replicas []Replica) {
	s := &clusterSnapshot{gen: c.gen.Add(1), usable: map[uint16][]netip.AddrPort{}, known: map[netip.AddrPort]uint16{}}
	for _, r := range replicas {
		s.known[r.Addr] = r.Cluster
		if !r.Draining {
			s.usable[r.Cluster] = append(s.usable[r.Cluster], r.Addr)
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
