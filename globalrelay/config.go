package globalrelay

// The global relay's config: the file's keys, their defaults, their
// validation, and the keys and clusters derived from them.

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// Defaults of the global relay role.
const (
	// DefaultReadyWait bounds how long a starting replica holds back
	// forwarding until it is ready (knows its clusters' relays).
	DefaultReadyWait = 10 * time.Second
	// DefaultTokenLifetime is how old a routing token may be and still
	// open a new flow.
	DefaultTokenLifetime = 24 * time.Hour
	// EnvRedisURL overrides redis_url (URLs with passwords).
	EnvRedisURL = "RTCEDGE_REDIS_URL"
)

// Config is the global relay role's config: the file's keys
// (docs/operations.md), then what only code sets. NewNode takes it whole;
// New (the relay alone, as tests and benchmarks build it) reads the relay's
// part and its runtime fields.
type Config struct {
	node.Common `yaml:",inline"`
	Region      string `yaml:"region"`
	POP         uint16 `yaml:"pop"`         // this POP's ID (non-zero)
	PublicAddr  string `yaml:"public_addr"` // the VIP port, e.g. 0.0.0.0:3478
	// InternalAddr is where cluster relays send replies: a specific IP
	// reachable from the clusters, optionally with a base port. Worker i
	// binds base+i; with a fixed base a replica restarted on the same
	// address gets its in-flight replies and restores flows from them.
	// Without a port the kernel picks them.
	InternalAddr string `yaml:"internal_addr"`
	// TCPAddr is where the POP accepts ICE-TCP (docs/tcp.md): the same VIP
	// as public_addr, "IP:port", or just the IP for DefaultTCPPort (443).
	// Empty: no TCP ingress.
	TCPAddr string `yaml:"tcp_addr"`
	// TCP tunes the TCP ingress's limits and timeouts (zero: defaults).
	TCP     TCPConfig `yaml:"tcp"`
	Workers int       `yaml:"workers"` // SO_REUSEPORT sockets; default: one per CPU
	// Tuning is how the workers move datagrams (udpio.Runner; keys
	// batch, lock_threads, cpus, bundle, event_loop): each worker's two
	// directions on one event loop, or on two read loops of the runtime's
	// poller. Bundle bundles only toward cluster relays (replies in
	// bundles are always read). Defaults: batches of 32 on event loops.
	udpio.Tuning `yaml:",inline"`
	// FastPath is the in-kernel fast path (docs/fastpath.md): auto (the
	// default) attaches it with TCX where the kernel allows, the sockets
	// are not on loopback and IPv4 forwarding is on for their interfaces,
	// else stays in user space with one log line and a metric; tc
	// attaches or fails; xdp is not built yet; off never attaches.
	FastPath fastpath.Mode `yaml:"fast_path"`
	// Steering is how the kernel spreads the public SO_REUSEPORT
	// sockets' datagrams: "hash" (default: by 4-tuple, a flow stays on
	// one worker), "cpu" (the worker pinned to the CPU the datagram
	// arrives on) or "incoming_cpu". See docs/benchmarks.md.
	Steering string `yaml:"steering"`
	// FlowIdle is how long a flow lives without a datagram from its
	// client; default 30s. Consent checks every few seconds keep live calls.
	FlowIdle time.Duration `yaml:"flow_idle"`
	MaxFlows int           `yaml:"max_flows"` // cap on the flow table; default 262144
	// Clusters are the cluster IDs this POP serves: the replica is ready
	// once it knows a live cluster relay of each. Catalogue, a region
	// catalogue file, adds all of its clusters. Neither set: ready once it
	// knows a live cluster relay of any cluster.
	Clusters  []uint16 `yaml:"clusters"`
	Catalogue string   `yaml:"catalogue"`
	// ReadyWait bounds how long a starting replica waits to be ready
	// before it forwards anyway (a load balancer sends it nothing until
	// /readyz says so; SO_REUSEPORT neighbours would); default 10s.
	ReadyWait time.Duration `yaml:"ready_wait"`
	// RedisURL shares flows between replicas ("redis://host:6379/0");
	// empty: no sharing (a restarted replica recovers from the next
	// STUN check). Prefer $RTCEDGE_REDIS_URL for URLs with passwords.
	RedisURL string         `yaml:"redis_url"`
	Token    node.TokenKeys `yaml:"token"`
	// TokenLifetime is how old a routing token may be and still open a
	// new flow (at the token's one-hour resolution); flows it opened go
	// on. Default 24h; at least 1h.
	TokenLifetime time.Duration `yaml:"token_lifetime"`
	// HopKeys are the inter-tier keys of every cluster this POP serves;
	// prefer $RTCEDGE_HOP_KEYS.
	HopKeys node.HopKeys `yaml:"hop_keys"`
	// Authority are the authority secrets of the clusters this POP serves
	// (prefer $RTCEDGE_AUTHORITY_KEYS): with them the relay derives the
	// token and hop key of the pod a token or header names, so no pod can
	// speak for another, and seals route-cache entries with a key pods do
	// not hold. Token and HopKeys are then optional (a migration keeps
	// both, docs/operations.md).
	Authority node.Authority `yaml:"authority"`
	Gossip    node.Gossip    `yaml:"gossip"` // the global pool

	// Not in the file: tuning that tests and benchmarks set.

	// FlowQuiet is how long a flow must have carried no client datagram
	// before a check naming another cluster or pod may take its client
	// address over (and so at most one takeover per FlowQuiet per
	// address). A live call, even in Opus DTX silence (a packet every
	// 400 ms), is never moved by someone else's check. Default 3s.
	FlowQuiet time.Duration `yaml:"-"`
	// AllowSource reports whether a client IP may have a flow. Default:
	// global unicast (Go's netip definition, private ranges included),
	// plus loopback when the public socket itself is on loopback (the
	// dev world and tests). Port 0 and the relay's own socket addresses
	// are refused whatever it says.
	AllowSource func(netip.Addr) bool `yaml:"-"`
	// SilenceAfter, CheckTimeout and AvoidFor tune the data-plane failure
	// detection (failover.go): a flow leaves its cluster relay when
	// replies stop for SilenceAfter (or 3× their usual interval) or a
	// check goes unanswered for CheckTimeout (or 4× the flow's check
	// round trip), and avoids it for AvoidFor. CheckTimeout also bounds
	// the wait for a relay probe's answer (relayprobe.go). Defaults
	// DefaultSilenceAfter, DefaultCheckTimeout, DefaultAvoidFor.
	SilenceAfter, CheckTimeout, AvoidFor time.Duration `yaml:"-"`
	// CacheRefresh is how often a live flow is written to the cache again,
	// so that it outlives the cache TTL for as long as the call runs;
	// default 20s (a third of the cache's default TTL).
	CacheRefresh time.Duration `yaml:"-"`

	// What the relay runs with: NewNode sets these from the fields above
	// and its environment; New requires Keys, Directory and Hop.

	Keys      *token.Keyring   `yaml:"-"` // verifies routing tokens
	Directory ClusterDirectory `yaml:"-"` // cluster relay replicas
	// Hop are the inter-tier MAC keys of the clusters this POP serves:
	// datagrams toward a cluster are sealed with its current key, replies
	// must verify under one of its keys, and route cache entries are
	// sealed with them too. SetHopKeys replaces them without a restart.
	Hop *encap.ClusterKeys `yaml:"-"`
	// Cache shares flows between replicas (Redis in production): new flows
	// are stored, and a datagram from an unknown client starts a lookup
	// whose hit must be handed to RestoreFlow (routecache.Config.OnFound).
	// The relay never waits for it. nil: no cache.
	Cache routecache.Cache `yaml:"-"`
	// CacheStore, when redis_url is empty, is the in-process store
	// NewNode's route cache uses (the dev world's stand-in for Redis,
	// shared by its replicas); nil and no redis_url: no route cache.
	CacheStore *routecache.MemoryStore `yaml:"-"`
	Logger     *slog.Logger            `yaml:"-"` // default slog.Default()
	Registerer prometheus.Registerer   `yaml:"-"` // nil: metrics are not registered
	Now        func() time.Time        `yaml:"-"` // default time.Now
}

// DefaultTCPPort is the TCP ingress port when tcp_addr names only an IP:
// 443 gets through the firewalls that drop UDP, and browsers send ICE-TCP
// to it (they refuse most other ports below 1024).
const DefaultTCPPort = 443

// tcpAddr parses TCPAddr; ok is false when it is empty.
func (c *Config) tcpAddr() (ap netip.AddrPort, ok bool, err error) {
	if c.TCPAddr == "" {
		return netip.AddrPort{}, false, nil
	}
	if ap, err := netip.ParseAddrPort(c.TCPAddr); err == nil {
		return ap, true, nil
	}
	ip, err := netip.ParseAddr(c.TCPAddr)
	if err != nil {
		return netip.AddrPort{}, false, fmt.Errorf("tcp_addr %q: want IP or IP:port", c.TCPAddr)
	}
	return netip.AddrPortFrom(ip, DefaultTCPPort), true, nil
}

// ApplyEnv takes the secrets from the environment (config.Load calls it).
func (c *Config) ApplyEnv() error {
	c.Gossip.ApplyEnv()
	c.HopKeys.ApplyEnv()
	c.Authority.ApplyEnv()
	if env := os.Getenv(EnvRedisURL); env != "" {
		c.RedisURL = env
	}
	return c.Token.ApplyEnv()
}

// Defaults fills the unset fields: the file's defaults (one worker per
// CPU, batches of 32 on event loops, ...) and the relay's.
func (c *Config) Defaults() {
	c.Common.Defaults()
	config.Default(&c.Workers, udpio.Procs())
	c.Tuning.Defaults()
	config.Default(&c.ReadyWait, DefaultReadyWait)
	config.Default(&c.FastPath, fastpath.ModeAuto)
	c.relayDefaults()
}

// relayDefaults fills the relay's unset fields; New applies them to a
// Config built in code, whose tuning stays as given (zero: plain reads).
func (c *Config) relayDefaults() {
	config.Default(&c.FlowIdle, 30*time.Second)
	config.Default(&c.MaxFlows, 1<<18)
	config.Default(&c.CacheRefresh, 20*time.Second)
	config.Default(&c.TokenLifetime, DefaultTokenLifetime)
	config.Default(&c.FlowQuiet, 3*time.Second)
	if c.SilenceAfter <= 0 {
		c.SilenceAfter = DefaultSilenceAfter
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = DefaultCheckTimeout
	}
	if c.AvoidFor <= 0 {
		c.AvoidFor = DefaultAvoidFor
	}
	config.Default(&c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate checks c after Defaults.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate(),
		node.NotNegative("workers", c.Workers),
		c.Tuning.Validate(),
		node.NotNegative("flow_idle", c.FlowIdle),
		node.NotNegative("max_flows", c.MaxFlows),
		node.NotNegative("ready_wait", c.ReadyWait),
		c.Gossip.Validate("gossip"),
	}
	if _, err := udpio.ParseSteering(c.Steering); err != nil {
		errs = append(errs, err)
	}
	if _, err := fastpath.ParseMode(string(c.FastPath)); err != nil {
		errs = append(errs, err)
	}
	if c.POP == 0 {
		errs = append(errs, errors.New("pop must be non-zero"))
	}
	if _, err := netip.ParseAddrPort(c.PublicAddr); err != nil {
		errs = append(errs, fmt.Errorf("public_addr %q: want IP:port", c.PublicAddr))
	}
	if _, err := c.internal(); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := c.tcpAddr(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, node.NotNegative("tcp.max_conns", c.TCP.MaxConns), node.NotNegative("tcp.max_conns_per_ip", c.TCP.MaxConnsPerIP),
		node.NotNegative("tcp.max_pending", c.TCP.MaxPending), node.NotNegative("tcp.write_queue", c.TCP.WriteQueue),
		node.NotNegative("tcp.handshake_timeout", c.TCP.HandshakeTimeout), node.NotNegative("tcp.idle_timeout", c.TCP.IdleTimeout),
		node.NotNegative("tcp.write_timeout", c.TCP.WriteTimeout))
	if _, err := c.tokenKeyring(); err != nil {
		errs = append(errs, err)
	}
	if hop, err := c.clusterKeys(); err != nil {
		errs = append(errs, err)
	} else {
		for _, cl := range c.Clusters {
			if hop.For(cl) == nil {
				errs = append(errs, fmt.Errorf("hop_keys: no inter-tier key for served cluster %d", cl))
			}
		}
	}
	if c.TokenLifetime < time.Hour {
		errs = append(errs, fmt.Errorf("token_lifetime %v: must be at least 1h", c.TokenLifetime))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("globalrelay config: %w", err)
	}
	return nil
}

// tokenKeyring builds the token keyring from Token and Authority (it is
// also their validation).
func (c *Config) tokenKeyring() (*token.Keyring, error) {
	sec, err := c.Authority.Secrets()
	if err != nil || sec == nil {
		if err == nil {
			return c.Token.Keyring()
		}
		return nil, err
	}
	var static *token.Keyring
	if len(c.Token.Keys) > 0 {
		if static, err = c.Token.Keyring(); err != nil {
			return nil, err
		}
	}
	return sec.TokenKeyring(static)
}

// clusterKeys builds the hop keys from HopKeys and Authority (it is also
// their validation).
func (c *Config) clusterKeys() (*encap.ClusterKeys, error) {
	sec, err := c.Authority.Secrets()
	if err != nil || sec == nil {
		if err == nil {
			return c.HopKeys.ClusterKeys()
		}
		return nil, err
	}
	var static *encap.ClusterKeys
	if c.HopKeys.Set() {
		if static, err = c.HopKeys.ClusterKeys(); err != nil {
			return nil, err
		}
	}
	return sec.ClusterKeys(static)
}

// internal parses InternalAddr: IP or IP:port.
func (c *Config) internal() (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(c.InternalAddr); err == nil {
		return ap, nil
	}
	ip, err := netip.ParseAddr(c.InternalAddr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("internal_addr %q: want IP or IP:port", c.InternalAddr)
	}
	return netip.AddrPortFrom(ip, 0), nil
}

// servedClusters is Clusters plus the catalogue's clusters, without
// duplicates.
func (c *Config) servedClusters() ([]uint16, error) {
	out := append([]uint16(nil), c.Clusters...)
	if c.Catalogue != "" {
		cat, err := geo.LoadCatalogue(c.Catalogue)
		if err != nil {
			return nil, err
		}
		for _, r := range cat.Regions {
			for _, cl := range r.Clusters {
				out = append(out, cl.ID)
			}
		}
	}
	seen := map[uint16]bool{}
	uniq := out[:0]
	for _, id := range out {
		if !seen[id] {
			seen[id] = true
			uniq = append(uniq, id)
		}
	}
	return uniq, nil
}
