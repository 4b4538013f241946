package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/udpio"
	"github.com/rtcedge/rtcedge/signaling"
	"github.com/rtcedge/rtcedge/transceiver"
	"github.com/rtcedge/rtcedge/transceiver/echo"
	"github.com/rtcedge/rtcedge/transceiver/netbackend"
	"github.com/rtcedge/rtcedge/web"
)

func init() {
	commands = append(commands,
		command{"signaling", "run the geo-aware HTTP front (POST /v1/realtime/sdp)", runSignaling},
		command{"transceiver", "run a transceiver pod (WebRTC termination, echo backend)", runTransceiver},
		command{"clusterrelay", "run a cluster relay replica and the cluster's session API front", runClusterRelay},
		command{"globalrelay", "run a global relay replica (a POP's public UDP ingress)", runGlobalRelay},
		command{"backend", "run the reference echo backend over the network backend protocol", runBackend},
	)
}

// listenData opens a role's data-plane UDP socket and returns the address
// others should send to: advertise when set, else the bound address.
func listenData(bind, advertise string) (*net.UDPConn, netip.AddrPort, error) {
	b, err := parseAddr("data_addr", bind)
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	conn, err := udpio.Listen(b)
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	data := udpio.LocalAddrPort(conn)
	if advertise != "" {
		if data, err = parseAddr("data_advertise", advertise); err != nil {
			conn.Close()
			return nil, netip.AddrPort{}, err
		}
	}
	if data.Addr().IsUnspecified() {
		conn.Close()
		return nil, netip.AddrPort{}, fmt.Errorf("data address %v is not one others can send to: set data_advertise (e.g. \"${POD_IP}:%d\")", data, data.Port())
	}
	return conn, data, nil
}

// roleSetup parses -config into cfg and returns a logger.
func roleSetup(name string, args []string, cfg any, common func() *Common) (*slog.Logger, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	path := fs.String("config", "", "YAML config file (see docs/operations.md); secrets come from the environment")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *path == "" {
		return nil, errors.New("-config is required")
	}
	if err := loadConfig(*path, cfg); err != nil {
		return nil, err
	}
	c := common()
	c.defaults()
	log, err := newLogger(c.LogLevel)
	if err != nil {
		return nil, err
	}
	slog.SetDefault(log)
	return log, nil
}

// TransceiverConfig is the transceiver role's config file.
type TransceiverConfig struct {
	Common         `yaml:",inline"`
	Region         string        `yaml:"region"`
	Cluster        uint16        `yaml:"cluster"`
	Pod            uint16        `yaml:"pod"`       // 0: from the hostname's StatefulSet ordinal
	DataAddr       string        `yaml:"data_addr"` // pod UDP socket, e.g. 0.0.0.0:7000
	DataAdvertise  string        `yaml:"data_advertise"`
	APIAddr        string        `yaml:"api_addr"` // session API, e.g. 0.0.0.0:8081
	APIAdvertise   string        `yaml:"api_advertise"`
	MaxSessions    int           `yaml:"max_sessions"`
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	IdleTimeout    time.Duration `yaml:"idle_timeout"`
	DTLSRole       string        `yaml:"dtls_role"` // client (a=setup:active) or server (a=setup:passive)
	// BackendAddr is the inference backend (host:port, docs/backend-protocol.md);
	// empty: the in-process echo backend.
	BackendAddr string    `yaml:"backend_addr"`
	Token       TokenKeys `yaml:"token"`
	Gossip      Gossip    `yaml:"gossip"` // the cluster pool
}

func runTransceiver(ctx context.Context, args []string) error {
	var cfg TransceiverConfig
	log, err := roleSetup("transceiver", args, &cfg, func() *Common { return &cfg.Common })
	if err != nil {
		return err
	}
	if cfg.Pod == 0 {
		if cfg.Pod, err = podFromHostname(); err != nil {
			return err
		}
	}
	keys, err := cfg.Token.keyring()
	if err != nil {
		return err
	}
	conn, data, err := listenData(cfg.DataAddr, cfg.DataAdvertise)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	var backend transceiver.Backend = echo.Backend{}
	if cfg.BackendAddr != "" {
		backend = &netbackend.Backend{Addr: cfg.BackendAddr, Logger: log}
	}
	relays := &transceiver.RelaySet{}
	tr, err := transceiver.New(transceiver.Config{
		Cluster: cfg.Cluster, Pod: cfg.Pod, Keys: keys, Backend: backend, Relays: relays,
		MaxSessions: cfg.MaxSessions, ConnectTimeout: cfg.ConnectTimeout, IdleTimeout: cfg.IdleTimeout,
		DTLSRole: cfg.DTLSRole, Logger: log, Registerer: reg,
	}, conn)
	if err != nil {
		conn.Close()
		return err
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	runErr := make(chan error, 1)
	go func() { runErr <- tr.Run(runCtx) }()

	api, err := serve(cfg.APIAddr, tr.Handler(), log)
	if err != nil {
		tr.Close()
		return err
	}
	apiURL, err := advertisedURL(cfg.APIAdvertise, api)
	if err != nil {
		shutdown(api)
		tr.Close()
		return err
	}
	metrics, err := metricsServer(cfg.MetricsAddr, reg, log, tr.Draining)
	if err != nil {
		shutdown(api)
		tr.Close()
		return err
	}
	pool, err := cfg.Gossip.pool(runCtx, "", false, membership.Meta{
		Role: membership.RoleTransceiver, Region: cfg.Region, Cluster: cfg.Cluster, Pod: cfg.Pod,
		Data: data, API: apiURL, Capacity: tr.Capacity(),
	}, log)
	if err != nil {
		shutdown(api, metrics)
		tr.Close()
		return err
	}
	_ = reg.Register(pool.Collector("cluster"))
	go tr.Publish(runCtx, pool)
	go transceiver.FollowRelays(runCtx, pool, cfg.Cluster, relays)
	log.Info("transceiver up", "cluster", cfg.Cluster, "pod", cfg.Pod, "data", data, "api", apiURL, "gossip", pool.LocalAddr())

	select {
	case err := <-runErr:
		shutdown(api, metrics)
		pool.Close()
		return err
	case <-ctx.Done():
	}
	// Drain: refuse new sessions (gossip and readiness say so), let calls
	// finish, end what is left at the deadline.
	log.Info("draining", "sessions", tr.Sessions(), "deadline", cfg.DrainTimeout)
	drained := tr.Drain()
	select {
	case <-drained:
		log.Info("drained")
	case <-time.After(cfg.DrainTimeout):
		log.Warn("drain deadline passed; ending remaining sessions", "sessions", tr.Sessions())
		tr.EndAllForDrainDeadline()
	}
	_ = pool.Leave(time.Second)
	stopRun()
	<-runErr
	shutdown(api, metrics)
	return pool.Close()
}

// ClusterRelayConfig is the cluster relay role's config file.
type ClusterRelayConfig struct {
	Common        `yaml:",inline"`
	Region        string `yaml:"region"`
	Cluster       uint16 `yaml:"cluster"`
	DataAddr      string `yaml:"data_addr"` // UDP, e.g. 0.0.0.0:7100
	DataAdvertise string `yaml:"data_advertise"`
	APIAddr       string `yaml:"api_addr"` // the cluster's session API front, e.g. 0.0.0.0:8080
	APIAdvertise  string `yaml:"api_advertise"`
	Batch         int    `yaml:"batch"` // datagrams per recvmmsg/sendmmsg; default 32, 1 = plain
	ClusterGossip Gossip `yaml:"cluster_gossip"`
	GlobalGossip  Gossip `yaml:"global_gossip"`
}

func runClusterRelay(ctx context.Context, args []string) error {
	var cfg ClusterRelayConfig
	log, err := roleSetup("clusterrelay", args, &cfg, func() *Common { return &cfg.Common })
	if err != nil {
		return err
	}
	conn, data, err := listenData(cfg.DataAddr, cfg.DataAdvertise)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	dir := clusterrelay.NewDirectory()
	if cfg.Batch == 0 {
		cfg.Batch = 32
	}
	relay, err := clusterrelay.New(clusterrelay.Config{Cluster: cfg.Cluster, Pods: dir, Batch: cfg.Batch, Logger: log, Registerer: reg}, conn)
	if err != nil {
		conn.Close()
		return err
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	runErr := make(chan error, 1)
	go func() { runErr <- relay.Run(runCtx) }()
	front := clusterrelay.NewFront(clusterrelay.FrontConfig{Cluster: cfg.Cluster, Pods: dir, Logger: log})
	api, err := serve(cfg.APIAddr, front.Handler(), log)
	if err != nil {
		relay.Close()
		return err
	}
	apiURL, err := advertisedURL(cfg.APIAdvertise, api)
	if err != nil {
		shutdown(api)
		relay.Close()
		return err
	}
	metrics, err := metricsServer(cfg.MetricsAddr, reg, log, nil)
	if err != nil {
		shutdown(api)
		relay.Close()
		return err
	}
	cpool, err := cfg.ClusterGossip.pool(runCtx, "", false, membership.Meta{
		Role: membership.RoleClusterRelay, Region: cfg.Region, Cluster: cfg.Cluster, Data: data}, log)
	if err != nil {
		shutdown(api, metrics)
		relay.Close()
		return err
	}
	// Draining until it has heard of a ready pod (PublishAggregate).
	gpool, err := cfg.GlobalGossip.pool(runCtx, "@global", true, membership.Meta{
		Role: membership.RoleClusterRelay, Region: cfg.Region, Cluster: cfg.Cluster, Data: data, API: apiURL, Draining: true}, log)
	if err != nil {
		cpool.Close()
		shutdown(api, metrics)
		relay.Close()
		return err
	}
	_ = reg.Register(cpool.Collector("cluster"))
	_ = reg.Register(gpool.Collector("global"))
	go clusterrelay.FollowPods(runCtx, cpool, cfg.Cluster, dir)
	var stopping atomic.Bool
	go clusterrelay.PublishAggregate(runCtx, gpool, dir, stopping.Load)
	log.Info("cluster relay up", "cluster", cfg.Cluster, "data", data, "api", apiURL,
		"cluster_gossip", cpool.LocalAddr(), "global_gossip", gpool.LocalAddr())

	select {
	case err := <-runErr:
		shutdown(api, metrics)
		gpool.Close()
		cpool.Close()
		return err
	case <-ctx.Done():
	}
	// A cluster relay holds no flow state: announce draining so global
	// relays move their flows, give gossip a moment, then go.
	log.Info("draining")
	stopping.Store(true)
	_ = gpool.UpdateMeta(func(m *membership.Meta) { m.Draining = true })
	select {
	case <-time.After(min(cfg.DrainTimeout, 3*time.Second)):
	case <-runErr:
	}
	_ = gpool.Leave(time.Second)
	_ = cpool.Leave(time.Second)
	stopRun()
	shutdown(api, metrics)
	gpool.Close()
	return cpool.Close()
}

// GlobalRelayConfig is the global relay role's config file.
type GlobalRelayConfig struct {
	Common     `yaml:",inline"`
	Region     string `yaml:"region"`
	POP        uint16 `yaml:"pop"`
	PublicAddr string `yaml:"public_addr"` // the VIP port, e.g. 0.0.0.0:3478
	// InternalAddr is where cluster relays send replies: a specific IP
	// reachable from the clusters, optionally with a base port. Worker i
	// binds base+i; with a fixed base a replica restarted on the same
	// address gets its in-flight replies and restores flows from them.
	// Without a port the kernel picks them.
	InternalAddr string `yaml:"internal_addr"`
	Workers      int    `yaml:"workers"` // SO_REUSEPORT sockets; default: one per CPU
	// Batch > 1 uses recvmmsg/sendmmsg with up to that many datagrams per
	// call; 0: one datagram per call (allocation-free; see docs/benchmarks.md).
	Batch    int           `yaml:"batch"`
	FlowIdle time.Duration `yaml:"flow_idle"`
	MaxFlows int           `yaml:"max_flows"`
	// RedisURL shares flows between replicas ("redis://host:6379/0");
	// empty: no sharing (a restarted replica recovers from the next
	// STUN check). Prefer $RTCEDGE_REDIS_URL for URLs with passwords.
	RedisURL string    `yaml:"redis_url"`
	Token    TokenKeys `yaml:"token"`
	Gossip   Gossip    `yaml:"gossip"` // the global pool
}

func runGlobalRelay(ctx context.Context, args []string) error {
	var cfg GlobalRelayConfig
	log, err := roleSetup("globalrelay", args, &cfg, func() *Common { return &cfg.Common })
	if err != nil {
		return err
	}
	keys, err := cfg.Token.keyring()
	if err != nil {
		return err
	}
	pub, err := parseAddr("public_addr", cfg.PublicAddr)
	if err != nil {
		return err
	}
	internal, err := netip.ParseAddrPort(cfg.InternalAddr)
	if err != nil {
		ip, perr := netip.ParseAddr(cfg.InternalAddr)
		if perr != nil {
			return fmt.Errorf("internal_addr %q: want IP or IP:port: %w", cfg.InternalAddr, err)
		}
		internal = netip.AddrPortFrom(ip, 0)
	}
	n := cfg.Workers
	if n == 0 {
		n = numCPU()
	}
	if cfg.Batch == 0 {
		cfg.Batch = 32
	}
	pubs, ins, err := udpio.ListenWorkerPairs(pub, internal, n)
	if err != nil {
		return err
	}
	workers := make([]globalrelay.Worker, len(pubs))
	for i := range pubs {
		workers[i] = globalrelay.Worker{Public: pubs[i], Internal: ins[i]}
	}
	reg := prometheus.NewRegistry()
	clusters := globalrelay.NewClusters(nil)
	closeWorkers := func() {
		for _, w := range workers {
			w.Public.Close()
			w.Internal.Close()
		}
	}
	var relay *globalrelay.Relay
	var cache routecache.Cache
	redisURL := cfg.RedisURL
	if env := os.Getenv("RTCEDGE_REDIS_URL"); env != "" {
		redisURL = env
	}
	if redisURL != "" {
		routecache.SetRedisLogger(log)
		cache, err = routecache.Open(redisURL, routecache.Config{Logger: log, Registerer: reg,
			OnFound: func(c netip.AddrPort, r routecache.Route) { relay.RestoreFlow(c, r) }})
		if err != nil {
			closeWorkers()
			return err
		}
		defer cache.Close()
	}
	relay, err = globalrelay.New(globalrelay.Config{POP: cfg.POP, Keys: keys, Clusters: clusters,
		FlowIdle: cfg.FlowIdle, MaxFlows: cfg.MaxFlows, Cache: cache, Batch: cfg.Batch, Logger: log, Registerer: reg}, workers)
	if err != nil {
		closeWorkers()
		return err
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	if cache != nil {
		go func() { _ = cache.Run(runCtx) }()
	}
	runErr := make(chan error, 1)
	go func() { runErr <- relay.Run(runCtx) }()
	// The UDP load balancer's health check reads /readyz on the metrics
	// listener: a draining replica gets no new clients.
	metrics, err := metricsServer(cfg.MetricsAddr, reg, log, relay.Draining)
	if err != nil {
		relay.Close()
		return err
	}
	pool, err := cfg.Gossip.pool(runCtx, "", true, membership.Meta{
		Role: membership.RoleGlobalRelay, Region: cfg.Region, POP: cfg.POP, Data: relay.PublicAddr()}, log)
	if err != nil {
		shutdown(metrics)
		relay.Close()
		return err
	}
	_ = reg.Register(pool.Collector("global"))
	go globalrelay.FollowClusters(runCtx, pool, clusters)
	log.Info("global relay up", "pop", cfg.POP, "public", relay.PublicAddr(), "workers", n, "gossip", pool.LocalAddr())

	select {
	case err := <-runErr:
		shutdown(metrics)
		pool.Close()
		return err
	case <-ctx.Done():
	}
	log.Info("draining", "flows", relay.Flows(), "deadline", cfg.DrainTimeout)
	relay.Drain()
	_ = pool.UpdateMeta(func(m *membership.Meta) { m.Draining = true })
	deadline := time.After(cfg.DrainTimeout)
	tick := time.NewTicker(time.Second)
drain:
	for relay.Flows() > 0 {
		select {
		case <-deadline:
			log.Warn("drain deadline passed", "flows", relay.Flows())
			break drain
		case <-tick.C:
		case <-runErr:
			break drain
		}
	}
	tick.Stop()
	_ = pool.Leave(time.Second)
	stopRun()
	shutdown(metrics)
	return pool.Close()
}

// SignalingConfig is the signaling role's config file.
type SignalingConfig struct {
	Common         `yaml:",inline"`
	ListenAddr     string   `yaml:"listen_addr"` // e.g. 0.0.0.0:8080
	Catalogue      string   `yaml:"catalogue"`   // region catalogue YAML (geo package)
	GeoIPDB        string   `yaml:"geoip_db"`    // GeoIP2/GeoLite2 City .mmdb; reloaded on change
	TrustedProxies []string `yaml:"trusted_proxies"`
	CORSOrigins    []string `yaml:"cors_origins"`
	DemoPage       bool     `yaml:"demo_page"`
	// APIKeys: prefer $RTCEDGE_API_KEYS. ClientSecretKey (base64): prefer
	// $RTCEDGE_CLIENT_SECRET_KEY; when absent a random one is made (then
	// client secrets only verify on this replica).
	APIKeys         []string      `yaml:"api_keys"`
	ClientSecretKey string        `yaml:"client_secret_key"`
	ClientSecretTTL time.Duration `yaml:"client_secret_ttl"`
	RatePerSecond   float64       `yaml:"rate_per_second"`
	// DrainDelay is how long a stopping replica keeps serving after its
	// readiness turns 503, so load balancers stop sending to it first;
	// default 5s.
	DrainDelay time.Duration `yaml:"drain_delay"`
	RateBurst  int           `yaml:"rate_burst"`
	Gossip     Gossip        `yaml:"gossip"` // the global pool; empty bind = no gossip
}

func runSignaling(ctx context.Context, args []string) error {
	var cfg SignalingConfig
	log, err := roleSetup("signaling", args, &cfg, func() *Common { return &cfg.Common })
	if err != nil {
		return err
	}
	if cfg.DrainDelay == 0 {
		cfg.DrainDelay = 5 * time.Second
	}
	cat, err := geo.LoadCatalogue(cfg.Catalogue)
	if err != nil {
		return err
	}
	var trusted []netip.Prefix
	for _, s := range cfg.TrustedProxies {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("trusted_proxies: %w", err)
		}
		trusted = append(trusted, p)
	}
	loc, err := geo.NewLocator(geo.LocatorConfig{DBPath: cfg.GeoIPDB, TrustedProxies: trusted, Default: cat.DefaultLocation(), Logger: log})
	if err != nil {
		return err
	}
	defer loc.Close()
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	go func() { _ = loc.Run(runCtx) }()

	apiKeys := cfg.APIKeys
	if env := os.Getenv(envAPIKeys); env != "" {
		apiKeys = nil
		for _, k := range strings.Split(env, ",") {
			if k = strings.TrimSpace(k); k != "" {
				apiKeys = append(apiKeys, k)
			}
		}
	}
	if len(apiKeys) == 0 {
		log.Warn("no API keys configured: anyone can place calls and mint client secrets (set RTCEDGE_API_KEYS)")
	}
	secretB64 := cfg.ClientSecretKey
	if env := os.Getenv(envSecretKey); env != "" {
		secretB64 = env
	}
	var secret []byte
	if secretB64 != "" {
		if secret, err = base64.StdEncoding.DecodeString(secretB64); err != nil {
			return fmt.Errorf("client secret key: %w", err)
		}
	} else {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return err
		}
		log.Warn("no client secret key configured: secrets minted here verify only on this replica")
	}
	reg := prometheus.NewRegistry()
	// Warns once when Cloudflare proxies requests without the visitor
	// location headers (the zone's managed transform is off).
	cfCheck, err := geo.NewCFHeaderCheck(geo.CFHeaderCheckConfig{Proxies: trusted, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	scfg := signaling.Config{
		Catalogue: cat, Locator: loc, APIKeys: apiKeys, ClientSecretKey: secret, ClientSecretTTL: cfg.ClientSecretTTL,
		RatePerSecond: cfg.RatePerSecond, RateBurst: cfg.RateBurst, CORSOrigins: cfg.CORSOrigins,
		Logger: log, Registerer: reg,
	}
	if cfg.DemoPage {
		scfg.Web = web.FS()
	}
	var pool *membership.Pool
	if cfg.Gossip.Bind != "" {
		if pool, err = cfg.Gossip.pool(runCtx, "", true, membership.Meta{Role: membership.RoleSignaling}, log); err != nil {
			return err
		}
		defer pool.Close()
		_ = reg.Register(pool.Collector("global"))
		h := signaling.GossipHealth{Pool: pool}
		scfg.Health, scfg.POPUp, scfg.SessionAPIs, scfg.GossipAuthoritative = h.Cluster, h.POPUp, h.SessionAPIs, h.Authoritative
	}
	sig, err := signaling.New(scfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return err
	}
	// The hardened server: header and body read timeouts, header cap.
	srv := signaling.NewHTTPServer(cfCheck.Wrap(sig.Handler()), log)
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()
	var draining atomic.Bool
	metrics, err := metricsServer(cfg.MetricsAddr, reg, log, draining.Load)
	if err != nil {
		_ = srv.Close()
		return err
	}
	log.Info("signaling up", "url", "http://"+ln.Addr().String())
	select {
	case <-ctx.Done():
	case err := <-srvDone:
		shutdown(metrics)
		return err
	}
	// Drain: readiness fails at once so load balancers stop sending new
	// requests; keep serving for drain_delay while they notice; then let
	// in-flight offers finish (they may try several clusters).
	log.Info("draining", "delay", cfg.DrainDelay)
	sig.Drain()
	draining.Store(true)
	if pool != nil {
		_ = pool.Leave(time.Second)
	}
	time.Sleep(cfg.DrainDelay)
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	shutdown(metrics)
	return nil
}

// runBackend serves the reference echo backend over the network protocol
// that transceivers with backend_addr speak (docs/backend-protocol.md).
func runBackend(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("backend", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:9500", "TCP address transceivers connect to")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	log.Info("echo backend up", "addr", ln.Addr().String())
	return netbackend.Serve(ctx, ln, log, netbackend.EchoHandler)
}
