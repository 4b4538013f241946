// Package devworld builds the whole rtcedge system in one process on
// loopback: regions with a cluster of transceiver pods and cluster relay
// replicas each, a global relay per POP on its own loopback address, real
// memberlist gossip between all of them, and signaling with an embedded
// GeoIP database and the demo page. `rtcedge dev` runs it, and the
// end-to-end tests build it the same way with every port at 0.
package devworld

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
	"github.com/rtcedge/rtcedge/signaling"
	"github.com/rtcedge/rtcedge/transceiver"
	"github.com/rtcedge/rtcedge/transceiver/echo"
	"github.com/rtcedge/rtcedge/transceiver/netbackend"
	"github.com/rtcedge/rtcedge/web"
)

// RegionSpec describes one region of the dev world.
type RegionSpec struct {
	Name     string
	Location geo.Point
	Cluster  uint16
	POP      uint16
	POPName  string
	POPIP    netip.Addr // the POP's loopback VIP address, e.g. 127.0.0.2
}

// DefaultRegions is the built-in two-region world.
var DefaultRegions = []RegionSpec{
	{Name: "eu-central", Location: geo.Point{Lat: 50.11, Lon: 8.68}, Cluster: 1, POP: 1, POPName: "fra", POPIP: netip.MustParseAddr("127.0.0.2")},
	{Name: "us-east", Location: geo.Point{Lat: 39.04, Lon: -77.49}, Cluster: 2, POP: 2, POPName: "iad", POPIP: netip.MustParseAddr("127.0.0.3")},
}

// Config configures a World. The zero value gives the test world: default
// regions, every port chosen by the kernel.
type Config struct {
	Regions []RegionSpec // default DefaultRegions
	// PodsPerCluster and RelaysPerCluster size each cluster; default 2 each.
	PodsPerCluster   int
	RelaysPerCluster int
	// WorkersPerPOP is the number of SO_REUSEPORT workers of each global
	// relay; default 2.
	WorkersPerPOP int
	// HTTPAddr is signaling's listen address; default 127.0.0.1:0.
	HTTPAddr string
	// MetricsAddr serves /metrics for every component; "" = none.
	MetricsAddr string
	// POPPort is the UDP port of every POP VIP; 0 = kernel-chosen per POP.
	POPPort uint16
	// APIKeys, when set, are required by signaling.
	APIKeys []string
	// TrustedProxies lets tests stand in for Cloudflare: signaling believes
	// CF-IPLatitude/CF-IPLongitude from these peers.
	TrustedProxies []netip.Prefix
	// Transceiver tweaks (zero = package defaults).
	ConnectTimeout time.Duration
	MaxSessions    int
	RouteTTL       time.Duration
	// FlowIdle is the global relays' flow expiry (zero = package default).
	FlowIdle time.Duration
	// RedisURL makes the global relays share flows through Redis. Empty:
	// an in-process store shared by all relays of the world plays Redis.
	RedisURL string
	// NetBackend runs the echo backend as a network service (the
	// netbackend protocol over loopback TCP) instead of in process.
	NetBackend bool
	// NoRouteCache runs the global relays without any shared cache: a
	// restarted relay then recovers flows only from the next STUN check
	// (or a reply from the cluster side).
	NoRouteCache bool

	Logger *slog.Logger // default slog.Default()
}

// Pod is one transceiver pod.
type Pod struct {
	ID          uint16
	Transceiver *transceiver.Transceiver
	API         string // base URL of the pod's session API
	Data        netip.AddrPort
	Pool        *membership.Pool
	Relays      *transceiver.RelaySet // the cluster relays it accepts datagrams from
	node
}

// ClusterRelay is one cluster relay replica with its session API front.
type ClusterRelay struct {
	Relay       *clusterrelay.Relay
	Directory   *clusterrelay.Directory
	Front       string // base URL of the cluster session API it serves
	ClusterPool *membership.Pool
	GlobalPool  *membership.Pool
	node
}

// Region is one running region.
type Region struct {
	Spec          RegionSpec
	Pods          []*Pod
	ClusterRelays []*ClusterRelay
	GlobalRelay   *globalrelay.Relay // the region's POP (its first replica)
	GlobalPool    *membership.Pool   // that replica's membership
	// POPReplicas are the POP's global relay replicas, all on the same
	// public address (SO_REUSEPORT): the kernel spreads clients over them
	// as a UDP load balancer would.
	POPReplicas []*POPReplica
	popGen      int
}

// POPReplica is one global relay replica of a POP.
type POPReplica struct {
	Relay *globalrelay.Relay
	Pool  *membership.Pool
	node
}

// World is a running dev world.
type World struct {
	Regions       []*Region
	Catalogue     *geo.Catalogue
	SignalingURL  string // e.g. http://127.0.0.1:8080
	MetricsURL    string // "" when MetricsAddr was empty
	Registry      *prometheus.Registry
	SignalingPool *membership.Pool

	cfg        Config
	log        *slog.Logger
	keys       *token.Keyring
	hop        map[uint16]*encap.Keyring // inter-tier keys by cluster
	memStore   *routecache.MemoryStore   // the dev stand-in for Redis
	backend    transceiver.Backend       // what every pod bridges to
	httpClient *http.Client              // control-plane calls between components; idle conns closed by Close
	globalSeed string
	errMu      sync.Mutex
	errs       []error
	nodes      []*node // in start order; stopped in reverse
}

// node is one component's lifetime: its goroutines and what closes it.
type node struct {
	name    string
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closers []func() error
	once    sync.Once
	servers []*http.Server
}

// stop shuts the component down: HTTP servers, context, closers, goroutines.
func (n *node) stop() {
	n.once.Do(func() {
		for _, s := range n.servers {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if s.Shutdown(ctx) != nil {
				_ = s.Close() // idle keep-alive connections that never got a request
			}
			cancel()
		}
		n.cancel()
		for i := len(n.closers) - 1; i >= 0; i-- {
			_ = n.closers[i]()
		}
		n.wg.Wait()
	})
}

// Kill stops the component abruptly: its sockets close and its gossip stops
// without a goodbye, so others detect it as dead, as after a crash.
func (n *node) Kill() { n.stop() }

func (w *World) newNode(name string) (*node, context.Context) {
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{name: name, cancel: cancel}
	w.nodes = append(w.nodes, n)
	return n, ctx
}

// adopt registers an already built node (embedded in a component struct).
func (w *World) adopt(n *node, name string) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	n.name, n.cancel = name, cancel
	w.nodes = append(w.nodes, n)
	return ctx
}

// run starts a component loop on n, recording a failure.
func (w *World) run(n *node, ctx context.Context, run func(context.Context) error) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := run(ctx); err != nil {
			w.errMu.Lock()
			w.errs = append(w.errs, fmt.Errorf("%s: %w", n.name, err))
			w.errMu.Unlock()
			w.log.Error("component stopped", "node", n.name, "err", err)
		}
	}()
}

// goLoop starts a background loop on n.
func goLoop(n *node, f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// Start builds and starts a world. Close stops it.
func Start(cfg Config) (*World, error) {
	if len(cfg.Regions) == 0 {
		cfg.Regions = DefaultRegions
	}
	if cfg.PodsPerCluster == 0 {
		cfg.PodsPerCluster = 2
	}
	if cfg.RelaysPerCluster == 0 {
		cfg.RelaysPerCluster = 2
	}
	if cfg.WorkersPerPOP == 0 {
		cfg.WorkersPerPOP = 2
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &World{cfg: cfg, log: cfg.Logger.With("component", "devworld"), Registry: prometheus.NewRegistry(),
		httpClient: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}}}
	if err := w.start(); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

func (w *World) start() error {
	cfg := w.cfg
	w.Registry.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))

	key := make([]byte, token.KeyLen)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	var err error
	if w.keys, err = token.NewKeyring(1, map[uint8][]byte{1: key}); err != nil {
		return err
	}
	// One inter-tier key per cluster, as production has.
	w.hop = map[uint16]*encap.Keyring{}
	for _, spec := range cfg.Regions {
		k := make([]byte, encap.KeyLen)
		if _, err := rand.Read(k); err != nil {
			return err
		}
		if w.hop[spec.Cluster], err = encap.NewKeyring(1, map[uint8][]byte{1: k}); err != nil {
			return err
		}
	}

	w.memStore = routecache.NewMemoryStore()
	w.backend = echo.Backend{}
	if cfg.NetBackend {
		addr, err := w.startNetBackend()
		if err != nil {
			return err
		}
		w.backend = &netbackend.Backend{Addr: addr, Logger: cfg.Logger}
	}
	globalSeed := &w.globalSeed
	cat := &geo.Catalogue{DefaultRegion: cfg.Regions[0].Name}
	for _, spec := range cfg.Regions {
		rg := &Region{Spec: spec}
		w.Regions = append(w.Regions, rg)
		var clusterSeed string
		for i := range cfg.PodsPerCluster {
			p, err := w.startPod(spec, uint16(i+1), &clusterSeed)
			if err != nil {
				return err
			}
			rg.Pods = append(rg.Pods, p)
		}
		for i := range cfg.RelaysPerCluster {
			cr, err := w.startClusterRelay(spec, i+1, &clusterSeed, globalSeed)
			if err != nil {
				return err
			}
			rg.ClusterRelays = append(rg.ClusterRelays, cr)
		}
	}
	for _, rg := range w.Regions {
		if err := w.startPOP(rg, netip.AddrPortFrom(rg.Spec.POPIP, cfg.POPPort)); err != nil {
			return err
		}
		spec := rg.Spec
		cat.Regions = append(cat.Regions, geo.Region{
			Name: spec.Name, Location: spec.Location,
			Clusters: []geo.Cluster{{ID: spec.Cluster, Name: spec.Name + "-1", Location: spec.Location, SessionAPI: rg.ClusterRelays[0].Front}},
			POPs:     []geo.POP{{ID: spec.POP, Name: spec.POPName, VIP: rg.GlobalRelay.PublicAddr(), Location: spec.Location}},
		})
	}
	if err := cat.Validate(); err != nil {
		return err
	}
	w.Catalogue = cat
	if err := w.startSignaling(globalSeed); err != nil {
		return err
	}
	if err := w.awaitConverged(10 * time.Second); err != nil {
		return err
	}
	return nil
}

// startNetBackend serves the echo backend over loopback TCP and returns its
// address. It is the first node, so it stops last.
func (w *World) startNetBackend() (string, error) {
	n, ctx := w.newNode("backend")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	w.run(n, ctx, func(ctx context.Context) error { return netbackend.Serve(ctx, ln, w.log, netbackend.EchoHandler) })
	return ln.Addr().String(), nil
}

func (w *World) newPool(name string, wan bool, meta membership.Meta, seed *string) (*membership.Pool, error) {
	pool, err := membership.New(membership.Config{
		Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), WAN: wan,
		AllowInsecure: true, Fast: true, Logger: w.cfg.Logger,
	}, meta)
	if err != nil {
		return nil, fmt.Errorf("gossip %s: %w", name, err)
	}
	if *seed == "" {
		*seed = pool.LocalAddr().String()
	} else if _, err := pool.Join([]string{*seed}); err != nil {
		pool.Close()
		return nil, fmt.Errorf("gossip %s: join: %w", name, err)
	}
	kind := "cluster"
	if wan {
		kind = "global"
	}
	if err := prometheus.WrapRegistererWith(prometheus.Labels{"node": name}, w.Registry).Register(pool.Collector(kind)); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

func (w *World) startPod(spec RegionSpec, id uint16, clusterSeed *string) (*Pod, error) {
	p := &Pod{ID: id}
	name := spec.Name + "/pod-" + strconv.Itoa(int(id))
	ctx := w.adopt(&p.node, name)
	conn, err := udpio.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		return nil, err
	}
	p.Data = udpio.LocalAddrPort(conn)
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"region": spec.Name, "pod": strconv.Itoa(int(id))}, w.Registry)
	relays := &transceiver.RelaySet{}
	p.Relays = relays
	tr, err := transceiver.New(transceiver.Config{
		Cluster: spec.Cluster, Pod: id, Keys: w.keys, HopKeys: w.hop[spec.Cluster], Backend: w.backend, Relays: relays,
		ConnectTimeout: w.cfg.ConnectTimeout, MaxSessions: w.cfg.MaxSessions, RouteTTL: w.cfg.RouteTTL,
		Logger: w.cfg.Logger, Registerer: reg,
	}, conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p.Transceiver = tr
	p.closers = append(p.closers, tr.Close)
	w.run(&p.node, ctx, tr.Run)
	if p.API, err = w.serveHTTP(&p.node, "127.0.0.1:0", tr.Handler()); err != nil {
		return nil, err
	}
	p.Pool, err = w.newPool(name, false, membership.Meta{
		Role: membership.RoleTransceiver, Region: spec.Name, Cluster: spec.Cluster, Pod: id,
		Data: p.Data, API: p.API, Capacity: tr.Capacity(),
	}, clusterSeed)
	if err != nil {
		return nil, err
	}
	p.closers = append(p.closers, p.Pool.Close)
	goLoop(&p.node, func() { tr.Publish(ctx, p.Pool) })
	goLoop(&p.node, func() { transceiver.FollowRelays(ctx, p.Pool, spec.Cluster, relays) })
	return p, nil
}

func (w *World) startClusterRelay(spec RegionSpec, i int, clusterSeed, globalSeed *string) (*ClusterRelay, error) {
	cr := &ClusterRelay{Directory: clusterrelay.NewDirectory()}
	name := spec.Name + "/clusterrelay-" + strconv.Itoa(i)
	ctx := w.adopt(&cr.node, name)
	conn, err := udpio.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		return nil, err
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"region": spec.Name, "replica": strconv.Itoa(i)}, w.Registry)
	relay, err := clusterrelay.New(clusterrelay.Config{Cluster: spec.Cluster, Pods: cr.Directory, HopKeys: w.hop[spec.Cluster], Batch: 32, Logger: w.cfg.Logger, Registerer: reg}, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	cr.Relay = relay
	cr.closers = append(cr.closers, relay.Close)
	w.run(&cr.node, ctx, relay.Run)
	front := clusterrelay.NewFront(clusterrelay.FrontConfig{Cluster: spec.Cluster, Pods: cr.Directory, HTTPClient: w.httpClient, Logger: w.cfg.Logger})
	if cr.Front, err = w.serveHTTP(&cr.node, "127.0.0.1:0", front.Handler()); err != nil {
		return nil, err
	}
	if cr.ClusterPool, err = w.newPool(name, false, membership.Meta{
		Role: membership.RoleClusterRelay, Region: spec.Name, Cluster: spec.Cluster, Data: relay.Addr(),
	}, clusterSeed); err != nil {
		return nil, err
	}
	cr.closers = append(cr.closers, cr.ClusterPool.Close)
	if cr.GlobalPool, err = w.newPool(name+"@global", true, membership.Meta{
		Role: membership.RoleClusterRelay, Region: spec.Name, Cluster: spec.Cluster, Data: relay.Addr(), API: cr.Front,
		Draining: true, // until it hears of a ready pod
	}, globalSeed); err != nil {
		return nil, err
	}
	cr.closers = append(cr.closers, cr.GlobalPool.Close)
	goLoop(&cr.node, func() { clusterrelay.FollowPods(ctx, cr.ClusterPool, spec.Cluster, cr.Directory) })
	goLoop(&cr.node, func() { clusterrelay.PublishAggregate(ctx, cr.GlobalPool, cr.Directory, nil) })
	return cr, nil
}

func (w *World) startPOP(rg *Region, public netip.AddrPort) error {
	_, err := w.startPOPReplica(rg, public)
	return err
}

func (w *World) startPOPReplica(rg *Region, public netip.AddrPort) (*POPReplica, error) {
	spec := rg.Spec
	rg.popGen++
	name := spec.Name + "/globalrelay-" + spec.POPName
	if rg.popGen > 1 {
		name += "#" + strconv.Itoa(rg.popGen)
	}
	rep := &POPReplica{}
	ctx := w.adopt(&rep.node, name)
	n := &rep.node
	err := w.buildPOPReplica(rg, rep, n, ctx, public)
	if err != nil {
		return nil, err
	}
	rg.POPReplicas = append(rg.POPReplicas, rep)
	rg.GlobalRelay, rg.GlobalPool = rg.POPReplicas[0].Relay, rg.POPReplicas[0].Pool
	return rep, nil
}

func (w *World) buildPOPReplica(rg *Region, rep *POPReplica, n *node, ctx context.Context, public netip.AddrPort) error {
	spec := rg.Spec
	pubs, ins, err := udpio.ListenWorkerPairs(public, netip.MustParseAddrPort("127.0.0.1:0"), w.cfg.WorkersPerPOP)
	if err != nil {
		return fmt.Errorf("POP %s: %w", spec.POPName, err)
	}
	workers := make([]globalrelay.Worker, len(pubs))
	for i := range pubs {
		workers[i] = globalrelay.Worker{Public: pubs[i], Internal: ins[i]}
	}
	closeAll := func() {
		for _, wk := range workers {
			wk.Public.Close()
			wk.Internal.Close()
		}
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"pop": spec.POPName, "gen": strconv.Itoa(rg.popGen)}, w.Registry)
	var relay *globalrelay.Relay
	var cache routecache.Cache
	if !w.cfg.NoRouteCache {
		ccfg := routecache.Config{Logger: w.cfg.Logger, Registerer: reg,
			OnFound: func(c netip.AddrPort, r routecache.Route) { relay.RestoreFlow(c, r) }}
		if w.cfg.RedisURL != "" {
			cache, err = routecache.Open(w.cfg.RedisURL, ccfg)
		} else {
			cache, err = routecache.NewMemoryOn(w.memStore, ccfg)
		}
		if err != nil {
			closeAll()
			return err
		}
		n.closers = append(n.closers, cache.Close)
	}
	clusters := globalrelay.NewClusters(nil)
	relay, err = globalrelay.New(globalrelay.Config{POP: spec.POP, Keys: w.keys, HopKeys: encap.NewClusterKeys(w.hop), Clusters: clusters, FlowIdle: w.cfg.FlowIdle,
		Cache: cache, Batch: 32, Logger: w.cfg.Logger, Registerer: reg}, workers)
	if err != nil {
		closeAll()
		return err
	}
	rep.Relay = relay
	n.closers = append(n.closers, relay.Close)
	if cache != nil {
		w.run(n, ctx, cache.Run)
	}
	if rep.Pool, err = w.newPool(n.name, true, membership.Meta{
		Role: membership.RoleGlobalRelay, Region: spec.Name, POP: spec.POP, Data: relay.PublicAddr(),
	}, &w.globalSeed); err != nil {
		return err
	}
	n.closers = append(n.closers, rep.Pool.Close)
	// Learn the cluster relays before taking traffic, as a restarted
	// replica would wait for readiness.
	goLoop(n, func() { globalrelay.FollowClusters(ctx, rep.Pool, clusters) })
	deadline := time.Now().Add(5 * time.Second)
	for clusters.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	w.run(n, ctx, relay.Run)
	return nil
}

// RestartPOP replaces region i's first global relay replica with a new
// one on the same public address, as after a crash and restart: the old
// one stops without goodbye, the new one has an empty flow table, new
// internal sockets and a new gossip identity.
func (w *World) RestartPOP(i int) error {
	rg := w.Regions[i]
	old := rg.POPReplicas[0]
	public := old.Relay.PublicAddr()
	old.Kill()
	rg.POPReplicas = rg.POPReplicas[1:]
	rep, err := w.startPOPReplica(rg, public)
	if err != nil {
		return err
	}
	// Keep the new replica first, where the old one was.
	rg.POPReplicas = append([]*POPReplica{rep}, rg.POPReplicas[:len(rg.POPReplicas)-1]...)
	rg.GlobalRelay, rg.GlobalPool = rep.Relay, rep.Pool
	return nil
}

// AddPOPReplica starts another global relay replica of region i's POP on
// the same public address.
func (w *World) AddPOPReplica(i int) (*POPReplica, error) {
	rg := w.Regions[i]
	return w.startPOPReplica(rg, rg.GlobalRelay.PublicAddr())
}

func (w *World) startSignaling(globalSeed *string) error {
	n, _ := w.newNode("signaling")
	loc, err := geo.NewLocator(geo.LocatorConfig{DB: geo.DevGeoIPDB, Default: w.Catalogue.DefaultLocation(),
		TrustedProxies: w.cfg.TrustedProxies, Logger: w.cfg.Logger})
	if err != nil {
		return err
	}
	n.closers = append(n.closers, loc.Close)
	if w.SignalingPool, err = w.newPool("signaling", true, membership.Meta{Role: membership.RoleSignaling}, globalSeed); err != nil {
		return err
	}
	n.closers = append(n.closers, w.SignalingPool.Close)
	health := signaling.GossipHealth{Pool: w.SignalingPool}
	secretKey := make([]byte, 32)
	if _, err := rand.Read(secretKey); err != nil {
		return err
	}
	sig, err := signaling.New(signaling.Config{
		Catalogue: w.Catalogue, Locator: loc, Health: health.Cluster, POPUp: health.POPUp, SessionAPIs: health.SessionAPIs,
		GossipAuthoritative: health.Authoritative,
		APIKeys:             w.cfg.APIKeys, ClientSecretKey: secretKey,
		// Everything in the dev world comes from one address; a per-IP
		// limit meant for the internet would throttle load tests.
		RatePerSecond: 10000, RateBurst: 10000,
		CORSOrigins: []string{"*"}, Web: web.FS(), HTTPClient: w.httpClient, Logger: w.cfg.Logger, Registerer: w.Registry,
	})
	if err != nil {
		return err
	}
	if w.SignalingURL, err = w.serveHTTP(n, w.cfg.HTTPAddr, sig.Handler()); err != nil {
		return err
	}
	if w.cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(w.Registry, promhttp.HandlerOpts{}))
		if w.MetricsURL, err = w.serveHTTP(n, w.cfg.MetricsAddr, mux); err != nil {
			return err
		}
		w.MetricsURL += "/metrics"
	}
	return nil
}

// awaitConverged waits until gossip has told every cluster relay about all
// its pods and every global relay and signaling about all cluster relays, so
// the first call after Start finds the world as configured.
func (w *World) awaitConverged(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ok := true
		relays := 0
		for _, rg := range w.Regions {
			for _, cr := range rg.ClusterRelays {
				if _, _, ready := cr.Directory.Aggregate(); ready != len(rg.Pods) {
					ok = false
				}
			}
			relays += len(rg.ClusterRelays)
		}
		for _, pool := range w.globalPools() {
			n := 0
			for _, m := range pool.Members() {
				if m.State == membership.StateAlive && m.Meta.Role == membership.RoleClusterRelay && m.Meta.Capacity > 0 && !m.Meta.Draining {
					n++
				}
			}
			if n != relays {
				ok = false
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("devworld: gossip did not converge")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *World) globalPools() []*membership.Pool {
	out := []*membership.Pool{w.SignalingPool}
	for _, rg := range w.Regions {
		out = append(out, rg.GlobalPool)
	}
	return out
}

// serveHTTP serves h on addr for node n and returns its base URL.
func (w *World) serveHTTP(n *node, addr string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := signaling.NewHTTPServer(h, w.log)
	n.servers = append(n.servers, srv)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			w.log.Error("http server", "err", err)
		}
	}()
	return "http://" + ln.Addr().String(), nil
}

// Err returns the errors components stopped with, if any.
func (w *World) Err() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return errors.Join(w.errs...)
}

// Close stops everything, newest first, and waits for it.
func (w *World) Close() error {
	for i := len(w.nodes) - 1; i >= 0; i-- {
		w.nodes[i].stop()
	}
	w.httpClient.CloseIdleConnections()
	return nil
}

// String summarises the world for the console.
func (w *World) String() string {
	var b strings.Builder
	b.WriteString("rtcedge dev world\n  signaling + demo page: " + w.SignalingURL + "\n")
	for _, rg := range w.Regions {
		fmt.Fprintf(&b, "  region %s: cluster %d (%d pods, %d cluster relays), POP %s at %s\n",
			rg.Spec.Name, rg.Spec.Cluster, len(rg.Pods), len(rg.ClusterRelays), rg.Spec.POPName, rg.GlobalRelay.PublicAddr())
	}
	if w.MetricsURL != "" {
		b.WriteString("  metrics: " + w.MetricsURL + "\n")
	}
	return b.String()
}

// Sessions returns the number of sessions held by every pod of the world.
func (w *World) Sessions() int {
	n := 0
	for _, rg := range w.Regions {
		for _, p := range rg.Pods {
			n += p.Transceiver.Sessions()
		}
	}
	return n
}

// SessionAPIs returns the cluster's live session API fronts as signaling
// sees them through gossip.
func (w *World) SessionAPIs(cluster uint16) []string {
	return signaling.GossipHealth{Pool: w.SignalingPool}.SessionAPIs(cluster)
}
