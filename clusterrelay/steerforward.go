package clusterrelay

import (
	"bytes"
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// SteerForwarder passes the round trips the cluster's pods measure
// (internal/steer samples messages, sent to one cluster relay of the
// cluster pool) on to every live signaling replica of the global pool:
// the relay is the one role in both pools. Messages that do not parse, or
// that claim another source than a pod, are dropped and counted. It owns
// a bounded queue; Run sends from it.
type SteerForwarder struct {
	from, to *membership.Pool
	queue    chan []byte
	msgs     *prometheus.CounterVec
}

// steerQueue bounds the messages waiting to be passed on.
const steerQueue = 64

// NewSteerForwarder forwards from the cluster pool from to the global pool
// to once Run runs; it installs itself as from's message handler.
func NewSteerForwarder(from, to *membership.Pool, reg prometheus.Registerer) (*SteerForwarder, error) {
	f := &SteerForwarder{from: from, to: to, queue: make(chan []byte, steerQueue),
		msgs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_clusterrelay_rtt_messages_total",
			Help: "Pods' round-trip sample messages, by result: forwarded (to this many signaling replicas in all), dropped (queue full), invalid.",
		}, []string{"result"})}
	if err := metric.Register(reg, "clusterrelay steering", f.msgs); err != nil {
		return nil, err
	}
	from.SetHandler(f.receive)
	return f, nil
}

// receive runs on the cluster pool's packet goroutine: check, copy, queue.
func (f *SteerForwarder) receive(msg []byte) {
	if src, _, err := steer.ParseMessage(msg); err != nil || src != steer.SourcePod {
		f.msgs.WithLabelValues("invalid").Inc()
		return
	}
	select {
	case f.queue <- bytes.Clone(msg):
	default:
		f.msgs.WithLabelValues("dropped").Inc()
	}
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
