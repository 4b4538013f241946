package signaling

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/node"
)

// Environment variables that carry signaling's secrets.
const (
	EnvAPIKeys   = "RTCEDGE_API_KEYS" // comma-separated
	EnvSecretKey = "RTCEDGE_CLIENT_SECRET_KEY"
)

// DefaultDrainDelay is how long a stopping replica keeps serving after its
// readiness turns 503.
const DefaultDrainDelay = 5 * time.Second

// NodeConfig is the signaling role's config file (docs/operations.md).
// Zero rates and TTLs take the defaults of Config.
type NodeConfig struct {
	node.Common    `yaml:",inline"`
	ListenAddr     string   `yaml:"listen_addr"` // e.g. 0.0.0.0:8080
	Catalogue      string   `yaml:"catalogue"`   // region catalogue YAML (geo package)
	GeoIPDB        string   `yaml:"geoip_db"`    // GeoIP2/GeoLite2 City .mmdb; reloaded on change
	TrustedProxies []string `yaml:"trusted_proxies"`
	CORSOrigins    []string `yaml:"cors_origins"`
	DemoPage       bool     `yaml:"demo_page"`
	// APIKeys: prefer $RTCEDGE_API_KEYS. ClientSecretKey (base64): prefer
	// $RTCEDGE_CLIENT_SECRET_KEY; when absent a random one is made (then
	// client secrets only verify on this replica).
	APIKeys         []string      `yaml:"api_keys"`
	ClientSecretKey string        `yaml:"client_secret_key"`
	ClientSecretTTL time.Duration `yaml:"client_secret_ttl"`
	RatePerSecond   float64       `yaml:"rate_per_second"`
	RateBurst       int           `yaml:"rate_burst"`
	// DrainDelay is how long a stopping replica keeps serving after its
	// readiness turns 503, so load balancers stop sending to it first;
	// default 5s.
	DrainDelay time.Duration `yaml:"drain_delay"`
	Gossip     node.Gossip   `yaml:"gossip"` // the global pool; empty bind = no gossip

	// CatalogueData, when set, is used instead of the Catalogue file, and
	// GeoIPData (an .mmdb in memory) instead of GeoIPDB: the dev world's
	// built-in world and embedded database.
	CatalogueData *geo.Catalogue `yaml:"-"`
	GeoIPData     []byte         `yaml:"-"`
}

// ApplyEnv takes the secrets from the environment (config.Load calls it).
func (c *NodeConfig) ApplyEnv() error {
	c.Gossip.ApplyEnv()
	if env := os.Getenv(EnvAPIKeys); env != "" {
		c.APIKeys = nil
		for _, k := range strings.Split(env, ",") {
			if k = strings.TrimSpace(k); k != "" {
				c.APIKeys = append(c.APIKeys, k)
			}
		}
	}
	if env := os.Getenv(EnvSecretKey); env != "" {
		c.ClientSecretKey = env
	}
	return nil
}

// Defaults fills the unset fields that are the node's own.
func (c *NodeConfig) Defaults() {
	c.Common.Defaults()
	if c.DrainDelay == 0 {
		c.DrainDelay = DefaultDrainDelay
	}
}

// Validate checks c after Defaults.
func (c *NodeConfig) Validate() error {
	errs := []error{c.Common.Validate(),
		node.CheckHostPort("listen_addr", c.ListenAddr, false),
		node.NotNegative("rate_per_second", c.RatePerSecond),
		node.NotNegative("rate_burst", c.RateBurst),
		node.NotNegative("client_secret_ttl", c.ClientSecretTTL),
		node.NotNegative("drain_delay", c.DrainDelay),
	}
	if c.Gossip.Bind != "" {
		errs = append(errs, c.Gossip.Validate("gossip"))
	}
	if c.Catalogue == "" && c.CatalogueData == nil {
		errs = append(errs, errors.New("catalogue is required"))
	}
	if c.GeoIPDB != "" && c.GeoIPData != nil {
		errs = append(errs, errors.New("geoip_db and an in-memory database are both set"))
	}
	if _, err := c.trusted(); err != nil {
		errs = append(errs, err)
	}
	if c.ClientSecretKey != "" {
		if _, err := base64.StdEncoding.DecodeString(c.ClientSecretKey); err != nil {
			errs = append(errs, fmt.Errorf("client_secret_key: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("signaling config: %w", err)
	}
	return nil
}

func (c *NodeConfig) trusted() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.TrustedProxies {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("trusted_proxies: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}
