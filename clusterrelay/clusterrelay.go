// Package clusterrelay is the stateless middle tier of rtcedge's data plane.
//
// A cluster relay receives encapsulated datagrams from global relays and
// forwards each to the pod its header names; it forwards the pods' replies to
// the global relay replica (ingress address) their header names. It keeps no
// per-flow state: the only inputs to a forwarding decision are the header and
// the pod directory, so any replica can carry any packet and a dead replica
// loses nothing. The header is docs/wire.md section 2.
package clusterrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// dropReason is why a datagram was dropped; it indexes the preallocated
// counters, so a drop costs one slice index. dropLabels holds the "reason"
// labels, besides encap's own decode reasons which appear as
// "encap_<reason>".
type dropReason uint8

const (
	dropOther dropReason = iota
	dropWrongCluster
	dropUnknownPod
	dropNotFromPod
	dropPodMismatch
	dropEmpty
	dropOversize       // longer than encap.MaxDatagram
	dropIngress        // toward a pod, but not sent by the ingress the header names
	dropUnknownIngress // a reply toward an address no global relay sent from
	numDropReasons
)

var dropLabels = [numDropReasons]string{"other", "wrong_cluster", "unknown_pod", "not_from_pod",
	"pod_mismatch", "empty", "oversize", "ingress_mismatch", "unknown_ingress"}

// Relay forwards between global relays and the pods of one cluster over one
// UDP socket.
type Relay struct {
	// Static after New.
	cfg        Config
	log        *slog.Logger
	addr       netip.AddrPort
	advertised netip.AddrPort // Config.Advertise, else addr: what probes name
	io         *udpio.Runner  // owns the socket
	m          *metrics
	keys       atomic.Pointer[encap.Keyring]
	kernel     *kernelPath // the in-kernel fast path (fastpath.go); nil: off or unavailable

	// ingresses are the global relay internal sockets that have sent
	// authenticated datagrams toward pods through this relay: the only
	// addresses replies go to. A pod's header could name any address (a
	// compromised pod holds the hop key), and the relay would be its
	// forwarder to anywhere.
	ingresses ingressSet
}

// ingressSet is a bounded set of addresses, cleared when full (a
// deployment has a few hundred global relay sockets at most; replies to
// the ones cleared wait for their next datagram toward a pod). It changes
// only when a new global relay socket appears, so it is an immutable map
// replaced whole: a lookup per datagram is one atomic load.
type ingressSet struct {
	mu   sync.Mutex // serialises replacements
	snap atomic.Pointer[map[netip.AddrPort]struct{}]
	// onAdd, set before the relay runs, is told each new address and
	// whether the set was cleared first (the fast path's copy).
	onAdd func(a netip.AddrPort, cleared bool)
}

const maxIngresses = 1 << 12

func (s *ingressSet) has(a netip.AddrPort) bool {
	m := s.snap.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[a]
	return ok
}

func (s *ingressSet) add(a netip.AddrPort) {
	if s.has(a) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.snap.Load()
	if old != nil {
		if _, ok := (*old)[a]; ok {
			return // another worker added it meanwhile
		}
	}
	next := map[netip.AddrPort]struct{}{a: {}}
	cleared := old != nil && len(*old) >= maxIngresses
	if old != nil && !cleared {
		for k := range *old {
			next[k] = struct{}{}
		}
	}
	s.snap.Store(&next)
	if s.onAdd != nil {
		s.onAdd(a, cleared)
	}
}

// New returns a relay over conn. It takes ownership of conn.
func New(cfg Config, conn *net.UDPConn) (*Relay, error) {
	if cfg.Cluster == 0 || cfg.Pods == nil || cfg.Hop == nil {
		return nil, errors.New("clusterrelay config: a non-zero cluster ID, the pod directory and the inter-tier hop keys are required")
	}
	config.Default(&cfg.Logger, slog.Default())
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, log: cfg.Logger.With("component", "clusterrelay", "cluster", cfg.Cluster), m: m,
		addr: conn.LocalAddr().(*net.UDPAddr).AddrPort()}
	r.advertised = cfg.Advertise
	if !r.advertised.IsValid() {
		r.advertised = r.addr
	}
	r.keys.Store(cfg.Hop)
	if r.io, err = udpio.NewRunner(cfg.Tuning, r.log, []udpio.Path{r.path(conn)}); err != nil {
		return nil, fmt.Errorf("clusterrelay: %w", err)
	}
	mode, err := fastpath.ParseMode(string(cfg.FastPath))
	if err == nil {
		err = r.startFastPath(mode)
	}
	if err != nil {
		_ = r.io.Close()
		return nil, err
	}
	return r, nil
}

// SetHopKeys replaces the inter-tier keys (key rotation), from the next
// datagram on.
func (r *Relay) SetHopKeys(k *encap.Keyring) {
	if k != nil {
		r.keys.Store(k)
		r.setKernelKeys()
	}
}

// Addr returns the relay's data address.
func (r *Relay) Addr() netip.AddrPort { return r.addr }

// Run forwards until ctx ends or Close is called.
func (r *Relay) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { r.Close() })
	defer stop()
	kctx, kstop := context.WithCancel(ctx)
	kdone := make(chan struct{})
	go func() { defer close(kdone); r.runKernel(kctx) }()
	err := r.io.Run()
	r.Close()
	kstop()
	<-kdone
	if err != nil {
		return fmt.Errorf("clusterrelay: %w", err)
	}
	return nil
}

// path is how the relay forwards on conn: every datagram decided as it
// stands, bundles from either side split.
func (r *Relay) path(conn *net.UDPConn) udpio.Path {
	return udpio.Path{From: conn, To: conn, Limit: encap.MaxDatagram, Decide: r.decide, Hooks: udpio.Hooks{
		WriteErr:  func(error) { r.m.writeErrors.Inc() },
		Oversize:  func() { r.m.drops.Inc(dropOversize) },
		Unbundle:  encap.BundleFormat{},
		BadBundle: func() { r.m.encapDrops.Inc(encap.ReasonBundle) },
		Bundle:    encap.BundleFormat{},
		Bundled: func(bundles, datagrams int) {
			r.m.bundles.Add(float64(bundles))
			r.m.bundledPackets.Add(float64(datagrams))
		},
	}}
}

// Close stops the relay. Idempotent.
func (r *Relay) Close() error {
	err := r.io.Close()
	if r.kernel != nil {
		err = errors.Join(err, r.kernel.fp.Close())
	}
	return err
}

// decide is the whole forwarding logic: parse the header, check it, pick the
// destination. The datagram is forwarded unchanged, header included. A
// relay probe is answered instead (answerProbe).
func (r *Relay) decide(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
	pkt := buf[:n]
	if encap.IsProbe(pkt) {
		return r.answerProbe(pkt, from)
	}
	h, hl, err := encap.Decode(pkt)
	if err != nil {
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return nil, netip.AddrPort{}, false
	}
	if h.Cluster != r.cfg.Cluster {
		r.m.drops.Inc(dropWrongCluster)
		return nil, netip.AddrPort{}, false
	}
	// Nothing in the header is believed before its tag verifies.
	if err := r.keys.Load().Verify(pkt, hl); err != nil {
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return nil, netip.AddrPort{}, false
	}
	return r.route(pkt, h, hl, from)
}

// answerProbe answers a global relay's probe (docs/wire.md §5) in place,
// to the address it came from: the only datagram this relay originates.
// It is as long as the probe and made only for a probe whose tag verifies
// from that source to this relay's advertised address, so a host without
// the key gets nothing sent, and a captured probe replayed from another
// source fails the tag: the answer goes only to the socket that sealed it.
func (r *Relay) answerProbe(pkt []byte, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
	if encap.ProbeCluster(pkt) != r.cfg.Cluster {
		r.m.drops.Inc(dropWrongCluster)
		return nil, netip.AddrPort{}, false
	}
	if err := r.keys.Load().AnswerProbe(pkt, from, r.advertised); err != nil {
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return nil, netip.AddrPort{}, false
	}
	r.m.probes.Inc()
	return pkt, from, true
}

// route picks the destination of an authenticated datagram from its header
// and the pod directory.
func (r *Relay) route(pkt []byte, h encap.Header, hl int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
	n := len(pkt)
	if n == hl {
		r.m.drops.Inc(dropEmpty)
		return nil, netip.AddrPort{}, false
	}
	if h.ToClient {
		// Only a pod of this cluster may send toward clients, and only in
		// its own name: otherwise anyone could reflect traffic through us.
		pod, ok := r.cfg.Pods.PodAt(from)
		if !ok {
			r.m.drops.Inc(dropNotFromPod)
			return nil, netip.AddrPort{}, false
		}
		if pod != h.Pod {
			r.m.drops.Inc(dropPodMismatch)
			return nil, netip.AddrPort{}, false
		}
		if !r.ingresses.has(h.Ingress) {
			r.m.drops.Inc(dropUnknownIngress)
			return nil, netip.AddrPort{}, false
		}
		r.m.toClient.Inc()
		r.m.toClientBytes.Add(float64(n))
		return pkt, h.Ingress, true
	}
	// A global relay sends from the internal socket it names as ingress,
	// and replies will go there: a header naming anyone else would make
	// this relay and the pod send a call's media to a third party.
	if h.Ingress != from {
		r.m.drops.Inc(dropIngress)
		return nil, netip.AddrPort{}, false
	}
	r.ingresses.add(from)
	dst, ok := r.cfg.Pods.PodAddr(h.Pod)
	if !ok {
		r.m.drops.Inc(dropUnknownPod)
		return nil, netip.AddrPort{}, false
	}
	r.m.toPod.Inc()
	r.m.toPodBytes.Add(float64(n))
	return pkt, dst, true
}

type metrics struct {
	toPod, toClient           prometheus.Counter
	toPodBytes, toClientBytes prometheus.Counter
	writeErrors               prometheus.Counter
	bundles, bundledPackets   prometheus.Counter
	probes                    prometheus.Counter
	drops                     *udpio.Drops[dropReason]
	encapDrops                *udpio.Drops[encap.Reason]
	fastMetrics
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	packets := metric.CounterVec("rtcedge_clusterrelay_packets_total", "Datagrams forwarded, by direction (to_pod, to_client).", "direction")
	bytes := metric.CounterVec("rtcedge_clusterrelay_bytes_total", "Bytes forwarded including the encapsulation header, by direction.", "direction")
	drops := metric.CounterVec("rtcedge_clusterrelay_dropped_packets_total", "Datagrams dropped, by reason.", "reason")
	writeErrors := metric.Counter("rtcedge_clusterrelay_write_errors_total", "Failed sends.")
	bundles := metric.Counter("rtcedge_clusterrelay_bundles_sent_total", "Bundles sent to pods and global relays (Config.Bundle).")
	bundledPackets := metric.Counter("rtcedge_clusterrelay_bundled_packets_total", "Datagrams sent inside bundles.")
	probes := metric.Counter("rtcedge_clusterrelay_probes_answered_total", "Relay probes of global relays answered (docs/wire.md section 5); forged ones count as encap drops.")
	m := &metrics{
		toPod: packets.WithLabelValues("to_pod"), toClient: packets.WithLabelValues("to_client"),
		toPodBytes: bytes.WithLabelValues("to_pod"), toClientBytes: bytes.WithLabelValues("to_client"),
		writeErrors: writeErrors, bundles: bundles, bundledPackets: bundledPackets, probes: probes,
		drops:      udpio.NewDrops[dropReason](drops, "", dropLabels[:]...),
		encapDrops: udpio.NewDrops[encap.Reason](drops, "encap_", encap.Reasons[:]...),
	}
	var fast []prometheus.Collector
	m.fastMetrics, fast = newFastMetrics()
	if err := metric.Register(reg, "clusterrelay", append(fast, packets, bytes, drops, writeErrors, bundles, bundledPackets, probes)...); err != nil {
		return nil, err
	}
	return m, nil
}
