package globalrelay

// The global relay as a process runs it (Node): the relay, its route
// cache, gossip, key reloads, readiness and drain, built from the sockets
// cmd/ or the dev world opens.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/metacheck"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// Sockets are a global relay node's sockets, opened by the caller
// (OpenSockets from the config's addresses, or a test's own); the node
// owns them once NewNode is called.
type Sockets struct {
	Workers []Worker     // public/internal socket pairs (at least one)
	Metrics net.Listener // nil: no metrics and health endpoints
	TCP     net.Listener // the TCP ingress listener (ICE-TCP); nil: none
}

// OpenSockets opens the sockets cfg's addresses name (defaults applied):
// the workers' public/internal pairs with cfg's steering, the metrics
// listener (none without metrics_addr) and the TCP ingress (none without
// tcp_addr). On error nothing stays open.
func OpenSockets(cfg Config) (s Sockets, err error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return Sockets{}, err
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	internal, _ := cfg.internal() // checked by Validate
	pubs, ins, err := udpio.ListenWorkerPairs(netip.MustParseAddrPort(cfg.PublicAddr), internal, cfg.Workers)
	if err != nil {
		return Sockets{}, err
	}
	for i := range pubs {
		s.Workers = append(s.Workers, Worker{Public: pubs[i], Internal: ins[i]})
	}
	steering, _ := udpio.ParseSteering(cfg.Steering) // checked by Validate
	if err := udpio.Steer(pubs, steering, cfg.CPUs); err != nil {
		return s, err
	}
	if s.Metrics, err = node.Listen("metrics_addr", cfg.MetricsAddr); err != nil {
		return s, err
	}
	if ap, ok, _ := cfg.tcpAddr(); ok { // checked by Validate
		if s.TCP, err = ListenTCP(ap); err != nil {
			return s, fmt.Errorf("tcp_addr: %w", err)
		}
	}
	return s, nil
}

// Close closes every socket of s.
func (s Sockets) Close() error {
	var errs []error
	for _, w := range s.Workers {
		errs = append(errs, w.Public.Close(), w.Internal.Close())
	}
	for _, ln := range []net.Listener{s.Metrics, s.TCP} {
		if ln != nil {
			errs = append(errs, ln.Close())
		}
	}
	return errors.Join(errs...)
}

// ErrNoClusterRelay is Ready's answer (wrapped, naming the cluster) while
// the replica knows no live cluster relay of a cluster it serves.
var ErrNoClusterRelay = errors.New("globalrelay: no live cluster relay known")

// ErrRestoring is Ready's answer while the replica loads its POP's routes
// from the route cache.
var ErrRestoring = errors.New("globalrelay: loading routes from the route cache")

// RestoreLimit bounds the bulk load of the route cache at start; after it
// the replica reports ready anyway and recovers the rest by lookups.
const RestoreLimit = 5 * time.Second

// Node is one global relay replica as a process runs it: the relay, its
// route cache, and its membership of the global pool, from which it
// learns the cluster relays.
type Node struct {
	// Static after NewNode.
	cfg      Config
	env      node.Env
	life     node.Life
	relay    *Relay
	tcp      *TCP // nil without a TCP ingress
	clusters *Clusters
	served   []uint16
	pool     *membership.Pool
	// Set once each (warm by Ready itself, restored by the route cache's
	// load), read by Ready.
	warm     atomic.Bool // Ready's start-up gate has passed
	restored atomic.Bool // the bulk load of the route cache is over (or there is none)
	// The keys in use, swapped by setKeys on a reload (under keyMu, which
	// serialises the watchers' reloads); read lock-free.
	keyMu     sync.Mutex
	staticTok *token.Keyring // token.keys (not reloaded); nil: none
	staticHop atomic.Pointer[encap.ClusterKeys]
	auth      atomic.Pointer[popAuth]
}

// NewNode builds a global relay node from cfg (defaults applied,
// validated) on s, which it owns from then on. Run starts it.
func NewNode(cfg Config, s Sockets, env node.Env) (_ *Node, err error) {
	n := &Node{env: env.WithDefaults(), clusters: NewClusters(nil)}
	env = n.env
	n.life.OnClose(s.Close)
	defer func() {
		if err != nil {
			n.life.Close()
		}
	}()
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(s.Workers) == 0 {
		return nil, errors.New("globalrelay: no worker sockets")
	}
	node.WarnSmallBuffer(env.Logger, s.Workers[0].Public)
	meta := membership.Meta{Role: membership.RoleGlobalRelay, Region: cfg.Region, POP: cfg.POP}
	if err := n.loadKeys(&cfg, meta); err != nil {
		return nil, err
	}
	cfg.Directory, cfg.Logger, cfg.Registerer, cfg.Now = n.clusters, env.Logger, env.Registerer, env.Now
	cache, err := n.openCache(cfg)
	if err != nil {
		return nil, err
	}
	cfg.Cache, n.cfg = cache, cfg
	if n.relay, err = New(cfg, s.Workers); err != nil {
		return nil, err
	}
	n.life.OnClose(n.relay.Close)
	if s.TCP != nil {
		if err := n.openTCP(cfg, s.TCP, env); err != nil {
			return nil, err
		}
	}
	n.restoreFlows(cache)
	n.life.Go("relay", func(ctx context.Context) error {
		n.awaitReady(ctx)
		return n.relay.Run(ctx)
	})
	// The UDP load balancer's health check reads /readyz: a replica gets
	// clients once it knows where to send them, and none while draining.
	n.life.ServeHealth(s.Metrics, env, n.Ready)
	meta.Data = n.relay.PublicAddr()
	if err := n.joinGlobal(cfg, meta); err != nil {
		return nil, err
	}
	return n, nil
}

// loadKeys sets up the keys the node starts with, all checked by
// Validate: the clusters it serves, the token and hop keyrings, and the
// POP's authority (which proves its metadata in gossip).
func (n *Node) loadKeys(cfg *Config, meta membership.Meta) (err error) {
	if n.served, err = cfg.servedClusters(); err != nil {
		return err
	}
	cfg.Keys, _ = cfg.tokenKeyring() // checked by Validate
	cfg.Hop, _ = cfg.clusterKeys()   // checked by Validate
	if len(cfg.Token.Keys) > 0 {
		n.staticTok, _ = cfg.Token.Keyring() // checked by Validate
	}
	if cfg.HopKeys.Set() {
		static, _ := cfg.HopKeys.ClusterKeys() // checked by Validate
		n.staticHop.Store(static)
	}
	if sec, _ := cfg.Authority.Secrets(); sec != nil { // checked by Validate
		a, err := newPOPAuth(sec, meta)
		if err != nil {
			return err
		}
		if a.prove == nil {
			n.env.Logger.Warn("no authority key of this POP: its metadata goes unproven, and signaling holding POP keys ignores it", "pop", cfg.POP)
		}
		n.auth.Store(a)
	}
	return nil
}

// openCache opens the route cache the config names (Redis, or a shared
// in-process store), nil for none, and runs it until the node closes.
// Flows it finds are restored into the relay.
func (n *Node) openCache(cfg Config) (routecache.Cache, error) {
	var cache routecache.Cache
	var err error
	ccfg := routecache.Config{Logger: n.env.Logger, Registerer: n.env.Registerer,
		OnFound: func(c netip.AddrPort, r routecache.Route) { n.relay.RestoreFlow(c, r) }}
	switch {
	case cfg.RedisURL != "":
		cache, err = routecache.Open(cfg.RedisURL, ccfg)
	case cfg.CacheStore != nil:
		cache, err = routecache.NewMemoryOn(cfg.CacheStore, ccfg)
	}
	if err != nil {
		return nil, err
	}
	if cache != nil {
		n.life.OnClose(cache.Close)
		n.life.Go("route cache", cache.Run)
	}
	return cache, nil
}

// restoreFlows takes the POP's recent flows from the cache in bulk, when
// it can, before the node reports ready: a restarted replica then needs
// no lookup per lost datagram. Without such a cache the node is restored
// at once.
func (n *Node) restoreFlows(cache routecache.Cache) {
	loader, ok := cache.(routecache.Loader)
	if !ok {
		n.restored.Store(true)
		return
	}
	n.life.Go("route cache load", func(ctx context.Context) error {
		defer n.restored.Store(true)
		ctx, cancel := context.WithTimeout(ctx, RestoreLimit)
		defer cancel()
		if k, err := loader.Load(ctx); err != nil {
			n.env.Logger.Warn("route cache load failed; flows recover by lookups", "restored", k, "err", err)
		}
		return nil
	})
}

// joinGlobal joins the global gossip pool as meta, follows the cluster
// relays it lists, and watches the hop and authority keys.
func (n *Node) joinGlobal(cfg Config, meta membership.Meta) (err error) {
	env := n.env
	cfg.Gossip.CheckMeta = metacheck.Bounded(metacheck.Bounds{}) // believed only within bounds
	if n.auth.Load() != nil {
		// It proves its POP with the POP's key, and takes for a cluster
		// relay of a cluster it holds the secret of only a member proven
		// by that cluster's relay key, on its own gossip address. Every
		// use reads the keys in use (setKeys swaps them).
		cfg.Gossip.Prove = func(in []byte) []byte {
			if p := n.auth.Load().prove; p != nil {
				return p(in)
			}
			return nil
		}
		cfg.Gossip.CheckMember = func(m membership.Member, in []byte) error { return n.auth.Load().check(m, in) }
	}
	if n.pool, err = n.life.JoinPool(cfg.Gossip, "global", "", true, meta, env); err != nil {
		return err
	}
	n.life.Go("follow clusters", func(ctx context.Context) error { FollowClusters(ctx, n.pool, n.clusters); return nil })
	n.life.Go("hop keys", func(ctx context.Context) error {
		return node.WatchHopKeys(ctx, cfg.HopKeys, env, func(k *encap.ClusterKeys) error { return n.setKeys(k, n.auth.Load()) })
	})
	if n.auth.Load() != nil {
		n.life.Go("authority keys", func(ctx context.Context) error {
			return node.WatchAuthority(ctx, cfg.Authority, env, func(sec *authority.Secrets) error {
				a, err := newPOPAuth(sec, meta)
				if err != nil {
					return err
				}
				return n.setKeys(n.staticHop.Load(), a)
			})
		})
	}
	return nil
}

// popAuth is what a global relay builds from its authority secrets; a
// reload swaps in a new one whole.
type popAuth struct {
	sec   *authority.Secrets
	prove func([]byte) []byte // nil: no key of this POP
	check func(membership.Member, []byte) error
}

func newPOPAuth(sec *authority.Secrets, meta membership.Meta) (*popAuth, error) {
	prove, err := sec.GlobalProve(meta)
	if err != nil {
		return nil, err
	}
	return &popAuth{sec: sec, prove: prove, check: sec.GlobalCheck(false)}, nil
}

// setKeys applies reloaded keys: the static hop keys (hop_keys) and the
// authority's (nil: none), merged into the relay's token and hop
// keyrings; a new authority also proves the node's metadata again under
// its current key and checks every member again (Pool.Recheck). A set without a key of a served cluster, or a clash
// between the two, keeps everything in use.
func (n *Node) setKeys(static *encap.ClusterKeys, a *popAuth) error {
	n.keyMu.Lock()
	defer n.keyMu.Unlock()
	hop, tok := static, n.staticTok
	if a != nil {
		var err error
		if hop, err = a.sec.ClusterKeys(static); err != nil {
			return err
		}
		if tok, err = a.sec.TokenKeyring(n.staticTok); err != nil {
			return err
		}
	}
	for _, cl := range n.cfg.Clusters {
		if hop.For(cl) == nil {
			return fmt.Errorf("no hop key for served cluster %d", cl)
		}
	}
	n.staticHop.Store(static)
	n.relay.SetHopKeys(hop)
	n.relay.SetTokenKeys(tok)
	if a != nil && a != n.auth.Load() {
		n.auth.Store(a)
		if n.pool != nil {
			_ = n.pool.UpdateMeta(func(*membership.Meta) {}) // ErrLeft while stopping: nothing to prove
			n.pool.Recheck()
		}
	}
	return nil
}

// awaitReady holds back forwarding until the replica is ready (or
// draining), ReadyWait passes or ctx ends: datagrams wait in the socket buffers meanwhile,
// rather than being dropped for want of a cluster relay.
func (n *Node) awaitReady(ctx context.Context) {
	deadline := time.NewTimer(n.cfg.ReadyWait)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for n.Ready() != nil && !n.relay.Draining() { // a drain forwards what flows there are
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			n.env.Logger.Warn("forwarding before ready", "err", n.Ready())
			return
		case <-tick.C:
		}
	}
}

// Run runs the node until ctx ends, then drains: no new flows (readiness
// and gossip say draining), existing flows are forwarded until they end or
// drain_timeout passes, the replica leaves the pool, and everything stops.
func (n *Node) Run(ctx context.Context) error {
	log := n.env.Logger
	up := []any{"pop", n.cfg.POP, "public", n.relay.PublicAddr(), "workers", n.cfg.Workers, "gossip", n.pool.LocalAddr()}
	if n.tcp != nil {
		up = append(up, "tcp", n.tcp.Addr())
	}
	log.Info("global relay up", up...)
	return n.life.Run(ctx, log, func(failed context.Context) {
		log.Info("draining", "flows", n.relay.Flows(), "deadline", n.cfg.DrainTimeout)
		n.relay.Drain()
		if n.tcp != nil {
			n.tcp.Drain() // open connections go on; new ones try the backup POP
		}
		node.SetDraining(n.pool, log)
		deadline := time.NewTimer(n.cfg.DrainTimeout)
		defer deadline.Stop()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
	wait:
		for n.relay.Flows() > 0 || n.TCPConns() > 0 {
			select {
			case <-deadline.C:
				log.Warn("drain deadline passed", "flows", n.relay.Flows())
				break wait
			case <-failed.Done():
				break wait
			case <-tick.C:
			}
		}
		node.Leave(n.pool, log)
	})
}

// Close stops the node at once, without a goodbye to the pool.
func (n *Node) Close() error { return n.life.Close() }

// Ready reports whether the replica can take clients: not draining, and it
// has known a live (alive, not draining) cluster relay of every cluster it
// serves (Config.Clusters), or of any cluster when none is configured.
// That is a start-up gate, latched once passed: a cluster that later
// loses all its relays must not make every replica of every POP report
// not ready, which would take the other clusters' calls down with it
// (its own flows are dropped as no_cluster_relay, counted, until a relay
// is back).
func (n *Node) Ready() error {
	switch {
	case n.life.Closed():
		return node.ErrClosed
	case n.relay.Draining():
		return errors.New("globalrelay: draining")
	case !n.restored.Load():
		return ErrRestoring
	case n.warm.Load():
		return nil
	}
	if err := n.knowsClusters(); err != nil {
		return err
	}
	n.warm.Store(true)
	return nil
}

// knowsClusters reports whether a live relay of every served cluster is
// known now.
func (n *Node) knowsClusters() error {
	if len(n.served) == 0 {
		if n.clusters.live(0) == 0 {
			return ErrNoClusterRelay
		}
		return nil
	}
	for _, c := range n.served {
		if n.clusters.live(c) == 0 {
			return fmt.Errorf("%w: cluster %d", ErrNoClusterRelay, c)
		}
	}
	return nil
}

// openTCP starts the TCP ingress on ln.
func (n *Node) openTCP(cfg Config, ln net.Listener, env node.Env) error {
	tc := cfg.TCP
	tc.Registerer = env.Registerer
	s, err := NewTCP(n.relay, ln, tc)
	if err != nil {
		return err
	}
	n.tcp = s
	n.life.OnClose(s.Close)
	n.life.Go("tcp ingress", s.Run)
	return nil
}

// TCP is the node's TCP ingress, nil without one.
func (n *Node) TCP() *TCP { return n.tcp }

// TCPConns returns the open TCP connections (0 without a TCP ingress).
func (n *Node) TCPConns() int {
	if n.tcp == nil {
		return 0
	}
	return n.tcp.Conns()
}

// Relay is the node's packet relay.
func (n *Node) Relay() *Relay { return n.relay }

// Pool is the node's membership of the global pool.
func (n *Node) Pool() *membership.Pool { return n.pool }
