package transceiver

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// Round trips for steering (docs/steering.md). Signaling hands the pod a
// call's steering key (the caller's prefix and coarse location, as
// signaling located it) with the offer. The session notes the first
// authenticated check through each POP it advertises (nearest and
// backup); once connected, it measures the client's round trip through
// each of them with one Binding Request of its own
// (podnet.Socket.MeasureRTT). The reporter batches the samples per call,
// each call with the ticket the cluster's front gave it with the create,
// and sends them, about once a second, as a report tagged with the pod's
// own key (internal/steer, report.go) to one cluster relay of the pod's
// cluster pool, which checks it and passes the samples to every signaling
// replica as this pod's (clusterrelay, steerforward.go).

// RTTReportInterval is how often the pod sends its batch of samples.
const RTTReportInterval = time.Second

// maxPendingRTT bounds the samples waiting for the next report; more are
// dropped and counted.
const maxPendingRTT = 512

// rttPaths is a session's record of the POPs its client checked: the
// client's address through each, and the USERNAME of its first check
// there. Guarded by mu (written on the ICE agent's loop, read once
// connected).
type rttPaths struct {
	key    steer.Key    // invalid: signaling sent none, nothing is measured
	ticket steer.Ticket // the front's, for key and pops
	pops   []uint16     // the POPs the call was offered, in order
	mu     sync.Mutex
	paths  [maxPOPs]rttPath
	n      int
}

type rttPath struct {
	pop    uint16
	client netip.AddrPort
	user   string
}

// noteCheck records the first authenticated check through pop.
func (p *rttPaths) noteCheck(pop uint16, client netip.AddrPort, msg *stun.Message) {
	if !p.key.Valid() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == len(p.paths) {
		return
	}
	for _, q := range p.paths[:p.n] {
		if q.pop == pop {
			return
		}
	}
	var user stun.Username
	if user.GetFrom(msg) != nil {
		return
	}
	p.paths[p.n] = rttPath{pop: pop, client: client, user: user.String()}
	p.n++
}

// measureRTT sends the measuring probe through every POP the client
// checked; each answer becomes a sample for the reporter.
func (s *session) measureRTT() {
	p := &s.rtt
	if !p.key.Valid() || s.t.rttOut == nil {
		return
	}
	p.mu.Lock()
	paths := p.paths
	n := p.n
	p.mu.Unlock()
	for _, q := range paths[:n] {
		pop := q.pop
		s.t.sock.MeasureRTT(pop, q.client, s.ufrag, q.user, s.client.Pwd, func(rtt time.Duration) {
			s.t.rttOut.add(p, steer.RTT{POP: pop, RTT: rtt})
		})
	}
}

// rttReporter batches samples for ReportRTT.
type rttReporter struct {
	// Static after newRTTReporter.
	keyID uint8  // of key
	key   []byte // the pod's report key; nil without pod keys: reports go untagged

	mu      sync.Mutex
	pending []pendingRTT           // guarded by mu: added by the sessions, taken by the reporting loop
	samples *prometheus.CounterVec // by result: sent, dropped (queue full), unsent (no relay, send failed)
}

// pendingRTT is one sample waiting, with the call that measured it.
type pendingRTT struct {
	call *rttPaths
	rtt  steer.RTT
}

func newRTTReporter(keys *authority.PodKeys, reg prometheus.Registerer) (*rttReporter, error) {
	r := &rttReporter{}
	if keys != nil {
		var err error
		if r.keyID, r.key, err = keys.SteerReportKey(); err != nil {
			return nil, fmt.Errorf("transceiver rtt: %w", err)
		}
	}
	r.samples = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtcedge_transceiver_rtt_samples_total",
		Help: "Round trips measured through POPs for steering, by result: sent to a cluster relay, dropped (queue full), unsent (no relay or the send failed).",
	}, []string{"result"})
	if err := metric.Register(reg, "transceiver rtt", r.samples); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rttReporter) add(call *rttPaths, x steer.RTT) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pending) >= maxPendingRTT {
		r.samples.WithLabelValues("dropped").Inc()
		return
	}
	r.pending = append(r.pending, pendingRTT{call, x})
}

// take empties the queue: the samples per call, in the order of each
// call's first.
func (r *rttReporter) take() []steer.Call {
	r.mu.Lock()
	pending := r.pending
	r.pending = nil
	r.mu.Unlock()
	var calls []steer.Call
	at := map[*rttPaths]int{}
	for _, x := range pending {
		i, ok := at[x.call]
		if !ok {
			i = len(calls)
			at[x.call] = i
			calls = append(calls, steer.Call{Key: x.call.key, Ticket: x.call.ticket, POPs: x.call.pops})
		}
		calls[i].RTTs = append(calls[i].RTTs, x.rtt)
	}
	return calls
}

// ReportRTT sends the measured round trips to a live cluster relay of
// the pod's cluster in pool, every RTTReportInterval until ctx ends.
func (t *Transceiver) ReportRTT(ctx context.Context, pool *membership.Pool) {
	tick := time.NewTicker(RTTReportInterval)
	defer tick.Stop()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		calls := t.rttOut.take()
		if len(calls) == 0 {
			continue
		}
		var relays []string
		for _, m := range pool.Members() {
			if m.State == membership.StateAlive && m.Meta.Role == membership.RoleClusterRelay && m.Meta.Cluster == t.cfg.Cluster && !m.Meta.Draining {
				relays = append(relays, m.Name)
			}
		}
		r := t.rttOut
		for len(calls) > 0 {
			msg, n := steer.AppendReport(nil, t.cfg.Cluster, t.cfg.Pod, r.keyID, r.key, calls)
			result := "unsent"
			if len(relays) > 0 {
				next++
				if pool.Send(relays[next%len(relays)], msg) == nil {
					result = "sent"
				}
			}
			for _, c := range calls[:n] {
				r.samples.WithLabelValues(result).Add(float64(len(c.RTTs)))
			}
			calls = calls[n:]
		}
	}
}
