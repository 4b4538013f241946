package signaling

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/metacheck"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// Sockets are a signaling node's listeners: HTTP (required) and Metrics
// (nil: no metrics listener). OpenSockets opens those a config names.
type Sockets struct {
	HTTP    net.Listener
	Metrics net.Listener
}

// OpenSockets checks cfg and opens its listeners: listen_addr and, when
// set, metrics_addr. On error none stays open.
func OpenSockets(cfg Config) (s Sockets, err error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return s, err
	}
	if s.HTTP, err = node.Listen("listen_addr", cfg.ListenAddr); err != nil {
		return s, err
	}
	if s.Metrics, err = node.Listen("metrics_addr", cfg.MetricsAddr); err != nil {
		s.HTTP.Close()
		return Sockets{}, err
	}
	return s, nil
}

// Node is one signaling replica as a process runs it: the HTTP front, the
// GeoIP locator, and (optionally) its membership of the global pool, from
// which it learns cluster and POP health.
type Node struct {
	// Static after NewNode.
	cfg  Config
	env  node.Env
	life node.Life
	srv  *Server
	pool *membership.Pool
	url  string
	// Set once when the drain begins, read by Ready.
	draining atomic.Bool
	// Swapped whole by the authority's reload, read lock-free.
	auth atomic.Pointer[globalAuth] // the global pool's keys in use (nil: none)
}

// NewNode builds a signaling node from cfg (defaults applied, validated)
// on s, which it owns from the call on (it closes them on error too). Run
// starts it.
func NewNode(cfg Config, s Sockets, env node.Env) (_ *Node, err error) {
	env = env.WithDefaults()
	log := env.Logger
	n := &Node{env: env}
	for _, ln := range []net.Listener{s.HTTP, s.Metrics} {
		if ln != nil {
			n.life.OnClose(ln.Close)
		}
	}
	defer func() {
		if err != nil {
			n.life.Close()
		}
	}()
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if s.HTTP == nil {
		return nil, errors.New("signaling: no HTTP listener (OpenSockets opens listen_addr)")
	}
	if cfg.CatalogueData == nil {
		if cfg.CatalogueData, err = geo.LoadCatalogue(cfg.Catalogue); err != nil {
			return nil, err
		}
	}
	cloudflare, internal, _ := cfg.proxies() // checked by Validate
	if cfg.Locator, err = geo.NewLocator(geo.LocatorConfig{DBPath: cfg.GeoIPDB, DB: cfg.GeoIPData,
		CloudflareRanges: cloudflare, InternalProxies: internal, Default: cfg.CatalogueData.DefaultLocation(), Logger: log}); err != nil {
		return nil, err
	}
	n.life.OnClose(cfg.Locator.Close)
	n.life.Go("geoip reload", cfg.Locator.Run)
	// Warns once when Cloudflare proxies requests without the visitor
	// location headers (the zone's managed transform is off).
	cfCheck, err := geo.NewCFHeaderCheck(geo.CFHeaderCheckConfig{Proxies: slices.Concat(cloudflare, internal), Logger: log, Registerer: env.Registerer})
	if err != nil {
		return nil, err
	}
	if cfg.AllowAnonymous {
		log.Warn("allow_anonymous: anyone can place calls and mint client secrets (dev only)")
	}
	if cfg.AnyAPIKey {
		log.Warn("any bearer key is accepted as an anonymous caller's (dev only)")
	}
	cfg.Logger, cfg.Registerer, cfg.Now = log, env.Registerer, env.Now
	if cfg.HTTPClient, err = cfg.SessionAPITLS.Client(env.HTTPClient); err != nil {
		return nil, err
	}
	if cfg.Gossip.Bind != "" {
		if err := n.joinGossip(&cfg); err != nil {
			return nil, err
		}
	}
	if n.srv, err = New(cfg); err != nil {
		return nil, err
	}
	n.life.OnClose(func() error { n.srv.Close(); return nil }) // the sideband relays, after the HTTP server
	if n.pool != nil {
		// Samples from the pods (via the cluster relays) and from the
		// other replicas' probes, signed by their roles' keys.
		if n.auth.Load() != nil {
			n.srv.setSteerKeys(func() (*steer.Signer, *steer.Verifier) { a := n.auth.Load(); return a.steerSigner, a.steerVerifier })
		}
		n.pool.SetHandler(n.srv.receiveSamples)
	}
	n.cfg, n.url = cfg, cfg.TLS.URL("http://"+s.HTTP.Addr().String())
	ln, err := cfg.TLS.Listener(s.HTTP) // closing it closes s.HTTP
	if err != nil {
		return nil, fmt.Errorf("signaling tls: %w", err)
	}
	// The hardened server: header and body read timeouts, header cap.
	n.life.Serve("http", ln, NewHTTPServer(cfCheck.Wrap(n.srv.Handler()), log))
	n.life.ServeHealth(s.Metrics, env, n.Ready)
	return n, nil
}

// joinGossip opens the node's membership of the global pool, whose members
// are believed only as far as the catalogue allows, and points cfg's
// health functions at it.
func (n *Node) joinGossip(cfg *Config) (err error) {
	check := metacheck.New(cfg.CatalogueData, metacheck.Bounds{MaxClusterCapacity: cfg.MaxClusterCapacity})
	cfg.Gossip.CheckMeta = check
	meta := membership.Meta{Role: membership.RoleSignaling}
	if sec, _ := cfg.Authority.Secrets(); sec != nil { // checked by Validate
		a, err := newGlobalAuth(sec)
		if err != nil {
			return err
		}
		n.auth.Store(a)
		// Every use reads the keys in use (a reload swaps them).
		cfg.Gossip.Prove = func(in []byte) []byte {
			if p := n.auth.Load().prove; p != nil {
				return p(in)
			}
			return nil
		}
		cfg.Gossip.CheckMember = func(m membership.Member, in []byte) error { return n.auth.Load().check(m, in) }
		auth := cfg.Authority
		n.life.Go("authority keys", func(ctx context.Context) error {
			return node.WatchAuthority(ctx, auth, n.env, func(sec *authority.Secrets) error {
				a, err := newGlobalAuth(sec)
				if err != nil {
					return err
				}
				n.auth.Store(a)
				_ = n.pool.UpdateMeta(func(*membership.Meta) {}) // proven again under the current key; ErrLeft while stopping
				n.pool.Recheck()                                 // members proven by a key gone, or just added
				return nil
			})
		})
	}
	if n.pool, err = n.life.JoinPool(cfg.Gossip, "global", "", true, meta, n.env); err != nil {
		return err
	}
	h := GossipHealth{Pool: n.pool, Check: check}
	cfg.Health, cfg.POPUp, cfg.SessionAPIs, cfg.GossipAuthoritative = h.Cluster, h.POPUp, h.SessionAPIs, h.Authoritative
	cfg.FanOut = h.FanOut
	return nil
}

// globalAuth is what signaling builds from its authority keys.
type globalAuth struct {
	prove func([]byte) []byte // nil: no signaling secret
	check func(membership.Member, []byte) error
	// The steering samples' keys (internal/authority, steer.go).
	steerSigner   *steer.Signer // nil: no signaling secret
	steerVerifier *steer.Verifier
}

// newGlobalAuth builds signaling's proof and its check of the global
// pool, strict: holding a kind's keys, every member of that role must
// prove its cluster or POP (a cluster without a relay key is refused,
// not believed).
func newGlobalAuth(sec *authority.Secrets) (*globalAuth, error) {
	prove, err := sec.GlobalProve(membership.Meta{Role: membership.RoleSignaling})
	if err != nil {
		return nil, err
	}
	return &globalAuth{prove: prove, check: sec.GlobalCheck(true), steerSigner: sec.SteerSigner(), steerVerifier: sec.SteerVerifier()}, nil
}

// Run serves until ctx ends, then drains: readiness fails at once so load
// balancers stop sending new requests, the replica leaves the pool, keeps
// serving for drain_delay while they notice, then lets in-flight offers
// finish (they may try several clusters) and stops.
func (n *Node) Run(ctx context.Context) error {
	log := n.env.Logger
	log.Info("signaling up", "url", n.url)
	return n.life.Run(ctx, log, func(failed context.Context) {
		log.Info("draining", "delay", n.cfg.DrainDelay)
		n.srv.Drain()
		n.draining.Store(true)
		if n.pool != nil {
			node.Leave(n.pool, log)
		}
		node.Sleep(failed, n.cfg.DrainDelay)
	})
}

// Close stops the node at once.
func (n *Node) Close() error { return n.life.Close() }

// Ready reports whether the replica can place calls: its catalogue is
// loaded and it is not draining.
func (n *Node) Ready() error {
	switch {
	case n.life.Closed():
		return node.ErrClosed
	case n.draining.Load():
		return errors.New("signaling: draining")
	case n.cfg.CatalogueData == nil || len(n.cfg.CatalogueData.Regions) == 0:
		return errors.New("signaling: no catalogue")
	}
	return nil
}

// URL is the base URL of the signaling front.
func (n *Node) URL() string { return n.url }

// Pool is the node's membership of the global pool (nil without gossip).
func (n *Node) Pool() *membership.Pool { return n.pool }

// Catalogue is the region catalogue the node serves.
func (n *Node) Catalogue() *geo.Catalogue { return n.cfg.CatalogueData }
