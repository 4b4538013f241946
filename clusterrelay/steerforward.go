package clusterrelay

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// SteerForwarder passes the round trips the cluster's pods measure on to
// every live signaling replica of the global pool: the relay is the one
// role in both pools, and pods are not in the global pool. A pod sends
// its report (internal/steer, report.go) to one cluster relay of the
// cluster pool; the forwarder believes it only from a pod of its cluster
// that gossip admitted and, with the deployment authority, only with that
// pod's tag and, per call, a ticket the front minted for that pod, that
// caller's key and those POPs. It then sends the samples on stamped with
// the pod as their reporter, so that signaling caps what each pod can
// weigh (docs/steering.md), and signed with the cluster's relay key, so
// that signaling takes pods of this cluster from this cluster's relays
// only. Reports that do not parse are dropped as
// invalid, those that fail a check as refused, both counted. It owns a
// bounded queue; Run sends from it.
type SteerForwarder struct {
	cfg      SteerForwarderConfig
	from, to *membership.Pool
	queue    chan []byte
	msgs     *prometheus.CounterVec
}

// SteerForwarderConfig is who the forwarder believes.
type SteerForwarderConfig struct {
	Cluster uint16
	// Authority checks reports and tickets and signs the samples passed
	// on; nil without the deployment authority (shared keys): the pod a
	// report names is then believed, and the samples go unsigned. It is
	// asked for each report, so a key reload takes effect at once.
	Authority func() *steer.Authority
	// Admitted reports whether gossip lists pod (with the authority, it
	// proved its ID); nil admits every pod.
	Admitted func(pod uint16) bool
	Now      func() time.Time // default time.Now
}

// steerQueue bounds the messages waiting to be passed on.
const steerQueue = 64

// NewSteerForwarder forwards from the cluster pool from to the global pool
// to once Run runs; it installs itself as from's message handler.
func NewSteerForwarder(from, to *membership.Pool, cfg SteerForwarderConfig, reg prometheus.Registerer) (*SteerForwarder, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	f := &SteerForwarder{cfg: cfg, from: from, to: to, queue: make(chan []byte, steerQueue),
		msgs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_clusterrelay_rtt_messages_total",
			Help: "Pods' round-trip reports and the samples messages made of them, by result: forwarded (samples messages, to this many signaling replicas in all), dropped (queue full), invalid (reports that do not parse), refused (reports from a pod not admitted, or failing its tag or a ticket).",
		}, []string{"result"})}
	for _, r := range []string{"forwarded", "dropped", "invalid", "refused"} {
		f.msgs.WithLabelValues(r)
	}
	if err := metric.Register(reg, "clusterrelay steering", f.msgs); err != nil {
		return nil, err
	}
	from.SetHandler(f.receive)
	return f, nil
}

// receive runs on the cluster pool's packet goroutine: parse, check,
// restamp, queue (no blocking).
func (f *SteerForwarder) receive(msg []byte) {
	if len(msg) == 0 || msg[0] != steer.ReportKind {
		f.msgs.WithLabelValues("invalid").Inc()
		return
	}
	r, err := steer.ParseReport(msg)
	if err != nil {
		f.msgs.WithLabelValues("invalid").Inc()
		return
	}
	a := f.authority()
	if err := f.check(a, &r); err != nil {
		f.msgs.WithLabelValues("refused").Inc()
		return
	}
	var sg *steer.Signer
	if a != nil {
		sg = a.Signer
	}
	samples := r.Samples()
	from := steer.PodReporter(f.cfg.Cluster, r.Pod)
	now := f.cfg.Now()
	for len(samples) > 0 {
		out, n := steer.AppendMessage(nil, sg, now, steer.SourcePod, from, samples)
		samples = samples[n:]
		select {
		case f.queue <- out:
		default:
			f.msgs.WithLabelValues("dropped").Inc()
		}
	}
}

// authority is the keys in use (nil: none).
func (f *SteerForwarder) authority() *steer.Authority {
	if f.cfg.Authority == nil {
		return nil
	}
	return f.cfg.Authority()
}

// check believes r under a (nil: the format only) or says why not.
func (f *SteerForwarder) check(a *steer.Authority, r *steer.Report) error {
	if r.Cluster != f.cfg.Cluster {
		return steer.ErrReport
	}
	if f.cfg.Admitted != nil && !f.cfg.Admitted(r.Pod) {
		return steer.ErrReport
	}
	if a != nil {
		return a.Check(r, f.cfg.Now())
	}
	return nil
}

// Run sends queued messages to every live signaling member of the global
// pool until ctx ends.
func (f *SteerForwarder) Run(ctx context.Context) error {
	defer f.from.SetHandler(nil)
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg := <-f.queue:
			for _, m := range f.to.Members() {
				if m.State == membership.StateAlive && m.Meta.Role == membership.RoleSignaling && f.to.Send(m.Name, msg) == nil {
					f.msgs.WithLabelValues("forwarded").Inc()
				}
			}
		}
	}
}
