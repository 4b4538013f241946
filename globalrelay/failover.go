package globalrelay

// Data-plane failover: each flow watches its own cluster relay
// (relayWatch) and leaves it when the relay stops answering, long before
// gossip notices. relayFor, on the client path, judges the watch
// (evidence) and re-picks (pick); watchCheck and watchReply, on the client
// and return paths, feed it. The directory of relays is directory.go; the
// evidence shared by every flow (suspects, votes, cluster answer times) is
// suspects.go; the probe of a suspected relay is relayprobe.go.
//
// Why: gossip is the source of membership, but the global pool runs
// memberlist's WAN timings in production (5 s probes, a suspicion timeout
// of tens of seconds), far too slow for a call whose cluster relay died.
// The relay sees the failure sooner in its own traffic: the client keeps
// sending and nothing comes back. Two kinds of evidence, each acted on at
// once and without asking anyone:
//
//   - silence: a flow whose replies had been arriving (a few intervals
//     measured) gets none for SilenceAfter, or three times its usual
//     interval between replies if that is longer (a model that is not
//     talking sends only RTCP, about once a second), capped at
//     maxSilence. The flow alone moves to the next cluster relay of its
//     cluster (rendezvous order) and avoids the silent one for AvoidFor.
//     Moving a flow is harmless when the guess is wrong: cluster relays
//     hold no flow state and the pod follows the relay its datagrams come
//     from.
//   - an unanswered check: a STUN Binding Request forwarded through a relay
//     got no reply at all within CheckTimeout (or four times the flow's
//     check round trip, if longer). A live transceiver answers every check,
//     so this is evidence against the relay itself: once flows of several
//     sessions found so, the relay has delivered to no flow since, and it
//     leaves a probe of ours unanswered (relayprobe.go), every flow avoids
//     it for AvoidFor (new calls included), unless every relay of its
//     cluster is avoided (suspects.vote). The same holds for a flow that
//     has sent through a relay for a second and never had any reply (a
//     flow restored after a restart sends media at once): a replica that
//     restarted while a cluster relay was dying, and gossip still lists
//     it, learns so from its first flows instead of from each one in turn.
//
// Any datagram from a relay clears the suspicion against it. Avoidance is
// bounded in time; by then gossip has declared a dead member dead.

import (
	"net/netip"
	"sync/atomic"
	"time"
)

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
//
// Two sides write it at once: the client path (relayFor, watchCheck: the
// worker reading the client's datagrams, UDP or TCP) and the return path
// (watchReply: the worker reading the cluster relay's datagram, or the
// fast path's sync). So every field is atomic, and every read-modify-write
// is a compare-and-swap: a load then a store would lose the other side's
// update.
type relayWatch struct {
	// Set by the client path when it picks a relay; read by both.
	since atomic.Int64 // when the flow started using its current relay
	// checkAt is armed by the client path (0 → now, watchCheck) and
	// disarmed by the return path (at → 0, watchReply); only the worker
	// whose swap disarms it folds the check's round trip into checkRTT.
	checkAt  atomic.Int64 // forwarding time of the oldest check not yet followed by a reply
	checkRTT atomic.Int64 // smoothed time from a check to the next reply
	// Owned by the return path: the worker whose swap moves lastReply to
	// a new clock tick folds that tick's gap (foldGap) and counts it.
	lastReply atomic.Int64 // last datagram toward the client
	replyGap  atomic.Int64 // smoothed interval between replies (longer ones weigh 1/2, shorter 1/4)
	replies   atomic.Int32 // reply intervals measured, up to minReplies
	// strikes is raised by the client path (bumpTo) and cleared by the
	// return path: rounds over every relay without a reply since the last
	// one, each doubling the limits.
	strikes atomic.Int32
	// avoid is replaced whole by both sides (compare-and-swap): the relays
	// this flow found silent. The slice is immutable.
	avoid atomic.Pointer[[]avoidance]
}

// bumpTo adds one to v unless it has reached limit; concurrent bumps all
// count.
func bumpTo(v *atomic.Int32, limit int32) {
	for n := v.Load(); n < limit; n = v.Load() {
		if v.CompareAndSwap(n, n+1) {
			return
		}
	}
}

// foldGap folds one interval between replies into the smoothed gap g.
// Longer gaps count fast (a model that stopped talking must not look like
// a dead relay for long), shorter ones a little slower — but fast enough
// that a call half a second into its media no longer carries the spacing
// of its setup's replies (checks, DTLS) in its silence limit.
func foldGap(g *atomic.Int64, gap int64) {
	for {
		old := g.Load()
		next := old
		if gap > old {
			next += (gap - old) / 2
		} else {
			next -= (old - gap) / 4
		}
		if g.CompareAndSwap(old, next) {
			return
		}
	}
}

// foldRTT folds one round trip into the smoothed rtt (weight 1/4).
func foldRTT(v *atomic.Int64, rtt int64) {
	for {
		old, next := v.Load(), rtt
		if old > 0 {
			next = old + (rtt-old)/4
		}
		if v.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
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
	for {
		p := w.avoid.Load()
		var next []avoidance
		if p != nil {
			for _, a := range *p {
				if a.until > now && a.addr != addr {
					next = append(next, a)
				}
			}
		}
		next = append(next, avoidance{addr: addr, until: until})
		if len(next) > maxAvoid {
			next = next[len(next)-maxAvoid:]
		}
		if w.avoid.CompareAndSwap(p, &next) {
			return
		}
	}
}

// forgive removes addr from the flow's avoidances: it answered.
func (w *relayWatch) forgive(addr netip.AddrPort) {
	for {
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
		if !found || w.avoid.CompareAndSwap(p, &next) {
			return
		}
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

// relayFor returns the flow's cluster relay. It re-picks when the flow's
// own watch says its relay went silent (evidence), or when the directory or the suspects changed since the
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
				bumpTo(&w.strikes, maxStrikes)
				// A new round replaces the list whole: what another
				// worker changed in it this instant belonged to the
				// round that ends.
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
			// The watch starts over for the new relay; a check another
			// worker armed this instant goes unjudged, and the silence
			// limit, counted from since, judges the new relay anyway.
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
	if f.watch.checkAt.Load() == 0 { // the common case, without a locked instruction
		f.watch.checkAt.CompareAndSwap(0, now)
	}
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
	// One worker per clock tick claims the reply (the swap of lastReply)
	// and folds the interval since the last one.
	if last := w.lastReply.Load(); last != now && w.lastReply.CompareAndSwap(last, now) {
		switch {
		case last == 0 && w.checkAt.Load() == 0:
			r.answers.observe(f.cluster, now-w.since.Load()) // the flow's first reply
		case last != 0:
			foldGap(&w.replyGap, now-last)
			bumpTo(&w.replies, minReplies)
		}
	}
	if at := w.checkAt.Load(); at != 0 && w.checkAt.CompareAndSwap(at, 0) {
		foldRTT(&w.checkRTT, now-at)
		r.answers.observe(f.cluster, now-at)
	}
	r.clearSuspect(relay, now)
	w.forgive(relay)
	if w.strikes.Load() != 0 {
		w.strikes.Store(0) // a constant, not a read-modify-write: a bump racing it counts a round begun after this reply
	}
}

// clearSuspect ends the suspicion against relay: a datagram came from it.
func (r *Relay) clearSuspect(relay netip.AddrPort, now int64) {
	if r.suspects.until(relay) != 0 && r.suspects.set(relay, 0, now) {
		r.m.suspects.Set(float64(r.suspects.count(now)))
		r.log.Info("cluster relay answers again", "relay", relay)
	}
}
