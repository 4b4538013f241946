package globalrelay

// Relay probes: the relay's own word before it is made suspect. Votes of
// several sessions (suspects.vote) can all be one caller's, and at a
// replica where that caller's flows are a cluster relay's only traffic,
// the relay's silence toward the other flows proves nothing: there are
// none. So a vote that stands sends the relay one probe (docs/wire.md
// section 5), sealed with the cluster's relay key, which no caller, pod
// or Internet host holds; the relay becomes suspect only if no answer
// sealed with that key and echoing the probe's nonce comes back within
// probeWait, and the relay delivered to no flow meanwhile. A live relay
// answers, whoever voted; a dead one cannot. Nobody but the relay can
// make the answer, and nobody off the path between the two relays can
// keep it from arriving.
//
// The probe is never an amplifier: a vote sends at most one probe per
// relay per voteWindow whatever the number of flows and sessions, only to
// a relay of the directory, and the answer is as long as the probe.

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// Probe results (the label of rtcedge_globalrelay_relay_probes_total).
const (
	ProbeSent       = "sent"
	ProbeAnswered   = "answered"   // in time: the vote is refused
	ProbeUnanswered = "unanswered" // the relay is made suspect
	ProbeLate       = "late"       // an answer after the wait: the suspicion ends
)

// probeMinWait is the shortest wait for a probe's answer: two ticks of
// the clock that judges it.
const probeMinWait = 2 * clockTick

// relayProbes are the probes sent to cluster relays, by relay. An entry
// lives voteWindow from its probe, which is the rate limit.
type relayProbes struct {
	mu sync.Mutex
	m  map[netip.AddrPort]*relayProbe // guarded by mu
	// waiting counts probes not yet judged: the clock tick looks no
	// further while it is 0.
	waiting atomic.Int32
}

// relayProbe is one probe and what became of it.
type relayProbe struct {
	cluster  uint16
	nonce    uint64
	ingress  netip.AddrPort // the socket it went from and its answer comes to
	sent     int64          // coarse unix nanos
	deadline int64
	answered bool
	judged   bool
}

// probeWait is how long a probe to a relay of cluster may take: twice
// the cluster's answer time (what a pod's answer through a live relay
// takes, an upper bound of the relay's own), between probeMinWait and
// CheckTimeout; CheckTimeout when none was measured yet.
func (r *Relay) probeWait(cluster uint16) int64 {
	rtt := r.answers.get(cluster)
	if rtt == 0 {
		return int64(r.cfg.CheckTimeout)
	}
	return min(int64(r.cfg.CheckTimeout), max(int64(probeMinWait), 2*rtt))
}

// probeRelay sends relay (of cluster) a probe, unless one was sent to it
// within voteWindow: a vote of enough sessions stood against it at now.
func (r *Relay) probeRelay(relay netip.AddrPort, cluster uint16, now int64) {
	p := &r.probes
	k := r.hopKeys.Load().For(cluster)
	if k == nil {
		return // no flow of the cluster is forwarded either (no_hop_key)
	}
	var nb [8]byte
	_, _ = rand.Read(nb[:]) // never fails (crypto/rand)
	w := &r.workers[0]
	pr := &relayProbe{cluster: cluster, nonce: binary.BigEndian.Uint64(nb[:]), ingress: w.ingress,
		sent: now, deadline: now + r.probeWait(cluster)}
	p.mu.Lock()
	if old := p.m[relay]; old != nil && now-old.sent < int64(voteWindow) {
		p.mu.Unlock()
		return
	}
	for a, old := range p.m { // few entries: relays voted against lately
		if old.judged && now-old.sent >= int64(voteWindow) {
			delete(p.m, a)
		}
	}
	if p.m == nil {
		p.m = map[netip.AddrPort]*relayProbe{}
	}
	if old := p.m[relay]; old != nil && !old.judged {
		p.waiting.Add(-1) // replaced before any clock tick judged it
	}
	p.m[relay] = pr
	p.waiting.Add(1)
	p.mu.Unlock()
	var buf [encap.ProbeLen]byte
	pkt := k.SealProbe(buf[:], cluster, pr.nonce, pr.ingress, relay)
	if _, err := w.internal.WriteToUDPAddrPort(pkt, relay); err != nil {
		r.m.writeErrors.Inc() // judged unanswered at its deadline
	}
	r.m.probes[ProbeSent].Inc()
}

// judgeProbes makes suspect every relay whose probe's wait ended at now
// without an answer and that delivered to no flow since the probe went
// out. The clock tick calls it.
func (r *Relay) judgeProbes(now int64) {
	p := &r.probes
	if p.waiting.Load() == 0 {
		return
	}
	var silent, spoke []netip.AddrPort
	p.mu.Lock()
	for relay, pr := range p.m {
		if pr.judged || now < pr.deadline {
			continue
		}
		pr.judged = true
		p.waiting.Add(-1)
		if r.suspects.lastHeard(relay) >= pr.sent {
			spoke = append(spoke, relay)
		} else {
			silent = append(silent, relay)
		}
	}
	p.mu.Unlock()
	for range spoke {
		r.m.suspicionsRefused.Inc() // it delivered to a flow meanwhile
	}
	for _, relay := range silent {
		r.m.probes[ProbeUnanswered].Inc()
		if r.suspects.set(relay, now+int64(r.cfg.AvoidFor), now) {
			r.m.suspects.Set(float64(r.suspects.count(now)))
			r.log.Warn("cluster relay left checks of several sessions and its probe unanswered; avoiding it", "relay", relay, "for", r.cfg.AvoidFor)
		}
	}
}

// probeAnswer takes a datagram starting with encap.ProbeMagic from the
// internal socket: the answer to the probe sent to from, or a drop. An
// answer in time refuses the vote; a late one ends the suspicion it
// caused. Either way the relay is alive, as any datagram from it says.
func (r *Relay) probeAnswer(pkt []byte, from netip.AddrPort) {
	now := r.now.Load()
	p := &r.probes
	p.mu.Lock()
	pr := p.m[from]
	var ingress netip.AddrPort
	var nonce uint64
	if pr != nil && pr.cluster == encap.ProbeCluster(pkt) {
		ingress, nonce = pr.ingress, pr.nonce
	}
	p.mu.Unlock()
	if !ingress.IsValid() {
		r.m.drops.Inc(dropProbeUnmatched)
		return
	}
	got, err := r.hopKeys.Load().For(encap.ProbeCluster(pkt)).OpenProbeAnswer(pkt, ingress, from)
	if err != nil {
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return
	}
	result := ""
	p.mu.Lock()
	if got == nonce && !pr.answered {
		pr.answered = true
		result = ProbeLate
		if !pr.judged {
			pr.judged = true
			p.waiting.Add(-1)
			result = ProbeAnswered
		}
	}
	p.mu.Unlock()
	if result == "" {
		r.m.drops.Inc(dropProbeUnmatched) // an old answer replayed, or a second copy
		return
	}
	r.m.probes[result].Inc()
	if result == ProbeAnswered {
		r.m.suspicionsRefused.Inc()
	}
	r.suspects.hear(from, now)
	r.clearSuspect(from, now)
}
