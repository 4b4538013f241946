package globalrelay

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/node"
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

// NodeConfig is the global relay role's config file (docs/operations.md).
type NodeConfig struct {
	node.Common `yaml:",inline"`
	Region      string `yaml:"region"`
	POP         uint16 `yaml:"pop"`
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
	TCP     TCPLimits `yaml:"tcp"`
	Workers int       `yaml:"workers"` // SO_REUSEPORT sockets; default: one per CPU
	// Tuning: batch, lock_threads, cpus, bundle and event_loop
	// (udpio.Tuning; Defaults: batches of 32 on event loops).
	udpio.Tuning `yaml:",inline"`
	// Steering is how the kernel spreads the public SO_REUSEPORT
	// sockets' datagrams: "hash" (default: by 4-tuple, a flow stays on
	// one worker), "cpu" (the worker pinned to the CPU the datagram
	// arrives on) or "incoming_cpu". See docs/benchmarks.md.
	Steering string        `yaml:"steering"`
	FlowIdle time.Duration `yaml:"flow_idle"`
	MaxFlows int           `yaml:"max_flows"`
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
	// TokenLifetime: a routing token older than this opens no new flow
	// (its calls go on); default 24h, at least 1h.
	TokenLifetime time.Duration `yaml:"token_lifetime"`
	// HopKeys are the inter-tier keys of every cluster this POP serves;
	// prefer $RTCEDGE_HOP_KEYS.
	HopKeys node.HopKeys `yaml:"hop_keys"`
	Gossip  node.Gossip  `yaml:"gossip"` // the global pool
}

// DefaultTCPPort is the TCP ingress port when tcp_addr names only an IP:
// 443 gets through the firewalls that drop UDP, and browsers send ICE-TCP
// to it (they refuse most other ports below 1024).
const DefaultTCPPort = 443

// TCPLimits are the tunable bounds of the TCP ingress (TCPConfig).
type TCPLimits struct {
	MaxConns         int           `yaml:"max_conns"`
	MaxConnsPerIP    int           `yaml:"max_conns_per_ip"`
	MaxPending       int           `yaml:"max_pending"`
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	IdleTimeout      time.Duration `yaml:"idle_timeout"`
	WriteQueue       int           `yaml:"write_queue"`
	WriteTimeout     time.Duration `yaml:"write_timeout"`
}

// tcpAddr parses TCPAddr; ok is false when it is empty.
func (c *NodeConfig) tcpAddr() (ap netip.AddrPort, ok bool, err error) {
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
func (c *NodeConfig) ApplyEnv() error {
	c.Gossip.ApplyEnv()
	c.HopKeys.ApplyEnv()
	if env := os.Getenv(EnvRedisURL); env != "" {
		c.RedisURL = env
	}
	return c.Token.ApplyEnv()
}

// Defaults fills the unset fields.
func (c *NodeConfig) Defaults() {
	c.Common.Defaults()
	if c.Workers == 0 {
		c.Workers = udpio.Procs()
	}
	c.Tuning.Defaults()
	if c.ReadyWait == 0 {
		c.ReadyWait = DefaultReadyWait
	}
	if c.TokenLifetime == 0 {
		c.TokenLifetime = DefaultTokenLifetime
	}
}

// Validate checks c after Defaults.
func (c *NodeConfig) Validate() error {
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
	if _, err := c.Token.Keyring(); err != nil {
		errs = append(errs, err)
	}
	if hop, err := c.HopKeys.ClusterKeys(); err != nil {
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

// internal parses InternalAddr: IP or IP:port.
func (c *NodeConfig) internal() (netip.AddrPort, error) {
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
func (c *NodeConfig) servedClusters() ([]uint16, error) {
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
