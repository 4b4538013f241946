// The sipfront role's assembly: its config file, its sockets and the node
// that runs the front on them (rtcedge sipfront -config FILE, and the dev
// world).

package sipfront

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/placement"
)

// NodeConfig is the sipfront role's config file (docs/sip.md).
type NodeConfig struct {
	node.Common `yaml:",inline"`
	Config      `yaml:",inline"`
	// SIPUDP and SIPTCP are the SIP listen addresses, e.g. 0.0.0.0:5060;
	// "" disables one (not both).
	SIPUDP string `yaml:"sip_udp"`
	SIPTCP string `yaml:"sip_tcp"`
	// SIPTLS is the SIP over TLS address, e.g. 0.0.0.0:5061 ("" none),
	// with the certificate chain and key in TLSCert and TLSKey (PEM files,
	// from a Secret in Kubernetes).
	SIPTLS string `yaml:"sip_tls"`
	// APIAddr serves the call-control API (POST
	// /v1/realtime/calls/{call_id}/accept|reject|refer|hangup) over HTTP,
	// e.g. 0.0.0.0:8443 behind the operator's TLS ingress; required with a
	// webhook_url, "" none.
	APIAddr string `yaml:"api_addr"`
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// Catalogue is the region catalogue file (geo package); GeoIPDB a
	// GeoIP2/GeoLite2 City .mmdb that locates carriers (empty: the
	// catalogue's default location for every carrier).
	Catalogue string `yaml:"catalogue"`
	GeoIPDB   string `yaml:"geoip_db"`
	// SessionAPISecrets and SessionAPITLS reach the clusters' session
	// APIs, as signaling's keys of the same names (docs/operations.md).
	SessionAPISecrets map[uint16]string `yaml:"session_api_secrets"`
	SessionAPITLS     sessionapi.TLS    `yaml:"session_api_tls"`
	// ClusterTimeout bounds one create at a cluster (default 2s);
	// MaxAttempts the clusters asked per call (default 3).
	ClusterTimeout time.Duration `yaml:"cluster_timeout"`
	MaxAttempts    int           `yaml:"max_attempts"`

	// CatalogueData is used instead of loading Catalogue (the dev world's
	// world); GeoIPData instead of GeoIPDB.
	CatalogueData *geo.Catalogue `yaml:"-"`
	GeoIPData     []byte         `yaml:"-"`
	// Health, POPUp and SessionAPIs are gossip's view of the clusters, as
	// signaling's (nil: all healthy, the catalogue's session_api).
	Health      geo.HealthFunc                `yaml:"-"`
	POPUp       func(pop uint16) bool         `yaml:"-"`
	SessionAPIs func(cluster uint16) []string `yaml:"-"`
}

// ApplyEnv takes the secrets from the environment (config.Load calls it):
// the trunks' digest passwords are read where they are used.
func (c *NodeConfig) ApplyEnv() error { return nil }

// Settings is the role's node.Common.
func (c *NodeConfig) Settings() *node.Common { return &c.Common }

// Defaults fills c's unset fields.
func (c *NodeConfig) Defaults() {
	c.Common.Defaults()
	c.Config.Defaults()
	config.Default(&c.ClusterTimeout, 2*time.Second)
	config.Default(&c.MaxAttempts, 3)
}

// Validate reports every problem of c (after Defaults) at once.
func (c *NodeConfig) Validate() error {
	errs := []error{c.Config.Validate()}
	if c.SIPUDP == "" && c.SIPTCP == "" && c.SIPTLS == "" {
		errs = append(errs, errors.New("sip_udp, sip_tcp or sip_tls is required"))
	}
	if (c.SIPTLS != "") != (c.TLSCert != "" && c.TLSKey != "") {
		errs = append(errs, errors.New("sip_tls goes with tls_cert and tls_key"))
	}
	if c.APIAddr == "" && c.hasWebhook() {
		errs = append(errs, errors.New("a webhook_url needs api_addr: the accepts come there"))
	}
	if c.Catalogue == "" && c.CatalogueData == nil {
		errs = append(errs, errors.New("catalogue is required"))
	}
	if c.ClusterTimeout <= 0 || c.MaxAttempts <= 0 {
		errs = append(errs, errors.New("cluster_timeout and max_attempts must be positive"))
	}
	return errors.Join(errs...)
}

// Sockets are what a node serves on; OpenSockets opens them.
type Sockets struct {
	UDP     net.PacketConn // nil when sip_udp is ""
	TCP     net.Listener   // nil when sip_tcp is ""
	TLS     net.Listener   // TLS connections; nil when sip_tls is ""
	Metrics net.Listener   // nil when metrics_addr is ""
	API     net.Listener   // the call-control API; nil when api_addr is ""
}

// OpenSockets opens the addresses cfg names.
func OpenSockets(cfg NodeConfig) (s Sockets, err error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return s, err
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if cfg.SIPUDP != "" {
		if s.UDP, err = net.ListenPacket("udp", cfg.SIPUDP); err != nil {
			return s, fmt.Errorf("sip_udp: %w", err)
		}
	}
	if cfg.SIPTCP != "" {
		if s.TCP, err = node.Listen("sip_tcp", cfg.SIPTCP); err != nil {
			return s, err
		}
	}
	if cfg.SIPTLS != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return s, fmt.Errorf("tls_cert and tls_key: %w", err)
		}
		ln, err := node.Listen("sip_tls", cfg.SIPTLS)
		if err != nil {
			return s, err
		}
		s.TLS = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	if s.Metrics, err = node.Listen("metrics_addr", cfg.MetricsAddr); err != nil {
		return s, err
	}
	if cfg.APIAddr != "" {
		if s.API, err = node.Listen("api_addr", cfg.APIAddr); err != nil {
			return s, err
		}
	}
	return s, nil
}

func (s Sockets) close() {
	if s.UDP != nil {
		_ = s.UDP.Close()
	}
	if s.TCP != nil {
		_ = s.TCP.Close()
	}
	if s.TLS != nil {
		_ = s.TLS.Close()
	}
	if s.Metrics != nil {
		_ = s.Metrics.Close()
	}
	if s.API != nil {
		_ = s.API.Close()
	}
}

// Node runs a Front on its sockets. Run(ctx) serves until ctx ends;
// Close stops it. Both are idempotent.
type Node struct {
	front *Front
	socks Sockets
	log   *slog.Logger
	life  node.Life
}

// NewNode builds a node on s (it takes ownership of the sockets).
func NewNode(cfg NodeConfig, s Sockets, env node.Env) (_ *Node, err error) {
	env = env.WithDefaults()
	n := &Node{socks: s}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if s.UDP == nil && s.TCP == nil && s.TLS == nil {
		return nil, errors.New("sipfront: no SIP socket (OpenSockets opens sip_udp, sip_tcp and sip_tls)")
	}
	cat := cfg.CatalogueData
	if cat == nil {
		if cat, err = geo.LoadCatalogue(cfg.Catalogue); err != nil {
			return nil, err
		}
	}
	locator, err := geo.NewLocator(geo.LocatorConfig{DBPath: cfg.GeoIPDB, DB: cfg.GeoIPData, Default: cat.DefaultLocation(), Logger: env.Logger})
	if err != nil {
		return nil, err
	}
	n.life.OnClose(locator.Close)
	httpClient, err := cfg.SessionAPITLS.Client(env.HTTPClient)
	if err != nil {
		return nil, err
	}
	if httpClient == nil { // the binary gives none: signaling's default
		httpClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 32, IdleConnTimeout: 90 * time.Second}}
	}
	clusters := &placement.Clusters{HTTPClient: httpClient, Timeout: cfg.ClusterTimeout, Secrets: cfg.SessionAPISecrets, Endpoints: cfg.SessionAPIs}
	m, collectors := placement.NewMetrics("sipfront", cat)
	if err := metric.Register(env.Registerer, "sipfront", collectors...); err != nil {
		return nil, err
	}
	placer, err := placement.New(placement.Config{Catalogue: cat, Health: cfg.Health, POPUp: cfg.POPUp, Clusters: clusters,
		MaxAttempts: cfg.MaxAttempts, Logger: env.Logger.With("component", "sipfront"), Now: env.Now, Metrics: m})
	if err != nil {
		return nil, err
	}
	cfg.Config.Now = env.Now
	n.front, err = New(cfg.Config, Deps{Placer: placer, Clusters: clusters, Catalogue: cat, Logger: env.Logger,
		Registerer: env.Registerer, Locate: locate(locator, cat)})
	if err != nil {
		return nil, err
	}
	n.life.OnClose(func() error { s.close(); return nil })
	n.life.OnClose(n.front.Close) // first: BYEs go out before the sockets close
	n.life.Go("sip", func(ctx context.Context) error {
		return n.front.Serve(ctx, Listeners{UDP: s.UDP, TCP: s.TCP, TLS: s.TLS})
	})
	if s.API != nil {
		n.life.Serve("api", s.API, node.NewHTTPServer(n.front.API(), env.Logger))
	}
	n.life.ServeHealth(s.Metrics, env, func() error { return nil })
	n.log = env.Logger
	return n, nil
}

// Front is the node's SIP front.
func (n *Node) Front() *Front { return n.front }

// URI is the SIP URI to call (on the UDP listener when there is one).
func (n *Node) URI() string {
	if n.socks.UDP != nil {
		return n.front.URI(n.socks.UDP.LocalAddr())
	}
	if n.socks.TCP != nil {
		return n.front.URI(n.socks.TCP.Addr()) + ";transport=tcp"
	}
	return n.front.URI(n.socks.TLS.Addr()) + ";transport=tls"
}

// Run serves SIP until ctx ends, then ends every call (BYE) and stops.
func (n *Node) Run(ctx context.Context) error { return n.life.Run(ctx, n.log, n.front.Drain) }

// Close stops the node at once. Idempotent.
func (n *Node) Close() error { return n.life.Close() }

// locate is where a carrier's signaling address is: its GeoIP location,
// else the catalogue's default.
func locate(l *geo.Locator, cat *geo.Catalogue) func(netip.Addr) geo.Location {
	return func(a netip.Addr) geo.Location {
		if loc, ok := l.LookupIP(a); ok {
			return loc
		}
		return geo.Location{IP: a, Point: cat.DefaultLocation(), Source: geo.SourceDefault}
	}
}
