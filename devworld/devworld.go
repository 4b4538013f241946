// Package devworld builds the whole rtcedge system in one process on
// loopback: regions with a cluster relay and transceivers each, a global
// relay per POP on its own loopback address, signaling with an embedded
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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rtcedge/rtcedge/clusterrelay"
	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/signaling"
	"github.com/rtcedge/rtcedge/transceiver"
	"github.com/rtcedge/rtcedge/transceiver/echo"
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
	// HTTPAddr is signaling's listen address; default 127.0.0.1:0.
	HTTPAddr string
	// MetricsAddr serves /metrics for every component; "" = none.
	MetricsAddr string
	// POPPort is the UDP port of every POP VIP; 0 = kernel-chosen per POP.
	POPPort uint16
	// APIKeys, when set, are required by signaling.
	APIKeys []string
	// Transceiver tweaks (zero = package defaults).
	ConnectTimeout time.Duration
	MaxSessions    int
	RouteTTL       time.Duration
	// FlowIdle is the global relays' flow expiry (zero = package default).
	FlowIdle time.Duration

	Logger *slog.Logger // default slog.Default()
}

// Region is one running region.
type Region struct {
	Spec           RegionSpec
	ClusterRelay   *clusterrelay.Relay
	Transceiver    *transceiver.Transceiver
	TransceiverAPI string // base URL of the pod's session API
	GlobalRelay    *globalrelay.Relay
}

// World is a running dev world.
type World struct {
	Regions      []*Region
	Catalogue    *geo.Catalogue
	SignalingURL string // e.g. http://127.0.0.1:8080
	MetricsURL   string // "" when MetricsAddr was empty
	Registry     *prometheus.Registry

	log     *slog.Logger
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	servers []*http.Server
	closers []func() error
	errMu   sync.Mutex
	errs    []error
}

// Start builds and starts a world. Close stops it.
func Start(cfg Config) (w *World, err error) {
	if len(cfg.Regions) == 0 {
		cfg.Regions = DefaultRegions
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	w = &World{log: cfg.Logger.With("component", "devworld"), cancel: cancel, Registry: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	w.Registry.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))

	key := make([]byte, token.KeyLen)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	keys, err := token.NewKeyring(1, map[uint8][]byte{1: key})
	if err != nil {
		return nil, err
	}
	loop := netip.MustParseAddr("127.0.0.1")

	// Cluster tier first: the pods, then their cluster relay.
	var replicas []globalrelay.Replica
	for _, spec := range cfg.Regions {
		reg := prometheus.WrapRegistererWith(prometheus.Labels{"region": spec.Name}, w.Registry)
		rg := &Region{Spec: spec}
		w.Regions = append(w.Regions, rg)

		podConn, err := listenUDP(netip.AddrPortFrom(loop, 0))
		if err != nil {
			return nil, err
		}
		tr, err := transceiver.New(transceiver.Config{
			Cluster: spec.Cluster, Pod: 1, Keys: keys, Backend: echo.Backend{},
			ConnectTimeout: cfg.ConnectTimeout, MaxSessions: cfg.MaxSessions, RouteTTL: cfg.RouteTTL,
			Logger: cfg.Logger, Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"pod": "1"}, reg),
		}, podConn)
		if err != nil {
			podConn.Close()
			return nil, fmt.Errorf("region %s: %w", spec.Name, err)
		}
		rg.Transceiver = tr
		w.run(ctx, tr.Run)
		w.closers = append(w.closers, tr.Close)
		apiURL, err := w.serveHTTP(netip.AddrPortFrom(loop, 0).String(), tr.Handler())
		if err != nil {
			return nil, err
		}
		rg.TransceiverAPI = apiURL

		crConn, err := listenUDP(netip.AddrPortFrom(loop, 0))
		if err != nil {
			return nil, err
		}
		pods := clusterrelay.NewPods(map[uint16]netip.AddrPort{1: udpAddr(podConn)})
		cr, err := clusterrelay.New(clusterrelay.Config{Cluster: spec.Cluster, Pods: pods, Logger: cfg.Logger, Registerer: reg}, crConn)
		if err != nil {
			crConn.Close()
			return nil, err
		}
		rg.ClusterRelay = cr
		w.run(ctx, cr.Run)
		w.closers = append(w.closers, cr.Close)
		replicas = append(replicas, globalrelay.Replica{Cluster: spec.Cluster, Addr: cr.Addr()})
	}

	// Global relay tier: one POP per region, on the region's VIP address.
	clusters := globalrelay.NewClusters(replicas)
	cat := &geo.Catalogue{DefaultRegion: cfg.Regions[0].Name}
	for _, rg := range w.Regions {
		spec := rg.Spec
		reg := prometheus.WrapRegistererWith(prometheus.Labels{"pop": spec.POPName}, w.Registry)
		pub, err := listenUDP(netip.AddrPortFrom(spec.POPIP, cfg.POPPort))
		if err != nil {
			return nil, fmt.Errorf("POP %s: %w", spec.POPName, err)
		}
		internal, err := listenUDP(netip.AddrPortFrom(loop, 0))
		if err != nil {
			pub.Close()
			return nil, err
		}
		gr, err := globalrelay.New(globalrelay.Config{POP: spec.POP, Keys: keys, Clusters: clusters, FlowIdle: cfg.FlowIdle, Logger: cfg.Logger, Registerer: reg},
			[]globalrelay.Worker{{Public: pub, Internal: internal}})
		if err != nil {
			pub.Close()
			internal.Close()
			return nil, err
		}
		rg.GlobalRelay = gr
		w.run(ctx, gr.Run)
		w.closers = append(w.closers, gr.Close)
		cat.Regions = append(cat.Regions, geo.Region{
			Name: spec.Name, Location: spec.Location,
			Clusters: []geo.Cluster{{ID: spec.Cluster, Name: spec.Name + "-1", Location: spec.Location, SessionAPI: rg.TransceiverAPI}},
			POPs:     []geo.POP{{ID: spec.POP, Name: spec.POPName, VIP: gr.PublicAddr(), Location: spec.Location}},
		})
	}
	if err := cat.Validate(); err != nil {
		return nil, err
	}
	w.Catalogue = cat

	loc, err := geo.NewLocator(geo.LocatorConfig{DB: geo.DevGeoIPDB, Default: cat.DefaultLocation(), Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	w.closers = append(w.closers, loc.Close)
	secretKey := make([]byte, 32)
	if _, err := rand.Read(secretKey); err != nil {
		return nil, err
	}
	sig, err := signaling.New(signaling.Config{
		Catalogue: cat, Locator: loc, APIKeys: cfg.APIKeys, ClientSecretKey: secretKey,
		CORSOrigins: []string{"*"}, Web: web.FS(), Logger: cfg.Logger,
		Registerer: w.Registry,
	})
	if err != nil {
		return nil, err
	}
	if w.SignalingURL, err = w.serveHTTP(cfg.HTTPAddr, sig.Handler()); err != nil {
		return nil, err
	}
	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(w.Registry, promhttp.HandlerOpts{}))
		if w.MetricsURL, err = w.serveHTTP(cfg.MetricsAddr, mux); err != nil {
			return nil, err
		}
		w.MetricsURL += "/metrics"
	}
	return w, nil
}

// run starts a component's Run in the background, recording its error.
func (w *World) run(ctx context.Context, run func(context.Context) error) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		if err := run(ctx); err != nil {
			w.errMu.Lock()
			w.errs = append(w.errs, err)
			w.errMu.Unlock()
			w.log.Error("component stopped", "err", err)
		}
	}()
}

// serveHTTP serves h on addr and returns its base URL.
func (w *World) serveHTTP(addr string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := signaling.NewHTTPServer(h, w.log)
	w.servers = append(w.servers, srv)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
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

// Close stops everything and waits for it.
func (w *World) Close() error {
	for _, s := range w.servers {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.Shutdown(ctx)
		cancel()
	}
	w.cancel()
	for i := len(w.closers) - 1; i >= 0; i-- {
		_ = w.closers[i]()
	}
	w.wg.Wait()
	return nil
}

func listenUDP(ap netip.AddrPort) (*net.UDPConn, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
	if err != nil {
		return nil, fmt.Errorf("listen udp %s: %w", ap, err)
	}
	return c, nil
}

func udpAddr(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

// String summarises the world for the console.
func (w *World) String() string {
	s := "rtcedge dev world\n  signaling + demo page: " + w.SignalingURL + "\n"
	for _, rg := range w.Regions {
		s += "  region " + rg.Spec.Name + ": cluster " + strconv.Itoa(int(rg.Spec.Cluster)) +
			", POP " + rg.Spec.POPName + " at " + rg.GlobalRelay.PublicAddr().String() + "\n"
	}
	if w.MetricsURL != "" {
		s += "  metrics: " + w.MetricsURL + "\n"
	}
	return s
}
