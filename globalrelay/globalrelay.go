// Package globalrelay is rtcedge's public UDP ingress, one per POP.
//
// A client's first datagram to the POP's VIP must be a STUN Binding Request
// whose USERNAME starts with a valid routing token (the server ufrag, docs/wire.md
// section 1). Only then does the relay create a flow: client address →
// (cluster, pod), and a cluster relay replica of that cluster chosen by the
// client's address. Every later datagram of the flow (STUN, DTLS, SRTP,
// SRTCP) is forwarded opaquely with the encapsulation header in front. Replies
// come back on the worker's internal socket and leave from the public socket,
// only toward clients that are live flows: the relay never answers or
// reflects anything by itself. Flows are soft state and expire when idle.
package globalrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// dropReason is why a datagram was dropped; it indexes the preallocated
// counters, so a drop costs one slice index. dropLabels holds the "reason"
// labels; token, STUN and header decode failures appear as "token_<reason>",
// "stun_<reason>" and "encap_<reason>".
type dropReason uint8

const (
	dropOther          dropReason = iota
	dropUnknownFlow               // non-STUN datagram from an address with no flow
	dropNoClusterRelay            // the token's cluster has no usable relay
	dropTableFull                 // flow table at its cap
	dropWrongDirection            // toward-transceiver header on the internal socket
	dropWrongPOP                  // to-client header for another POP
	dropFlowMismatch              // to-client from a pod that does not own the client's flow
	dropEmpty
	dropDraining       // a new flow refused while the replica drains
	dropTokenReuse     // the token already opened its share of flows from other addresses
	dropOversize       // longer than encap.MaxPayload (from a client) or encap.MaxDatagram
	dropNotFromCluster // a reply not sent by a cluster relay of the header's cluster
	dropBadSource      // a client address no client can have (port 0, multicast, our own, ...)
	dropTokenExpired   // a token older than TokenLifetime may open no new flow
	dropFlowBusy       // a check for another cluster/pod while the address's flow is live
	dropNoHopKey       // no inter-tier key for the flow's cluster
	dropSSRCLive       // RTP from an unknown address with the SSRC of a live flow (ssrc.go)
	dropUnconfirmed    // a reply for a flow restored from the return path before its client sent on it
	dropRestoreLimit   // a return-path restore over the rate restores are limited to
	dropProbeUnmatched // a relay probe answer for no probe of ours, or replayed (relayprobe.go)
	numDropReasons
)

var dropLabels = [numDropReasons]string{"other", "unknown_flow", "no_cluster_relay", "table_full",
	"wrong_direction", "wrong_pop", "flow_mismatch", "empty", "draining", "token_reuse", "oversize",
	"not_from_cluster", "bad_source", "token_expired", "flow_busy", "no_hop_key", "ssrc_live",
	"unconfirmed", "restore_limit", "probe_unmatched"}

// Worker is one socket pair of the relay: Public is bound to the POP's VIP
// (with SO_REUSEPORT when there are several workers), Internal to an
// address cluster relays can reach, which is the ingress address written in
// headers so replies come back to this worker.
type Worker struct {
	Public   *net.UDPConn
	Internal *net.UDPConn
}

// Relay is one global relay replica: its workers share one flow table.
type Relay struct {
	// Static after New.
	cfg     Config
	log     *slog.Logger
	workers []worker
	flows   *flowTable
	ssrcs   *ssrcIndex // the SSRC each flow's client sends audio with (ssrc.go)
	m       *metrics

	own     []netip.AddrPort // the relay's own socket addresses: never a client
	ownIPs  []netip.Addr     // specific, non-loopback addresses the sockets are bound to
	io      *udpio.Runner    // the workers' read loops
	hopKeys atomic.Pointer[encap.ClusterKeys]
	tokKeys atomic.Pointer[token.Keyring] // verifies routing tokens (SetTokenKeys)
	tcp     atomic.Pointer[TCP]           // the TCP ingress, if any (tcp.go)
	kernel  *kernelPath                   // the in-kernel fast path (fastpath.go); nil: off or unavailable

	now atomic.Int64 // coarse clock, unix nanos, advanced by Run
	// restores counts this second's return-path restores: the unix
	// second in the high 32 bits, the count in the low (restoreBudget).
	restores  atomic.Uint64
	suspects  suspects    // cluster relays avoided on data-plane evidence (suspects.go)
	probes    relayProbes // asked before a relay becomes suspect (relayprobe.go)
	draining  atomic.Bool
	closeOnce sync.Once
	done      chan struct{}

	// repickTrace, when set, is called at each change of a flow's cluster
	// relay (SetRepickTrace, failover.go).
	repickTrace atomic.Pointer[func(RepickEvent)]
	// answers is how long each cluster's pods take to answer (suspects.go).
	answers clusterAnswers
}

type worker struct {
	Worker
	ingress netip.AddrPort
	// internal sends on the internal socket from outside the read loops
	// (the TCP ingress): Internal, or its event loop's socket.
	internal udpio.Writer
}

// New returns a relay over the given workers' sockets, taking ownership of
// them.
func New(cfg Config, workers []Worker) (*Relay, error) {
	switch {
	case cfg.POP == 0 || cfg.Keys == nil || cfg.Directory == nil || cfg.Hop == nil:
		return nil, errors.New("globalrelay config: a non-zero POP ID, the token keyring, the cluster directory and the inter-tier hop keys are required")
	case cfg.TokenLifetime < 0 || (cfg.TokenLifetime > 0 && cfg.TokenLifetime < time.Hour):
		return nil, errors.New("globalrelay config: token lifetime must be at least 1h")
	case cfg.FlowQuiet < 0:
		return nil, errors.New("globalrelay config: flow quiet time must not be negative")
	case len(workers) == 0:
		return nil, errors.New("globalrelay: at least one worker is required")
	}
	cfg.relayDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r := &Relay{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "globalrelay", "pop", cfg.POP),
		flows: newFlowTable(cfg.MaxFlows),
		ssrcs: newSSRCIndex(),
		m:     m,
		done:  make(chan struct{}),
	}
	for _, w := range workers {
		in := udpio.LocalAddrPort(w.Internal)
		if in.Addr().IsUnspecified() {
			return nil, fmt.Errorf("globalrelay: internal socket %v must be bound to a specific address: it is the return address in every header", in)
		}
		r.workers = append(r.workers, worker{Worker: w, ingress: in})
		pub := udpio.LocalAddrPort(w.Public)
		r.own = append(r.own, pub, in)
		for _, a := range []netip.Addr{pub.Addr(), in.Addr()} {
			if !a.IsUnspecified() && !a.IsLoopback() {
				r.ownIPs = append(r.ownIPs, a)
			}
		}
	}
	if r.cfg.AllowSource == nil {
		r.cfg.AllowSource = defaultAllowSource(r.own[0].Addr())
	}
	r.hopKeys.Store(cfg.Hop)
	r.tokKeys.Store(cfg.Keys)
	r.now.Store(cfg.Now().UnixNano())
	paths := make([][]udpio.Path, len(r.workers))
	for i := range r.workers {
		paths[i] = r.directions(&r.workers[i])
	}
	if r.io, err = udpio.NewRunner(cfg.Tuning, r.log, paths...); err != nil {
		return nil, fmt.Errorf("globalrelay: %w", err)
	}
	for i := range r.workers {
		r.workers[i].internal = r.io.Writer(r.workers[i].Internal)
	}
	mode, err := fastpath.ParseMode(string(cfg.FastPath))
	if err == nil {
		err = r.startFastPath(mode)
	}
	if err != nil {
		_ = r.io.Close()
		return nil, err
	}
	if r.kernel != nil {
		r.flows.gone = r.forget
	}
	return r, nil
}

// directions are a worker's two ways: from clients toward cluster relays
// (read on Public, the header written into the headroom, bundled with
// Config.Bundle) and back (read on Internal; cluster relays may bundle
// replies, so bundles are always read).
func (r *Relay) directions(w *worker) []udpio.Path {
	hooks := udpio.Hooks{WriteErr: r.writeErr, Oversize: func() { r.m.drops.Inc(dropOversize) }}
	up := udpio.Path{From: w.Public, To: w.Internal, Headroom: encap.MaxLen, Limit: encap.MaxPayload, Hooks: hooks,
		Decide: func(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
			if r.kernel == nil {
				return r.fromClient(buf, n, from, w.ingress)
			}
			// The kernel passed it up: first what it saw of the flow,
			// then the decision, then the flow back into the kernel.
			if f := r.flows.get(from); f != nil {
				r.foldKernel(from, f)
			}
			out, to, ok := r.fromClient(buf, n, from, w.ingress)
			if ok {
				r.offer(w, from, to)
			}
			return out, to, ok
		}}
	up.Hooks.Bundle, up.Hooks.Bundled = encap.BundleFormat{}, r.bundled
	down := udpio.Path{From: w.Internal, To: w.Public, Limit: encap.MaxDatagram, Hooks: hooks, Decide: r.toClient}
	down.Hooks.Unbundle, down.Hooks.BadBundle = encap.BundleFormat{}, func() { r.m.encapDrops.Inc(encap.ReasonBundle) }
	return []udpio.Path{up, down}
}

// SetTokenKeys replaces the routing-token keyring (key rotation): tokens
// verify against it from the next check on; flows open go on.
func (r *Relay) SetTokenKeys(k *token.Keyring) {
	if k != nil {
		r.tokKeys.Store(k)
	}
}

// SetHopKeys replaces the inter-tier keys (key rotation): datagrams are
// sealed with each cluster's new current key from the next packet on, and
// verified against every key the new set holds.
func (r *Relay) SetHopKeys(k *encap.ClusterKeys) {
	if k != nil {
		r.hopKeys.Store(k)
		r.setKernelKeys()
	}
}

// PublicAddr returns the address clients send to.
func (r *Relay) PublicAddr() netip.AddrPort {
	return r.workers[0].Public.LocalAddr().(*net.UDPAddr).AddrPort()
}

// IngressAddrs returns the internal addresses of the workers.
func (r *Relay) IngressAddrs() []netip.AddrPort {
	out := make([]netip.AddrPort, len(r.workers))
	for i, w := range r.workers {
		out[i] = w.ingress
	}
	return out
}

// Drain makes the replica refuse new flows while it keeps forwarding the
// ones it has; they end by expiry. The load balancer should stop sending it
// new clients (its readiness fails while draining).
func (r *Relay) Drain() { r.draining.Store(true) }

// Draining reports whether Drain was called.
func (r *Relay) Draining() bool { return r.draining.Load() }

// Flows returns the number of live flows.
func (r *Relay) Flows() int { return r.flows.len() }

// Run forwards until ctx ends or Close is called. A socket failure closes
// the whole relay and is returned.
func (r *Relay) Run(ctx context.Context) error {
	ioErr := make(chan error, 1)
	go func() {
		err := r.io.Run()
		r.Close() // a loop that ends, for whatever reason, ends the relay
		ioErr <- err
	}()
	// The coarse clock ticks often (it stamps flows and times the
	// failure detection); the expiry scan, which locks every shard in
	// turn, runs a few times per FlowIdle.
	tick := time.NewTicker(clockTick)
	defer tick.Stop()
	scanEvery := min(max(r.cfg.FlowIdle/8, time.Second/4), 5*time.Second)
	lastScan := time.Now()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			r.Close()
			done = true
		case <-r.done:
			done = true
		case <-tick.C:
			now := r.cfg.Now()
			r.now.Store(now.UnixNano())
			r.judgeProbes(now.UnixNano())
			r.m.flows.Set(float64(r.flows.len()))
			if now.Sub(lastScan) >= scanEvery {
				lastScan = now
				r.expire()
			}
		}
	}
	if err := <-ioErr; err != nil {
		return fmt.Errorf("globalrelay: %w", err)
	}
	return nil
}

func (r *Relay) writeErr(error) { r.m.writeErrors.Inc() }

func (r *Relay) bundled(bundles, datagrams int) {
	r.m.bundles.Add(float64(bundles))
	r.m.bundledPackets.Add(float64(datagrams))
}

func (r *Relay) expire() {
	r.syncKernel() // the kernel's last-seen times first
	cutoff := r.cfg.Now().Add(-r.cfg.FlowIdle).UnixNano()
	unconfirmed := r.cfg.Now().Add(-unconfirmedTTL).UnixNano()
	if n := r.flows.expire(cutoff, unconfirmed) + r.flows.expireAbandoned(r.cfg.Now().UnixNano()); n > 0 { // abandon.go
		r.m.flowsExpired.Add(float64(n))
		r.ssrcs.sweep(r.flows)
	}
	r.m.flows.Set(float64(r.flows.len()))
}

// Close stops the relay and closes its sockets. Idempotent.
func (r *Relay) Close() error {
	r.closeOnce.Do(func() {
		close(r.done)
		_ = r.io.Close()
		if r.kernel != nil {
			_ = r.kernel.fp.Close()
		}
	})
	return nil
}

type metrics struct {
	flows                                   prometheus.Gauge
	flowsCreated, flowsExpired              prometheus.Counter
	ssrcFollows                             prometheus.Counter
	flowsRestoredReturn, flowsRestoredCache prometheus.Counter
	toCluster, toClient                     prometheus.Counter
	toClusterBytes, toClientBytes           prometheus.Counter
	writeErrors                             prometheus.Counter
	takeovers, cacheRejected                prometheus.Counter
	bundles, bundledPackets                 prometheus.Counter
	repicks                                 map[string]prometheus.Counter // by reason (failover.go)
	suspects                                prometheus.Gauge
	suspicionsRefused                       prometheus.Counter            // votes of enough sessions against a relay that still answers others
	probes                                  map[string]prometheus.Counter // by result (relayprobe.go)
	drops                                   *udpio.Drops[dropReason]
	encapDrops                              *udpio.Drops[encap.Reason]
	stunDrops                               *udpio.Drops[stunmsg.Reason]
	tokenDrops                              *udpio.Drops[token.Reason]
	fastMetrics
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	flows := metric.Gauge("rtcedge_globalrelay_flows", "Live flows (client addresses with a route).")
	created := metric.Counter("rtcedge_globalrelay_flows_created_total", "Flows created from a verified routing token.")
	expired := metric.Counter("rtcedge_globalrelay_flows_expired_total", "Flows removed after FlowIdle without client packets, or abandoned for a newer address of the same token.")
	followed := metric.Counter("rtcedge_globalrelay_flows_followed_total", "Flows opened for a new client address by the RTP SSRC of a silent flow (a NAT rebinding before the client's next check).")
	restored := metric.CounterVec("rtcedge_globalrelay_flows_restored_total", "Flows restored after being lost, by source (return_path, cache).", "source")
	packets := metric.CounterVec("rtcedge_globalrelay_packets_total", "Datagrams forwarded, by direction (to_cluster, to_client).", "direction")
	bytes := metric.CounterVec("rtcedge_globalrelay_bytes_total", "Client payload bytes forwarded (without header), by direction.", "direction")
	drops := metric.CounterVec("rtcedge_globalrelay_dropped_packets_total", "Datagrams dropped, by reason.", "reason")
	writeErrors := metric.Counter("rtcedge_globalrelay_write_errors_total", "Failed sends.")
	takeovers := metric.Counter("rtcedge_globalrelay_flow_takeovers_total", "Client addresses whose quiet flow a check for another cluster or pod took over.")
	cacheRejected := metric.Counter("rtcedge_globalrelay_cache_rejected_total", "Route-cache entries refused: bad or unknown MAC, unusable client address, or token cap reached.")
	bundles := metric.Counter("rtcedge_globalrelay_bundles_sent_total", "Bundles sent to cluster relays (Config.Bundle).")
	bundledPackets := metric.Counter("rtcedge_globalrelay_bundled_packets_total", "Datagrams sent to cluster relays inside bundles.")
	repicks := metric.CounterVec("rtcedge_globalrelay_relay_repicks_total", "Flows moved to another cluster relay of their cluster on data-plane evidence, by reason (silence: replies stopped; check: a check went unanswered; unanswered: never a reply through the relay; avoided: another flow's evidence).", "reason")
	suspects := metric.Gauge("rtcedge_globalrelay_relay_suspects", "Cluster relays every flow avoids because flows of several sessions found them silent, they delivered to no flow since and left their probe unanswered (until they answer or the avoidance ends).")
	refused := metric.Counter("rtcedge_globalrelay_relay_suspicions_refused_total", "Votes of enough sessions against a cluster relay that were not acted on: the relay had delivered to other flows since the voters' evidence began, or answered its probe.")
	probes := metric.CounterVec("rtcedge_globalrelay_relay_probes_total", "Relay probes to cluster relays a vote stood against, by result (sent; answered: in time, the vote refused; unanswered: the relay made suspect; late: an answer after the wait, the suspicion ended).", "result")
	m := &metrics{
		repicks: map[string]prometheus.Counter{}, suspects: suspects, suspicionsRefused: refused, probes: map[string]prometheus.Counter{},
		takeovers: takeovers, cacheRejected: cacheRejected,
		flows: flows, flowsCreated: created, flowsExpired: expired, ssrcFollows: followed,
		flowsRestoredReturn: restored.WithLabelValues("return_path"),
		flowsRestoredCache:  restored.WithLabelValues("cache"),
		toCluster:           packets.WithLabelValues("to_cluster"), toClient: packets.WithLabelValues("to_client"),
		toClusterBytes: bytes.WithLabelValues("to_cluster"), toClientBytes: bytes.WithLabelValues("to_client"),
		writeErrors: writeErrors, bundles: bundles, bundledPackets: bundledPackets,
		drops:      udpio.NewDrops[dropReason](drops, "", dropLabels[:]...),
		encapDrops: udpio.NewDrops[encap.Reason](drops, "encap_", encap.Reasons[:]...),
		stunDrops:  udpio.NewDrops[stunmsg.Reason](drops, "stun_", stunmsg.Reasons[:]...),
		tokenDrops: udpio.NewDrops[token.Reason](drops, "token_", token.Reasons[:]...),
	}
	for _, reason := range []string{RepickSilence, RepickCheck, RepickAvoided, RepickUnanswered} {
		m.repicks[reason] = repicks.WithLabelValues(reason)
	}
	for _, result := range []string{ProbeSent, ProbeAnswered, ProbeUnanswered, ProbeLate} {
		m.probes[result] = probes.WithLabelValues(result)
	}
	var fast []prometheus.Collector
	m.fastMetrics, fast = newFastMetrics()
	if err := metric.Register(reg, "globalrelay", append(fast, flows, created, expired, followed, restored, packets, bytes, drops, writeErrors,
		takeovers, cacheRejected, bundles, bundledPackets, repicks, suspects, refused, probes)...); err != nil {
		return nil, err
	}
	return m, nil
}
