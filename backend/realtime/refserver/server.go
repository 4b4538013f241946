// Package refserver is a reference server of the OpenAI Realtime WebSocket
// protocol (GET /v1/realtime?model=…, GA event names, or the beta names with
// Config.Beta): sessions, an energy-based server VAD, commits, replies,
// response.cancel and conversation.item.truncate. It answers every turn with
// "parrot" audio — the audio of the caller's last committed turn played back
// (a 1 s tone at ToneHz when the conversation has none), sent faster than
// real time as real models do — so tests can check both that the server
// heard the caller and that the caller heard the reply. Every session
// records what it received (State) for tests.
//
// Handler is the http.Handler; Server runs it on a listener (rtcedge
// realtime-ref, tests on port 0).
package refserver

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/internal/config"
)

// DefaultAddr is the reference server's default listen address.
const DefaultAddr = "127.0.0.1:9600"

// Path is where the server accepts WebSocket upgrades.
const Path = "/v1/realtime"

// ToneHz is the frequency of the reply to a response.create when the
// conversation holds no caller audio yet.
const ToneHz = 440

// Config configures the reference server. The zero value is a GA server at
// 24 kHz without authentication.
type Config struct {
	// Addr is the listen address New opens when it is given no listener;
	// default DefaultAddr.
	Addr string `yaml:"addr"`
	// APIKey, if set, is the only key accepted, as "Authorization: Bearer
	// KEY" or the browser's "openai-insecure-api-key.KEY" subprotocol.
	APIKey string `yaml:"-"`
	// Beta sends the beta event names and session shape
	// (response.audio.delta, input_audio_format: pcm16, …).
	Beta bool `yaml:"beta"`
	// Rate is the PCM16 sample rate of input and output audio: 24000
	// (default, OpenAI's) or 16000.
	Rate int `yaml:"rate"`
	// Speed is how many times faster than real time reply audio is sent;
	// 0 sends it as fast as the connection takes it.
	Speed float64 `yaml:"speed"`
	// DeltaMs is the audio in one delta event; default 100.
	DeltaMs int `yaml:"delta_ms"`
	// ToneMs is the length of the tone a response.create gets when the
	// conversation holds no caller audio; default 1000.
	ToneMs int `yaml:"tone_ms"`
	// MaxReplyMs caps a reply's audio; default 30000.
	MaxReplyMs int `yaml:"max_reply_ms"`
	// RecordMs caps the input audio each session records in its State
	// (for tests: reftest.Start records 10 minutes); 0 records none.
	RecordMs int `yaml:"record_ms"`
	// MaxInputMs bounds a session's input audio buffer: past it, the
	// oldest audio goes (State.InputDropped), as the buffer's start moves
	// on. It also bounds the audio of one conversation.item.create.
	// Default 30000 (1.4 MB at 24 kHz).
	MaxInputMs int          `yaml:"max_input_ms"`
	Logger     *slog.Logger `yaml:"-"`
}

func (c *Config) defaults() error {
	config.Default(&c.Addr, DefaultAddr)
	config.Default(&c.Rate, 24000)
	if c.Rate != 24000 && c.Rate != 16000 {
		return fmt.Errorf("refserver: rate %d: want 24000 or 16000", c.Rate)
	}
	if c.Speed < 0 {
		return fmt.Errorf("refserver: negative speed %v", c.Speed)
	}
	if c.DeltaMs <= 0 {
		c.DeltaMs = 100
	}
	if c.ToneMs <= 0 {
		c.ToneMs = 1000
	}
	if c.MaxReplyMs <= 0 {
		c.MaxReplyMs = 30000
	}
	if c.RecordMs < 0 {
		return fmt.Errorf("refserver: negative record_ms %d", c.RecordMs)
	}
	if c.MaxInputMs <= 0 {
		c.MaxInputMs = 30000
	}
	config.Default(&c.Logger, slog.Default())
	return nil
}

// Handler serves the protocol on GET Path. Its sessions are tracked until
// they end; Close ends them all.
type Handler struct {
	cfg Config // static after NewHandler
	log *slog.Logger

	ids  atomic.Uint64 // event, item, response and session IDs
	next chan *Session // sessions not yet taken by NextSession

	mu       sync.Mutex
	sessions []*Session // guarded by mu: the open sessions, in order of arrival
	closed   bool       // guarded by mu
	wg       sync.WaitGroup
}

// NewHandler validates cfg and returns the protocol handler.
func NewHandler(cfg Config) (*Handler, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Handler{cfg: cfg, log: cfg.Logger.With("component", "realtime-ref"), next: make(chan *Session, 64)}, nil
}

func (h *Handler) id(prefix string) string {
	return string(appendID(make([]byte, 0, 24), prefix, h.ids.Add(1)))
}

// Sessions returns the sessions open now, in order of arrival.
func (h *Handler) Sessions() []*Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Session(nil), h.sessions...)
}

// NextSession waits for the next session the handler accepts (each is
// handed out once, in order of arrival).
func (h *Handler) NextSession(ctx context.Context) (*Session, error) {
	select {
	case s := <-h.next:
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != Path {
		httpError(w, http.StatusNotFound, "not_found", "no such endpoint")
		return
	}
	if r.Method != http.MethodGet {
		httpError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET with a WebSocket upgrade")
		return
	}
	var protos []string
	if h.cfg.APIKey != "" {
		proto, ok := h.authorized(r)
		if !ok {
			httpError(w, http.StatusUnauthorized, "invalid_api_key", "Incorrect API key provided.")
			return
		}
		if proto != "" {
			protos = []string{"realtime", proto}
		}
	}
	model := r.URL.Query().Get("model")
	config.Default(&model, "rtcedge-ref")
	var s *Session
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: protos,
		// Called by s.run's reads: a stalled session answers no ping.
		OnPingReceived: func(context.Context, []byte) bool { return !s.stalled.Load() }})
	if err != nil {
		return // Accept answered the request
	}
	s = h.newSession(conn, model)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = conn.CloseNow()
		return
	}
	h.sessions = append(h.sessions, s)
	h.wg.Add(1)
	h.mu.Unlock()
	select {
	case h.next <- s:
	default: // nobody is taking them (a server run by hand)
	}
	defer h.wg.Done()
	s.run() // forgets s (Handler.forget) before it reports Closed
}

// forget drops a closed session from the handler's list: a server that
// runs for days holds its open sessions only (what NextSession has not
// handed out yet stays in its queue, released: Session.release).
func (h *Handler) forget(s *Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i := slices.Index(h.sessions, s); i >= 0 {
		h.sessions = slices.Delete(h.sessions, i, i+1)
	}
}

// authorized checks the API key; proto is the subprotocol to echo when the
// key came as one.
func (h *Handler) authorized(r *http.Request) (proto string, ok bool) {
	want := []byte(h.cfg.APIKey)
	if got, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found {
		return "", subtle.ConstantTimeCompare([]byte(got), want) == 1
	}
	for _, p := range strings.Split(r.Header.Get("Sec-WebSocket-Protocol"), ",") {
		p = strings.TrimSpace(p)
		if key, found := strings.CutPrefix(p, "openai-insecure-api-key."); found {
			return p, subtle.ConstantTimeCompare([]byte(key), want) == 1
		}
	}
	return "", false
}

func httpError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"type": "invalid_request_error", "code": code, "message": msg, "param": nil,
	}})
}

// Close ends every session and waits for them.
func (h *Handler) Close() error {
	h.mu.Lock()
	h.closed = true
	sessions := append([]*Session(nil), h.sessions...)
	h.mu.Unlock()
	for _, s := range sessions {
		s.Kill()
	}
	h.wg.Wait()
	return nil
}

// Server is the Handler on its own listener.
type Server struct {
	*Handler
	ln  net.Listener
	srv *http.Server
}

// New builds a server on ln (nil: it listens on cfg.Addr).
func New(cfg Config, ln net.Listener) (*Server, error) {
	h, err := NewHandler(cfg)
	if err != nil {
		return nil, err
	}
	if ln == nil {
		if ln, err = net.Listen("tcp", h.cfg.Addr); err != nil {
			return nil, fmt.Errorf("refserver: listen: %w", err)
		}
	}
	return &Server{Handler: h, ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}, nil
}

// URL is the WebSocket URL of the server, e.g. ws://127.0.0.1:9600/v1/realtime.
func (s *Server) URL() string { return "ws://" + s.ln.Addr().String() + Path }

// Run serves until ctx ends or Close is called; open sessions end then.
func (s *Server) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	s.log.Info("realtime reference server up", "url", s.URL(), "beta", s.cfg.Beta, "rate", s.cfg.Rate)
	err := s.srv.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("refserver: serve: %w", err)
}

// Close stops the server at once and ends its sessions.
func (s *Server) Close() error {
	err := s.srv.Close()
	_ = s.Handler.Close()
	return err
}
