// Package realtime is a backend.Backend that speaks the OpenAI Realtime
// WebSocket protocol to a model server (OpenAI, speaches, LocalAI, vLLM, or
// the reference server in refserver): one WebSocket per call, opened in
// Open so it is warm before the first word.
//
// Toward the server it sends the call's session configuration as the first
// session.update (audio formats forced to PCM16 at Config.Rate), the
// caller's data-channel events as backend/oaievents translates them (an
// allow-list of types and fields, read strictly, re-encoded by the pod;
// a session.update accepted in part, per the call's policy;
// input_audio_buffer.append dropped: audio comes by media) and the
// caller's audio, decoded from Opus to PCM16 and sent as
// input_audio_buffer.append every appendMs. Toward the caller it sends every
// server event but the audio deltas on the data channel, and the deltas'
// audio as 20 ms Opus frames, which the pod paces at real time and frames
// with output_audio_buffer.started/stopped (backend.Player,
// transceiver/pace). On the server's input_audio_buffer.speech_started or
// the caller's output_audio_buffer.clear it clears the pod's queue, cancels
// the response in progress and truncates the item to what the caller was
// sent.
//
// A server that refuses fails Open; one that closes or stops answering
// pings ends the call with an error event on the data channel (no URL, no
// key in it) and Ender.End. docs/backends.md describes the mapping.
package realtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/config"
)

// APIKeyEnv is the environment variable the API key of a backend URL
// comes from (FromURL).
const APIKeyEnv = "RTCEDGE_BACKEND_API_KEY"

// DefaultMaxMessage is the default bound of one server event (Config.MaxMessage):
// 1 MiB holds over 16 s of 24 kHz audio in one delta, and more than any
// other event a model server sends (a session with long instructions and
// tools is tens of KiB).
const DefaultMaxMessage = 1 << 20

// minMaxMessage is the smallest Config.MaxMessage: below it a session's
// own echo (session.created, session.updated) might not fit.
const minMaxMessage = 64 << 10

// Protocols: the event names and session shape the connector sends.
const (
	ProtocolGA   = "ga"
	ProtocolBeta = "beta"
)

// Config configures a Realtime backend. Validate (called by New) fills
// the defaults.
type Config struct {
	// URL is the server's WebSocket URL, ws:// or wss://, e.g.
	// wss://api.openai.com/v1/realtime?model=gpt-realtime. The model is the
	// URL's: a session's config cannot change it.
	URL string
	// APIKey is sent as "Authorization: Bearer KEY" if set; the caller
	// reads it from the environment (APIKeyEnv), never from a file in the
	// repo.
	APIKey string
	// Protocol is what the connector sends: "ga" (default) or "beta"
	// (beta event and session field names, and the OpenAI-Beta:
	// realtime=v1 header). Server events of either flavour are understood.
	Protocol string
	// Rate is the server's PCM16 sample rate: 24000 (default) or 16000
	// (any rate libopus takes: 8, 12, 16, 24 or 48 kHz).
	Rate int
	// DialTimeout bounds the WebSocket handshake; default 5s.
	DialTimeout time.Duration
	// StallTimeout ends a call whose server answers no ping for this
	// long; pings go every StallTimeout/3. Default 10s.
	StallTimeout time.Duration
	// MaxMessage bounds one server event, in bytes; default
	// DefaultMaxMessage. A larger one ends the call (ReasonOversized): the
	// server is broken or hostile, or sends a whole reply's audio in one
	// delta and needs a larger bound (docs/backends.md). The read buffer
	// is released after a message over readbuf.Keep, so the bound is
	// what a call holds while it reads one, not for its life.
	MaxMessage int
	// G711 says the server takes audio/pcmu and audio/pcma (beta:
	// g711_ulaw, g711_alaw), as OpenAI's and the reference server do: a
	// phone call's G.711 then goes to it and back as it is, with no codec
	// on the pod (backend.G711Taker, g711.go).
	G711   bool
	Logger *slog.Logger
	// Registerer receives the rtcedge_realtime_* metrics; nil: none.
	Registerer prometheus.Registerer
}

// Validate checks c and fills its defaults.
func (c *Config) Validate() error {
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("realtime: backend URL %s does not parse", RedactURL(c.URL))
	}
	if (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return errors.New("realtime: backend URL must be ws://HOST/… or wss://HOST/…")
	}
	if u.User != nil {
		return errors.New("realtime: backend URL must not hold credentials: set the API key in " + APIKeyEnv)
	}
	switch c.Protocol {
	case "":
		c.Protocol = ProtocolGA
	case ProtocolGA, ProtocolBeta:
	default:
		return fmt.Errorf("realtime: protocol %q: want %q or %q", c.Protocol, ProtocolGA, ProtocolBeta)
	}
	config.Default(&c.Rate, 24000)
	switch c.Rate {
	case 8000, 12000, 16000, 24000, 48000:
	default:
		return fmt.Errorf("realtime: rate %d: want 8000, 12000, 16000, 24000 or 48000", c.Rate)
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 10 * time.Second
	}
	switch {
	case c.MaxMessage == 0:
		c.MaxMessage = DefaultMaxMessage
	case c.MaxMessage < minMaxMessage:
		return fmt.Errorf("realtime: max message %d bytes: want at least %d", c.MaxMessage, minMaxMessage)
	}
	config.Default(&c.Logger, slog.Default())
	return nil
}

// Backend opens one WebSocket per call. It is safe for concurrent use.
type Backend struct {
	cfg  Config // static after New
	m    *metrics
	log  *slog.Logger
	host string // for logs: the URL without its query
	ids  atomic.Uint64
}

// New validates cfg and registers the metrics.
func New(cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(cfg.URL)
	return &Backend{cfg: cfg, m: m, host: u.Scheme + "://" + u.Host + u.Path,
		log: cfg.Logger.With("component", "realtime")}, nil
}

// FromURL is the backend a transceiver with backend_url rawURL uses: the
// API key from getenv(APIKeyEnv) (os.Getenv in a process), the protocol
// "ga" or "beta" (empty: ga).
func FromURL(rawURL, protocol string, getenv func(string) string, log *slog.Logger, reg prometheus.Registerer) (*Backend, error) {
	return New(Config{URL: rawURL, APIKey: getenv(APIKeyEnv), Protocol: protocol, Logger: log, Registerer: reg})
}

// The connector is a backend.Backend that tells the pod its PCM rate (the
// pod offers Opus no richer than that).
var (
	_ backend.Backend    = (*Backend)(nil)
	_ backend.InputRater = (*Backend)(nil)
	_ backend.G711Taker  = (*Backend)(nil)
)

// Open implements backend.Backend: it dials the server, sends the first
// session.update and starts the call's loops.
func (b *Backend) Open(ctx context.Context, info backend.SessionInfo, out backend.Sink) (backend.Handler, error) {
	start := time.Now()
	fail := func(reason string, err error) (backend.Handler, error) {
		b.m.failed.WithLabelValues(reason).Inc()
		return nil, err
	}
	format, err := b.formatOf(info)
	if err != nil {
		return fail(ReasonSetup, err)
	}
	dec, enc, err := b.codecs(format)
	if err != nil {
		return fail(ReasonSetup, err)
	}
	codecs := func() { closeCodecs(dec, enc) }
	hdr := http.Header{}
	if b.cfg.APIKey != "" {
		hdr.Set("Authorization", "Bearer "+b.cfg.APIKey)
	}
	if b.cfg.Protocol == ProtocolBeta {
		hdr.Set("OpenAI-Beta", "realtime=v1")
	}
	dctx, cancel := context.WithTimeout(ctx, b.cfg.DialTimeout)
	conn, resp, err := websocket.Dial(dctx, b.cfg.URL, &websocket.DialOptions{HTTPHeader: hdr})
	cancel()
	if err != nil {
		codecs()
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return fail(ReasonRefused, fmt.Errorf("realtime: %s refused the session: HTTP %d", b.host, resp.StatusCode))
		}
		return fail(ReasonDial, fmt.Errorf("realtime: dial %s: %w", b.host, redactErr(err, b.cfg.URL)))
	}
	conn.SetReadLimit(int64(b.cfg.MaxMessage))
	c := newCall(b, info, out, conn, format, dec, enc)
	if err := c.sendSession(info.Config); err != nil {
		_ = conn.CloseNow()
		codecs()
		return fail(ReasonSetup, redactErr(err, b.cfg.URL))
	}
	c.start()
	b.m.opened.Inc()
	b.m.openSeconds.Observe(time.Since(start).Seconds())
	return c, nil
}

// InputRate implements backend.InputRater: the server's PCM rate.
func (b *Backend) InputRate() int { return b.cfg.Rate }
