package clusterrelay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/metacheck"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/steer"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// Sockets are a cluster relay node's sockets, opened by the caller
// (OpenSockets from the config's addresses, or a test's own); the node
// owns them once NewNode is called.
type Sockets struct {
	Data    *net.UDPConn // the data-plane socket (required)
	API     net.Listener // the session API front (required)
	Metrics net.Listener // nil: no metrics and health endpoints
}

// OpenSockets opens the sockets cfg's addresses name (NewNode validates
// the rest). On error nothing stays open.
func OpenSockets(cfg Config) (Sockets, error) {
	var s Sockets
	data, err := netip.ParseAddrPort(cfg.DataAddr)
	if err == nil {
		s.Data, err = udpio.Listen(data)
	} else {
		err = fmt.Errorf("data_addr %q: %w", cfg.DataAddr, err)
	}
	if err == nil {
		s.API, err = node.Listen("api_addr", cfg.APIAddr)
	}
	if err == nil {
		s.Metrics, err = node.Listen("metrics_addr", cfg.MetricsAddr)
	}
	if err != nil {
		s.Close()
		return Sockets{}, err
	}
	return s, nil
}

// Close closes every socket of s.
func (s Sockets) Close() error {
	var errs []error
	if s.Data != nil {
		errs = append(errs, s.Data.Close())
	}
	for _, ln := range []net.Listener{s.API, s.Metrics} {
		if ln != nil {
			errs = append(errs, ln.Close())
		}
	}
	return errors.Join(errs...)
}

// Node is one cluster relay replica as a process runs it: the relay, the
// cluster's session API front, the cluster pool it learns pods from and the
// global pool it announces itself in.
type Node struct {
	// Static after NewNode.
	cfg         Config
	env         node.Env
	life        node.Life
	relay       *Relay
	dir         *Directory
	apiURL      string
	clusterPool *membership.Pool
	globalPool  *membership.Pool
	// Set once when the drain begins (Run), read by the aggregate
	// publisher.
	stopping atomic.Bool
	// The keys in use, swapped whole by setKeys on a reload (under keyMu,
	// which serialises the watchers' reloads); read lock-free.
	keyMu     sync.Mutex
	auth      atomic.Pointer[relayAuth]
	staticHop atomic.Pointer[encap.Keyring]
}

// ErrNoReadyPod is Ready's answer while the replica knows no ready pod.
var ErrNoReadyPod = errors.New("clusterrelay: no ready pod known")

// NewNode builds a cluster relay node from cfg (defaults applied,
// validated) on s, which it owns from then on. Run starts it.
func NewNode(cfg Config, s Sockets, env node.Env) (_ *Node, err error) {
	env = env.WithDefaults()
	n := &Node{env: env, dir: NewDirectory()}
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
	if s.Data == nil || s.API == nil {
		return nil, errors.New("clusterrelay: the data socket and the API listener are required")
	}
	var data netip.AddrPort
	if _, data, err = node.DataSocket(s.Data, "", cfg.DataAdvertise, env.Logger); err != nil {
		return nil, err
	}
	if err := n.loadKeys(&cfg); err != nil {
		return nil, err
	}
	cfg.Pods, cfg.Advertise, cfg.Logger, cfg.Registerer, n.cfg = n.dir, data, env.Logger, env.Registerer, cfg
	if n.relay, err = New(cfg, s.Data); err != nil {
		return nil, err
	}
	n.life.OnClose(n.relay.Close)
	n.life.Go("relay", n.relay.Run)
	n.watchKeys(cfg)
	steerCfg, err := n.serveAPI(&cfg, s.API)
	if err != nil {
		return nil, err
	}
	n.life.ServeHealth(s.Metrics, env, n.Ready)
	if err := n.joinPools(cfg, data, steerCfg); err != nil {
		return nil, err
	}
	return n, nil
}

// loadKeys sets up the keys the node starts with, all checked by
// Validate: the hop keyring and the cluster's authority.
func (n *Node) loadKeys(cfg *Config) error {
	cfg.Hop, _ = cfg.hopKeyring() // checked by Validate
	if cfg.HopKeys.Set() {
		static, _ := cfg.HopKeys.Keyring(cfg.Cluster) // checked by Validate
		n.staticHop.Store(static)
	}
	if sec, _ := cfg.Authority.Secrets(); sec != nil { // checked by Validate
		a, err := newRelayAuth(sec, cfg.Cluster)
		if err != nil {
			return err
		}
		n.auth.Store(a)
	}
	return nil
}

// watchKeys reloads the hop keys, and the authority's when there is one,
// until the node closes.
func (n *Node) watchKeys(cfg Config) {
	env := n.env
	n.life.Go("hop keys", func(ctx context.Context) error {
		return node.WatchHopKeys(ctx, cfg.HopKeys, env, func(k *encap.ClusterKeys) error {
			hop := k.For(cfg.Cluster)
			if hop == nil {
				return fmt.Errorf("no hop key for cluster %d", cfg.Cluster)
			}
			return n.setKeys(hop, n.auth.Load())
		})
	})
	if n.auth.Load() != nil {
		n.life.Go("authority keys", func(ctx context.Context) error {
			return node.WatchAuthority(ctx, cfg.Authority, env, func(sec *authority.Secrets) error {
				a, err := newRelayAuth(sec, cfg.Cluster)
				if err != nil {
					return err
				}
				return n.setKeys(n.staticHop.Load(), a)
			})
		})
	}
}

// serveAPI serves the session API (the front to the cluster's pods) on
// ln. With an authority, the front, the steering forwarder it returns the
// config of and the cluster pool's proofs read the keys in use.
func (n *Node) serveAPI(cfg *Config, ln net.Listener) (SteerForwarderConfig, error) {
	env := n.env
	steerCfg := SteerForwarderConfig{Cluster: cfg.Cluster, Now: env.Now,
		Admitted: func(pod uint16) bool { _, ok := n.dir.PodAddr(pod); return ok }}
	podClient, err := cfg.APITLS.Client(env.HTTPClient)
	if err != nil {
		return steerCfg, err
	}
	fc := FrontConfig{Cluster: cfg.Cluster, Pods: n.dir, Secret: cfg.SessionAPISecret, HTTPClient: podClient, Logger: env.Logger, Now: env.Now}
	if n.auth.Load() != nil {
		fc.Steer = func() *steer.Authority { return n.auth.Load().steer }
		steerCfg.Authority = fc.Steer
		// Every use reads the keys in use, so a reload (setKeys) takes
		// effect at once.
		cluster := cfg.Cluster
		fc.PodSecret = func(pod uint16) string { return n.auth.Load().sec.SessionAPICredential(cluster, pod) }
		cfg.ClusterGossip.Prove = func(in []byte) []byte { return n.auth.Load().clusterProve(in) }
		cfg.ClusterGossip.CheckMember = func(m membership.Member, in []byte) error { return n.auth.Load().clusterCheck(m, in) }
	}
	front := NewFront(fc)
	if n.apiURL, err = node.AdvertisedURL(ln, cfg.APIAdvertise); err != nil {
		return steerCfg, err
	}
	n.apiURL = cfg.APITLS.URL(n.apiURL)
	api, err := cfg.APITLS.Listener(ln)
	if err != nil {
		return steerCfg, err
	}
	n.life.Serve("session API", api, node.NewHTTPServer(front.Handler(), env.Logger))
	n.life.OnClose(func() error { front.Close(); return nil }) // sideband relays, after the server
	return steerCfg, nil
}

// joinPools joins the cluster pool (where the pods are) and the global
// pool (where the global relays and signaling are) with its data address,
// forwards the pods' steering samples from one to the other, follows the
// pods and publishes the cluster's aggregate.
func (n *Node) joinPools(cfg Config, data netip.AddrPort, steerCfg SteerForwarderConfig) (err error) {
	env := n.env
	meta := membership.Meta{Role: membership.RoleClusterRelay, Region: cfg.Region, Cluster: cfg.Cluster, Data: data}
	// Members are believed only within bounds (internal/metacheck).
	cfg.ClusterGossip.CheckMeta = metacheck.OfCluster(cfg.Cluster, metacheck.Bounds{})
	cfg.GlobalGossip.CheckMeta = metacheck.Bounded(metacheck.Bounds{})
	if n.clusterPool, err = n.life.JoinPool(cfg.ClusterGossip, "cluster", "", false, meta, env); err != nil {
		return err
	}
	meta.API, meta.Draining = n.apiURL, true // draining until it hears of a ready pod (PublishAggregate)
	if n.auth.Load() != nil {
		// In the global pool it speaks for its own cluster only (its
		// relay key), and believes signaling only on signaling's key
		// when it has the public key (internal/authority, global.go).
		cfg.GlobalGossip.Prove = func(in []byte) []byte { return n.auth.Load().globalProve(in) }
		cfg.GlobalGossip.CheckMember = func(m membership.Member, in []byte) error { return n.auth.Load().globalCheck(m, in) }
	}
	if n.globalPool, err = n.life.JoinPool(cfg.GlobalGossip, "global", "@global", true, meta, env); err != nil {
		return err
	}
	fwd, err := NewSteerForwarder(n.clusterPool, n.globalPool, steerCfg, env.Registerer)
	if err != nil {
		return err
	}
	n.life.Go("steering samples", fwd.Run)
	n.life.Go("follow pods", func(ctx context.Context) error {
		FollowPods(ctx, n.clusterPool, cfg.Cluster, n.dir, env.Logger)
		return nil
	})
	n.life.Go("publish aggregate", func(ctx context.Context) error {
		PublishAggregate(ctx, n.globalPool, n.dir, n.stopping.Load)
		return nil
	})
	return nil
}

// relayAuth is what a cluster relay builds from its authority secrets;
// a reload swaps in a new one whole.
type relayAuth struct {
	sec                       *authority.Secrets
	steer                     *steer.Authority // mints tickets, checks reports
	clusterProve, globalProve func([]byte) []byte
	clusterCheck, globalCheck func(membership.Member, []byte) error
}

func newRelayAuth(sec *authority.Secrets, cluster uint16) (a *relayAuth, err error) {
	a = &relayAuth{sec: sec, globalCheck: sec.GlobalCheck(false)}
	if a.clusterProve, err = sec.RelayProve(cluster); err != nil {
		return nil, err
	}
	if a.clusterCheck, err = sec.CheckMember(cluster); err != nil {
		return nil, err
	}
	if a.globalProve, err = sec.GlobalProve(membership.Meta{Role: membership.RoleClusterRelay, Cluster: cluster}); err != nil {
		return nil, err
	}
	if a.steer, err = sec.SteerAuthority(cluster); err != nil {
		return nil, err
	}
	return a, nil
}

// setKeys applies reloaded keys: the static hop keys (hop_keys) and the
// authority's (nil: none), merged into the relay's keyring; a new
// authority also proves the node's metadata again in both pools, under
// its current key ID, and checks every member again (Pool.Recheck). A
// clash between the two keeps everything in use.
func (n *Node) setKeys(static *encap.Keyring, a *relayAuth) error {
	n.keyMu.Lock()
	defer n.keyMu.Unlock()
	hop := static
	if a != nil {
		var err error
		if hop, err = a.sec.HopKeyring(n.cfg.Cluster, static); err != nil {
			return err
		}
	}
	n.staticHop.Store(static)
	n.relay.SetHopKeys(hop)
	if a != nil && a != n.auth.Load() {
		n.auth.Store(a)
		for _, p := range []*membership.Pool{n.clusterPool, n.globalPool} {
			if p != nil {
				_ = p.UpdateMeta(func(*membership.Meta) {}) // ErrLeft while stopping: nothing to prove
				p.Recheck()
			}
		}
	}
	return nil
}

// Run runs the node until ctx ends, then drains: it announces draining in
// the global pool (global relays move its flows; it holds no flow state),
// waits DrainAnnounce (at most drain_timeout), leaves both pools and stops.
func (n *Node) Run(ctx context.Context) error {
	log := n.env.Logger
	log.Info("cluster relay up", "cluster", n.cfg.Cluster, "data", n.relay.Addr(), "api", n.apiURL,
		"cluster_gossip", n.clusterPool.LocalAddr(), "global_gossip", n.globalPool.LocalAddr())
	return n.life.Run(ctx, log, func(failed context.Context) {
		log.Info("draining")
		n.stopping.Store(true)
		node.SetDraining(n.globalPool, log)
		node.Sleep(failed, min(n.cfg.DrainTimeout, DrainAnnounce))
		node.Leave(n.globalPool, log)
		node.Leave(n.clusterPool, log)
	})
}

// Close stops the node at once, without a goodbye to either pool.
func (n *Node) Close() error { return n.life.Close() }

// Ready reports whether the replica can do its job: it knows a ready pod
// of its cluster and is not stopping.
func (n *Node) Ready() error {
	switch {
	case n.life.Closed():
		return node.ErrClosed
	case n.stopping.Load():
		return errors.New("clusterrelay: draining")
	}
	if _, _, ready := n.dir.Aggregate(); ready == 0 {
		return ErrNoReadyPod
	}
	return nil
}

// Relay is the node's packet relay.
func (n *Node) Relay() *Relay { return n.relay }

// Directory is the node's view of its cluster's pods.
func (n *Node) Directory() *Directory { return n.dir }

// APIURL is the advertised base URL of the session API front.
func (n *Node) APIURL() string { return n.apiURL }

// ClusterPool is the node's membership of the cluster pool.
func (n *Node) ClusterPool() *membership.Pool { return n.clusterPool }

// GlobalPool is the node's membership of the global pool.
func (n *Node) GlobalPool() *membership.Pool { return n.globalPool }
