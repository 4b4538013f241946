// Package devworld builds the whole rtcedge system in one process on
// loopback: regions with a cluster of transceiver pods and cluster relay
// replicas each, a global relay per POP on its own loopback address, real
// memberlist gossip between all of them, and signaling with an embedded
// GeoIP database and the demo page. `rtcedge dev` runs it, and the
// end-to-end tests build it the same way with every port at 0.
//
// Every component is the same node a production process runs
// (transceiver.NewNode, clusterrelay.NewNode, globalrelay.NewNode,
// signaling.NewNode, netbackend.NewNode), from the same config structs;
// only the addresses (loopback, port 0) and the gossip timings (fast,
// unless Config.ProductionGossip) are the dev world's own.
package devworld

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rtcedge/rtcedge/backend/netbackend"
	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/signaling"
	"github.com/rtcedge/rtcedge/sipfront"
	"github.com/rtcedge/rtcedge/transceiver"
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
	// MetricsAddr serves /metrics for every component (and signaling's
	// /livez and /readyz); "" = none.
	MetricsAddr string
	// POPPort is the UDP port of every POP VIP; 0 = kernel-chosen per POP.
	POPPort uint16
	// APIKeys, when set, are required by signaling.
	APIKeys []string
	// SIPAddr is the SIP front's UDP and TCP address (docs/sip.md), e.g.
	// 127.0.0.1:5060 or 127.0.0.1:0; "" = no SIP front.
	SIPAddr string
	// AnyAPIKey, without APIKeys, lets any bearer key through as an
	// anonymous caller's (signaling.Config.AnyAPIKey): `rtcedge dev`, so
	// OpenAI's snippets, which always send one, work unchanged.
	AnyAPIKey bool
	// TLSDir, when set, makes signaling serve HTTPS and WSS with a
	// certificate for 127.0.0.1 from a throwaway CA, written there
	// (ca.pem, cert.pem, key.pem) and left for clients to trust:
	// World.TLSCA names the CA (NODE_EXTRA_CA_CERTS for Node).
	TLSDir string
	// Signaling, when set, adjusts signaling's config before it starts
	// (tests: a credential's options).
	Signaling func(*signaling.Config)
	// SIP, when set, adjusts the SIP front's config before it starts
	// (tests: a webhook, API keys and api_addr for call control).
	SIP func(*sipfront.NodeConfig)
	// TrustedProxies lets tests stand in for Cloudflare: signaling believes
	// CF-Connecting-IP, CF-IPLatitude/CF-IPLongitude from these peers.
	TrustedProxies []netip.Prefix
	// GeoIPDB is a GeoIP2/GeoLite2 City .mmdb file for signaling; "" = the
	// embedded dev database (a few documentation ranges).
	GeoIPDB string
	// Transceiver tweaks (zero = package defaults).
	ConnectTimeout time.Duration
	MaxSessions    int
	RouteTTL       time.Duration
	RTPTimeout     time.Duration // a phone call without RTP for this long ends (docs/sip.md)
	// FlowIdle is the global relays' flow expiry (zero = package default).
	FlowIdle time.Duration
	// RedisURL makes the global relays share flows through Redis. Empty:
	// an in-process store shared by all relays of the world plays Redis.
	RedisURL string
	// NetBackend runs the echo backend as a network service (the
	// netbackend protocol over loopback TCP) instead of in process.
	NetBackend bool
	// BackendAddr points every pod at a network backend run by the caller
	// (host:port, the netbackend protocol) instead.
	BackendAddr string
	// BackendURL points every pod at a model server speaking the OpenAI
	// Realtime protocol (transceiver.Config.BackendURL, the API key from
	// $RTCEDGE_BACKEND_API_KEY), sent BackendProtocol at BackendRate.
	BackendURL      string
	BackendProtocol string
	BackendRate     int
	// SessionAPITLS runs every session API (pods, cluster fronts) over TLS
	// with a throwaway CA that signaling and the fronts verify, as
	// production does (docs/operations.md).
	SessionAPITLS bool
	// NoRouteCache runs the global relays without any shared cache: a
	// restarted relay then recovers flows only from the next STUN check
	// (or a reply from the cluster side).
	NoRouteCache bool
	// ProductionGossip runs every pool with the roles' real memberlist
	// timings (LAN for cluster pools, WAN for the global pool, as
	// cmd/rtcedge without `fast: true`) instead of the loopback Fast
	// ones, so failure tests see production detection times.
	ProductionGossip bool
	// OnRepick, when set, traces every global relay replica's changes of a
	// flow's cluster relay (globalrelay.Relay.SetRepickTrace), with the
	// replica's node name; it is called from the relays' workers and must
	// not block. The soak run attributes media gaps with it.
	OnRepick func(node string, ev globalrelay.RepickEvent)

	Logger *slog.Logger // default slog.Default()
}

// readyLimit bounds the wait for a new global relay replica to be ready:
// it must join gossip and learn a live cluster relay of each cluster, and
// a join that failed on a loaded machine is retried after a back-off of up
// to 10 s (node.JoinLoop), so the limit outlasts two such retries.
const readyLimit = 30 * time.Second

// Pod is one transceiver pod.
type Pod struct {
	*transceiver.Node
	ID          uint16
	Transceiver *transceiver.Transceiver
	API         string // base URL of the pod's session API
	Data        netip.AddrPort
	Pool        *membership.Pool
	Relays      *transceiver.RelaySet // the cluster relays it accepts datagrams from
	running
}

// ClusterRelay is one cluster relay replica with its session API front.
type ClusterRelay struct {
	*clusterrelay.Node
	Relay       *clusterrelay.Relay
	Directory   *clusterrelay.Directory
	Front       string // base URL of the cluster session API it serves
	ClusterPool *membership.Pool
	GlobalPool  *membership.Pool
	running
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
	// TCPAddr is the POP's ICE-TCP address (same IP as the UDP VIP, a
	// kernel-chosen port shared by every replica).
	TCPAddr netip.AddrPort
	popGen  int
	crGen   int // generations of restarted cluster relays (RestartClusterRelay)
}

// POPReplica is one global relay replica of a POP.
type POPReplica struct {
	*globalrelay.Node
	Relay *globalrelay.Relay
	Pool  *membership.Pool
	running
}

// World is a running dev world.
type World struct {
	Regions       []*Region
	Catalogue     *geo.Catalogue
	SignalingURL  string // e.g. http://127.0.0.1:8080 (https:// with Config.TLSDir)
	TLSCA         string // the CA file signaling's certificate verifies with (Config.TLSDir), else ""
	MetricsURL    string // "" when MetricsAddr was empty
	Registry      *prometheus.Registry
	SignalingPool *membership.Pool
	Signaling     *signaling.Node
	SIP           *sipfront.Node // nil without Config.SIPAddr
	SIPURI        string         // the URI a softphone calls, e.g. sip:agent@127.0.0.1:5060
	SIPAPIURL     string         // the SIP front's call-control API (http://…) when Config.SIP set api_addr, else ""

	cfg Config
	log *slog.Logger
	// auth holds the clusters' authority secrets (random per world), as
	// production's relays do: relays get them, every pod only the keys
	// issued for it (internal/authority).
	auth     *authority.Secrets
	authKeys node.Authority // every cluster's secret
	// The global pool's keys: each POP's secret, signaling's secret and
	// the public keys of all (cluster relays get signaling's).
	popKeys    map[uint16]string
	sigKeys    []string
	sigPub     []string
	memStore   *routecache.MemoryStore // the dev stand-in for Redis
	backend    string                  // the network backend's address, if any
	httpClient *http.Client            // control-plane calls between components; idle conns closed by Close
	globalSeed []string
	clusters   []uint16
	// apiSecrets are the clusters' session API bearer secrets, random per
	// world, so the dev world runs the internal APIs authenticated as
	// production does.
	apiSecrets map[uint16]string
	// gossipKey encrypts the world's gossip, random per world: two worlds
	// on one loopback (tests in parallel packages, a port one world freed
	// and another reused) must never merge their pools.
	gossipKey string
	// gossip gathers every pool of the world: Close waits for the last of
	// their goroutines (a probe outlives memberlist's Shutdown).
	gossipGroup *membership.Group
	// apiTLS and apiCA are the session APIs' TLS (SessionAPITLS): the
	// servers' certificate and the clients' CA.
	apiTLS, apiCA sessionapi.TLS
	errMu         sync.Mutex
	errs          []error
	nodes         []*running // in start order; stopped in reverse
}

// running is one node's Run goroutine.
type running struct {
	name string
	n    io.Closer
	stop context.CancelFunc // ends Run's context: a graceful stop
	done chan struct{}
}

// Kill stops the component abruptly: its sockets close and its gossip stops
// without a goodbye, so others detect it as dead, as after a crash.
func (r *running) Kill() {
	_ = r.n.Close()
	<-r.done
}

// Stop starts a graceful stop, as the first SIGTERM does for a process:
// the node drains (a pod keeps its calls until they end or its drain
// timeout), leaves gossip and returns from Run. The channel is closed then.
func (r *running) Stop() <-chan struct{} {
	r.stop()
	return r.done
}

// run starts n's Run and records its failure.
func (w *World) run(r *running, name string, n interface {
	io.Closer
	Run(context.Context) error
}) {
	ctx, stop := context.WithCancel(context.Background())
	*r = running{name: name, n: n, stop: stop, done: make(chan struct{})}
	w.nodes = append(w.nodes, r)
	go func() {
		defer close(r.done)
		defer stop()
		if err := n.Run(ctx); err != nil {
			w.errMu.Lock()
			w.errs = append(w.errs, fmt.Errorf("%s: %w", name, err))
			w.errMu.Unlock()
			w.log.Error("component stopped", "node", name, "err", err)
		}
	}()
}

// labelNames are the labels the world's registry adds to every node's
// metrics (empty where they do not apply): metric families must keep one
// set of label names, and every node has gossip metrics.
var labelNames = []string{"node", "region", "pod", "replica", "pop", "gen"}

// env is a node's environment: the world's logger and HTTP client, and the
// world's registry with labels naming the node (kv: name, value pairs).
func (w *World) env(name string, kv ...string) node.Env {
	return node.Env{Logger: w.cfg.Logger, Registerer: prometheus.WrapRegistererWith(w.labels(name, kv...), w.Registry), HTTPClient: w.httpClient}
}

// labels are the labels naming a node (env).
func (w *World) labels(name string, kv ...string) prometheus.Labels {
	labels := prometheus.Labels{}
	for _, l := range labelNames {
		labels[l] = ""
	}
	labels["node"] = name
	for i := 0; i+1 < len(kv); i += 2 {
		labels[kv[i]] = kv[i+1]
	}
	return labels
}

// GossipKey returns the key the world's gossip is encrypted with (random
// per world), for tests that join a pool as an insider would.
func (w *World) GossipKey() []byte {
	k, _ := base64.StdEncoding.DecodeString(w.gossipKey)
	return k
}

// gossip is a dev pool's config: loopback, fast timings unless
// ProductionGossip, the world's own key.
func (w *World) gossip(name string, join []string) node.Gossip {
	return node.Gossip{Name: name, Bind: "127.0.0.1:0", Join: join, Key: w.gossipKey, Fast: !w.cfg.ProductionGossip, Group: w.gossipGroup}
}

// Start builds and starts a world. Close stops it.
func Start(cfg Config) (*World, error) {
	if len(cfg.Regions) == 0 {
		cfg.Regions = DefaultRegions
	}
	cfg.PodsPerCluster = cmp(cfg.PodsPerCluster, 2)
	cfg.RelaysPerCluster = cmp(cfg.RelaysPerCluster, 2)
	cfg.WorkersPerPOP = cmp(cfg.WorkersPerPOP, 2)
	config.Default(&cfg.HTTPAddr, "127.0.0.1:0")
	config.Default(&cfg.Logger, slog.Default())
	w := &World{cfg: cfg, log: cfg.Logger.With("component", "devworld"), Registry: prometheus.NewRegistry(),
		memStore: routecache.NewMemoryStore(), gossipGroup: membership.NewGroup(),
		httpClient: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}}}
	if err := w.start(); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

func cmp(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func (w *World) start() error {
	cfg := w.cfg
	w.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := w.mintKeys(); err != nil {
		return err
	}
	if cfg.NetBackend {
		b, err := netbackend.NewNode(netbackend.NodeConfig{Listen: "127.0.0.1:0"}, nil, nil, w.env("backend"))
		if err != nil {
			return err
		}
		w.run(new(running), "backend", b) // the first node, so it stops last
		w.backend = b.Addr()
	}
	if cfg.BackendAddr != "" {
		w.backend = cfg.BackendAddr
	}
	if cfg.SessionAPITLS {
		// The files are read while the nodes are built, then removed.
		dir, err := os.MkdirTemp("", "rtcedge-dev-ca-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if w.apiTLS, w.apiCA, err = sessionapi.WriteDevCA(dir, net.IPv4(127, 0, 0, 1)); err != nil {
			return err
		}
	}
	w.gossipKey = randomKey(32, base64.StdEncoding)
	w.apiSecrets = map[uint16]string{}
	for _, spec := range cfg.Regions {
		w.clusters = append(w.clusters, spec.Cluster)
		w.apiSecrets[spec.Cluster] = randomKey(24, base64.RawURLEncoding)
	}
	cat, err := w.startRegions()
	if err != nil {
		return err
	}
	if err := cat.Validate(); err != nil {
		return err
	}
	w.Catalogue = cat
	if err := w.startSignaling(); err != nil {
		return err
	}
	if cfg.SIPAddr != "" {
		if err := w.startSIP(); err != nil {
			return err
		}
	}
	// A member whose join failed retries it after a back-off of up to
	// 10 s (node.JoinLoop): the stall limit outlasts one such retry.
	stall := 20 * time.Second
	if cfg.ProductionGossip {
		// WAN timings gossip every 500 ms and wait up to 10 s for a meta
		// broadcast; a loaded machine needs more.
		stall = 30 * time.Second
	}
	return w.awaitConverged(stall, convergeCap*stall)
}

// mintKeys derives the world's authority keys from one random root, as
// the deployment's issuer would: a secret per cluster and per POP,
// signaling's own, and the public keys signaling checks the others with.
func (w *World) mintKeys() error {
	root := make([]byte, authority.KeyLen)
	if _, err := rand.Read(root); err != nil {
		return err
	}
	for _, spec := range w.cfg.Regions {
		w.authKeys.Keys = append(w.authKeys.Keys, authority.Spec(spec.Cluster, 1, authority.ClusterSecret(root, spec.Cluster)))
	}
	var err error
	if w.auth, err = w.authKeys.Secrets(); err != nil {
		return err
	}
	w.popKeys = map[uint16]string{}
	sig := authority.SignalingSpec(1, authority.SignalingSecret(root))
	all := append([]string{sig}, w.authKeys.Keys...)
	for _, spec := range w.cfg.Regions {
		w.popKeys[spec.POP] = authority.POPSpec(spec.POP, 1, authority.POPSecret(root, spec.POP))
		all = append(all, w.popKeys[spec.POP])
	}
	allSec, err := authority.Parse(all)
	if err != nil {
		return err
	}
	w.sigKeys = []string{sig}
	for _, k := range allSec.PublicSpecs() {
		if strings.HasPrefix(k, "signaling-pub/") {
			w.sigPub = append(w.sigPub, k)
		} else {
			w.sigKeys = append(w.sigKeys, k) // signaling checks relays and POPs
		}
	}
	return nil
}

// startRegions starts every region's pods and cluster relays, then (once
// every cluster relay can seed the global pool) its POP, and returns the
// catalogue of what runs.
func (w *World) startRegions() (*geo.Catalogue, error) {
	cfg := w.cfg
	cat := &geo.Catalogue{DefaultRegion: cfg.Regions[0].Name}
	for _, spec := range cfg.Regions {
		rg := &Region{Spec: spec}
		w.Regions = append(w.Regions, rg)
		var clusterSeed []string
		for i := range cfg.PodsPerCluster {
			p, err := w.startPod(spec, uint16(i+1), clusterSeed)
			if err != nil {
				return nil, err
			}
			clusterSeed = []string{p.Pool.LocalAddr().String()}
			rg.Pods = append(rg.Pods, p)
		}
		for i := range cfg.RelaysPerCluster {
			cr, err := w.startClusterRelay(spec, i+1, clusterSeed)
			if err != nil {
				return nil, err
			}
			rg.ClusterRelays = append(rg.ClusterRelays, cr)
		}
	}
	for _, rg := range w.Regions {
		if _, err := w.startPOPReplica(rg, netip.AddrPortFrom(rg.Spec.POPIP, cfg.POPPort)); err != nil {
			return nil, err
		}
		spec := rg.Spec
		cat.Regions = append(cat.Regions, geo.Region{
			Name: spec.Name, Location: spec.Location,
			Clusters: []geo.Cluster{{ID: spec.Cluster, Name: spec.Name + "-1", Location: spec.Location, SessionAPI: rg.ClusterRelays[0].Front}},
			POPs:     []geo.POP{{ID: spec.POP, Name: spec.POPName, VIP: rg.GlobalRelay.PublicAddr(), TCPPort: rg.TCPAddr.Port(), Location: spec.Location}},
		})
	}
	return cat, nil
}

// convergeCap bounds a convergence that keeps progressing, as a multiple
// of the stall limit: a world whose members join one by one on a machine
// so loaded (or under -race) that each takes seconds still starts, and one
// that never completes still fails.
const convergeCap = 4

// randomKey is n random bytes in enc.
func randomKey(n int, enc *base64.Encoding) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails
	return enc.EncodeToString(b)
}

func (w *World) startPod(spec RegionSpec, id uint16, clusterSeed []string) (*Pod, error) {
	name := spec.Name + "/pod-" + strconv.Itoa(int(id))
	cfg := transceiver.Config{
		Region: spec.Name, Cluster: spec.Cluster, Pod: id, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0",
		MaxSessions: w.cfg.MaxSessions, ConnectTimeout: w.cfg.ConnectTimeout, RouteTTL: w.cfg.RouteTTL,
		RTPTimeout:  w.cfg.RTPTimeout,
		BackendAddr: w.backend, Gossip: w.gossip(name, clusterSeed),
		BackendURL: w.cfg.BackendURL, BackendProtocol: w.cfg.BackendProtocol, BackendRate: w.cfg.BackendRate,
		APITLS: w.apiTLS, RedisURL: w.cfg.RedisURL,
	}
	if !w.cfg.NoRouteCache {
		cfg.CacheStore = w.memStore // phone calls' routes (docs/wire.md §6)
	}
	// The pod holds only what the issuer derives for it, as in production.
	keys, err := w.auth.Pod(spec.Cluster, id)
	if err != nil {
		return nil, err
	}
	if err := cfg.UsePodKeys(keys); err != nil {
		return nil, err
	}
	env := w.env(name, "region", spec.Name, "pod", strconv.Itoa(int(id)))
	// The turn metrics' pop label is the POP of a call's path, not a node's.
	turn := w.labels(name, "region", spec.Name, "pod", strconv.Itoa(int(id)))
	delete(turn, "pop")
	cfg.TurnRegisterer = prometheus.WrapRegistererWith(turn, w.Registry)
	b, err := cfg.NewBackend(os.Getenv, w.cfg.Logger, env.Registerer)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	socks, err := transceiver.OpenSockets(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	n, err := transceiver.NewNode(cfg, socks, b, env)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &Pod{Node: n, ID: id, Transceiver: n.Transceiver(), API: n.APIURL(), Data: n.Data(), Pool: n.Pool(), Relays: n.Relays()}
	w.run(&p.running, name, n)
	return p, nil
}

// authOf is the authority config of cluster's relays: its secret, and
// signaling's public key.
func (w *World) authOf(cluster uint16) node.Authority {
	prefix := strconv.Itoa(int(cluster)) + "/"
	var a node.Authority
	for _, k := range w.authKeys.Keys {
		if strings.HasPrefix(k, prefix) {
			a.Keys = append(a.Keys, k)
		}
	}
	a.Keys = append(a.Keys, w.sigPub...)
	return a
}

// authOfPOP is the authority config of pop's global relays: every
// cluster's secret and the POP's own.
func (w *World) authOfPOP(pop uint16) node.Authority {
	return node.Authority{Keys: append(slices.Clone(w.authKeys.Keys), w.popKeys[pop])}
}

func (w *World) startClusterRelay(spec RegionSpec, i int, clusterSeed []string) (*ClusterRelay, error) {
	return w.startClusterRelayGen(spec, i, 1, clusterSeed, w.globalSeed)
}

func (w *World) startClusterRelayGen(spec RegionSpec, i, gen int, clusterSeed, globalSeed []string) (*ClusterRelay, error) {
	name := crName(spec, i, gen)
	cfg := clusterrelay.Config{
		Region: spec.Name, Cluster: spec.Cluster, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0",
		Authority: w.authOf(spec.Cluster), ClusterGossip: w.gossip(name, clusterSeed), GlobalGossip: w.gossip(name, globalSeed),
		SessionAPISecret: w.apiSecrets[spec.Cluster],
		APITLS:           sessionapi.TLS{Cert: w.apiTLS.Cert, Key: w.apiTLS.Key, CA: w.apiCA.CA},
	}
	s, err := clusterrelay.OpenSockets(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	n, err := clusterrelay.NewNode(cfg, s, w.env(name, "region", spec.Name, "replica", strconv.Itoa(i), "gen", strconv.Itoa(gen)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cr := &ClusterRelay{Node: n, Relay: n.Relay(), Directory: n.Directory(), Front: n.APIURL(),
		ClusterPool: n.ClusterPool(), GlobalPool: n.GlobalPool()}
	if w.globalSeed == nil {
		w.globalSeed = []string{cr.GlobalPool.LocalAddr().String()}
	}
	w.run(&cr.running, name, n)
	return cr, nil
}

// startPOPReplica starts a global relay replica of rg's POP on public and
// returns once it is ready, as a load balancer would wait for /readyz.
func (w *World) startPOPReplica(rg *Region, public netip.AddrPort) (*POPReplica, error) {
	spec := rg.Spec
	rg.popGen++
	name := spec.Name + "/globalrelay-" + spec.POPName
	if rg.popGen > 1 {
		name += "#" + strconv.Itoa(rg.popGen)
	}
	var store *routecache.MemoryStore
	if !w.cfg.NoRouteCache {
		store = w.memStore
	}
	tcp := rg.TCPAddr
	if !tcp.IsValid() {
		tcp = netip.AddrPortFrom(public.Addr(), 0)
	}
	cfg := globalrelay.Config{
		Region: spec.Name, POP: spec.POP, PublicAddr: public.String(), InternalAddr: "127.0.0.1", TCPAddr: tcp.String(),
		Workers: w.cfg.WorkersPerPOP, FlowIdle: w.cfg.FlowIdle, Clusters: w.clusters, RedisURL: w.cfg.RedisURL,
		Authority: w.authOfPOP(spec.POP), Gossip: w.gossip(name, w.globalSeed), CacheStore: store,
	}
	s, err := globalrelay.OpenSockets(cfg)
	if err != nil {
		return nil, fmt.Errorf("POP %s: %w", spec.POPName, err)
	}
	n, err := globalrelay.NewNode(cfg, s, w.env(name, "pop", spec.POPName, "gen", strconv.Itoa(rg.popGen)))
	if err != nil {
		return nil, fmt.Errorf("POP %s: %w", spec.POPName, err)
	}
	rep := &POPReplica{Node: n, Relay: n.Relay(), Pool: n.Pool()}
	if fn := w.cfg.OnRepick; fn != nil {
		rep.Relay.SetRepickTrace(func(ev globalrelay.RepickEvent) { fn(name, ev) })
	}
	rg.TCPAddr = n.TCP().Addr()
	w.run(&rep.running, name, n)
	if err := awaitReady(n.Ready, readyLimit); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	rg.POPReplicas = append(rg.POPReplicas, rep)
	rg.GlobalRelay, rg.GlobalPool = rg.POPReplicas[0].Relay, rg.POPReplicas[0].Pool
	return rep, nil
}

// awaitReady polls ready (a node's Ready) until it reports nil.
func awaitReady(ready func() error, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", limit, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// RestartPOP replaces region i's first global relay replica with a new
// one on the same public address, as after a crash and restart: the old
// one stops without goodbye, the new one has an empty flow table, new
// internal sockets and a new gossip identity. It returns once the new
// replica is ready.
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

func (w *World) startSignaling() error {
	var trusted []string
	for _, p := range w.cfg.TrustedProxies {
		trusted = append(trusted, p.String())
	}
	var public sessionapi.TLS
	if w.cfg.TLSDir != "" {
		var ca sessionapi.TLS
		var err error
		if public, ca, err = sessionapi.WriteDevCA(w.cfg.TLSDir, net.IPv4(127, 0, 0, 1), net.IPv6loopback); err != nil {
			return fmt.Errorf("signaling certificate: %w", err)
		}
		w.TLSCA = ca.CA
	}
	scfg := signaling.Config{
		Common:     node.Common{MetricsAddr: w.cfg.MetricsAddr},
		ListenAddr: w.cfg.HTTPAddr, CatalogueData: w.Catalogue, GeoIPDB: w.cfg.GeoIPDB, CloudflareRanges: trusted,
		APIKeys: w.cfg.APIKeys, ClientSecretKey: randomKey(32, base64.StdEncoding),
		// Without keys the dev world is open: the demo page mints its own
		// client secrets.
		AllowAnonymous: len(w.cfg.APIKeys) == 0, AnyAPIKey: w.cfg.AnyAPIKey && len(w.cfg.APIKeys) == 0, TLS: public,
		SessionAPISecrets: w.apiSecrets, SessionAPITLS: w.apiCA,
		// Everything in the dev world comes from one address and a few
		// credentials; limits meant for the internet would throttle load
		// tests.
		RatePerSecond: 10000, RateBurst: 10000, KeyRatePerSecond: 10000, KeyRateBurst: 10000,
		SecretRatePerSecond: 10000, SecretRateBurst: 10000,
		CORSOrigins: []string{"*"}, DemoPage: true, Gossip: w.gossip("signaling", w.globalSeed), Authority: node.Authority{Keys: w.sigKeys},
	}
	if scfg.GeoIPDB == "" {
		scfg.GeoIPData = geo.DevGeoIPDB
	}
	if w.cfg.Signaling != nil {
		w.cfg.Signaling(&scfg)
	}
	socks, err := signaling.OpenSockets(scfg)
	if err != nil {
		return err
	}
	env := w.env("signaling")
	if socks.Metrics != nil {
		env.Gatherer, w.MetricsURL = w.Registry, "http://"+socks.Metrics.Addr().String()+"/metrics"
	}
	n, err := signaling.NewNode(scfg, socks, env)
	if err != nil {
		return err
	}
	w.Signaling, w.SignalingURL, w.SignalingPool = n, n.URL(), n.Pool()
	// Later members (restarted replicas) may join through signaling too:
	// the first cluster relay, the first seed, may be the one that died.
	w.globalSeed = append(w.globalSeed, n.Pool().LocalAddr().String())
	w.run(new(running), "signaling", n)
	return nil
}

// awaitConverged waits until gossip has told every cluster relay about all
// its pods, every global relay and signaling about all cluster relays, and
// signaling about every POP's global relay, so the first call after Start
// finds the world as configured.
func (w *World) awaitConverged(stall, limit time.Duration) error {
	return awaitProgress(w.convergence, stall, limit, time.Now, time.Sleep)
}

// awaitProgress polls check until it reports nothing missing. It fails
// once stall passes with nothing more known than before (a member that
// never joins, or gossip that lost one: a member lost and found again is
// no progress), or after limit in all. A loaded machine (or -race) slows
// each member's joining, so the wait is keyed to that progress rather
// than to one fixed time; now and sleep are the clock.
func awaitProgress(check func() (missing []string, known int), stall, limit time.Duration,
	now func() time.Time, sleep func(time.Duration)) error {
	start := now()
	progressed, best := start, -1
	for {
		missing, known := check()
		if len(missing) == 0 {
			return nil
		}
		t := now()
		if known > best {
			progressed, best = t, known
		}
		if t.Sub(progressed) > stall || t.Sub(start) > limit {
			return fmt.Errorf("devworld: gossip did not converge (%v without progress, %v in all): %s",
				t.Sub(progressed).Round(time.Millisecond), t.Sub(start).Round(time.Millisecond), strings.Join(missing, "; "))
		}
		sleep(20 * time.Millisecond)
	}
}

// convergence lists what gossip has not yet told the world's members
// (awaitConverged), and counts what it has: the ready pods, usable cluster
// relays and POPs each member knows of.
func (w *World) convergence() (missing []string, known int) {
	relays := 0
	for _, rg := range w.Regions {
		for i, cr := range rg.ClusterRelays {
			_, _, ready := cr.Directory.Aggregate()
			known += ready
			if ready != len(rg.Pods) {
				missing = append(missing, fmt.Sprintf("%s cluster relay %d knows %d of %d ready pods", rg.Spec.Name, i+1, ready, len(rg.Pods)))
			}
		}
		relays += len(rg.ClusterRelays)
	}
	for _, pool := range w.globalPools() {
		n := 0
		pops := map[uint16]bool{}
		for _, m := range pool.Members() {
			if m.State != membership.StateAlive || m.Meta.Draining {
				continue
			}
			switch m.Meta.Role {
			case membership.RoleClusterRelay:
				if m.Meta.Capacity > 0 {
					n++
				}
			case membership.RoleGlobalRelay:
				pops[m.Meta.POP] = true
			}
		}
		known += n + len(pops)
		if n != relays {
			missing = append(missing, fmt.Sprintf("%s sees %d of %d usable cluster relays", pool.Name(), n, relays))
		}
		// Signaling offers only the POPs it sees up (and a backup
		// besides): a call placed before it sees them all would get
		// another first POP than the catalogue says.
		if pool == w.SignalingPool && len(pops) != len(w.Regions) {
			missing = append(missing, fmt.Sprintf("%s sees %d of %d POPs up", pool.Name(), len(pops), len(w.Regions)))
		}
	}
	return missing, known
}

func (w *World) globalPools() []*membership.Pool {
	out := []*membership.Pool{w.SignalingPool}
	for _, rg := range w.Regions {
		out = append(out, rg.GlobalPool)
	}
	return out
}

// Err returns the errors components stopped with, if any.
func (w *World) Err() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return errors.Join(w.errs...)
}

// Close stops everything, newest first, and waits for it, down to the last
// goroutine of every gossip pool: a probe in flight outlives memberlist's
// Shutdown by up to a (health-scaled) probe interval, and a world that
// returned before it ended would leave it running into whatever comes next.
// It returns an error when one still runs after membership.MaxLinger.
func (w *World) Close() error {
	for i := len(w.nodes) - 1; i >= 0; i-- {
		w.nodes[i].Kill()
	}
	w.httpClient.CloseIdleConnections()
	// The global pool's WAN timings bound the cluster pools' LAN ones.
	ctx, cancel := context.WithTimeout(context.Background(), membership.MaxLinger(membership.Config{WAN: true, Fast: !w.cfg.ProductionGossip}))
	defer cancel()
	if err := w.gossipGroup.Wait(ctx); err != nil {
		return fmt.Errorf("devworld: close: %w", err)
	}
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
	if w.SIPURI != "" {
		b.WriteString("  SIP (UDP and TCP): " + w.SIPURI + "\n")
	}
	if w.MetricsURL != "" {
		b.WriteString("  metrics: " + w.MetricsURL + "\n")
	}
	if w.TLSCA != "" {
		b.WriteString("  TLS: signaling's certificate is issued by " + w.TLSCA + " (for Node: NODE_EXTRA_CA_CERTS=" + w.TLSCA + ")\n")
	}
	if w.cfg.AnyAPIKey && len(w.cfg.APIKeys) == 0 {
		b.WriteString("  API keys: any bearer key is accepted (OpenAI's snippets work unchanged); a key's calls' sideband attaches with that key only\n")
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
