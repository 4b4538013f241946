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
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/placement"
	"github.com/rtcedge/rtcedge/web"
)

// Response headers naming where a call was placed.
const (
	HeaderRegion    = "X-Rtcedge-Region"
	HeaderCluster   = "X-Rtcedge-Cluster"
	HeaderPOP       = "X-Rtcedge-Pop"
	HeaderBackupPOP = "X-Rtcedge-Backup-Pop"
)

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

	relays *sessionapi.Relays // the sidebands this replica relays (sideband.go); ended by Close

	steer    *steering           // measured round trips (steering.go)
	clusters *placement.Clusters // the clusters' session APIs
	placer   *placement.Placer   // the shared placement (placement.go)
	draining atomic.Bool
}

// New returns a signaling server built from cfg (Defaults applied); its
// CatalogueData and Locator must be set.
func New(cfg Config) (*Server, error) {
	cfg.Defaults()
	errs := cfg.validateServer()
	if cfg.CatalogueData == nil {
		errs = append(errs, errors.New("catalogue is required"))
	}
	if cfg.Locator == nil {
		errs = append(errs, errors.New("locator is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("signaling config: %w", err)
	}
	key := cfg.secretKey()
	m, err := newMetrics(cfg.Registerer, cfg.CatalogueData, cfg.GossipAuthoritative)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "signaling"),
		m:      m,
		calls:  newCallMinter(key),
		keys:   cfg.apiKeys(),
		relays: sessionapi.NewRelays(),
	}
	if s.secrets, err = newSecretMinter(key, cfg.Now); err != nil {
		return nil, err
	}
	if s.steer, err = newSteering(cfg.Steering, cfg.CatalogueData, cfg.Now, cfg.Registerer); err != nil {
		return nil, fmt.Errorf("signaling config: %w", err)
	}
	s.steer.fanOut = cfg.FanOut
	s.limits = newLimits(&s.cfg, s.keys)
	if err := s.newPlacer(); err != nil {
		return nil, err
	}
	s.handler = s.routes()
	return s, nil
}

// Handler returns the public HTTP API (and the demo page when configured).
func (s *Server) Handler() http.Handler { return s.handler }

// Close ends the sideband relays (whose connections the HTTP server no
// longer tracks once upgraded) and waits for them.
func (s *Server) Close() { s.relays.Close() }

// HTTPOption adjusts the http.Server built by NewHTTPServer.
type HTTPOption func(*http.Server)

// NewHTTPServer wraps h in an http.Server with the project's timeouts
// (node.NewHTTPServer), which keep a stalled or slow client (slowloris)
// from holding a connection: an offer is a few KiB, so honest clients
// finish in milliseconds. Request headers are capped at 16 KiB. A body
// that stalls past the read timeout is answered 408 by the handler and the
// connection is closed.
func NewHTTPServer(h http.Handler, log *slog.Logger, opts ...HTTPOption) *http.Server {
	s := node.NewHTTPServer(h, log)
	s.MaxHeaderBytes = 16 << 10
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
	handle("/v1/realtime", "sideband", route{http.MethodGet: s.handleSideband})
	handle("/v1/realtime/sdp", "sdp", route{http.MethodPost: s.handleSDP})
	handle("/v1/realtime/calls", "calls", route{http.MethodPost: s.handleCalls})
	handle("/v1/realtime/sessions/{id}", "session", route{http.MethodDelete: s.handleDelete, http.MethodPatch: s.handleRestart})
	handle("/v1/realtime/calls/{id}", "call", route{http.MethodDelete: s.handleDelete, http.MethodPatch: s.handleRestart})
	handle("/v1/realtime/calls/{id}/hangup", "hangup", route{http.MethodPost: s.handleDelete})
	handle("/v1/realtime/client_secrets", "client_secrets", route{http.MethodPost: s.handleClientSecret})
	handle("/v1/regions", "regions", route{http.MethodGet: s.handleRegions})
	handle("/v1/steering", "steering", route{http.MethodGet: s.handleSteeringView})
	handle("/v1/steering/samples", "steering_samples", route{http.MethodPost: s.handleSamples})
	handle("/livez", "livez", route{http.MethodGet: okHandler})
	handle("/readyz", "readyz", route{http.MethodGet: s.readyz})
	if s.cfg.DemoPage {
		files := http.FileServerFS(web.FS())
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
		if rec.status != http.StatusSwitchingProtocols { // a sideband's lifetime is no request duration
			s.m.seconds.WithLabelValues(name).Observe(s.cfg.Now().Sub(start).Seconds())
		}
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
	h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
	h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
	h.Set("Access-Control-Max-Age", "600")
}

// The request headers a page on an allowed origin may send, and the
// response headers it may read. Besides the API's own (If-Match and ETag:
// an ICE restart by PATCH, RFC 9725), they are what OpenAI's JavaScript
// SDKs send from a browser, so a page written for OpenAI works unchanged:
// the Agents SDK's WebRTC transport always sends X-OpenAI-Agents-SDK (a
// preflight without it fails connect() with "Failed to fetch"); the openai
// client sends its X-Stainless-* platform and retry headers, OpenAI-Beta,
// and OpenAI-Organization / OpenAI-Project when configured. Signaling
// ignores all of them. The SDKs read Location (the call ID) and
// Retry-After (when to retry a 429 or 503).
const (
	corsAllowHeaders = "Authorization, Content-Type, If-Match, " +
		"X-OpenAI-Agents-SDK, OpenAI-Beta, OpenAI-Organization, OpenAI-Project, " +
		"X-Stainless-Lang, X-Stainless-Package-Version, X-Stainless-OS, X-Stainless-Arch, " +
		"X-Stainless-Runtime, X-Stainless-Runtime-Version, X-Stainless-Retry-Count, X-Stainless-Timeout, " +
		"X-Stainless-Helper-Method, X-Stainless-Poll-Helper, X-Stainless-Custom-Poll-Interval"
	corsExposeHeaders = "Location, ETag, Retry-After, " + HeaderRegion + ", " + HeaderCluster + ", " + HeaderPOP + ", " + HeaderBackupPOP
)

type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status, r.wrote = code, true
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController (and the WebSocket upgrade of a
// sideband) reach the connection.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

// clientClosed is the status recorded for a request whose client went away
// before an answer was written (nginx's 499), so a dashboard does not count
// abandoned offers as successes.
const clientClosed = 499
