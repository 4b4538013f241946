package clusterrelay

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// Defaults of the cluster relay role.
const (
	// DrainAnnounce is how long a stopping replica announces draining in
	// the global pool before it leaves (at most drain_timeout), so global
	// relays move its flows to another replica first.
	DrainAnnounce = 3 * time.Second
)

// Config is the cluster relay role's config: the file's keys
// (docs/operations.md), then what only code sets. NewNode takes it whole;
// New (the relay alone, as tests and benchmarks build it) reads Cluster,
// Tuning and the runtime fields.
type Config struct {
	node.Common   `yaml:",inline"`
	Region        string `yaml:"region"`
	Cluster       uint16 `yaml:"cluster"`   // this relay's cluster (non-zero)
	DataAddr      string `yaml:"data_addr"` // UDP, e.g. 0.0.0.0:7100
	DataAdvertise string `yaml:"data_advertise"`
	APIAddr       string `yaml:"api_addr"` // the cluster's session API front, e.g. 0.0.0.0:8080
	APIAdvertise  string `yaml:"api_advertise"`
	// Tuning is how the socket's one path runs (udpio.Runner; keys batch,
	// lock_threads, cpus, bundle, event_loop): on an event loop or a read
	// loop of the runtime's poller, pinned to CPUs[0]. Bundle bundles
	// toward pods and global relay ingresses (bundles are always read).
	// Defaults: batches of 32 on an event loop.
	udpio.Tuning `yaml:",inline"`
	// FastPath is the in-kernel fast path (docs/fastpath.md): auto (the
	// default) attaches it with TCX where the kernel allows and the
	// relay's address is not on loopback, else stays in user space with
	// one log line and a metric; tc attaches or fails; xdp is not built
	// yet; off never attaches.
	FastPath fastpath.Mode `yaml:"fast_path"`
	// HopKeys are this cluster's inter-tier keys; prefer $RTCEDGE_HOP_KEYS.
	HopKeys node.HopKeys `yaml:"hop_keys"`
	// Authority is this cluster's authority secret (prefer
	// $RTCEDGE_AUTHORITY_KEYS): with it the relay derives every pod's hop
	// key from the header's pod, admits to the cluster pool only members
	// proven by it (pods by their own key, relays by the relay key), and
	// presents each pod its own session API credential. HopKeys are then
	// optional (a migration keeps both, docs/operations.md).
	Authority     node.Authority `yaml:"authority"`
	ClusterGossip node.Gossip    `yaml:"cluster_gossip"`
	GlobalGossip  node.Gossip    `yaml:"global_gossip"`
	// SessionAPISecret is the cluster's session API bearer secret, required
	// from signaling and presented to the pods; empty: none.
	SessionAPISecret string `yaml:"session_api_secret"`
	// APITLS serves the front over TLS (cert, key) and verifies the pods'
	// session APIs with ca, the cluster CA.
	APITLS sessionapi.TLS `yaml:"api_tls"`

	// What the relay runs with: NewNode sets these; New requires Pods
	// and Hop.

	Pods PodDirectory `yaml:"-"` // live pods of the cluster
	// Hop is this cluster's inter-tier MAC keyring: a datagram in either
	// direction is forwarded only if its tag verifies, so a host without
	// the key can make the relay send nothing. SetHopKeys replaces it
	// without a restart.
	Hop *encap.Keyring `yaml:"-"`
	// Advertise is the data address global relays send to (gossip's
	// Data); relay probes name it (docs/wire.md §5). Zero: the socket's
	// own address.
	Advertise  netip.AddrPort        `yaml:"-"`
	Logger     *slog.Logger          `yaml:"-"` // default slog.Default()
	Registerer prometheus.Registerer `yaml:"-"` // nil: metrics are not registered
}

// ApplyEnv takes the secrets from the environment (config.Load calls it).
func (c *Config) ApplyEnv() error {
	c.ClusterGossip.ApplyEnv()
	c.GlobalGossip.ApplyEnv()
	c.HopKeys.ApplyEnv()
	c.Authority.ApplyEnv()
	return nil
}

// Defaults fills the unset fields.
func (c *Config) Defaults() {
	c.Common.Defaults()
	c.Tuning.Defaults()
	if c.FastPath == "" {
		c.FastPath = fastpath.ModeAuto
	}
}

// hopKeyring builds the relay's keyring from HopKeys and Authority (it is
// also their validation).
func (c *Config) hopKeyring() (*encap.Keyring, error) {
	sec, err := c.Authority.Secrets()
	if err != nil || sec == nil {
		if err == nil {
			return c.HopKeys.Keyring(c.Cluster)
		}
		return nil, err
	}
	var static *encap.Keyring
	if c.HopKeys.Set() {
		if static, err = c.HopKeys.Keyring(c.Cluster); err != nil {
			return nil, err
		}
	}
	return sec.HopKeyring(c.Cluster, static)
}

// Validate checks c after Defaults.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate(),
		node.CheckHostPort("data_addr", c.DataAddr, false),
		node.CheckHostPort("api_addr", c.APIAddr, false),
		c.APITLS.Validate("api_tls"),
		c.Tuning.Validate(),
		c.ClusterGossip.Validate("cluster_gossip"),
		c.GlobalGossip.Validate("global_gossip"),
	}
	if _, err := c.hopKeyring(); err != nil {
		errs = append(errs, err)
	}
	if _, err := fastpath.ParseMode(string(c.FastPath)); err != nil {
		errs = append(errs, err)
	}
	if c.Cluster == 0 {
		errs = append(errs, errors.New("cluster must be non-zero"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clusterrelay config: %w", err)
	}
	return nil
}
