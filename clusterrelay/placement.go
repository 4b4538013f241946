package clusterrelay

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Placement under bursts. A pod gossips its session count at most once a
// second, and the cluster pool takes a little longer to spread it, so a
// burst of creates that all read the same gossiped loads would pile onto
// the pod that looked least loaded. The front therefore counts the
// sessions it has placed itself (in flight and recently created) on top of
// each pod's gossiped load until gossip catches up:
//
//   - a create is counted from the moment the front picks its pod (so
//     concurrent picks see each other), and released if the pod refuses;
//   - a created session stays counted until the front sees the pod's
//     gossiped load change at least GossipLag after the create finished
//     (that publish was made after the pod counted it), or until
//     PlacementHold passed (the pod's load may not change at all when a
//     session ended meanwhile, and then it publishes nothing).
//
// Each front replica counts only its own placements; the power-of-two
// choice keeps replicas reading the same loads from all picking one pod.

// Defaults of FrontConfig's placement settings.
const (
	// DefaultGossipLag bounds how long a pod's published load takes to
	// reach the front through the cluster pool.
	DefaultGossipLag = time.Second
	// DefaultPlacementHold is how long a placement counts at most: the
	// pod's publish interval (1 s) plus the lag, with margin.
	DefaultPlacementHold = 5 * time.Second
)

// placer holds the front's own placements per pod. All methods are safe for
// concurrent use; the lock is held only for arithmetic on a handful of pods.
type placer struct {
	lag, hold time.Duration
	now       func() time.Time

	mu   sync.Mutex
	pods map[uint16]*podPlacements // guarded by mu
	seen map[uint16]podSeen        // guarded by mu: pods' API addresses, kept for rememberPods after gossip drops them
}

// podSeen is a pod's session API address and when gossip last listed it.
type podSeen struct {
	api string
	at  time.Time
}

// rememberPods is how long the front still reaches a pod that gossip no
// longer lists, for requests naming its sessions: under load, gossip can
// declare a live pod dead for a moment (a "flap"), and a hang-up must not
// fail for it.
const rememberPods = time.Minute

// podAPI returns the session API address of pod, and whether gossip lists
// it now; a pod gossip dropped less than rememberPods ago is still
// returned (live false). "" means no such pod.
func (pl *placer) podAPI(pods []PodInfo, pod uint16) (api string, live bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	now := pl.now()
	pl.remember(pods, now)
	for _, p := range pods {
		if p.ID == pod && p.API != "" {
			return p.API, true
		}
	}
	if s, ok := pl.seen[pod]; ok && now.Sub(s.at) < rememberPods {
		return s.api, false
	}
	return "", false
}

// remember records the API addresses of pods and forgets old ones. Called
// with mu held.
func (pl *placer) remember(pods []PodInfo, now time.Time) {
	for _, p := range pods {
		if p.API != "" {
			pl.seen[p.ID] = podSeen{api: p.API, at: now}
		}
	}
	for id, s := range pl.seen {
		if now.Sub(s.at) >= rememberPods {
			delete(pl.seen, id)
		}
	}
}

// podPlacements is what the front knows about one pod beyond gossip.
type podPlacements struct {
	gossipLoad int         // the load gossip last reported
	inflight   int         // creates sent to the pod and not yet answered
	placed     []time.Time // when the front's creates finished, oldest first; not yet in gossipLoad
}

func newPlacer(lag, hold time.Duration, now func() time.Time) *placer {
	return &placer{lag: lag, hold: hold, now: now, pods: map[uint16]*podPlacements{}, seen: map[uint16]podSeen{}}
}

// pick orders up to n ready pods to try and counts the first as in flight
// (the caller reports the outcome with done, and calls reserve before
// trying a later one). The first is the less loaded, by gossiped load plus
// the front's own placements, of two picked at random ("power of two
// choices"); pods this front has already filled are left out while others
// remain.
func (pl *placer) pick(pods []PodInfo, n int) []PodInfo {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.sync(pods)
	pl.remember(pods, pl.now())
	type cand struct {
		PodInfo
		share float64
	}
	var ready, full []cand
	for _, p := range pods {
		if !p.Ready() {
			continue
		}
		st := pl.pods[p.ID]
		load := p.Load + st.inflight + len(st.placed)
		c := cand{p, float64(load) / float64(max(p.Capacity, 1))}
		if p.Capacity > 0 && load >= p.Capacity {
			full = append(full, c)
		} else {
			ready = append(ready, c)
		}
	}
	if len(ready) == 0 {
		ready = full // let the pods decide
	}
	rand.Shuffle(len(ready), func(i, j int) { ready[i], ready[j] = ready[j], ready[i] })
	if len(ready) >= 2 && ready[1].share < ready[0].share {
		ready[0], ready[1] = ready[1], ready[0]
	}
	out := make([]PodInfo, 0, min(len(ready), n))
	for _, c := range ready[:min(len(ready), n)] {
		out = append(out, c.PodInfo)
	}
	if len(out) > 0 {
		pl.pods[out[0].ID].inflight++
	}
	return out
}

// reserve counts a create to pod as in flight.
func (pl *placer) reserve(pod uint16) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if st := pl.pods[pod]; st != nil {
		st.inflight++
	}
}

// done ends an in-flight create to pod; created says whether the pod took
// the session (then it stays counted until gossip shows it).
func (pl *placer) done(pod uint16, created bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	st := pl.pods[pod]
	if st == nil { // the pod left the cluster meanwhile
		return
	}
	st.inflight = max(st.inflight-1, 0)
	if created {
		st.placed = append(st.placed, pl.now())
	}
}

// sync takes in the pods' gossiped loads: a changed load absorbs the
// placements that finished GossipLag before it was seen, and placements
// older than PlacementHold are dropped. Pods gone from gossip are
// forgotten. Called with mu held.
func (pl *placer) sync(pods []PodInfo) {
	now := pl.now()
	seen := make(map[uint16]bool, len(pods))
	for _, p := range pods {
		seen[p.ID] = true
		st := pl.pods[p.ID]
		if st == nil {
			pl.pods[p.ID] = &podPlacements{gossipLoad: p.Load}
			continue
		}
		cut := now.Add(-pl.hold)
		if p.Load != st.gossipLoad {
			st.gossipLoad = p.Load
			cut = later(cut, now.Add(-pl.lag))
		}
		i := 0
		for i < len(st.placed) && !st.placed[i].After(cut) {
			i++
		}
		st.placed = st.placed[i:]
	}
	for id := range pl.pods {
		if !seen[id] {
			delete(pl.pods, id)
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
