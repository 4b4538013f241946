package globalrelay

// Pending TCP connections: those that have not yet sent a valid first
// check, bounded per client network so that one network cannot hold the
// ingress's slots.

import "net/netip"

// pendingSet holds the TCP connections that have not yet sent a valid
// first frame, grouped by the client's wider prefix (pendingKey). When it
// is full, a newcomer from a group holding fewer than the largest group
// takes the slot of that group's oldest connection; a newcomer from a
// largest group is refused. So one party holding many addresses (a /57 of
// IPv6 is 128 /64s of 32 connections each: the whole default MaxPending)
// keeps at most an equal share once others want slots, and a caller's
// handshake, one round trip, is not refused because a prefix it does not
// belong to is slow on purpose. Guarded by TCP.mu.
type pendingSet struct {
	groups  map[netip.Prefix]*pendingGroup
	buckets []map[*pendingGroup]struct{} // buckets[n]: the groups of n connections (n ≥ 1)
	top     int                          // the largest n with a non-empty bucket
	n       int                          // connections in the set
}

type pendingGroup struct {
	key   netip.Prefix
	conns []*tcpConn // oldest first
}

// pendingKey is what pending admission groups by: a client's IPv4 /24 or
// IPv6 /48, the blocks one party is routinely given (wider than addrKey,
// which counts one host's connections).
func pendingKey(a netip.Addr) netip.Prefix {
	bits := 24
	if a.Is6() {
		bits = 48
	}
	p, _ := a.Prefix(bits)
	return p
}

func newPendingSet() pendingSet {
	return pendingSet{groups: map[netip.Prefix]*pendingGroup{}, buckets: []map[*pendingGroup]struct{}{nil}}
}

// move files g, which had from connections, under its count now.
func (p *pendingSet) move(g *pendingGroup, from int) {
	if from > 0 {
		delete(p.buckets[from], g)
	}
	to := len(g.conns)
	if to == 0 {
		delete(p.groups, g.key)
	} else {
		for len(p.buckets) <= to {
			p.buckets = append(p.buckets, map[*pendingGroup]struct{}{})
		}
		p.buckets[to][g] = struct{}{}
	}
	if to > p.top {
		p.top = to
	}
	for p.top > 0 && len(p.buckets[p.top]) == 0 {
		p.top--
	}
}

// add puts c, a connection from client, in the set.
func (p *pendingSet) add(c *tcpConn, client netip.Addr) {
	k := pendingKey(client)
	g := p.groups[k]
	if g == nil {
		g = &pendingGroup{key: k}
		p.groups[k] = g
	}
	g.conns = append(g.conns, c)
	p.n++
	p.move(g, len(g.conns)-1)
}

// remove takes c out of the set; it reports whether c was there.
func (p *pendingSet) remove(c *tcpConn) bool {
	g := p.groups[pendingKey(c.client.Addr())]
	if g == nil {
		return false
	}
	for i, x := range g.conns {
		if x == c {
			g.conns = append(g.conns[:i], g.conns[i+1:]...)
			p.n--
			p.move(g, len(g.conns)+1)
			return true
		}
	}
	return false
}

// evictFor picks the connection whose slot a newcomer from client takes
// when the set is full — the oldest of a largest group — and takes it out
// of the set; nil when client's own group is one of the largest.
func (p *pendingSet) evictFor(client netip.Addr) *tcpConn {
	own := 0
	if g := p.groups[pendingKey(client)]; g != nil {
		own = len(g.conns)
	}
	if own >= p.top {
		return nil
	}
	for g := range p.buckets[p.top] {
		c := g.conns[0]
		p.remove(c)
		return c
	}
	return nil
}
