package transceiver

// The transceiver as a node: the sockets and backend it is given, its
// lifecycle and readiness.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/metacheck"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/transceiver/podnet"
)

// RelaySet is the set of cluster relays whose datagrams the pod accepts.
type RelaySet = podnet.RelaySet

// Errors Ready reports.
var (
	ErrNoRelay = errors.New("transceiver: no cluster relay known")
)

// Node is one transceiver pod as a process runs it: the transceiver, its
// session API, and its membership of the cluster pool.
type Node struct {
	cfg     Config
	env     node.Env
	life    node.Life
	tr      *Transceiver
	backend backend.Backend
	relays  *RelaySet
	pool    *membership.Pool
	apiURL  string
	data    netip.AddrPort
}

// NewNode builds a transceiver node from cfg (defaults applied, validated)
// on the sockets of OpenSockets (Data and API required; it owns them from
// then on), bridging its sessions to backend. Run starts it.
func NewNode(cfg Config, s Sockets, backend backend.Backend, env node.Env) (_ *Node, err error) {
	env = env.WithDefaults()
	cfg.Backend, cfg.Logger, cfg.Registerer, cfg.Now = backend, env.Logger, env.Registerer, env.Now
	if cfg.TurnRegisterer == nil {
		cfg.TurnRegisterer = env.Registerer
	}
	cfg.Relays = &RelaySet{}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if s.Data == nil || s.API == nil {
		return nil, errors.New("transceiver node: data and API sockets are required (OpenSockets)")
	}
	if err := podID(&cfg); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, env: env, backend: backend, relays: cfg.Relays}
	n.life.OnClose(s.close)
	defer func() {
		if err != nil {
			n.life.Close()
		}
	}()
	if s.Data, n.data, err = node.DataSocket(s.Data, cfg.DataAddr, cfg.DataAdvertise, env.Logger); err != nil {
		return nil, err
	}
	if cfg.RouteCache, err = openRouteCache(cfg, env); err != nil {
		return nil, err
	}
	if c := cfg.RouteCache; c != nil {
		n.life.OnClose(c.Close)
		n.life.Go("route cache", c.Run)
	}
	if n.tr, err = New(cfg, s.Data); err != nil {
		return nil, err
	}
	n.life.OnClose(n.tr.Close)
	n.life.Go("transceiver", n.tr.Run)
	n.life.Go("hop keys", func(ctx context.Context) error {
		return node.WatchHopKeys(ctx, cfg.HopKeys, env, func(k *encap.ClusterKeys) error {
			hop := k.For(cfg.Cluster)
			if hop == nil {
				return fmt.Errorf("no hop key for cluster %d", cfg.Cluster)
			}
			n.tr.sock.SetHopKeys(hop)
			return nil
		})
	})
	if n.apiURL, err = node.AdvertisedURL(s.API, cfg.APIAdvertise); err != nil {
		return nil, err
	}
	n.apiURL = cfg.APITLS.URL(n.apiURL)
	api, err := cfg.APITLS.Listener(s.API)
	if err != nil {
		return nil, err
	}
	n.life.Serve("session API", api, node.NewHTTPServer(n.tr.Handler(), env.Logger))
	n.life.ServeHealth(s.Metrics, env, n.Ready)
	cfg.Gossip.CheckMeta = metacheck.OfCluster(cfg.Cluster, metacheck.Bounds{}) // believed only within bounds
	if k := cfg.PodKeys; k != nil {
		// The pod proves its own metadata and believes only relays the
		// authority's relay key proves (internal/authority).
		if cfg.Gossip.Prove, err = k.Prove(); err != nil {
			return nil, err
		}
		if cfg.Gossip.CheckMember, err = k.CheckMember(); err != nil {
			return nil, err
		}
	}
	if n.pool, err = n.life.JoinPool(cfg.Gossip, "cluster", "", false, membership.Meta{
		Role: membership.RoleTransceiver, Region: cfg.Region, Cluster: cfg.Cluster, Pod: cfg.Pod,
		Data: n.data, API: n.apiURL, Capacity: n.tr.cfg.MaxSessions,
	}, env); err != nil {
		return nil, err
	}
	n.life.Go("publish", func(ctx context.Context) error { n.tr.Publish(ctx, n.pool); return nil })
	n.life.Go("rtt reports", func(ctx context.Context) error { n.tr.ReportRTT(ctx, n.pool); return nil })
	n.life.Go("follow relays", func(ctx context.Context) error {
		FollowRelays(ctx, n.pool, cfg.Cluster, n.relays)
		return nil
	})
	return n, nil
}

// Run runs the node until ctx ends, then drains: no new sessions (gossip
// and readiness say so), calls go on until they end or drain_timeout
// passes (then the rest are ended), the pod leaves the cluster pool, and
// everything stops.
func (n *Node) Run(ctx context.Context) error {
	log := n.env.Logger
	log.Info("transceiver up", "cluster", n.cfg.Cluster, "pod", n.cfg.Pod, "data", n.data, "api", n.apiURL, "gossip", n.pool.LocalAddr())
	return n.life.Run(ctx, log, func(failed context.Context) {
		log.Info("draining", "sessions", n.tr.Sessions(), "deadline", n.cfg.DrainTimeout)
		drained := n.tr.Drain()
		t := time.NewTimer(n.cfg.DrainTimeout)
		select {
		case <-drained:
			log.Info("drained")
		case <-t.C:
			log.Warn("drain deadline passed; ending remaining sessions", "sessions", n.tr.Sessions())
			n.tr.endAll(endDrainDeadline)
		case <-failed.Done():
		}
		t.Stop()
		node.Leave(n.pool, log)
	})
}

// Close stops the node at once: sessions end, the pool closes without a
// goodbye.
func (n *Node) Close() error { return n.life.Close() }

// Ready reports whether the pod can take sessions: not draining, its
// backend reachable, and at least one cluster relay known to deliver them.
func (n *Node) Ready() error {
	switch {
	case n.life.Closed():
		return node.ErrClosed
	case n.tr.Draining():
		return ErrDraining
	case n.relays.Len() == 0:
		return ErrNoRelay
	}
	if rb, ok := n.backend.(backend.Ready); ok {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := rb.Ready(ctx); err != nil {
			return fmt.Errorf("transceiver: backend: %w", err)
		}
	}
	return nil
}

// Transceiver is the node's transceiver.
func (n *Node) Transceiver() *Transceiver { return n.tr }

// Relays is the set of cluster relays the pod accepts datagrams from.
func (n *Node) Relays() *RelaySet { return n.relays }

// Pool is the node's membership of the cluster pool.
func (n *Node) Pool() *membership.Pool { return n.pool }

// APIURL is the advertised base URL of the pod's session API.
func (n *Node) APIURL() string { return n.apiURL }

// Data is the advertised address of the pod's UDP socket.
func (n *Node) Data() netip.AddrPort { return n.data }

// ID is the pod's ID.
func (n *Node) ID() uint16 { return n.cfg.Pod }

// openRouteCache opens the route cache phone calls' routes are written to
// (Config.RedisURL, else CacheStore); nil when neither is set. The pod only
// writes: it looks nothing up.
func openRouteCache(cfg Config, env node.Env) (routecache.Cache, error) {
	ccfg := routecache.Config{Logger: env.Logger, Registerer: env.Registerer}
	switch {
	case cfg.RouteCache != nil:
		return cfg.RouteCache, nil
	case cfg.RedisURL != "":
		c, err := routecache.Open(cfg.RedisURL, ccfg)
		if err != nil {
			return nil, fmt.Errorf("route cache: %w", err)
		}
		return c, nil
	case cfg.CacheStore != nil:
		c, err := routecache.NewMemoryOn(cfg.CacheStore, ccfg)
		if err != nil {
			return nil, fmt.Errorf("route cache: %w", err)
		}
		return c, nil
	}
	return nil, nil
}
