package globalrelay

// Evidence shared by every flow of this replica: the suspects (cluster
// relays every flow avoids, on votes of several sessions confirmed by the
// relay's silence, see vote), when each relay last delivered to any flow
// (heard), and how long each cluster's pods take to answer (clusterAnswers),
// which judges a flow with no round trip of its own. failover.go reads and
// feeds them; relayprobe.go asks a suspected relay itself.

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// suspects are the cluster relays every flow avoids, each until a deadline.
// Readers on the packet path load gen only; the map is read when a flow
// re-picks, which is rare.
type suspects struct {
	gen  atomic.Uint64
	snap atomic.Pointer[map[netip.AddrPort]int64] // immutable; replaced under mu
	mu   sync.Mutex
	// votes count the flows that left a relay on evidence judged by their
	// cluster's round trips (weaker than their own), guarded by mu.
	votes map[netip.AddrPort]vote
	// heard is when each cluster relay last delivered a verified datagram
	// to any flow of this replica (coarse unix nanos).
	heard atomicMap[netip.AddrPort]
}

// atomicMap holds an atomic value per key, read and updated without a
// lock: the map itself is immutable, replaced whole (under mu) only when
// a key is added, and its values are updated in place.
type atomicMap[K comparable] struct {
	mu sync.Mutex // serialises adding a key
	m  atomic.Pointer[map[K]*atomic.Int64]
}

// get returns k's value, nil when k has none yet.
func (a *atomicMap[K]) get(k K) *atomic.Int64 {
	if m := a.m.Load(); m != nil {
		return (*m)[k]
	}
	return nil
}

// add returns k's value, adding a zero one if k has none. The other keys
// whose values keep reports false for are dropped with the copy.
func (a *atomicMap[K]) add(k K, keep func(v int64) bool) *atomic.Int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.m.Load()
	if old != nil && (*old)[k] != nil {
		return (*old)[k] // another worker added it meanwhile
	}
	next := map[K]*atomic.Int64{}
	if old != nil {
		for key, x := range *old {
			if keep(x.Load()) {
				next[key] = x
			}
		}
	}
	v := new(atomic.Int64)
	next[k] = v
	a.m.Store(&next)
	return v
}

// vote is which sessions' flows left a relay since first.
type vote struct {
	toks   [votesNeeded]tokenKey
	n      int
	first  int64
	latest int64 // the latest start of the voters' evidence (an unanswered check forwarded, a relay first used)
}

// Evidence against one relay from flows of votesNeeded sessions (tokens)
// within voteWindow makes it suspect for every flow — confirmed by the
// relay's silence toward this replica: it must have delivered nothing to
// any flow since the latest voter's evidence began. A caller can leave its
// own checks unanswered at will, with as many sessions as it likes, but it
// cannot stop a live relay's datagrams to other calls; a dead relay sends
// nothing to anyone, so real failover is judged as fast as before. Where
// the voters' flows are the relay's only traffic that silence proves
// nothing, so a vote that stands only sends the relay a probe
// (relayprobe.go); its answer, or its absence, decides.
const (
	votesNeeded = 3
	voteWindow  = 2 * time.Second
	// heardKeep is how long a relay that no longer sends is remembered in
	// heard: a relay that left the directory is dropped after it.
	heardKeep = time.Hour
)

// vote records that a flow of session tok left addr at now on evidence
// that began at since, and reports whether flows of enough sessions have,
// recently enough, with addr silent toward every flow since the latest of
// their evidence began. refused reports a vote of enough sessions that the
// relay's traffic to other flows contradicts.
func (s *suspects) vote(addr netip.AddrPort, tok tokenKey, since, now int64) (suspect, refused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.votes == nil {
		s.votes = map[netip.AddrPort]vote{}
	}
	for a, v := range s.votes { // few entries: relays that just failed
		if now-v.first > int64(voteWindow) {
			delete(s.votes, a)
		}
	}
	v := s.votes[addr]
	if v.n == 0 {
		v.first = now
	}
	if slices.Contains(v.toks[:v.n], tok) {
		return false, false // the same session again
	}
	if v.n < votesNeeded {
		v.toks[v.n] = tok
		v.n++
	}
	v.latest = max(v.latest, since)
	s.votes[addr] = v
	if v.n < votesNeeded {
		return false, false
	}
	if s.lastHeard(addr) >= v.latest {
		return false, true // the relay answers others: not its fault
	}
	delete(s.votes, addr)
	return true, false
}

// lastHeard returns when relay last delivered to a flow, 0 never.
func (s *suspects) lastHeard(relay netip.AddrPort) int64 {
	if v := s.heard.get(relay); v != nil {
		return v.Load()
	}
	return 0
}

// hear records a verified datagram from relay at now (coarse): on the
// return path, one map lookup and, once per clock tick, a store.
func (s *suspects) hear(relay netip.AddrPort, now int64) {
	v := s.heard.get(relay)
	if v == nil {
		v = s.heard.add(relay, func(last int64) bool { return now-last < int64(heardKeep) })
	}
	if v.Load() != now {
		v.Store(now) // a time, not a read-modify-write: the latest writer is as good as any
	}
}

func (s *suspects) until(addr netip.AddrPort) int64 {
	if m := s.snap.Load(); m != nil {
		return (*m)[addr]
	}
	return 0
}

// set adds (until > 0) or removes (until == 0) addr, dropping expired
// entries; it reports whether anything changed.
func (s *suspects) set(addr netip.AddrPort, until, now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.snap.Load()
	next := map[netip.AddrPort]int64{}
	if old != nil {
		for a, u := range *old {
			if u > now && a != addr {
				next[a] = u
			}
		}
	}
	if until > 0 {
		next[addr] = until
	}
	if old != nil && len(*old) == len(next) && (*old)[addr] == next[addr] {
		return false
	}
	s.snap.Store(&next)
	s.gen.Add(1)
	return true
}

// count returns how many relays are avoided at now.
func (s *suspects) count(now int64) int {
	n := 0
	if m := s.snap.Load(); m != nil {
		for _, u := range *m {
			if u > now {
				n++
			}
		}
	}
	return n
}

// clusterAnswers is, per cluster, how long its pods take to answer a
// flow through a live relay (smoothed; coarse unix nanos): the first reply
// of each flow after it started sending, and each check's reply. A flow
// with no round trip of its own yet (a new call, or every flow a restarted
// replica restored) is judged by its cluster's instead of a blind second.
type clusterAnswers struct {
	m atomicMap[uint16] // updated in place by the return path (observe)
}

// get returns cluster's answer time, 0 when none was measured.
func (c *clusterAnswers) get(cluster uint16) int64 {
	if v := c.m.get(cluster); v != nil {
		return v.Load()
	}
	return 0
}

// observe folds one answer time into cluster's (weight 1/4).
func (c *clusterAnswers) observe(cluster uint16, rtt int64) {
	v := c.m.get(cluster)
	if v == nil {
		v = c.m.add(cluster, func(int64) bool { return true })
	}
	foldRTT(v, max(rtt, 1)) // every flow's workers fold into one entry: compare-and-swap
}
