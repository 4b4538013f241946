// Package signaling is rtcedge's geo-aware HTTP front.
//
// POST /v1/realtime/sdp (and the OpenAI-compatible POST /v1/realtime/calls)
// takes an SDP offer, locates the client, picks the nearest healthy cluster
// and the nearest global relay POPs, asks that cluster's session API for an
// answer advertising those POPs, and returns it. A cluster that errors, times
// out or is full is skipped for the next-nearest. Signaling keeps no session
// state: a session ID names its cluster and pod, which is all a DELETE needs.
package signaling

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
)

// Response headers naming where a call was placed.
const (
	HeaderRegion    = "X-Rtcedge-Region"
	HeaderCluster   = "X-Rtcedge-Cluster"
	HeaderPOP       = "X-Rtcedge-Pop"
	HeaderBackupPOP = "X-Rtcedge-Backup-Pop"
)

// Config configures a Server.
type Config struct {
	Catalogue *geo.Catalogue
	Locator   *geo.Locator
	// Health reports clusters' gossip state; nil: all healthy.
	Health geo.HealthFunc
	// POPUp reports whether a POP has live global relays; nil: all up.
	POPUp func(pop uint16) bool
	// SessionAPIs lists the live session API endpoints of a cluster (its
	// cluster relays' fronts, from gossip); nil or empty: the catalogue's
	// session_api. Gossip lets signaling route around a dead replica
	// before any load balancer notices.
	SessionAPIs func(cluster uint16) []string
	// GossipAuthoritative, when set, is exported as a gauge (1 while
	// gossip decides health, 0 while signaling assumes all healthy).
	GossipAuthoritative func() bool

	// APIKeys are server-side credentials of the default tenant with the
	// default key quota (KeyRatePerSecond, KeyRateBurst); Keys lists keys
	// with their own tenant and quota. Without any key signaling refuses to
	// start unless AllowAnonymous is set.
	APIKeys []string
	Keys    []APIKey
	// AllowAnonymous lets requests without credentials place calls and
	// mint client secrets (the dev world). Presented credentials are
	// still checked.
	AllowAnonymous bool
	// ClientSecretKey seals ephemeral client secrets and keys the MAC of
	// call IDs (32 random bytes; every replica needs the same).
	ClientSecretKey []byte
	// ClientSecretTTL is the default lifetime of a client secret; default
	// 10 minutes, at most 2 hours.
	ClientSecretTTL time.Duration
	// ClientSessionFields are the session fields a client holding a client
	// secret may add to the server's session config; nil:
	// DefaultClientSessionFields.
	ClientSessionFields []string

	// SessionAPISecrets are the bearer secrets of the clusters' internal
	// session APIs, by cluster ID; a cluster without one is called without
	// credentials (see docs/operations.md).
	SessionAPISecrets map[uint16]string

	MaxBody        int64         // request body cap; default 64 KiB
	ClusterTimeout time.Duration // one cluster attempt; default 2s
	MaxAttempts    int           // clusters tried per offer; default 3
	// RatePerSecond and RateBurst limit each client address (an IPv4
	// address or IPv6 /64, aggregated to wider prefixes when the table is
	// full) for requests without valid credentials: anonymous ones and
	// failed authentications. Default 5/s, burst 20.
	RatePerSecond float64
	RateBurst     int
	// KeyRatePerSecond and KeyRateBurst are the default quota of an API
	// key (APIKey overrides them); default 50/s, burst 100.
	KeyRatePerSecond float64
	KeyRateBurst     int
	// SecretRatePerSecond and SecretRateBurst limit each client secret;
	// default 1/s, burst 10.
	SecretRatePerSecond float64
	SecretRateBurst     int
	// MaxLimiters bounds the per-address and the per-secret limiter
	// tables each; default 200000.
	MaxLimiters int
	// CORSOrigins lists origins allowed to call the API from a browser;
	// "*" allows any. Empty: same-origin only.
	CORSOrigins []string

	// Web is the demo page's file system, served at "/"; nil: no page.
	Web fs.FS

	HTTPClient *http.Client          // for session APIs; default one with no proxy
	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil: metrics are not registered
	Now        func() time.Time      // default time.Now
}

func (c *Config) applyDefaults() {
	if c.ClientSecretTTL == 0 {
		c.ClientSecretTTL = 10 * time.Minute
	}
	if c.MaxBody == 0 {
		c.MaxBody = 64 << 10
	}
	if c.ClusterTimeout == 0 {
		c.ClusterTimeout = 2 * time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.RatePerSecond == 0 {
		c.RatePerSecond = 5
	}
	if c.RateBurst == 0 {
		c.RateBurst = 20
	}
	if c.KeyRatePerSecond == 0 {
		c.KeyRatePerSecond = 50
	}
	if c.KeyRateBurst == 0 {
		c.KeyRateBurst = 100
	}
	if c.SecretRatePerSecond == 0 {
		c.SecretRatePerSecond = 1
	}
	if c.SecretRateBurst == 0 {
		c.SecretRateBurst = 10
	}
	if c.MaxLimiters == 0 {
		c.MaxLimiters = 200_000
	}
	if c.ClientSessionFields == nil {
		c.ClientSessionFields = DefaultClientSessionFields
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports the first problem with the configuration.
func (c *Config) Validate() error {
	switch {
	case c.Catalogue == nil:
		return errors.New("signaling config: catalogue is required")
	case c.Locator == nil:
		return errors.New("signaling config: locator is required")
	case len(c.ClientSecretKey) < 16:
		return errors.New("signaling config: client secret key must be at least 16 bytes")
	case c.ClientSecretTTL < 0 || c.ClientSecretTTL > 2*time.Hour:
		return errors.New("signaling config: client secret TTL must be within 2h")
	}
	for _, v := range []float64{c.RatePerSecond, c.KeyRatePerSecond, c.SecretRatePerSecond} {
		if v < 0 {
			return errors.New("signaling config: rates must not be negative")
		}
	}
	for _, v := range []int{c.RateBurst, c.KeyRateBurst, c.SecretRateBurst, c.MaxLimiters, c.MaxAttempts} {
		if v < 0 {
			return errors.New("signaling config: bursts, table sizes and attempts must not be negative")
		}
	}
	if c.MaxBody < 0 || c.ClusterTimeout < 0 {
		return errors.New("signaling config: max body and cluster timeout must not be negative")
	}
	keys := c.apiKeys()
	if len(keys) == 0 && !c.AllowAnonymous {
		return errors.New("signaling config: no API keys; configure some, or set allow_anonymous for a dev world")
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if len(k.Key) < 16 || strings.HasPrefix(k.Key, secretPrefix) {
			return errors.New("signaling config: API keys must be at least 16 characters and not start with ek_")
		}
		if seen[k.Key] {
			return errors.New("signaling config: an API key is listed twice")
		}
		seen[k.Key] = true
		if err := validTenant(k.Tenant); err != nil {
			return err
		}
		if k.RatePerSecond < 0 || k.RateBurst < 0 {
			return fmt.Errorf("signaling config: API key of tenant %q: negative quota", k.Tenant)
		}
	}
	return nil
}

// Server is the signaling HTTP front.
type Server struct {
	// Static after New.
	cfg     Config
	log     *slog.Logger
	secrets secretMinter
	m       *metrics
	handler http.Handler

	calls  callMinter
	keys   []APIKey // APIKeys and Keys with defaults applied
	limits *limits

	apiTurn  atomic.Uint32 // spreads requests over a cluster's live session API endpoints
	draining atomic.Bool
}

// New returns a signaling server.
func New(cfg Config) (*Server, error) {
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.Catalogue)
	if err != nil {
		return nil, err
	}
	if cfg.GossipAuthoritative != nil && cfg.Registerer != nil {
		auth := cfg.GossipAuthoritative
		if err := cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rtcedge_signaling_gossip_authoritative",
			Help: "1 while gossip knows relays and decides cluster and POP health; 0 while signaling assumes everything healthy.",
		}, func() float64 {
			if auth() {
				return 1
			}
			return 0
		})); err != nil {
			return nil, fmt.Errorf("register signaling metrics: %w", err)
		}
	}
	s := &Server{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "signaling"),
		m:     m,
		calls: newCallMinter(cfg.ClientSecretKey),
		keys:  cfg.apiKeys(),
	}
	if s.secrets, err = newSecretMinter(cfg.ClientSecretKey, cfg.Now); err != nil {
		return nil, err
	}
	s.limits = newLimits(&s.cfg, s.keys)
	s.handler = s.routes()
	return s, nil
}

// Handler returns the public HTTP API (and the demo page when configured).
func (s *Server) Handler() http.Handler { return s.handler }

// Default timeouts of NewHTTPServer. They bound how long a stalled or
// slow client (slowloris) can hold a connection: headers must arrive within
// DefaultReadHeaderTimeout and the whole request, body included, within
// DefaultReadTimeout. An offer is a few KiB, so honest clients finish in
// milliseconds.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 10 * time.Second
	DefaultWriteTimeout      = 15 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
)

// HTTPOption adjusts the http.Server built by NewHTTPServer.
type HTTPOption func(*http.Server)

// WithReadTimeouts replaces the header and whole-request read timeouts;
// zero keeps a default. Tests shorten them to watch a stalled client being
// cut off.
func WithReadTimeouts(header, request time.Duration) HTTPOption {
	return func(s *http.Server) {
		if header > 0 {
			s.ReadHeaderTimeout = header
		}
		if request > 0 {
			s.ReadTimeout = request
		}
	}
}

// NewHTTPServer wraps h in an http.Server whose timeouts keep a stalled
// client from holding a connection (see DefaultReadHeaderTimeout), with
// request headers capped at 16 KiB. A body that stalls past the read
// timeout is answered 408 by the handler and the connection is closed.
func NewHTTPServer(h http.Handler, log *slog.Logger, opts ...HTTPOption) *http.Server {
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		ReadTimeout:       DefaultReadTimeout,
		WriteTimeout:      DefaultWriteTimeout,
		IdleTimeout:       DefaultIdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// route is one endpoint: the methods it takes and the handler per method.
type route map[string]http.HandlerFunc

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	handle := func(pattern, name string, r route) {
		mux.Handle(pattern, s.instrument(name, r))
	}
	handle("/v1/realtime/sdp", "sdp", route{http.MethodPost: s.handleSDP})
	handle("/v1/realtime/calls", "calls", route{http.MethodPost: s.handleCalls})
	handle("/v1/realtime/sessions/{id}", "session", route{http.MethodDelete: s.handleDelete, http.MethodPatch: s.handleRestart})
	handle("/v1/realtime/calls/{id}", "call", route{http.MethodDelete: s.handleDelete, http.MethodPatch: s.handleRestart})
	handle("/v1/realtime/calls/{id}/hangup", "hangup", route{http.MethodPost: s.handleDelete})
	handle("/v1/realtime/client_secrets", "client_secrets", route{http.MethodPost: s.handleClientSecret})
	handle("/v1/regions", "regions", route{http.MethodGet: s.handleRegions})
	handle("/livez", "livez", route{http.MethodGet: okHandler})
	handle("/readyz", "readyz", route{http.MethodGet: s.readyz})
	if s.cfg.Web != nil {
		files := http.FileServerFS(s.cfg.Web)
		mux.Handle("GET /{$}", files)
		mux.Handle("GET /static/", files)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "not_found", "no such endpoint: "+r.URL.Path, 0)
	})
	return mux
}

func okHandler(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "draining", "this signaling replica is draining", time.Second)
		return
	}
	okHandler(w, r)
}

// Drain makes /readyz answer 503 so load balancers (Cloudflare's monitor,
// Kubernetes) stop sending new requests here, while requests keep being
// served until the HTTP server shuts down.
func (s *Server) Drain() { s.draining.Store(true) }

// instrument adds method checks (405 as JSON), CORS and metrics.
func (s *Server) instrument(name string, r route) http.Handler {
	allow := make([]string, 0, len(r))
	for m := range r {
		allow = append(allow, m)
	}
	allowed := strings.Join(append(allow, http.MethodOptions), ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := s.cfg.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		s.cors(rec, req, allowed)
		h, ok := r[req.Method]
		switch {
		case req.Method == http.MethodOptions:
			rec.WriteHeader(http.StatusNoContent)
		case !ok:
			rec.Header().Set("Allow", allowed)
			apierr.Write(rec, http.StatusMethodNotAllowed, apierr.TypeInvalidRequest, "method_not_allowed",
				req.Method+" is not allowed here; use "+strings.Join(allow, " or "), 0)
		default:
			h(rec, req)
		}
		if !rec.wrote && req.Context().Err() != nil {
			rec.status = clientClosed
		}
		s.m.requests.WithLabelValues(name, strconv.Itoa(rec.status)).Inc()
		s.m.seconds.WithLabelValues(name).Observe(s.cfg.Now().Sub(start).Seconds())
	})
}

func (s *Server) cors(w http.ResponseWriter, r *http.Request, allowed string) {
	origin := r.Header.Get("Origin")
	if origin == "" || len(s.cfg.CORSOrigins) == 0 {
		return
	}
	ok := false
	for _, o := range s.cfg.CORSOrigins {
		if o == "*" || o == origin {
			ok = true
			break
		}
	}
	if !ok {
		return
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Allow-Methods", allowed)
	// If-Match and ETag: an ICE restart by PATCH (RFC 9725) from another
	// origin sends the one and reads the other.
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, If-Match")
	h.Set("Access-Control-Expose-Headers", "Location, ETag, "+HeaderRegion+", "+HeaderCluster+", "+HeaderPOP+", "+HeaderBackupPOP)
	h.Set("Access-Control-Max-Age", "600")
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status, r.wrote = code, true
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

// clientClosed is the status recorded for a request whose client went away
// before an answer was written (nginx's 499), so a dashboard does not count
// abandoned offers as successes.
const clientClosed = 499
