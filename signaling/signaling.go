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
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sdpcheck"
	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// Session API paths on transceivers (mirrors the transceiver package, which
// signaling must not import: it reaches pods only over HTTP).
const (
	podSessionsPath = "/internal/v1/sessions"
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

	// APIKeys are the server-side credentials. When empty, session
	// endpoints need no credentials (the dev world), but client secrets
	// minted by this server are still checked when presented.
	APIKeys []string
	// ClientSecretKey signs ephemeral client secrets (32 random bytes).
	ClientSecretKey []byte
	// ClientSecretTTL is the default lifetime of a client secret; default
	// 10 minutes, at most 2 hours.
	ClientSecretTTL time.Duration

	MaxBody        int64         // request body cap; default 64 KiB
	ClusterTimeout time.Duration // one cluster attempt; default 2s
	MaxAttempts    int           // clusters tried per offer; default 3
	RatePerSecond  float64       // per client IP; default 5
	RateBurst      int           // default 20
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
	for _, k := range c.APIKeys {
		if len(k) < 16 || strings.HasPrefix(k, secretPrefix) {
			return errors.New("signaling config: API keys must be at least 16 characters and not start with ek_")
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

	limMu    sync.Mutex
	limiters map[netip.Addr]*limiter // guarded by limMu
	limSwept time.Time               // last sweep of idle limiters; guarded by limMu

	apiTurn  atomic.Uint32 // spreads requests over a cluster's live session API endpoints
	draining atomic.Bool
}

type limiter struct {
	l    *rate.Limiter
	seen time.Time
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
		cfg:      cfg,
		log:      cfg.Logger.With("component", "signaling"),
		secrets:  secretMinter{key: cfg.ClientSecretKey, now: cfg.Now},
		m:        m,
		limiters: map[netip.Addr]*limiter{},
	}
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
	handle("/v1/realtime/sessions/{id}", "session", route{http.MethodDelete: s.handleDelete})
	handle("/v1/realtime/calls/{id}", "call", route{http.MethodDelete: s.handleDelete})
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
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Expose-Headers", "Location, "+HeaderRegion+", "+HeaderCluster+", "+HeaderPOP+", "+HeaderBackupPOP)
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

// credential kinds returned by authenticate.
const (
	credNone = iota
	credAPIKey
	credSecret
)

// authenticate checks the bearer credential. With no API keys configured,
// a missing credential is accepted (credNone) and a presented one must
// still be valid. allowExpired accepts expired client secrets, for DELETE:
// a call outlives the secret that started it.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, allowExpired bool) (int, bool) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		if len(s.cfg.APIKeys) == 0 {
			return credNone, true
		}
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "missing_credentials",
			"an Authorization: Bearer header with an API key or client secret is required", 0)
		return 0, false
	}
	// The scheme is case-insensitive (RFC 9110 section 11.1).
	scheme, tok, ok := strings.Cut(auth, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "invalid_authorization",
			"the Authorization header must be \"Bearer <key>\"", 0)
		return 0, false
	}
	if strings.HasPrefix(tok, secretPrefix) {
		if err := s.secrets.verify(tok, allowExpired); err != nil {
			code := "invalid_client_secret"
			if errors.Is(err, errSecretExpired) {
				code = "expired_client_secret"
			}
			apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, code, "client secret rejected: "+err.Error(), 0)
			return 0, false
		}
		return credSecret, true
	}
	for _, k := range s.cfg.APIKeys {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(k)) == 1 {
			return credAPIKey, true
		}
	}
	apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "invalid_api_key", "the API key is not valid", 0)
	return 0, false
}

// allow applies the per-client rate limit. ip is the client as located
// through trusted proxies, so clients behind one proxy do not share a
// budget.
func (s *Server) allow(w http.ResponseWriter, ip netip.Addr) bool {
	now := s.cfg.Now()
	key := limitKey(ip)
	s.limMu.Lock()
	// Forget clients idle for a minute (a full bucket refills well within
	// that), at most once every 10 s: never a scan per request.
	if now.Sub(s.limSwept) > 10*time.Second {
		s.limSwept = now
		for a, x := range s.limiters {
			if now.Sub(x.seen) > time.Minute {
				delete(s.limiters, a)
			}
		}
	}
	l := s.limiters[key]
	if l == nil {
		if len(s.limiters) >= maxLimiters {
			// Full of active clients: new ones share one bucket rather
			// than grow the table (or stall every request on a scan).
			key = netip.Addr{}
			l = s.limiters[key]
		}
		if l == nil {
			l = &limiter{l: rate.NewLimiter(rate.Limit(s.cfg.RatePerSecond), s.cfg.RateBurst)}
			s.limiters[key] = l
		}
	}
	l.seen = now
	ok := l.l.AllowN(now, 1)
	s.limMu.Unlock()
	if !ok {
		s.m.rateLimited.Inc()
		apierr.Write(w, http.StatusTooManyRequests, apierr.TypeRateLimit, "rate_limited", "too many requests; slow down", time.Second)
	}
	return ok
}

// maxLimiters bounds the rate limiter's table.
const maxLimiters = 200_000

// limitKey is what a client is rate-limited by: its IPv4 address, or the
// /64 of its IPv6 address (one subscriber holds a whole /64, and keying by
// /128 would let one client mint unlimited budgets).
func limitKey(ip netip.Addr) netip.Addr {
	if ip.Is4() || ip.Is4In6() {
		return ip.Unmap()
	}
	p, err := ip.Prefix(64)
	if err != nil {
		return ip
	}
	return p.Addr()
}

// precheck locates the client, rate-limits it and authenticates it, in
// that order: rate limiting first makes guessing credentials cost the
// guesser its budget.
func (s *Server) precheck(w http.ResponseWriter, r *http.Request, allowExpired bool) (geo.Location, int, bool) {
	loc := s.cfg.Locator.Locate(r)
	if !s.allow(w, loc.IP) {
		return loc, 0, false
	}
	kind, ok := s.authenticate(w, r, allowExpired)
	return loc, kind, ok
}

// readBody reads a request body under the size cap. A body that stalls
// until the server's read timeout gets 408; the connection is closed.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() ([]byte, bool) {
		apierr.Write(w, http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large",
			fmt.Sprintf("request body over %d bytes", s.cfg.MaxBody), 0)
		return nil, false
	}
	// A declared length over the cap is refused before reading a byte.
	if r.ContentLength > s.cfg.MaxBody {
		w.Header().Set("Connection", "close")
		return tooLarge()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err == nil {
		return body, true
	}
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		return tooLarge()
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		s.m.readTimeouts.Inc()
		w.Header().Set("Connection", "close")
		apierr.Write(w, http.StatusRequestTimeout, apierr.TypeInvalidRequest, "request_timeout",
			"the request body did not arrive in time", 0)
	default:
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "unreadable_body", "could not read the request body", 0)
	}
	return nil, false
}

func unsupportedMediaType(w http.ResponseWriter, msg string) {
	apierr.Write(w, http.StatusUnsupportedMediaType, apierr.TypeInvalidRequest, "unsupported_media_type", msg, 0)
}

func (s *Server) handleSDP(w http.ResponseWriter, r *http.Request) {
	loc, _, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/sdp" {
		unsupportedMediaType(w, "the offer must be sent as Content-Type: application/sdp")
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	s.placeCall(w, r, loc, string(body), nil)
}

func (s *Server) handleCalls(w http.ResponseWriter, r *http.Request) {
	loc, _, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "application/sdp":
		body, ok := s.readBody(w, r)
		if !ok {
			return
		}
		s.placeCall(w, r, loc, string(body), nil)
	case "multipart/form-data":
		offer, session, ok := s.readMultipart(w, r, params["boundary"])
		if !ok {
			return
		}
		s.placeCall(w, r, loc, offer, session)
	default:
		unsupportedMediaType(w, "send the offer as application/sdp, or multipart/form-data with sdp and session fields")
	}
}

// readMultipart reads the "sdp" and optional "session" (a JSON object)
// fields of an OpenAI-style multipart offer. Either may be a plain field or
// a file part (curl -F sdp=@offer.sdp); other parts are ignored. The body
// is read under the size cap first, so parsing never touches the disk.
func (s *Server) readMultipart(w http.ResponseWriter, r *http.Request, boundary string) (string, json.RawMessage, bool) {
	body, ok := s.readBody(w, r)
	if !ok {
		return "", nil, false
	}
	bad := func(msg string) (string, json.RawMessage, bool) {
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_multipart", msg, 0)
		return "", nil, false
	}
	if boundary == "" {
		return bad("multipart body without a boundary parameter")
	}
	var offers, sessions [][]byte
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		part, err := mr.NextPart()
		if err == io.EOF { // the closing boundary: a well-formed end
			break
		}
		if err != nil {
			return bad("multipart body does not parse: " + err.Error())
		}
		data, err := io.ReadAll(part)
		if err != nil {
			return bad("multipart part does not parse: " + err.Error())
		}
		switch part.FormName() {
		case "sdp":
			offers = append(offers, data)
		case "session":
			sessions = append(sessions, data)
		}
	}
	if len(offers) != 1 {
		return bad(fmt.Sprintf("multipart body needs exactly one sdp field, has %d", len(offers)))
	}
	var session json.RawMessage
	switch len(sessions) {
	case 0:
	case 1:
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(sessions[0], &obj); err != nil || obj == nil {
			return bad("the session field must be a JSON object")
		}
		session = json.RawMessage(sessions[0])
	default:
		return bad("multipart body has more than one session field")
	}
	return string(offers[0]), session, true
}

// placeCall validates the offer, chooses where the call goes and asks the
// clusters nearest first until one answers. Nothing is allocated anywhere
// for an offer that fails validation.
func (s *Server) placeCall(w http.ResponseWriter, r *http.Request, loc geo.Location, offer string, session json.RawMessage) {
	if err := sdpcheck.Offer(offer); err != nil {
		code := sdpcheck.CodeOf(err)
		if code == "" {
			code = sdpcheck.CodeInvalidSDP
		}
		apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, code, err.Error(), 0)
		return
	}
	s.m.located.WithLabelValues(loc.Source).Inc()
	// The catalogue's steering overrides (per country/continent) win over
	// distance; see geo.Catalogue.ChooseFor.
	choice := s.cfg.Catalogue.ChooseFor(loc, s.cfg.Health)
	pops := s.cfg.Catalogue.ChoosePOPsFor(loc, 2, s.cfg.POPUp)
	if len(choice.Clusters) == 0 || len(pops) == 0 {
		s.m.noCapacity.Inc()
		s.log.Warn("no usable cluster or POP", "clusters", len(choice.Clusters), "pops", len(pops), "client", loc.IP)
		apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity",
			"no cluster can take a call right now", 2*time.Second)
		return
	}
	req := podCreateRequest{Offer: offer, Config: session}
	for _, p := range pops {
		req.POPs = append(req.POPs, podPOP{ID: p.ID, VIP: p.VIP.String()})
	}
	body, err := json.Marshal(req)
	if err != nil {
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not encode the request", 0)
		return
	}
	start := s.cfg.Now()
	attempts := min(len(choice.Clusters), s.cfg.MaxAttempts)
	for i, cc := range choice.Clusters[:attempts] {
		if r.Context().Err() != nil {
			return // the client left; a late answer would go nowhere
		}
		t0 := s.cfg.Now()
		res, status, errBody, err := s.createOn(r.Context(), cc.Cluster, body)
		result := attemptResult(status, err)
		cluster := strconv.Itoa(int(cc.Cluster.ID))
		s.m.attempts.WithLabelValues(cluster, result).Inc()
		s.m.attemptSeconds.WithLabelValues(result).Observe(s.cfg.Now().Sub(t0).Seconds())
		switch result {
		case resultCreated:
			h := w.Header()
			h.Set("Content-Type", "application/sdp")
			h.Set("Location", "/v1/realtime/sessions/"+res.ID)
			h.Set(HeaderRegion, cc.Region)
			h.Set(HeaderCluster, cluster)
			h.Set(HeaderPOP, pops[0].Name)
			if len(pops) > 1 {
				h.Set(HeaderBackupPOP, pops[1].Name)
			}
			h.Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, res.Answer)
			s.log.Debug("call placed", "session", res.ID, "cluster", cc.Cluster.ID, "attempt", i+1,
				"elapsed", s.cfg.Now().Sub(start), "pop", pops[0].ID, "client", loc.IP, "located_by", loc.Source)
			return
		case resultRejected:
			// The pod judged the offer itself bad: another cluster would
			// say the same. Pass its JSON error on.
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(errBody)
			return
		}
		// Down, slow, full, draining or confused: the next-nearest cluster
		// gets the offer.
		s.log.Warn("cluster did not take the session, trying the next", "cluster", cc.Cluster.ID,
			"result", result, "status", status, "err", err, "elapsed", s.cfg.Now().Sub(t0))
	}
	s.m.noCapacity.Inc()
	apierr.Write(w, http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_capacity",
		"no cluster could take the call; retry shortly", 2*time.Second)
}

// Results of one cluster attempt, the "result" label of the attempt metrics.
const (
	resultCreated     = "created"
	resultRejected    = "rejected"    // 400 with a JSON error: the offer is bad
	resultUnavailable = "unavailable" // 503: full or draining
	resultServerError = "server_error"
	resultBadAnswer   = "bad_answer" // any other status, or a 201 that does not decode
	resultTimeout     = "timeout"
	resultError       = "error" // refused, reset, unreachable
)

var attemptResults = []string{resultCreated, resultRejected, resultUnavailable, resultServerError, resultBadAnswer, resultTimeout, resultError}

func attemptResult(status int, err error) string {
	var bad *badAnswerError
	switch {
	case errors.As(err, &bad):
		return resultBadAnswer
	case errors.Is(err, context.DeadlineExceeded):
		return resultTimeout
	case err != nil:
		return resultError
	case status == http.StatusCreated:
		return resultCreated
	case status == http.StatusBadRequest:
		return resultRejected
	case status == http.StatusServiceUnavailable:
		return resultUnavailable
	case status >= 500:
		return resultServerError
	default:
		return resultBadAnswer
	}
}

// badAnswerError is a session API answer that cannot be used as it is.
type badAnswerError struct{ msg string }

func (e *badAnswerError) Error() string { return e.msg }

type podPOP struct {
	ID  uint16 `json:"id"`
	VIP string `json:"vip"`
}

type podCreateRequest struct {
	Offer  string          `json:"offer"`
	POPs   []podPOP        `json:"pops"`
	Config json.RawMessage `json:"config,omitempty"`
}

type podCreateResponse struct {
	ID     string `json:"id"`
	Answer string `json:"answer"`
}

// sessionAPI returns the base URL to reach a cluster's session API: one of
// the live endpoints gossip reports (spread over them), else the
// catalogue's address.
func (s *Server) sessionAPI(c geo.Cluster) string {
	if s.cfg.SessionAPIs != nil {
		if eps := s.cfg.SessionAPIs(c.ID); len(eps) > 0 {
			return strings.TrimSuffix(eps[int(s.apiTurn.Add(1))%len(eps)], "/")
		}
	}
	return strings.TrimSuffix(c.SessionAPI, "/")
}

// createOn posts a create to one cluster's session API within
// ClusterTimeout. It returns the decoded answer of a 201, or the status and
// body of a 400 carrying a JSON error; every other outcome is an error
// (a *badAnswerError when the cluster answered something unusable).
func (s *Server) createOn(ctx context.Context, c geo.Cluster, body []byte) (podCreateResponse, int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ClusterTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.sessionAPI(c)+podSessionsPath, bytes.NewReader(body))
	if err != nil {
		return podCreateResponse{}, 0, nil, fmt.Errorf("cluster %d: build request: %w", c.ID, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.cfg.HTTPClient.Do(req)
	if err != nil {
		return podCreateResponse{}, 0, nil, fmt.Errorf("cluster %d: post session: %w", c.ID, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<10))
	if err != nil {
		return podCreateResponse{}, 0, nil, fmt.Errorf("cluster %d: read answer: %w", c.ID, err)
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest:
		if !json.Valid(data) {
			return podCreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 400 without a JSON body", c.ID)}
		}
		return podCreateResponse{}, resp.StatusCode, data, nil
	case resp.StatusCode != http.StatusCreated:
		return podCreateResponse{}, resp.StatusCode, nil, nil
	}
	var out podCreateResponse
	if err := json.Unmarshal(data, &out); err != nil || out.Answer == "" {
		return podCreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 201 with a bad body (%v)", c.ID, err)}
	}
	// The ID is what a DELETE is routed by: it must name this cluster.
	if id, err := sessionid.Parse(out.ID); err != nil || id.Cluster != c.ID {
		return podCreateResponse{}, 0, nil, &badAnswerError{fmt.Sprintf("cluster %d answered 201 with session id %q that does not name it", c.ID, out.ID)}
	}
	return out, resp.StatusCode, nil, nil
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := s.precheck(w, r, true); !ok {
		return
	}
	notFound := func() {
		apierr.Write(w, http.StatusNotFound, apierr.TypeNotFound, "session_not_found", "no such session", 0)
	}
	raw := r.PathValue("id")
	id, err := sessionid.Parse(raw)
	if err != nil {
		notFound()
		return
	}
	c, _, ok := s.cfg.Catalogue.Cluster(id.Cluster)
	if !ok {
		notFound()
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ClusterTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, s.sessionAPI(c)+podSessionsPath+"/"+raw, nil)
	if err != nil {
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not build the request", 0)
		return
	}
	resp, err := s.cfg.HTTPClient.Do(req)
	if err != nil {
		s.log.Warn("delete: cluster session API failed", "cluster", c.ID, "err", err)
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_unreachable", "the session's cluster did not answer", 0)
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusNoContent, http.StatusOK:
		w.WriteHeader(http.StatusNoContent)
	case http.StatusNotFound:
		notFound()
	default:
		apierr.Write(w, http.StatusBadGateway, apierr.TypeServer, "cluster_error",
			fmt.Sprintf("the session's cluster answered %d", resp.StatusCode), 0)
	}
}

// clientSecretRequest is the optional JSON body of POST /v1/realtime/client_secrets.
type clientSecretRequest struct {
	ExpiresAfter *struct {
		Anchor  string `json:"anchor"`
		Seconds int    `json:"seconds"`
	} `json:"expires_after,omitempty"`
	Session json.RawMessage `json:"session,omitempty"`
}

// ClientSecret is the JSON answer of POST /v1/realtime/client_secrets,
// shaped like OpenAI's.
type ClientSecret struct {
	Value     string          `json:"value"`
	ExpiresAt int64           `json:"expires_at"`
	Session   json.RawMessage `json:"session,omitempty"`
}

func (s *Server) handleClientSecret(w http.ResponseWriter, r *http.Request) {
	_, kind, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	if kind == credSecret {
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "api_key_required",
			"client secrets are minted with an API key, not with another client secret", 0)
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req clientSecretRequest
	if len(bytes.TrimSpace(body)) > 0 {
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			unsupportedMediaType(w, "send the request as Content-Type: application/json")
			return
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_json", "request body is not valid JSON: "+err.Error(), 0)
			return
		}
	}
	ttl := s.cfg.ClientSecretTTL
	if ea := req.ExpiresAfter; ea != nil {
		if ea.Anchor != "" && ea.Anchor != "created_at" {
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_expiry",
				"expires_after.anchor must be created_at", 0)
			return
		}
		if ea.Seconds < 10 || ea.Seconds > 7200 {
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_expiry",
				"expires_after.seconds must be between 10 and 7200", 0)
			return
		}
		ttl = time.Duration(ea.Seconds) * time.Second
	}
	val, exp, err := s.secrets.mint(ttl)
	if err != nil {
		s.log.Error("mint client secret", "err", err)
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not mint a secret", 0)
		return
	}
	s.m.secretsMinted.Inc()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(ClientSecret{Value: val, ExpiresAt: exp.Unix(), Session: req.Session})
}

// RegionsResponse is the JSON answer of GET /v1/regions.
type RegionsResponse struct {
	DefaultRegion string          `json:"default_region"`
	Regions       []RegionSummary `json:"regions"`
}

// RegionSummary is one region with its clusters' health.
type RegionSummary struct {
	Name     string           `json:"name"`
	Location geo.Point        `json:"location"`
	Clusters []ClusterSummary `json:"clusters"`
	POPs     []POPSummary     `json:"pops"`
}

// ClusterSummary is one cluster as signaling sees it.
type ClusterSummary struct {
	ID       uint16 `json:"id"`
	Name     string `json:"name"`
	Known    bool   `json:"known"` // gossip has reported on it
	Healthy  bool   `json:"healthy"`
	Draining bool   `json:"draining"`
	Load     int    `json:"load"`
	Capacity int    `json:"capacity"`
}

// POPSummary is one relay POP.
type POPSummary struct {
	ID   uint16 `json:"id"`
	Name string `json:"name"`
	VIP  string `json:"vip"`
	Up   bool   `json:"up"`
}

func (s *Server) handleRegions(w http.ResponseWriter, _ *http.Request) {
	out := RegionsResponse{DefaultRegion: s.cfg.Catalogue.DefaultRegion}
	for _, rg := range s.cfg.Catalogue.Regions {
		rs := RegionSummary{Name: rg.Name, Location: rg.Location}
		for _, c := range rg.Clusters {
			cs := ClusterSummary{ID: c.ID, Name: c.Name, Healthy: true}
			if s.cfg.Health != nil {
				if st, ok := s.cfg.Health(c.ID); ok {
					cs.Known, cs.Healthy, cs.Draining, cs.Load, cs.Capacity = true, st.Healthy, st.Draining, st.Load, st.Capacity
				}
			}
			rs.Clusters = append(rs.Clusters, cs)
		}
		for _, p := range rg.POPs {
			up := s.cfg.POPUp == nil || s.cfg.POPUp(p.ID)
			rs.POPs = append(rs.POPs, POPSummary{ID: p.ID, Name: p.Name, VIP: p.VIP.String(), Up: up})
		}
		out.Regions = append(out.Regions, rs)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

type metrics struct {
	requests       *prometheus.CounterVec
	seconds        *prometheus.HistogramVec
	attempts       *prometheus.CounterVec
	attemptSeconds *prometheus.HistogramVec
	located        *prometheus.CounterVec
	noCapacity     prometheus.Counter
	rateLimited    prometheus.Counter
	readTimeouts   prometheus.Counter
	secretsMinted  prometheus.Counter
}

// newMetrics builds the metrics and sets every label value known up front
// to zero, so a dashboard sees a flat line rather than a missing series.
func newMetrics(reg prometheus.Registerer, cat *geo.Catalogue) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_signaling_requests_total", Help: "HTTP requests, by endpoint and status code.",
		}, []string{"endpoint", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_signaling_request_seconds", Help: "HTTP request duration, by endpoint.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"endpoint"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_signaling_cluster_attempts_total", Help: "Session creates sent to clusters, by cluster and result.",
		}, []string{"cluster", "result"}),
		attemptSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtcedge_signaling_cluster_attempt_seconds", Help: "Duration of one session create at a cluster, by result.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 3},
		}, []string{"result"}),
		located: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtcedge_signaling_located_total", Help: "Valid offers by how the client was located (cf-headers, geoip, default).",
		}, []string{"source"}),
		noCapacity: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_signaling_no_capacity_total", Help: "Offers refused with 503 because no cluster took them.",
		}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_signaling_rate_limited_total", Help: "Requests refused with 429 by the per-client rate limit.",
		}),
		readTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_signaling_body_timeouts_total", Help: "Requests whose body stalled past the read timeout (408).",
		}),
		secretsMinted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtcedge_signaling_client_secrets_total", Help: "Ephemeral client secrets minted.",
		}),
	}
	for _, res := range attemptResults {
		m.attemptSeconds.WithLabelValues(res)
		for _, r := range cat.Regions {
			for _, c := range r.Clusters {
				m.attempts.WithLabelValues(strconv.Itoa(int(c.ID)), res)
			}
		}
	}
	for _, src := range []string{geo.SourceCFHeaders, geo.SourceGeoIP, geo.SourceDefault} {
		m.located.WithLabelValues(src)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.seconds, m.attempts, m.attemptSeconds, m.located,
			m.noCapacity, m.rateLimited, m.readTimeouts, m.secretsMinted} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register signaling metrics: %w", err)
			}
		}
	}
	return m, nil
}
