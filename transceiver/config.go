package transceiver

// The transceiver's configuration: the typed Config with defaults,
// environment overrides and validation, the backend it names, and the
// sockets a node opens for it.

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/netbackend"
	"github.com/rtcedge/rtcedge/backend/realtime"
	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
	"github.com/rtcedge/rtcedge/transceiver/podnet"
)

// Config configures the transceiver role: the fields with a YAML key are
// its config file (docs/operations.md), the others (no key) are set by the
// program that runs it. Zero durations and counts take the defaults noted
// (Defaults).
type Config struct {
	node.Common   `yaml:",inline"`
	Region        string `yaml:"region"`
	Cluster       uint16 `yaml:"cluster"`   // this pod's cluster ID (non-zero)
	Pod           uint16 `yaml:"pod"`       // unique among live pods of the cluster; 0 in a file: from the hostname's StatefulSet ordinal
	DataAddr      string `yaml:"data_addr"` // pod UDP socket, e.g. 0.0.0.0:7000
	DataAdvertise string `yaml:"data_advertise"`
	APIAddr       string `yaml:"api_addr"` // session API, e.g. 0.0.0.0:8081
	APIAdvertise  string `yaml:"api_advertise"`

	MaxSessions    int           `yaml:"max_sessions"`    // capacity; default 500
	ConnectTimeout time.Duration `yaml:"connect_timeout"` // a session not connected by then is freed; default 30s
	IdleTimeout    time.Duration `yaml:"idle_timeout"`    // a connected session with no media or events for this long ends; default 60s
	RTPTimeout     time.Duration `yaml:"rtp_timeout"`     // a phone call without RTP from its carrier for this long ends (docs/sip.md); default 30s
	// RouteTTL is how long a client's return route is kept without
	// packets from it; default 2m.
	RouteTTL time.Duration `yaml:"route_ttl"`
	// DTLSRole is the server's DTLS role: "client" answers a=setup:active
	// (the server sends the ClientHello the moment ICE connects), "server"
	// answers a=setup:passive and skips the HelloVerify cookie round trip
	// (ICE has already proven the path with MESSAGE-INTEGRITY, so the
	// cookie adds nothing). Default "client".
	DTLSRole string `yaml:"dtls_role"`
	// PionMedia keeps every session's SRTP on Pion's own path (its SRTP
	// sessions, read streams and report interceptors) instead of the pod's
	// (podnet.Media). Only for comparing the two: the pod's path costs the
	// pod a fraction of the CPU per datagram (docs/benchmarks.md).
	PionMedia bool `yaml:"pion_media"`
	// BackendAddr is an inference backend speaking rtcedge's protocol
	// (host:port, docs/backend-protocol.md). BackendURL, instead, is a
	// model server speaking the OpenAI Realtime protocol (ws:// or
	// wss://…/v1/realtime?model=…, docs/backends.md), sent BackendProtocol
	// ("ga", default, or "beta") at BackendRate (its PCM16 rate, default
	// 24000), with the API key of $RTCEDGE_BACKEND_API_KEY. Neither: the
	// in-process echo. BackendMaxMessage bounds one event from the model
	// server in bytes (default realtime.DefaultMaxMessage, 1 MiB): a
	// larger one ends the call. BackendG711 says the server takes
	// audio/pcmu and audio/pcma (OpenAI's and the reference server do):
	// phone calls' G.711 then goes to it and back as it is, with no codec
	// on the pod (docs/sip.md, "Passthrough"). NewBackend builds the
	// node's Backend from them.
	BackendAddr       string         `yaml:"backend_addr"`
	BackendURL        string         `yaml:"backend_url"`
	BackendProtocol   string         `yaml:"backend_protocol"`
	BackendRate       int            `yaml:"backend_rate"`
	BackendMaxMessage int            `yaml:"backend_max_message"`
	BackendG711       bool           `yaml:"backend_g711"`
	Token             node.TokenKeys `yaml:"token"` // the routing-token keys Keys is built from
	// Hop are this cluster's inter-tier keys as configured (prefer
	// $RTCEDGE_HOP_KEYS); Hop is built from them.
	HopKeys node.HopKeys `yaml:"hop_keys"`
	Gossip  node.Gossip  `yaml:"gossip"` // the cluster pool
	// SessionAPISecret is the cluster's session API bearer secret (e.g.
	// "${RTCEDGE_SESSION_API_SECRET}"): Handler refuses session API
	// requests without it (health probes excepted). Empty: the API asks
	// for none (dev worlds and tests).
	SessionAPISecret string `yaml:"session_api_secret"`
	// SessionAPISecretSHA256, instead of the secret, is its
	// sessionapi.SecretHash (hex SHA-256): the pod verifies the front's
	// secret without holding it, so a compromised pod cannot call its
	// cluster's other pods. It wins over SessionAPISecret.
	SessionAPISecretSHA256 string `yaml:"session_api_secret_sha256"`
	// APITLS serves the session API over TLS (cert, key); the front
	// verifies it with the cluster CA.
	APITLS sessionapi.TLS `yaml:"api_tls"`
	// PodKeysFile is the file the pod's key issuer wrote (prefer
	// $RTCEDGE_POD_KEYS; internal/authority, docs/operations.md): the
	// pod's own token, hop, gossip-proof and session API keys and its
	// cluster's relay keys, derived for this pod only. It replaces token,
	// hop_keys and session_api_secret(_sha256), and sets pod when unset.
	PodKeysFile string `yaml:"pod_keys"`
	// PodKeys are the keys read from PodKeysFile (UsePodKeys sets them).
	PodKeys *authority.PodKeys `yaml:"-"`

	// ICE consent: after DisconnectedTimeout without a packet from the
	// client the session is "disconnected" (it still recovers), after
	// FailedTimeout it ends. Defaults 5s and 15s.
	DisconnectedTimeout time.Duration `yaml:"-"`
	FailedTimeout       time.Duration `yaml:"-"`
	// SCTPRTOMax caps SCTP's retransmission back-off so data channels
	// recover quickly after a path gap; default 1s.
	SCTPRTOMax time.Duration `yaml:"-"`
	// WaitForNomination makes the server select a candidate pair only when
	// the client nominates it, as RFC 8445 describes for lite agents. By
	// default the preferred POP's pair is selected on the first
	// authenticated check (see session.onBindingRequest), which saves
	// browsers about one ping interval of setup time.
	WaitForNomination bool `yaml:"-"`
	// Readers is how many goroutines read the pod socket, each taking
	// batches of datagrams (recvmmsg) and running their receive path;
	// default podnet.DefaultReaders.
	Readers int `yaml:"-"`

	Keys *token.Keyring `yaml:"-"` // mints server ufrags; default: built from Token
	Hop  *encap.Keyring `yaml:"-"` // the cluster's inter-tier MAC keys; default: built from HopKeys. SetHopKeys replaces them
	// RedisURL is the global relays' route cache (their redis_url): the
	// pod writes the route of each phone call's media address there
	// (docs/wire.md §6). Empty, with no CacheStore: phone calls get no
	// route and their carrier's RTP reaches no pod. Prefer
	// $RTCEDGE_REDIS_URL for URLs with passwords.
	RedisURL string `yaml:"redis_url"`
	// CacheStore, when redis_url is empty, is the in-process route cache
	// the dev world's relays share.
	CacheStore *routecache.MemoryStore `yaml:"-"`
	// RouteCache is the route cache itself (built by NewNode from
	// RedisURL or CacheStore; New takes it as given, nil: none).
	RouteCache routecache.Cache `yaml:"-"`
	Backend    backend.Backend  `yaml:"-"` // the inference side of every session
	// Relays, when set, limits the datagrams the pod accepts to those from
	// the cluster's relays (FollowRelays keeps it in step with gossip).
	Relays     *RelaySet             `yaml:"-"`
	Logger     *slog.Logger          `yaml:"-"` // default slog.Default()
	Registerer prometheus.Registerer `yaml:"-"` // nil: metrics are not registered
	// TurnRegisterer receives the turn metrics (rtcedge_turn_*,
	// rtcedge_reply_audio_seconds_total, rtcedge_bargeins_total), whose
	// pop label is the POP of a call's path; default Registerer. The dev
	// world, whose one registry labels every node with its own pop, gives
	// pods one without that label.
	TurnRegisterer prometheus.Registerer `yaml:"-"`
	Now            func() time.Time      `yaml:"-"` // default time.Now
}

// ApplyEnv takes the secrets from the environment (config.Load calls it).
func (c *Config) ApplyEnv() error {
	c.Gossip.ApplyEnv()
	c.HopKeys.ApplyEnv()
	if err := c.Token.ApplyEnv(); err != nil {
		return err
	}
	if env := os.Getenv(routecache.EnvRedisURL); env != "" {
		c.RedisURL = env
	}
	if env := os.Getenv(EnvPodKeys); env != "" {
		c.PodKeysFile = env
	}
	if c.PodKeysFile == "" {
		return nil
	}
	k, err := authority.ReadPodKeys(c.PodKeysFile)
	if err != nil {
		return err
	}
	return c.UsePodKeys(k)
}

// EnvPodKeys names the pod keys file (Config.PodKeysFile).
const EnvPodKeys = "RTCEDGE_POD_KEYS"

// UsePodKeys configures the pod with the keys its issuer gave it: they
// replace Token, HopKeys and the session API secret, and set Pod when it
// is unset (Validate checks that they are this pod's).
func (c *Config) UsePodKeys(k authority.PodKeys) error {
	if len(k.Token) == 0 || len(k.Hop) == 0 || len(k.SessionAPI) == 0 {
		return errors.New("pod_keys: token, hop and session_api keys are required")
	}
	id, _, err := token.ParseKeySpec(k.Token[0])
	if err != nil {
		return fmt.Errorf("pod_keys: %w", err)
	}
	c.PodKeys = &k
	c.Token = node.TokenKeys{Keys: k.Token, Current: &id}
	c.HopKeys = node.HopKeys{Keys: k.Hop}
	c.SessionAPISecret, c.SessionAPISecretSHA256 = "", ""
	if c.Pod == 0 {
		c.Pod = k.Pod
	}
	return nil
}

// Defaults fills c's unset fields; Keys and Hop are built from Token
// and Hop when those are configured (Validate says why they cannot be).
func (c *Config) Defaults() {
	c.Common.Defaults()
	config.Default(&c.MaxSessions, 500)
	config.Default(&c.ConnectTimeout, 30*time.Second)
	config.Default(&c.IdleTimeout, 60*time.Second)
	config.Default(&c.RTPTimeout, 30*time.Second)
	config.Default(&c.DisconnectedTimeout, 5*time.Second)
	config.Default(&c.FailedTimeout, 15*time.Second)
	config.Default(&c.SCTPRTOMax, time.Second)
	config.Default(&c.RouteTTL, 2*time.Minute)
	config.Default(&c.Readers, podnet.DefaultReaders())
	config.Default(&c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Keys == nil && len(c.Token.Keys) > 0 {
		c.Keys, _ = c.Token.Keyring()
	}
	if c.Hop == nil && (len(c.HopKeys.Keys) > 0 || c.HopKeys.File != "") {
		c.Hop, _ = c.HopKeys.Keyring(c.Cluster)
	}
}

// Validate checks c after Defaults and reports every problem.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate(),
		node.CheckHostPort("data_addr", c.DataAddr, false),
		node.CheckHostPort("api_addr", c.APIAddr, false),
		c.APITLS.Validate("api_tls"),
		checkSHA256("session_api_secret_sha256", c.SessionAPISecretSHA256),
		node.CheckHostPort("backend_addr", c.BackendAddr, true),
		c.checkBackend(),
		node.NotNegative("max_sessions", c.MaxSessions),
		node.NotNegative("connect_timeout", c.ConnectTimeout),
		node.NotNegative("idle_timeout", c.IdleTimeout),
		node.NotNegative("rtp_timeout", c.RTPTimeout),
		node.NotNegative("route_ttl", c.RouteTTL),
		node.NotNegative("readers", c.Readers),
		c.Gossip.Validate("gossip"),
		c.check(),
	}
	if c.Keys == nil {
		_, err := c.Token.Keyring()
		errs = append(errs, err)
	}
	if k := c.PodKeys; k != nil && (k.Cluster != c.Cluster || k.Pod != c.Pod) {
		errs = append(errs, fmt.Errorf("pod_keys are pod %d of cluster %d's, not pod %d of cluster %d's", k.Pod, k.Cluster, c.Pod, c.Cluster))
	}
	if c.Hop == nil {
		_, err := c.HopKeys.Keyring(c.Cluster)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("transceiver config: %w", err)
	}
	return nil
}

// check is what New needs of a config, whoever filled it (Validate adds
// the config file's settings).
func (c *Config) check() error {
	switch {
	case c.Cluster == 0:
		return errors.New("cluster must be non-zero")
	case c.DTLSRole != "" && c.DTLSRole != "client" && c.DTLSRole != "server":
		return fmt.Errorf("dtls_role %q: want client or server", c.DTLSRole)
	case c.MaxSessions < 0 || c.Readers < 0:
		return errors.New("max sessions and readers must not be negative")
	}
	return nil
}

// checkBackend checks the backend settings (Validate reports it).
func (c *Config) checkBackend() error {
	switch {
	case c.BackendURL != "" && c.BackendAddr != "":
		return errors.New("backend_url and backend_addr are exclusive: set backend_url for an OpenAI Realtime server, backend_addr for rtcedge's backend protocol")
	case c.BackendURL == "" && (c.BackendProtocol != "" || c.BackendRate != 0 || c.BackendMaxMessage != 0 || c.BackendG711):
		return errors.New("backend_protocol, backend_rate, backend_max_message and backend_g711 need backend_url")
	case c.BackendURL == "":
		return nil
	}
	rc := c.realtimeConfig(func(string) string { return "" })
	if err := rc.Validate(); err != nil {
		return fmt.Errorf("backend_url: %w", err)
	}
	return nil
}

func (c *Config) realtimeConfig(getenv func(string) string) realtime.Config {
	return realtime.Config{URL: c.BackendURL, Protocol: c.BackendProtocol, Rate: c.BackendRate, MaxMessage: c.BackendMaxMessage,
		G711: c.BackendG711, APIKey: getenv(realtime.APIKeyEnv)}
}

// NewBackend builds the backend c selects (after Validate): the OpenAI
// Realtime connector for BackendURL, its API key from
// getenv(realtime.APIKeyEnv) and its metrics registered with reg (nil:
// none); netbackend for BackendAddr; else the echo. A connector is ready
// while its server accepts TCP connections, as netbackend is.
func (c *Config) NewBackend(getenv func(string) string, log *slog.Logger, reg prometheus.Registerer) (backend.Backend, error) {
	if c.BackendURL == "" {
		return netbackend.ForAddr(c.BackendAddr, log), nil
	}
	rc := c.realtimeConfig(getenv)
	rc.Logger, rc.Registerer = log, reg
	b, err := realtime.New(rc)
	if err != nil {
		return nil, fmt.Errorf("backend_url: %w", err)
	}
	u, _ := url.Parse(c.BackendURL) // valid: New parsed it
	port := u.Port()
	if port == "" {
		port = map[string]string{"ws": "80", "wss": "443"}[u.Scheme]
	}
	return dialReady{b, net.JoinHostPort(u.Hostname(), port)}, nil
}

// dialReady is the Realtime connector, ready while addr (its server)
// accepts TCP connections. It embeds the connector itself, so every
// optional interface the connector implements (backend.InputRater) is
// the wrapper's too, checked below at compile time.
type dialReady struct {
	*realtime.Backend
	addr string
}

var (
	_ backend.Ready      = dialReady{}
	_ backend.InputRater = dialReady{}
	_ backend.G711Taker  = dialReady{}
)

// Ready implements backend.Ready: a TCP connect to the server within ctx.
func (b dialReady) Ready(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", b.addr)
	if err != nil {
		return fmt.Errorf("dial the Realtime server: %w", err)
	}
	return conn.Close()
}

// Sockets are a transceiver node's listeners, opened by OpenSockets (or by
// a test or an embedding program); Metrics may be nil.
type Sockets struct {
	Data    *net.UDPConn
	API     net.Listener
	Metrics net.Listener
}

// OpenSockets opens the listeners of cfg's addresses once cfg validates
// (after Defaults). The data socket is bound with SO_REUSEPORT, so the pod's
// socket readers each get a socket of their own, steered by client.
func OpenSockets(cfg Config) (s Sockets, err error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return s, err
	}
	defer func() {
		if err != nil {
			_ = s.close()
		}
	}()
	b, err := netip.ParseAddrPort(cfg.DataAddr)
	if err != nil {
		return s, fmt.Errorf("data_addr %q: %w", cfg.DataAddr, err)
	}
	conns, err := udpio.ListenReusePort(b, 1)
	if err != nil {
		return s, err
	}
	s.Data = conns[0]
	if s.API, err = node.Listen("api_addr", cfg.APIAddr); err != nil {
		return s, err
	}
	s.Metrics, err = node.Listen("metrics_addr", cfg.MetricsAddr)
	return s, err
}

// close closes whichever sockets are open.
func (s Sockets) close() error {
	if s.Data != nil {
		_ = s.Data.Close()
	}
	for _, ln := range []net.Listener{s.API, s.Metrics} {
		if ln != nil {
			_ = ln.Close()
		}
	}
	return nil
}

var ordinal = regexp.MustCompile(`-(\d+)$`)

// PodFromHostname derives a pod ID from a StatefulSet-style hostname
// ("transceiver-3" → 4), so a Kubernetes deployment needs no per-pod config.
func PodFromHostname(hostname string) (uint16, error) {
	m := ordinal.FindStringSubmatch(hostname)
	if m == nil {
		return 0, fmt.Errorf("pod ID not configured and hostname %q has no -N ordinal", hostname)
	}
	n, err := strconv.ParseUint(m[1], 10, 16)
	if err != nil || n >= 65535 {
		return 0, fmt.Errorf("hostname ordinal %q out of range", m[1])
	}
	return uint16(n + 1), nil
}

func podID(cfg *Config) error {
	if cfg.Pod != 0 {
		return nil
	}
	h, err := os.Hostname()
	if err != nil {
		return err
	}
	cfg.Pod, err = PodFromHostname(h)
	return err
}

// checkSHA256 accepts "" or 64 hex digits.
func checkSHA256(what, v string) error {
	if v == "" {
		return nil
	}
	if b, err := hex.DecodeString(v); err != nil || len(b) != 32 {
		return fmt.Errorf("%s: want the 64 hex digits of a SHA-256", what)
	}
	return nil
}
