// Package globalrelay is rtcedge's public UDP ingress, one per POP.
//
// A client's first datagram to the POP's VIP must be a STUN Binding Request
// whose USERNAME starts with a valid routing token (the server ufrag, WIRE.md
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
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// Drop reasons (the "reason" label). Token, STUN and header decode failures
// appear as "token_<reason>", "stun_<reason>" and "encap_<reason>".
const (
	DropUnknownFlow    = "unknown_flow"     // non-STUN datagram from an address with no flow
	DropNoClusterRelay = "no_cluster_relay" // the token's cluster has no usable relay
	DropTableFull      = "table_full"       // flow table at its cap
	DropWrongDirection = "wrong_direction"  // toward-transceiver header on the internal socket
	DropWrongPOP       = "wrong_pop"        // to-client header for another POP
	DropFlowMismatch   = "flow_mismatch"    // to-client from a pod that does not own the client's flow
	DropEmpty          = "empty"
	DropDraining       = "draining"         // a new flow refused while the replica drains
	DropTokenReuse     = "token_reuse"      // the token already opened its share of flows from other addresses
	DropOversize       = "oversize"         // longer than encap.MaxPayload (from a client) or encap.MaxDatagram
	DropNotFromCluster = "not_from_cluster" // a reply not sent by a cluster relay of the header's cluster
	DropBadSource      = "bad_source"       // a client address no client can have (port 0, multicast, our own, ...)
	DropTokenExpired   = "token_expired"    // a token older than TokenLifetime may open no new flow
	DropFlowBusy       = "flow_busy"        // a check for another cluster/pod while the address's flow is live
	DropNoHopKey       = "no_hop_key"       // no inter-tier key for the flow's cluster
	DropSSRCLive       = "ssrc_live"        // RTP from an unknown address with the SSRC of a live flow (ssrc.go)
	DropUnconfirmed    = "unconfirmed"      // a reply for a flow restored from the return path before its client sent on it
	DropRestoreLimit   = "restore_limit"    // a return-path restore over the rate restores are limited to
)

// dropReason is the typed form of the labels above; it indexes the
// preallocated counters, so a drop costs one slice index.
type dropReason uint8

const (
	dropOther dropReason = iota
	dropUnknownFlow
	dropNoClusterRelay
	dropTableFull
	dropWrongDirection
	dropWrongPOP
	dropFlowMismatch
	dropEmpty
	dropDraining
	dropTokenReuse
	dropOversize
	dropNotFromCluster
	dropBadSource
	dropTokenExpired
	dropFlowBusy
	dropNoHopKey
	dropSSRCLive
	dropUnconfirmed
	dropRestoreLimit
	numDropReasons
)

// dropLabels is the label of every dropReason, indexed by it.
var dropLabels = [numDropReasons]string{
	dropOther: "other", dropUnknownFlow: DropUnknownFlow, dropNoClusterRelay: DropNoClusterRelay,
	dropTableFull: DropTableFull, dropWrongDirection: DropWrongDirection, dropWrongPOP: DropWrongPOP,
	dropFlowMismatch: DropFlowMismatch, dropEmpty: DropEmpty, dropDraining: DropDraining,
	dropTokenReuse: DropTokenReuse, dropOversize: DropOversize, dropNotFromCluster: DropNotFromCluster,
	dropBadSource: DropBadSource, dropTokenExpired: DropTokenExpired, dropFlowBusy: DropFlowBusy, dropNoHopKey: DropNoHopKey,
	dropSSRCLive: DropSSRCLive, dropUnconfirmed: DropUnconfirmed, dropRestoreLimit: DropRestoreLimit,
}

// Config configures a Relay.
type Config struct {
	POP      uint16           // this POP's ID (non-zero)
	Keys     *token.Keyring   // verifies routing tokens
	Clusters ClusterDirectory // cluster relay replicas
	// HopKeys are the inter-tier MAC keys of the clusters this POP
	// serves (required): datagrams toward a cluster are sealed with its
	// current key, replies must verify under one of its keys, and route
	// cache entries are sealed with them too. SetHopKeys replaces them
	// without a restart.
	HopKeys *encap.ClusterKeys
	// TokenLifetime is how old a routing token may be and still open a
	// new flow (at the token's one-hour resolution); flows it opened go
	// on. Default 24h; at least 1h.
	TokenLifetime time.Duration
	// FlowQuiet is how long a flow must have carried no client datagram
	// before a check naming another cluster or pod may take its client
	// address over (and so at most one takeover per FlowQuiet per
	// address). A live call, even in Opus DTX silence (a packet every
	// 400 ms), is never moved by someone else's check. Default 3s.
	FlowQuiet time.Duration
	// AllowSource reports whether a client IP may have a flow. Default:
	// global unicast (Go's netip definition, private ranges included),
	// plus loopback when the public socket itself is on loopback (the
	// dev world and tests). Port 0 and the relay's own socket addresses
	// are refused whatever it says.
	AllowSource func(netip.Addr) bool
	// FlowIdle is how long a flow lives without a datagram from its
	// client; default 30s. Consent checks every few seconds keep live calls.
	FlowIdle time.Duration
	MaxFlows int // cap on the flow table; default 262144
	// SilenceAfter, CheckTimeout and AvoidFor tune the data-plane failure
	// detection (failover.go): a flow leaves its cluster relay when
	// replies stop for SilenceAfter (or 3× their usual interval) or a
	// check goes unanswered for CheckTimeout (or 4× the flow's check
	// round trip), and avoids it for AvoidFor. Defaults
	// DefaultSilenceAfter, DefaultCheckTimeout, DefaultAvoidFor.
	SilenceAfter, CheckTimeout, AvoidFor time.Duration
	// CacheRefresh is how often a live flow is written to the cache again,
	// so that it outlives the cache TTL for as long as the call runs;
	// default 20s (a third of the cache's default TTL).
	CacheRefresh time.Duration
	// Cache shares flows between replicas (Redis in production): new flows
	// are stored, and a datagram from an unknown client starts a lookup
	// whose hit must be handed to RestoreFlow (routecache.Config.OnFound).
	// The relay never waits for it. nil: no cache.
	Cache routecache.Cache
	// Tuning is how the workers move datagrams (udpio.Runner): each
	// worker's two directions on one event loop, or on two read loops of
	// the runtime's poller; Bundle bundles only toward cluster relays
	// (replies in bundles are always read).
	udpio.Tuning

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil: metrics are not registered
	Now        func() time.Time      // default time.Now
}

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
	tcp     atomic.Pointer[TCP] // the TCP ingress, if any (tcp.go)

	now atomic.Int64 // coarse clock, unix nanos, advanced by Run
	// restoreSec and restoreN count this second's return-path restores
	// (restoreBudget).
	restoreSec, restoreN atomic.Int64
	suspects             suspects // cluster relays avoided on data-plane evidence (failover.go)
	draining             atomic.Bool
	closeOnce            sync.Once
	done                 chan struct{}

	// repickTrace, when set, is called at each change of a flow's cluster
	// relay (SetRepickTrace, failover.go).
	repickTrace atomic.Pointer[func(RepickEvent)]
	// answers is how long each cluster's pods take to answer (failover.go).
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
	case cfg.POP == 0:
		return nil, errors.New("globalrelay config: POP ID must be non-zero")
	case cfg.Keys == nil:
		return nil, errors.New("globalrelay config: token keyring is required")
	case cfg.Clusters == nil:
		return nil, errors.New("globalrelay config: cluster directory is required")
	case cfg.HopKeys == nil:
		return nil, errors.New("globalrelay config: inter-tier hop keys are required")
	case cfg.TokenLifetime < 0 || (cfg.TokenLifetime > 0 && cfg.TokenLifetime < time.Hour):
		return nil, errors.New("globalrelay config: token lifetime must be at least 1h")
	case cfg.FlowQuiet < 0:
		return nil, errors.New("globalrelay config: flow quiet time must not be negative")
	case len(workers) == 0:
		return nil, errors.New("globalrelay: at least one worker is required")
	}
	if cfg.FlowIdle == 0 {
		cfg.FlowIdle = 30 * time.Second
	}
	if cfg.MaxFlows == 0 {
		cfg.MaxFlows = 1 << 18
	}
	if cfg.CacheRefresh == 0 {
		cfg.CacheRefresh = 20 * time.Second
	}
	if cfg.TokenLifetime == 0 {
		cfg.TokenLifetime = 24 * time.Hour
	}
	if cfg.FlowQuiet == 0 {
		cfg.FlowQuiet = 3 * time.Second
	}
	if cfg.SilenceAfter <= 0 {
		cfg.SilenceAfter = DefaultSilenceAfter
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = DefaultCheckTimeout
	}
	if cfg.AvoidFor <= 0 {
		cfg.AvoidFor = DefaultAvoidFor
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
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
		in := w.Internal.LocalAddr().(*net.UDPAddr).AddrPort()
		in = netip.AddrPortFrom(in.Addr().Unmap(), in.Port())
		if in.Addr().IsUnspecified() {
			return nil, fmt.Errorf("globalrelay: internal socket %v must be bound to a specific address: it is the return address in every header", in)
		}
		r.workers = append(r.workers, worker{Worker: w, ingress: in})
		pub := udpio.LocalAddrPort(w.Public)
		pub = netip.AddrPortFrom(pub.Addr().Unmap(), pub.Port())
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
	r.hopKeys.Store(cfg.HopKeys)
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
			return r.fromClient(buf, n, from, w.ingress)
		}}
	up.Hooks.Bundle, up.Hooks.Bundled = encap.BundleFormat{}, r.bundled
	down := udpio.Path{From: w.Internal, To: w.Public, Limit: encap.MaxDatagram, Hooks: hooks, Decide: r.toClient}
	down.Hooks.Unbundle, down.Hooks.BadBundle = encap.BundleFormat{}, func() { r.m.encapDrops.Inc(encap.ReasonBundle) }
	return []udpio.Path{up, down}
}

// SetHopKeys replaces the inter-tier keys (key rotation): datagrams are
// sealed with each cluster's new current key from the next packet on, and
// verified against every key the new set holds.
func (r *Relay) SetHopKeys(k *encap.ClusterKeys) {
	if k != nil {
		r.hopKeys.Store(k)
	}
}

// unconfirmedTTL is how long a flow restored from the return path lives
// without a datagram from its client.
const unconfirmedTTL = 2 * time.Second

// restoreBudget reports whether another return-path restore fits in this
// second's budget: an eighth of MaxFlows a second, so that with
// unconfirmedTTL unconfirmed flows hold at most a quarter of the table.
func (r *Relay) restoreBudget() bool {
	sec := r.now.Load() / int64(time.Second)
	if r.restoreSec.Load() != sec {
		r.restoreSec.Store(sec)
		r.restoreN.Store(0)
	}
	return r.restoreN.Add(1) <= int64(max(r.cfg.MaxFlows/8, 1))
}

// sourceOK reports whether a client address may have a flow: it is checked
// before any flow is created or restored.
func (r *Relay) sourceOK(a netip.AddrPort) bool {
	if a.Port() == 0 {
		return false
	}
	for _, o := range r.own {
		if a == o {
			return false
		}
	}
	ip := a.Addr()
	for _, o := range r.ownIPs {
		if ip == o {
			return false
		}
	}
	return r.cfg.AllowSource(ip)
}

// defaultAllowSource is the source filter derived from the relay's own
// public address: global unicast (netip's definition: not loopback,
// multicast, link-local, unspecified or broadcast; private ranges are
// global unicast), plus loopback when the relay itself is on loopback, as
// in the dev world and tests.
func defaultAllowSource(public netip.Addr) func(netip.Addr) bool {
	loopback := public.Unmap().IsLoopback()
	return func(a netip.Addr) bool { return a.IsGlobalUnicast() || (loopback && a.IsLoopback()) }
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
		ioErr <- r.io.Run()
		r.Close() // a loop that ends, for whatever reason, ends the relay
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
	})
	return nil
}

// fromClient handles a datagram on the public socket. The datagram is at
// buf[encap.MaxLen:][:n]; the header is written into the headroom before it.
// from is already unmapped (udpio does it for every datagram).
func (r *Relay) fromClient(buf []byte, n int, from netip.AddrPort, ingress netip.AddrPort) ([]byte, netip.AddrPort, bool) {
	pkt := buf[encap.MaxLen : encap.MaxLen+n]
	if n == 0 {
		r.m.drops.Inc(dropEmpty)
		return nil, netip.AddrPort{}, false
	}
	f := r.flows.get(from)
	now := r.now.Load()
	// The STUN message is parsed once: Username checks the framing and
	// the type and walks the attributes in one pass. Anything that is not
	// a Binding Request is forwarded opaquely if it belongs to a flow.
	var user []byte
	var stunErr error = stunmsg.ErrNotSTUN
	class := stunmsg.DemuxClass(pkt)
	if class == stunmsg.ClassSTUN {
		user, stunErr = stunmsg.Username(pkt)
	}
	if stunErr != stunmsg.ErrNotSTUN && stunErr != stunmsg.ErrNotBindingRequest {
		tok, ok := r.verify(user, stunErr)
		if !ok {
			return nil, netip.AddrPort{}, false
		}
		if f == nil || f.cluster != tok.Cluster || f.pod != tok.Pod {
			if f = r.openFlow(from, tok, f, now); f == nil {
				return nil, netip.AddrPort{}, false
			}
		}
	} else if f == nil {
		if !r.sourceOK(from) {
			r.m.drops.Inc(dropBadSource)
			return nil, netip.AddrPort{}, false
		}
		if class == stunmsg.ClassRTP {
			// A caller whose NAT rebound: its audio names the SSRC of
			// a flow gone silent (ssrc.go).
			f = r.followSSRC(pkt, from, now)
		}
	}
	if f == nil {
		// Maybe another replica (or this one before a restart) has it:
		// look it up in the background; this datagram is lost either way.
		// Only DTLS and RTP/RTCP can belong to a call; scans and junk must
		// not spend the lookup budget a restart needs.
		if r.cfg.Cache != nil && n >= 12 {
			if class == stunmsg.ClassDTLS || class == stunmsg.ClassRTP {
				r.cfg.Cache.Lookup(from, nil)
			}
		}
		r.m.drops.Inc(dropUnknownFlow)
		return nil, netip.AddrPort{}, false
	}
	keys := r.hopKeys.Load().For(f.cluster)
	if keys == nil {
		r.m.drops.Inc(dropNoHopKey)
		return nil, netip.AddrPort{}, false
	}
	if r.cfg.Cache != nil && now-f.lastStored.Load() >= int64(r.cfg.CacheRefresh) {
		// New flows, and live ones every CacheRefresh: the entry must
		// outlive its TTL for as long as the call runs.
		f.lastStored.Store(now)
		rt := routecache.Route{Cluster: f.cluster, Pod: f.pod, Token: f.tok.nonce, Stored: uint32(now / int64(time.Second))}
		rt.KeyID, rt.Tag = keys.SealRoute(from, f.cluster, f.pod, f.tok.nonce, rt.Stored)
		r.cfg.Cache.Store(from, rt)
	}
	out, hl, relay, ok := r.encapsulate(buf, n, f, from, ingress, now)
	if !ok {
		return nil, netip.AddrPort{}, false
	}
	if class == stunmsg.ClassRTP {
		r.noteSSRC(f, from, pkt, now)
	}
	if stunErr == nil {
		watchCheck(f, now) // a verified Binding Request: the pod must answer it
	}
	keys.Seal(out, hl)
	return out, relay, true
}

// encapsulate picks the flow's cluster relay and writes the header (with
// a zero tag) in front of the datagram at buf[encap.MaxLen:][:n]; the
// caller seals it.
func (r *Relay) encapsulate(buf []byte, n int, f *flow, from, ingress netip.AddrPort, now int64) ([]byte, int, netip.AddrPort, bool) {
	relay, ok := r.relayFor(f, from, now)
	if !ok {
		r.m.drops.Inc(dropNoClusterRelay)
		return nil, 0, netip.AddrPort{}, false
	}
	f.lastSeen.Store(now)
	if f.unconfirmed.Load() {
		f.unconfirmed.Store(false) // the client spoke: replies may go to it
	}
	h := encap.Header{Cluster: f.cluster, Pod: f.pod, POP: r.cfg.POP, Token: f.tok.nonce, Client: from, Ingress: ingress}
	hl := h.Len()
	if _, err := h.Put(buf[encap.MaxLen-hl : encap.MaxLen]); err != nil {
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return nil, 0, netip.AddrPort{}, false
	}
	r.m.toCluster.Inc()
	r.m.toClusterBytes.Add(float64(n))
	return buf[encap.MaxLen-hl : encap.MaxLen+n], hl, relay, true
}

// openFlow creates the flow of a verified token for a client address, in
// place of old (the address's current flow for another cluster or pod, or
// nil). It returns nil, counted, when the source is unusable, the token is
// too old, old is still live (a check must not move a live call), the
// replica drains, or the table or the token's share is full.
func (r *Relay) openFlow(from netip.AddrPort, tok token.Token, old *flow, now int64) *flow {
	switch {
	case !r.sourceOK(from):
		r.m.drops.Inc(dropBadSource)
		return nil
	case r.hopKeys.Load().For(tok.Cluster) == nil:
		// A flow we could not seal for: refuse it before it exists.
		r.m.drops.Inc(dropNoHopKey)
		return nil
	case tok.Expired(time.Unix(0, now), r.cfg.TokenLifetime):
		r.m.drops.Inc(dropTokenExpired)
		return nil
	case old != nil && (now-old.lastSeen.Load() < int64(r.cfg.FlowQuiet) || now-old.created < int64(r.cfg.FlowQuiet)):
		r.m.drops.Inc(dropFlowBusy)
		return nil
	case r.draining.Load():
		r.m.drops.Inc(dropDraining)
		return nil
	}
	nf, _ := r.storeFlow(from, tokenKey{tok.Cluster, tok.Pod, tok.Nonce}, now, true)
	if nf == nil {
		return nil
	}
	r.m.flowsCreated.Inc()
	if old != nil {
		r.m.takeovers.Inc()
	}
	return nf
}

// storeFlow makes a flow of token tk for a client address — replacing the
// address's flow, or only where it has none — and counts a refusal for a
// full table or a token at its cap. The flow is nil unless it was stored.
func (r *Relay) storeFlow(from netip.AddrPort, tk tokenKey, now int64, replace bool) (*flow, putResult) {
	nf := &flow{cluster: tk.cluster, pod: tk.pod, tok: tk, created: now}
	nf.lastSeen.Store(now)
	res := r.flows.store(from, nf, replace)
	switch res {
	case putStored:
		return nf, res
	case putFull:
		r.m.drops.Inc(dropTableFull)
	case putTokenCap:
		r.m.drops.Inc(dropTokenReuse)
	}
	return nil, res
}

// RestoreFlow recreates a flow the route cache found for a client, unless
// the client has a flow by now. It is the cache's OnFound callback. The
// entry must carry a valid MAC under its cluster's hop keys (a process
// that can write to the cache cannot point flows elsewhere), the address
// must be usable, and the flow counts against its token's cap like any
// other.
func (r *Relay) RestoreFlow(client netip.AddrPort, route routecache.Route) {
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	if route.Cluster == 0 {
		return
	}
	if err := r.hopKeys.Load().For(route.Cluster).VerifyRoute(client, route.Cluster, route.Pod, route.Token, route.Stored, route.KeyID, route.Tag); err != nil {
		r.m.cacheRejected.Inc()
		return
	}
	// A live flow's entry is rewritten every CacheRefresh: an older one is
	// a dead flow's, or replayed by someone who can write to the cache.
	// A few seconds "ahead" are clock skew between replicas. The clock is
	// read afresh: the bulk load of the cache comes before Run advances
	// the coarse one.
	age := r.cfg.Now().Unix() - int64(route.Stored)
	if age > int64(3*r.cfg.CacheRefresh/time.Second) || age < -5 {
		r.m.cacheRejected.Inc()
		return
	}
	if !r.sourceOK(client) {
		r.m.cacheRejected.Inc()
		return
	}
	now := r.now.Load()
	nf := &flow{cluster: route.Cluster, pod: route.Pod, tok: tokenKey{route.Cluster, route.Pod, route.Token}, created: now}
	nf.lastSeen.Store(now)
	// The entry is as old as its writer made it: the flow rewrites it a
	// CacheRefresh after that, not after this restore (it would expire
	// meanwhile).
	nf.lastStored.Store(int64(route.Stored) * int64(time.Second))
	switch r.flows.putIfAbsent(client, nf) {
	case putStored:
		r.m.flowsRestoredCache.Inc()
	case putFull:
		r.m.drops.Inc(dropTableFull)
	case putTokenCap:
		r.m.cacheRejected.Inc()
	}
}

// verify checks the routing token of a Binding Request, given its
// USERNAME and the error Username returned for it.
func (r *Relay) verify(user []byte, err error) (token.Token, bool) {
	if err == nil {
		user, err = stunmsg.ServerUfrag(user)
	}
	if err != nil {
		r.m.stunDrops.Inc(stunmsg.ReasonOf(err))
		return token.Token{}, false
	}
	tok, err := r.cfg.Keys.Verify(user)
	if err != nil {
		r.m.tokenDrops.Inc(token.ReasonOf(err))
		return token.Token{}, false
	}
	return tok, true
}

// toClient handles a datagram on an internal socket: a reply on its way to
// a client. It leaves from the public socket without its header. Nothing
// about it is believed before its MAC verifies under the header's
// cluster's hop keys.
func (r *Relay) toClient(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
	pkt := buf[:n]
	h, hl, err := encap.Decode(pkt)
	if err == nil {
		err = r.hopKeys.Load().For(h.Cluster).Verify(pkt, hl)
	}
	switch {
	case err != nil:
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return nil, netip.AddrPort{}, false
	case !h.ToClient:
		r.m.drops.Inc(dropWrongDirection)
		return nil, netip.AddrPort{}, false
	case h.POP != r.cfg.POP:
		r.m.drops.Inc(dropWrongPOP)
		return nil, netip.AddrPort{}, false
	case hl == n:
		r.m.drops.Inc(dropEmpty)
		return nil, netip.AddrPort{}, false
	}
	// Only a cluster relay of the header's own cluster may send toward
	// clients: anyone else reaching this socket could inject into calls.
	if c, ok := r.cfg.Clusters.ClusterOf(from); !ok || c != h.Cluster {
		r.m.drops.Inc(dropNotFromCluster)
		return nil, netip.AddrPort{}, false
	}
	if h.TCP {
		r.tcpToClient(&h, pkt[hl:], from) // written into the client's connection
		return nil, netip.AddrPort{}, false
	}
	f := r.flows.get(h.Client)
	if f == nil {
		// A restarted replica learns the flow back from the first reply;
		// it counts against the token the header names. But a
		// compromised pod can name any client and token: the flow sends
		// nothing until its client sends on it (encapsulate), lives
		// unconfirmedTTL without that, and restores are rate-limited,
		// so a pod can neither spray the Internet from our address nor
		// fill the table. The client's next datagram finds the flow,
		// which is the restore's point.
		if !r.sourceOK(h.Client) {
			r.m.drops.Inc(dropBadSource)
			return nil, netip.AddrPort{}, false
		}
		if !r.restoreBudget() {
			r.m.drops.Inc(dropRestoreLimit)
			return nil, netip.AddrPort{}, false
		}
		nf, res := r.storeFlow(h.Client, tokenKey{h.Cluster, h.Pod, h.Token}, r.now.Load(), false)
		switch res {
		case putFull, putTokenCap:
			return nil, netip.AddrPort{}, false
		case putExists:
			if f = r.flows.get(h.Client); f == nil || f.cluster != h.Cluster || f.pod != h.Pod {
				r.m.drops.Inc(dropFlowMismatch)
				return nil, netip.AddrPort{}, false
			}
		case putStored:
			r.m.flowsRestoredReturn.Inc()
			// The next client datagram confirms it and writes it to
			// the cache (lastStored is zero).
			nf.unconfirmed.Store(true)
			r.watchReply(nf, from, r.now.Load())
			return nil, netip.AddrPort{}, false
		}
	} else if f.cluster != h.Cluster || f.pod != h.Pod {
		r.m.drops.Inc(dropFlowMismatch)
		return nil, netip.AddrPort{}, false
	}
	r.watchReply(f, from, r.now.Load())
	if f.unconfirmed.Load() {
		r.m.drops.Inc(dropUnconfirmed)
		return nil, netip.AddrPort{}, false
	}
	r.m.toClient.Inc()
	r.m.toClientBytes.Add(float64(n - hl))
	return pkt[hl:], h.Client, true
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
	drops                                   *udpio.Drops[dropReason]
	encapDrops                              *udpio.Drops[encap.Reason]
	stunDrops                               *udpio.Drops[stunmsg.Reason]
	tokenDrops                              *udpio.Drops[token.Reason]
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	flows := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rtcedge_globalrelay_flows", Help: "Live flows (client addresses with a route).",
	})
	created := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_flows_created_total", Help: "Flows created from a verified routing token.",
	})
	expired := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_flows_expired_total", Help: "Flows removed after FlowIdle without client packets, or abandoned for a newer address of the same token.",
	})
	followed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_flows_followed_total",
		Help: "Flows opened for a new client address by the RTP SSRC of a silent flow (a NAT rebinding before the client's next check).",
	})
	restored := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_flows_restored_total", Help: "Flows restored after being lost, by source (return_path, cache).",
	}, []string{"source"})
	packets := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_packets_total", Help: "Datagrams forwarded, by direction (to_cluster, to_client).",
	}, []string{"direction"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_bytes_total", Help: "Client payload bytes forwarded (without header), by direction.",
	}, []string{"direction"})
	drops := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_dropped_packets_total", Help: "Datagrams dropped, by reason.",
	}, []string{"reason"})
	writeErrors := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_write_errors_total", Help: "Failed sends.",
	})
	takeovers := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_flow_takeovers_total",
		Help: "Client addresses whose quiet flow a check for another cluster or pod took over.",
	})
	cacheRejected := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_cache_rejected_total",
		Help: "Route-cache entries refused: bad or unknown MAC, unusable client address, or token cap reached.",
	})
	bundles := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_bundles_sent_total", Help: "Bundles sent to cluster relays (Config.Bundle).",
	})
	bundledPackets := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_bundled_packets_total", Help: "Datagrams sent to cluster relays inside bundles.",
	})
	repicks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtcedge_globalrelay_relay_repicks_total",
		Help: "Flows moved to another cluster relay of their cluster on data-plane evidence, by reason (silence: replies stopped; check: a check went unanswered; unanswered: never a reply through the relay; avoided: another flow's evidence).",
	}, []string{"reason"})
	suspects := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rtcedge_globalrelay_relay_suspects",
		Help: "Cluster relays every flow avoids because one left a check unanswered (until they answer or the avoidance ends).",
	})
	m := &metrics{
		repicks: map[string]prometheus.Counter{}, suspects: suspects,
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
	if reg != nil {
		for _, c := range []prometheus.Collector{flows, created, expired, followed, restored, packets, bytes, drops, writeErrors, takeovers, cacheRejected, bundles, bundledPackets, repicks, suspects} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register globalrelay metrics: %w", err)
			}
		}
	}
	return m, nil
}
