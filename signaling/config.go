package signaling

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
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
	node.Common `yaml:",inline"`
	ListenAddr  string `yaml:"listen_addr"` // e.g. 0.0.0.0:8080
	Catalogue   string `yaml:"catalogue"`   // region catalogue YAML (geo package)
	GeoIPDB     string `yaml:"geoip_db"`    // GeoIP2/GeoLite2 City .mmdb; reloaded on change
	// CloudflareRanges are Cloudflare's edge addresses, whose CF-* headers
	// are believed (the entry "cloudflare" is Cloudflare's published list);
	// InternalProxies the operator's ingress in front of signaling, walked
	// over in X-Forwarded-For (docs/operations.md, "Proxy trust").
	// TrustedProxies is the former single list: its entries inside
	// Cloudflare's published ranges count as Cloudflare's, the others as
	// internal proxies.
	CloudflareRanges []string `yaml:"cloudflare_ranges"`
	InternalProxies  []string `yaml:"internal_proxies"`
	TrustedProxies   []string `yaml:"trusted_proxies"`
	CORSOrigins      []string `yaml:"cors_origins"`
	DemoPage         bool     `yaml:"demo_page"`
	// APIKeys: prefer $RTCEDGE_API_KEYS. ClientSecretKey (base64): prefer
	// $RTCEDGE_CLIENT_SECRET_KEY; when absent a random one is made (then
	// client secrets only verify on this replica).
	APIKeys         []string      `yaml:"api_keys"`
	ClientSecretKey string        `yaml:"client_secret_key"`
	ClientSecretTTL time.Duration `yaml:"client_secret_ttl"`
	// Keys are API keys with a tenant and a quota of their own (key:
	// "${APP_KEY}"); AllowAnonymous serves requests without credentials
	// and is required when there are no keys at all (dev only).
	Keys           []APIKey `yaml:"keys"`
	AllowAnonymous bool     `yaml:"allow_anonymous"`
	// ClientSessionFields are the session fields a browser holding a
	// client secret may add; empty: DefaultClientSessionFields.
	ClientSessionFields []string `yaml:"client_session_fields"`
	// RatePerSecond and RateBurst limit each client address, for requests
	// without valid credentials; Key* are the default per-key quota,
	// Secret* each client secret's (see Config).
	RatePerSecond       float64 `yaml:"rate_per_second"`
	RateBurst           int     `yaml:"rate_burst"`
	KeyRatePerSecond    float64 `yaml:"key_rate_per_second"`
	KeyRateBurst        int     `yaml:"key_rate_burst"`
	SecretRatePerSecond float64 `yaml:"secret_rate_per_second"`
	SecretRateBurst     int     `yaml:"secret_rate_burst"`
	MaxLimiters         int     `yaml:"max_limiters"`
	// SessionAPISecrets are the clusters' session API bearer secrets, by
	// cluster ID (e.g. 1: "${RTCEDGE_SESSION_API_SECRET_1}").
	SessionAPISecrets map[uint16]string `yaml:"session_api_secrets"`
	// SessionAPITLS.CA is the CA bundle signaling verifies https
	// session_api URLs with (the clusters' CA); empty: system roots.
	SessionAPITLS sessionapi.TLS `yaml:"session_api_tls"`
	// MaxClusterCapacity bounds what a cluster relay may advertise in
	// gossip; default 100000.
	MaxClusterCapacity int `yaml:"max_cluster_capacity"`
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
		node.NotNegative("key_rate_per_second", c.KeyRatePerSecond),
		node.NotNegative("key_rate_burst", c.KeyRateBurst),
		node.NotNegative("secret_rate_per_second", c.SecretRatePerSecond),
		node.NotNegative("secret_rate_burst", c.SecretRateBurst),
		node.NotNegative("max_limiters", c.MaxLimiters),
		node.NotNegative("max_cluster_capacity", c.MaxClusterCapacity),
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
	errs = append(errs, c.SessionAPITLS.Validate("session_api_tls"))
	if _, _, err := c.proxies(); err != nil {
		errs = append(errs, err)
	}
	if len(c.APIKeys) == 0 && len(c.Keys) == 0 && !c.AllowAnonymous {
		errs = append(errs, fmt.Errorf("no API keys (api_keys, keys or $%s): set some, or allow_anonymous: true for a dev world", EnvAPIKeys))
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

// proxies returns the Cloudflare ranges and the internal proxies. Entries
// of the former trusted_proxies list are sorted into the two: those inside
// Cloudflare's published ranges are Cloudflare's, any other (an ingress the
// old docs told operators to list) an internal proxy, so an old config no
// longer lets whoever reaches the ingress choose their CF-* headers.
func (c *NodeConfig) proxies() (cloudflare, internal []netip.Prefix, err error) {
	if cloudflare, err = geo.ParsePrefixes(c.CloudflareRanges); err != nil {
		return nil, nil, fmt.Errorf("cloudflare_ranges: %w", err)
	}
	if internal, err = geo.ParsePrefixes(c.InternalProxies); err != nil {
		return nil, nil, fmt.Errorf("internal_proxies: %w", err)
	}
	legacy, err := geo.ParsePrefixes(c.TrustedProxies)
	if err != nil {
		return nil, nil, fmt.Errorf("trusted_proxies: %w", err)
	}
	published := geo.CloudflareRanges()
	for _, p := range legacy {
		if slices.ContainsFunc(published, func(cf netip.Prefix) bool { return cf.Bits() <= p.Bits() && cf.Contains(p.Addr()) }) {
			cloudflare = append(cloudflare, p)
		} else {
			internal = append(internal, p)
		}
	}
	return cloudflare, internal, nil
}
