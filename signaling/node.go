package signaling

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net"
	"slices"
	"sync/atomic"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/metacheck"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/web"
)

// Sockets are a signaling node's listeners; nil ones are opened from the
// config's addresses.
type Sockets struct {
	HTTP    net.Listener
	Metrics net.Listener
}

// Node is one signaling replica as a process runs it: the HTTP front, the
// GeoIP locator, and (optionally) its membership of the global pool, from
// which it learns cluster and POP health.
type Node struct {
	cfg      NodeConfig
	env      node.Env
	life     node.Life
	srv      *Server
	cat      *geo.Catalogue
	pool     *membership.Pool
	url      string
	draining atomic.Bool
}

// NewNode builds a signaling node from cfg (defaults applied, validated).
// Run starts it.
func NewNode(cfg NodeConfig, s Sockets, env node.Env) (_ *Node, err error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	env = env.WithDefaults()
	log := env.Logger
	n := &Node{cfg: cfg, env: env, cat: cfg.CatalogueData}
	defer func() {
		if err != nil {
			n.life.Close()
		}
	}()
	if n.cat == nil {
		if n.cat, err = geo.LoadCatalogue(cfg.Catalogue); err != nil {
			return nil, err
		}
	}
	cloudflare, internal, _ := cfg.proxies() // checked by Validate
	loc, err := geo.NewLocator(geo.LocatorConfig{DBPath: cfg.GeoIPDB, DB: cfg.GeoIPData,
		CloudflareRanges: cloudflare, InternalProxies: internal, Default: n.cat.DefaultLocation(), Logger: log})
	if err != nil {
		return nil, err
	}
	n.life.OnClose(loc.Close)
	n.life.Go("geoip reload", loc.Run)
	// Warns once when Cloudflare proxies requests without the visitor
	// location headers (the zone's managed transform is off).
	cfCheck, err := geo.NewCFHeaderCheck(geo.CFHeaderCheckConfig{Proxies: slices.Concat(cloudflare, internal), Logger: log, Registerer: env.Registerer})
	if err != nil {
		return nil, err
	}
	if cfg.AllowAnonymous {
		log.Warn("allow_anonymous: anyone can place calls and mint client secrets (dev only)")
	}
	var secret []byte
	if cfg.ClientSecretKey != "" {
		secret, _ = base64.StdEncoding.DecodeString(cfg.ClientSecretKey) // checked by Validate
	} else {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, err
		}
		log.Warn("no client secret key configured: secrets minted here verify only on this replica")
	}
	apiClient, err := cfg.SessionAPITLS.Client(env.HTTPClient)
	if err != nil {
		return nil, err
	}
	scfg := Config{
		Catalogue: n.cat, Locator: loc, APIKeys: cfg.APIKeys, Keys: cfg.Keys, AllowAnonymous: cfg.AllowAnonymous,
		ClientSecretKey: secret, ClientSecretTTL: cfg.ClientSecretTTL, ClientSessionFields: cfg.ClientSessionFields,
		SessionAPISecrets: cfg.SessionAPISecrets,
		RatePerSecond:     cfg.RatePerSecond, RateBurst: cfg.RateBurst,
		KeyRatePerSecond: cfg.KeyRatePerSecond, KeyRateBurst: cfg.KeyRateBurst,
		SecretRatePerSecond: cfg.SecretRatePerSecond, SecretRateBurst: cfg.SecretRateBurst, MaxLimiters: cfg.MaxLimiters,
		CORSOrigins: cfg.CORSOrigins, HTTPClient: apiClient, Logger: log, Registerer: env.Registerer, Now: env.Now,
	}
	if cfg.DemoPage {
		scfg.Web = web.FS()
	}
	if cfg.Gossip.Bind != "" {
		// Members are believed only as far as the catalogue allows.
		check := metacheck.New(n.cat, metacheck.Bounds{MaxClusterCapacity: cfg.MaxClusterCapacity})
		cfg.Gossip.CheckMeta = check
		if n.pool, err = cfg.Gossip.Open("", true, membership.Meta{Role: membership.RoleSignaling}, log); err != nil {
			return nil, err
		}
		n.life.OnClose(n.pool.Close)
		if err := env.Register(n.pool.Collector("global")); err != nil {
			return nil, err
		}
		n.life.Go("gossip join", func(ctx context.Context) error { return cfg.Gossip.JoinLoop(ctx, n.pool, log) })
		h := GossipHealth{Pool: n.pool, Check: check}
		scfg.Health, scfg.POPUp, scfg.SessionAPIs, scfg.GossipAuthoritative = h.Cluster, h.POPUp, h.SessionAPIs, h.Authoritative
	}
	if n.srv, err = New(scfg); err != nil {
		return nil, err
	}
	if s.HTTP == nil {
		if s.HTTP, err = node.Listen("listen_addr", cfg.ListenAddr); err != nil {
			return nil, err
		}
	}
	n.url = "http://" + s.HTTP.Addr().String()
	// The hardened server: header and body read timeouts, header cap.
	n.life.Serve("http", s.HTTP, NewHTTPServer(cfCheck.Wrap(n.srv.Handler()), log))
	if s.Metrics == nil {
		if s.Metrics, err = node.Listen("metrics_addr", cfg.MetricsAddr); err != nil {
			return nil, err
		}
	}
	n.life.ServeHealth(s.Metrics, env, n.Ready)
	return n, nil
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
	case n.cat == nil || len(n.cat.Regions) == 0:
		return errors.New("signaling: no catalogue")
	}
	return nil
}

// URL is the base URL of the signaling front.
func (n *Node) URL() string { return n.url }

// Pool is the node's membership of the global pool (nil without gossip).
func (n *Node) Pool() *membership.Pool { return n.pool }

// Catalogue is the region catalogue the node serves.
func (n *Node) Catalogue() *geo.Catalogue { return n.cat }
