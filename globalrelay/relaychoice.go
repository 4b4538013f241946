package globalrelay

// Relay choice: which cluster relay of a flow's cluster carries it. The
// directory (Clusters, rebuilt from the global pool by FollowClusters)
// picks by rendezvous hashing; the data-plane failure detection below
// moves a flow off a relay that stops answering before gossip notices.

import (
	"context"
	"hash/maphash"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	snap atomic.Pointer[clusterSnapshot]
	gen  atomic.Uint64

	mu       sync.Mutex // serialises Set and follow
	watchers []func(map[netip.AddrPort]uint16)
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

// Data-plane failure detection. Gossip is the source of membership, but the
// global pool runs memberlist's WAN timings in production (5 s probes, a
// suspicion timeout of tens of seconds), far too slow for a call whose
// cluster relay died. The relay sees the failure sooner in its own
// traffic: the client keeps sending and nothing comes back. Two kinds of
// evidence, each acted on at once and without asking anyone:
//
//   - silence: a flow whose replies had been arriving (a few intervals
//     measured) gets none for SilenceAfter, or three times its usual
//     interval between replies if that is longer (a model that is not
//     talking sends only RTCP, about once a second), capped at maxSilence. The flow alone moves to the
//     next cluster relay of its cluster (rendezvous order) and avoids the
//     silent one for AvoidFor. Moving a flow is harmless when the guess is
//     wrong: cluster relays hold no flow state and the pod follows the
//     relay its datagrams come from.
//   - an unanswered check: a STUN Binding Request forwarded through a relay
//     got no reply at all within CheckTimeout (or four times the flow's
//     check round trip, if longer). A live transceiver answers every check,
//     so this is evidence against the relay itself: once flows of several
//     sessions found so, the relay has delivered to no flow since, and it
//     leaves a probe of ours unanswered (relayprobe.go), every flow avoids
//     it for AvoidFor (new calls included), unless every relay of its
//     cluster is avoided (suspects.vote). The same holds for a flow that has sent through a relay
//     for a second and never had any reply (a flow restored after a
//     restart sends media at once): a replica that restarted while a
//     cluster relay was dying, and gossip still lists it, learns so from
//     its first flows instead of from each one in turn.
//
// Any datagram from a relay clears the suspicion against it. Avoidance is
// bounded in time; by then gossip has declared a dead member dead.

// Defaults of the failure detection settings in Config.
const (
	// DefaultSilenceAfter is 12 lost audio packets in a row: with the
	// 50 ms clock, the gap a dead cluster relay costs stays under 300 ms
	// (TestClusterRelayFailover: 256–300 ms, median 270; at 300 ms the
	// median was 307). A wrong guess only moves the flow to another
	// stateless relay of its cluster.
	DefaultSilenceAfter = 250 * time.Millisecond
	DefaultCheckTimeout = 400 * time.Millisecond
	DefaultAvoidFor     = 30 * time.Second
	// maxSilence caps the adaptive silence limit.
	maxSilence = 3 * time.Second
	// maxStrikes caps the back-off of a flow that gets no reply through
	// any relay (its pod is gone): limits double each time the flow has
	// found every relay of its cluster silent, up to 16×.
	maxStrikes = 4
	// maxAvoid bounds the relays one flow avoids on its own evidence.
	maxAvoid = 4
	// minReplies is how many intervals between replies (in clock ticks)
	// a flow must have seen before silence is judged.
	minReplies = 4
	// firstCheckTimeout is the check timeout of a flow with no measured
	// check round trip yet: the cluster may be on another continent.
	firstCheckTimeout = time.Second
	// clockTick is the resolution of the relay's coarse clock, and so of
	// the failure detection.
	clockTick = 50 * time.Millisecond
)

// Re-pick reasons (the label of rtcedge_globalrelay_relay_repicks_total).
const (
	RepickSilence = "silence"
	RepickCheck   = "check"
	RepickAvoided = "avoided" // another flow's evidence
	// RepickUnanswered: a second of client datagrams through the relay and
	// never a reply (a flow restored after a restart whose relay died).
	RepickUnanswered = "unanswered"
)

// relayWatch is what a flow knows about its cluster relay's liveness. All
// times are coarse unix nanos; zero means never.
type relayWatch struct {
	since     atomic.Int64                // when the flow started using its current relay
	lastReply atomic.Int64                // last datagram toward the client
	replyGap  atomic.Int64                // smoothed interval between replies (longer ones weigh 1/2, shorter 1/4)
	checkAt   atomic.Int64                // forwarding time of the oldest check not yet followed by a reply
	checkRTT  atomic.Int64                // smoothed time from a check to the next reply
	replies   atomic.Int32                // reply intervals measured, up to minReplies
	strikes   atomic.Int32                // rounds over every relay without a reply since the last one: each doubles the limits
	avoid     atomic.Pointer[[]avoidance] // immutable; the relays this flow found silent
}

// avoidance is a relay one flow found silent.
type avoidance struct {
	addr  netip.AddrPort
	until int64
}

// avoiding returns the flow's own avoidances still in force at now.
func (w *relayWatch) avoiding(now int64) []avoidance {
	p := w.avoid.Load()
	if p == nil {
		return nil
	}
	for _, a := range *p {
		if a.until > now {
			return *p // the caller checks each entry's deadline
		}
	}
	return nil
}

// avoidAlso adds addr to the flow's avoidances (dropping expired ones and,
// beyond maxAvoid, the oldest).
func (w *relayWatch) avoidAlso(addr netip.AddrPort, until, now int64) {
	var next []avoidance
	for _, a := range w.avoiding(now) {
		if a.until > now && a.addr != addr {
			next = append(next, a)
		}
	}
	next = append(next, avoidance{addr: addr, until: until})
	if len(next) > maxAvoid {
		next = next[len(next)-maxAvoid:]
	}
	w.avoid.Store(&next)
}

// forgive removes addr from the flow's avoidances: it answered.
func (w *relayWatch) forgive(addr netip.AddrPort) {
	p := w.avoid.Load()
	if p == nil {
		return
	}
	var next []avoidance
	found := false
	for _, a := range *p {
		if a.addr == addr {
			found = true
		} else {
			next = append(next, a)
		}
	}
	if found {
		w.avoid.Store(&next)
	}
}

// avoids reports whether the flow avoids addr at now.
func avoids(own []avoidance, addr netip.AddrPort, now int64) bool {
	for _, a := range own {
		if a.addr == addr && a.until > now {
			return true
		}
	}
	return false
}

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
	// to any flow of this replica (coarse unix nanos): immutable map,
	// entries updated in place; new relays are added under mu.
	heard atomic.Pointer[map[netip.AddrPort]*atomic.Int64]
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
	if m := s.heard.Load(); m != nil {
		if v := (*m)[relay]; v != nil {
			return v.Load()
		}
	}
	return 0
}

// hear records a verified datagram from relay at now (coarse): on the
// return path, one map lookup and, once per clock tick, a store.
func (s *suspects) hear(relay netip.AddrPort, now int64) {
	var v *atomic.Int64
	if m := s.heard.Load(); m != nil {
		v = (*m)[relay]
	}
	if v == nil {
		s.mu.Lock()
		old := s.heard.Load()
		next := map[netip.AddrPort]*atomic.Int64{}
		if old != nil {
			for a, x := range *old {
				if now-x.Load() < int64(heardKeep) {
					next[a] = x
				}
			}
		}
		if v = next[relay]; v == nil {
			v = new(atomic.Int64)
			next[relay] = v
		}
		s.heard.Store(&next)
		s.mu.Unlock()
	}
	if v.Load() != now {
		v.Store(now)
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

// relayFor returns the flow's cluster relay. It re-picks when the flow's
// own watch says its relay went silent (see the comment at the top of
// this file), or when the directory or the suspects changed since the
// last pick — unless the flow is being answered through a relay that is
// still usable and not suspect: a relay joining gossip must not take a
// healthy call (the pods may not trust the newcomer yet, and the call has
// nothing to gain from moving); new flows spread over it.
func (r *Relay) relayFor(f *flow, client netip.AddrPort, now int64) (netip.AddrPort, bool) {
	w := &f.watch
	gen, sgen := r.cfg.Directory.Generation(), r.suspects.gen.Load()
	c := f.choice.Load()
	reason := ""
	if c != nil && c.found && (c.gen != gen || c.sgen != sgen) && r.keeps(f, c.addr, now) {
		c = &relayChoice{gen: gen, sgen: sgen, addr: c.addr, found: true}
		f.choice.Store(c)
	}
	if c != nil && c.gen == gen && c.sgen == sgen && c.found {
		if reason = r.evidence(f, now); reason != "" {
			r.m.repicks[reason].Inc()
			until := now + int64(r.cfg.AvoidFor)
			// Whether every flow avoids the relay takes flows of several
			// sessions: a client can leave its own check unanswered at
			// will (a wrong MESSAGE-INTEGRITY, which only the pod can
			// tell), so one session's evidence, however strong, moves
			// only its own flow; several sessions at once are no slow
			// pod and no single caller.
			//
			// And the relay must be silent toward every flow since the
			// voters' evidence began (suspects.vote): several sessions
			// can be one attacker's. And even then it must leave a
			// probe of ours unanswered (relayprobe.go): those sessions
			// may be the relay's only traffic.
			strong := false
			if reason == RepickCheck || reason == RepickUnanswered {
				since := w.checkAt.Load()
				if reason == RepickUnanswered || since == 0 {
					since = w.since.Load()
				}
				var refused bool
				if strong, refused = r.suspects.vote(c.addr, f.tok, since, now); refused {
					r.m.suspicionsRefused.Inc()
				}
			}
			if strong {
				r.probeRelay(c.addr, f.cluster, now)
			}
			w.avoidAlso(c.addr, until, now)
			if r.triedAll(f, client, now) {
				// Every relay of the cluster found silent: the pod is
				// gone, or the whole cluster unreachable. Back off, and
				// start a new round over them.
				if n := w.strikes.Load(); n < maxStrikes {
					w.strikes.Store(n + 1)
				}
				w.avoid.Store(&[]avoidance{{addr: c.addr, until: until}})
			}
			c = nil
		}
	}
	if c == nil || c.gen != gen || c.sgen != sgen {
		prev := f.choice.Load()
		addr, ok := r.pick(f, client, now)
		if c != nil && c.found && addr != c.addr && c.gen == gen {
			// Only the suspects changed: another flow's evidence moved this one.
			r.m.repicks[RepickAvoided].Inc()
		}
		if c == nil || addr != c.addr {
			w.since.Store(now)
			w.checkAt.Store(0)
		}
		c = &relayChoice{gen: gen, sgen: sgen, addr: addr, found: ok}
		f.choice.Store(c)
		if tr := r.repickTrace.Load(); tr != nil && (prev == nil || prev.addr != addr) {
			(*tr)(r.repickEvent(f, client, prev, c, reason, gen, sgen, now))
		}
	}
	return c.addr, c.found
}

// RepickEvent is one flow's change of cluster relay, for tracing
// (SetRepickTrace): the soak run attributes media gaps with it.
type RepickEvent struct {
	At       time.Time      // the relay's coarse clock
	Client   netip.AddrPort // the flow
	Cluster  uint16
	From, To netip.AddrPort // From is invalid for a flow's first pick
	// Reason is a Repick* reason, "gossip" when the directory changed,
	// or "new" for a flow's first pick.
	Reason string
	// Strikes is the flow's back-off after the event: its limits are
	// multiplied by 2^Strikes until a reply arrives.
	Strikes int
	// Avoided are the relays the flow avoided when it picked To: its own
	// and the suspects.
	Avoided []netip.AddrPort
}

// SetRepickTrace makes the relay call fn (from its workers; fn must not
// block) each time a flow changes cluster relay, nil to stop. It costs
// nothing while unset; set, the re-picks allocate. For tests and the soak.
func (r *Relay) SetRepickTrace(fn func(RepickEvent)) {
	if fn == nil {
		r.repickTrace.Store(nil)
		return
	}
	r.repickTrace.Store(&fn)
}

func (r *Relay) repickEvent(f *flow, client netip.AddrPort, prev, c *relayChoice, reason string, gen, sgen uint64, now int64) RepickEvent {
	ev := RepickEvent{At: time.Unix(0, now), Client: client, Cluster: f.cluster, To: c.addr, Reason: reason, Strikes: int(f.watch.strikes.Load())}
	switch {
	case prev == nil:
		ev.Reason = "new"
	case reason != "":
		ev.From = prev.addr
	case prev.gen != gen:
		ev.From, ev.Reason = prev.addr, "gossip"
	case prev.sgen != sgen:
		ev.From, ev.Reason = prev.addr, RepickAvoided
	}
	for _, a := range f.watch.avoiding(now) {
		if a.until > now {
			ev.Avoided = append(ev.Avoided, a.addr)
		}
	}
	if m := r.suspects.snap.Load(); m != nil {
		for a, u := range *m {
			if u > now {
				ev.Avoided = append(ev.Avoided, a)
			}
		}
	}
	return ev
}

// watchCheck records that a Binding Request of the flow was forwarded: a
// reply must follow within the check timeout.
func watchCheck(f *flow, now int64) {
	if f.watch.checkAt.Load() == 0 {
		f.watch.checkAt.Store(now)
	}
}

// clusterAnswers is, per cluster, how long its pods take to answer a
// flow through a live relay (smoothed; coarse unix nanos): the first reply
// of each flow after it started sending, and each check's reply. A flow
// with no round trip of its own yet (a new call, or every flow a restarted
// replica restored) is judged by its cluster's instead of a blind second.
type clusterAnswers struct {
	mu sync.Mutex
	m  atomic.Pointer[map[uint16]*atomic.Int64] // immutable map; entries updated in place
}

// get returns cluster's answer time, 0 when none was measured.
func (c *clusterAnswers) get(cluster uint16) int64 {
	if m := c.m.Load(); m != nil {
		if v := (*m)[cluster]; v != nil {
			return v.Load()
		}
	}
	return 0
}

// observe folds one answer time into cluster's (weight 1/4).
func (c *clusterAnswers) observe(cluster uint16, rtt int64) {
	rtt = max(rtt, 1)
	var v *atomic.Int64
	if m := c.m.Load(); m != nil {
		v = (*m)[cluster]
	}
	if v == nil {
		c.mu.Lock()
		old := c.m.Load()
		next := map[uint16]*atomic.Int64{}
		if old != nil {
			for k, x := range *old {
				next[k] = x
			}
		}
		if v = next[cluster]; v == nil {
			v = new(atomic.Int64)
			next[cluster] = v
			c.m.Store(&next)
		}
		c.mu.Unlock()
	}
	if old := v.Load(); old > 0 {
		rtt = old + (rtt-old)/4
	}
	v.Store(max(rtt, 1))
}

// answerLimit is how long a reply may take through the flow's relay before
// that is evidence against it: four round trips (at least CheckTimeout) of
// the flow's own checks, else of its cluster's flows (at most a second),
// else a second.
func (r *Relay) answerLimit(f *flow) int64 {
	if rtt := f.watch.checkRTT.Load(); rtt > 0 {
		return max(int64(r.cfg.CheckTimeout), 4*rtt)
	}
	if rtt := r.answers.get(f.cluster); rtt > 0 {
		return min(int64(firstCheckTimeout), max(int64(r.cfg.CheckTimeout), 4*rtt))
	}
	return int64(firstCheckTimeout)
}

// evidence returns why the flow's current relay should be left, or "".
func (r *Relay) evidence(f *flow, now int64) string {
	w := &f.watch
	strikes := w.strikes.Load()
	if at := w.checkAt.Load(); at != 0 && now-at >= r.answerLimit(f)<<strikes {
		return RepickCheck
	}
	last := w.lastReply.Load()
	if last == 0 {
		// Never answered through this relay: a flow restored from the
		// cache carries media at once, and a live pod answers within a
		// round trip, so client datagrams with nothing back for as long
		// as a check may take are evidence too (a new call's checks are
		// judged the same way).
		d := now - w.since.Load()
		if d < int64(r.cfg.CheckTimeout)<<strikes {
			return "" // below any limit: no need to look further
		}
		if d >= r.answerLimit(f)<<strikes {
			return RepickUnanswered
		}
		return ""
	}
	if w.replies.Load() < minReplies {
		return "" // no usual interval yet: the check timeout judges it
	}
	silence := min(max(int64(r.cfg.SilenceAfter), 3*w.replyGap.Load()), int64(maxSilence))
	if now-max(last, w.since.Load()) >= silence<<strikes {
		return RepickSilence
	}
	return ""
}

// keeps reports whether a flow stays on relay across a change of the
// directory or of the suspects: it has been answered through relay since
// it picked it, and relay is still usable and not suspect.
func (r *Relay) keeps(f *flow, relay netip.AddrPort, now int64) bool {
	ad, ok := r.cfg.Directory.(avoidingDirectory)
	if !ok {
		return false
	}
	w := &f.watch
	last := w.lastReply.Load()
	return last != 0 && last >= w.since.Load() && r.suspects.until(relay) <= now && ad.Usable(f.cluster, relay)
}

// pick chooses the flow's relay, skipping suspects and the relays the flow
// itself found silent, while their avoidance lasts.
func (r *Relay) pick(f *flow, client netip.AddrPort, now int64) (netip.AddrPort, bool) {
	addr, ok, _ := r.pickAvoiding(f, client, now)
	return addr, ok
}

// pickAvoiding is pick, also reporting whether the avoidances ruled out
// every usable relay of the flow's cluster.
func (r *Relay) pickAvoiding(f *flow, client netip.AddrPort, now int64) (netip.AddrPort, bool, bool) {
	ad, ok := r.cfg.Directory.(avoidingDirectory)
	if !ok {
		addr, ok := r.cfg.Directory.RelayFor(f.cluster, client)
		return addr, ok, false
	}
	own := f.watch.avoiding(now)
	if own == nil && r.suspects.count(now) == 0 {
		addr, ok := r.cfg.Directory.RelayFor(f.cluster, client) // no closure: the first packet stays cheap
		return addr, ok, false
	}
	return ad.relayForAvoiding(f.cluster, client, func(a netip.AddrPort) bool {
		return avoids(own, a, now) || r.suspects.until(a) > now
	})
}

// triedAll reports whether the flow's avoidances (its own and the
// suspects) rule out every usable relay of its cluster.
func (r *Relay) triedAll(f *flow, client netip.AddrPort, now int64) bool {
	_, _, exhausted := r.pickAvoiding(f, client, now)
	return exhausted
}

// watchReply records a datagram toward the client that came from relay:
// the flow's relay is alive, and so is relay, whatever was suspected.
func (r *Relay) watchReply(f *flow, relay netip.AddrPort, now int64) {
	r.suspects.hear(relay, now)
	w := &f.watch
	if c := f.choice.Load(); c != nil && c.addr != relay {
		// A reply through another relay than the one the flow now sends
		// to (the pod answers through the relay its last datagram came
		// from): that relay is alive, but it says nothing about the
		// current one, which must still be judged by its own replies.
		r.clearSuspect(relay, now)
		w.forgive(relay)
		return
	}
	if w.lastReply.Load() == 0 && w.checkAt.Load() == 0 {
		r.answers.observe(f.cluster, now-w.since.Load()) // the flow's first reply
	}
	if last := w.lastReply.Load(); last != now {
		if last != 0 {
			// Longer gaps count fast (a model that stopped talking must
			// not look like a dead relay for long), shorter ones a little
			// slower — but fast enough that a call half a second into its
			// media no longer carries the spacing of its setup's replies
			// (checks, DTLS) in its silence limit.
			g, gap := w.replyGap.Load(), now-last
			if gap > g {
				g += (gap - g) / 2
			} else {
				g -= (g - gap) / 4
			}
			w.replyGap.Store(g)
			if n := w.replies.Load(); n < minReplies {
				w.replies.Store(n + 1)
			}
		}
		w.lastReply.Store(now)
	}
	if at := w.checkAt.Load(); at != 0 {
		rtt := now - at
		if old := w.checkRTT.Load(); old > 0 {
			rtt = old + (rtt-old)/4
		}
		w.checkRTT.Store(max(rtt, 1))
		w.checkAt.Store(0)
		r.answers.observe(f.cluster, now-at)
	}
	r.clearSuspect(relay, now)
	w.forgive(relay)
	if w.strikes.Load() != 0 {
		w.strikes.Store(0)
	}
}

// clearSuspect ends the suspicion against relay: a datagram came from it.
func (r *Relay) clearSuspect(relay netip.AddrPort, now int64) {
	if r.suspects.until(relay) != 0 && r.suspects.set(relay, 0, now) {
		r.m.suspects.Set(float64(r.suspects.count(now)))
		r.log.Info("cluster relay answers again", "relay", relay)
	}
}
