package signaling

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/config"
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

// Config is the signaling role's config file (docs/operations.md) and what
// a Server is built from: the fields tagged yaml:"-" are set by the node
// (or a test) that builds one, never by the file. The caller owns it; New
// and NewNode take copies.
type Config struct {
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
	// CORSOrigins lists origins allowed to call the API from a browser;
	// "*" allows any. Empty: same-origin only.
	CORSOrigins []string `yaml:"cors_origins"`
	DemoPage    bool     `yaml:"demo_page"` // serve the demo page at "/"

	// APIKeys are server-side credentials of the default tenant with the
	// default key quota (prefer $RTCEDGE_API_KEYS); Keys are API keys with
	// a tenant and a quota of their own (key: "${APP_KEY}"). Without any
	// key signaling refuses to start unless AllowAnonymous is set: it lets
	// requests without credentials place calls and mint client secrets
	// (dev only); presented credentials are still checked.
	APIKeys        []string `yaml:"api_keys"`
	Keys           []APIKey `yaml:"keys"`
	AllowAnonymous bool     `yaml:"allow_anonymous"`
	// AnyAPIKey (with AllowAnonymous; the dev world, never a config file)
	// takes any bearer token that is neither a configured key nor a client
	// secret as an anonymous caller's, instead of 401 invalid_api_key:
	// OpenAI's snippets always send one. The token still names the owner
	// of its calls' sideband, so one key cannot attach to another's calls.
	AnyAPIKey bool `yaml:"-"`
	// TLS (cert and key, PEM files) serves the public API over HTTPS, and
	// so the sideband over WSS, on listen_addr itself: for signaling
	// without a TLS-terminating proxy in front, and `rtcedge dev -tls`
	// (OpenAI's SDK opens the sideband on wss: only). Empty: plain HTTP.
	TLS sessionapi.TLS `yaml:"tls"`
	// ClientSecretKey (base64, at least 16 bytes; prefer
	// $RTCEDGE_CLIENT_SECRET_KEY) seals ephemeral client secrets and keys
	// the MAC of call IDs; every replica needs the same. Unset: a random
	// one, so client secrets only verify on this replica.
	ClientSecretKey string `yaml:"client_secret_key"`
	// ClientSecretTTL is the default lifetime of a client secret; default
	// 10 minutes, at most 2 hours.
	ClientSecretTTL time.Duration `yaml:"client_secret_ttl"`
	// ClientSessionFields are the session fields a caller may set, in the
	// session of a /calls offer placed with a client secret and in its
	// own session.update on the data channel; an API key's own list
	// (APIKey.ClientSessionFields) wins for its calls and the secrets it
	// mints. Empty: sessionapi.DefaultClientSessionFields.
	ClientSessionFields []string `yaml:"client_session_fields"`
	// SealedFieldsWin: a caller's session fields off that list are
	// dropped without an error instead of refused (the call keeps the
	// sealed values, the allowed fields apply), for SDKs that always send
	// an agent's whole configuration (OpenAI's Agents SDK). An API key's
	// own setting (APIKey.SealedFieldsWin) wins. Default false.
	SealedFieldsWin bool `yaml:"sealed_fields_win"`

	// RatePerSecond and RateBurst limit each client address (an IPv4
	// address or IPv6 /64, aggregated to wider prefixes when the table is
	// full) for requests without valid credentials: anonymous ones and
	// failed authentications; default 5/s, burst 20. KeyRatePerSecond and
	// KeyRateBurst are the default quota of an API key (APIKey overrides
	// them); default 50/s, burst 100. Secret* limit each client secret;
	// default 1/s, burst 10. MaxLimiters bounds the per-address and the
	// per-secret limiter tables each; default 200000.
	RatePerSecond       float64 `yaml:"rate_per_second"`
	RateBurst           int     `yaml:"rate_burst"`
	KeyRatePerSecond    float64 `yaml:"key_rate_per_second"`
	KeyRateBurst        int     `yaml:"key_rate_burst"`
	SecretRatePerSecond float64 `yaml:"secret_rate_per_second"`
	SecretRateBurst     int     `yaml:"secret_rate_burst"`
	MaxLimiters         int     `yaml:"max_limiters"`

	// SessionAPISecrets are the clusters' session API bearer secrets, by
	// cluster ID (e.g. 1: "${RTCEDGE_SESSION_API_SECRET_1}"); a cluster
	// without one is called without credentials (docs/operations.md).
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
	// Authority are signaling's keys of the global pool (prefer
	// $RTCEDGE_AUTHORITY_KEYS): its own secret ("signaling/ID:BASE64",
	// rtcedge keys signaling), which proves its metadata, and the public
	// keys (rtcedge keys public) of every cluster's relays and every POP:
	// with a key of a kind, a member of that role must prove its cluster
	// or POP with it, or it is ignored (docs/operations.md).
	Authority node.Authority `yaml:"authority"`
	// Steering tunes the choice of POPs by measured round trips and holds
	// the operator's pins (docs/steering.md).
	Steering SteeringConfig `yaml:"steering"`

	// CatalogueData is the catalogue the Server places calls with; NewNode
	// loads it from the Catalogue file when unset (the dev world sets its
	// built-in world). GeoIPData (an .mmdb in memory) is used instead of
	// GeoIPDB (the dev world's embedded database).
	CatalogueData *geo.Catalogue `yaml:"-"`
	GeoIPData     []byte         `yaml:"-"`
	// Locator locates clients; NewNode builds it from the GeoIP and proxy
	// settings.
	Locator *geo.Locator `yaml:"-"`
	// Health reports clusters' gossip state; nil: all healthy. POPUp
	// reports whether a POP has live global relays; nil: all up.
	// SessionAPIs lists the live session API endpoints of a cluster (its
	// cluster relays' fronts, from gossip); nil or empty: the catalogue's
	// session_api, so gossip lets signaling route around a dead replica
	// before any load balancer notices. GossipAuthoritative, when set, is
	// exported as a gauge (1 while gossip decides health, 0 while
	// signaling assumes all healthy). NewNode sets them from its pool.
	Health              geo.HealthFunc                `yaml:"-"`
	POPUp               func(pop uint16) bool         `yaml:"-"`
	SessionAPIs         func(cluster uint16) []string `yaml:"-"`
	GossipAuthoritative func() bool                   `yaml:"-"`
	// FanOut passes a steering samples message to the other signaling
	// replicas (probe samples taken here); nil: none. NewNode sets it
	// from its pool.
	FanOut func(msg []byte) `yaml:"-"`

	MaxBody        int64         `yaml:"-"` // request body cap; default 64 KiB
	ClusterTimeout time.Duration `yaml:"-"` // one cluster attempt; default 2s
	MaxAttempts    int           `yaml:"-"` // clusters tried per offer; default 3

	HTTPClient *http.Client          `yaml:"-"` // for session APIs; default one with no proxy
	Logger     *slog.Logger          `yaml:"-"` // default slog.Default()
	Registerer prometheus.Registerer `yaml:"-"` // nil: metrics are not registered
	Now        func() time.Time      `yaml:"-"` // default time.Now
}

// ApplyEnv takes the secrets from the environment (config.Load calls it).
func (c *Config) ApplyEnv() error {
	c.Gossip.ApplyEnv()
	c.Authority.ApplyEnv()
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

// Defaults fills c's unset fields.
func (c *Config) Defaults() {
	c.Common.Defaults()
	config.Default(&c.DrainDelay, DefaultDrainDelay)
	config.Default(&c.ClientSecretTTL, 10*time.Minute)
	config.Default(&c.MaxBody, 64<<10)
	config.Default(&c.ClusterTimeout, 2*time.Second)
	config.Default(&c.MaxAttempts, 3)
	config.Default(&c.RatePerSecond, 5)
	config.Default(&c.RateBurst, 20)
	config.Default(&c.KeyRatePerSecond, 50)
	config.Default(&c.KeyRateBurst, 100)
	config.Default(&c.SecretRatePerSecond, 1)
	config.Default(&c.SecretRateBurst, 10)
	config.Default(&c.MaxLimiters, 200_000)
	if c.ClientSessionFields == nil {
		c.ClientSessionFields = sessionapi.DefaultClientSessionFields
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 32, IdleConnTimeout: 90 * time.Second}}
	}
	config.Default(&c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate checks c after Defaults.
func (c *Config) Validate() error {
	errs := append(c.validateServer(), c.Common.Validate(),
		node.CheckHostPort("listen_addr", c.ListenAddr, false),
		node.NotNegative("max_cluster_capacity", c.MaxClusterCapacity),
		node.NotNegative("drain_delay", c.DrainDelay),
		c.SessionAPITLS.Validate("session_api_tls"), c.TLS.Validate("tls"))
	if c.TLS.CA != "" {
		errs = append(errs, errors.New("tls: the public listener takes cert and key; ca is for session_api_tls"))
	}
	if c.Gossip.Bind != "" {
		errs = append(errs, c.Gossip.Validate("gossip"))
	}
	if _, err := c.Authority.Secrets(); err != nil {
		errs = append(errs, err)
	}
	if c.Catalogue == "" && c.CatalogueData == nil {
		errs = append(errs, errors.New("catalogue is required"))
	}
	if c.GeoIPDB != "" && c.GeoIPData != nil {
		errs = append(errs, errors.New("geoip_db and an in-memory database are both set"))
	}
	if _, _, err := c.proxies(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("signaling config: %w", err)
	}
	return nil
}

// validateServer checks what a Server is built from (New checks it too,
// for a Config not loaded from a file).
func (c *Config) validateServer() []error {
	errs := []error{
		node.NotNegative("rate_per_second", c.RatePerSecond),
		node.NotNegative("rate_burst", c.RateBurst),
		node.NotNegative("key_rate_per_second", c.KeyRatePerSecond),
		node.NotNegative("key_rate_burst", c.KeyRateBurst),
		node.NotNegative("secret_rate_per_second", c.SecretRatePerSecond),
		node.NotNegative("secret_rate_burst", c.SecretRateBurst),
		node.NotNegative("max_limiters", c.MaxLimiters),
		node.NotNegative("client_secret_ttl", c.ClientSecretTTL),
		node.NotNegative("max body", c.MaxBody),
		node.NotNegative("cluster timeout", c.ClusterTimeout),
		node.NotNegative("max attempts", c.MaxAttempts),
	}
	steering := c.Steering.Config
	steering.Defaults()
	errs = append(errs, steering.Validate())
	if c.ClientSecretTTL > 2*time.Hour {
		errs = append(errs, fmt.Errorf("client_secret_ttl %v: at most 2h", c.ClientSecretTTL))
	}
	if c.ClientSecretKey != "" {
		if key, err := base64.StdEncoding.DecodeString(c.ClientSecretKey); err != nil {
			errs = append(errs, fmt.Errorf("client_secret_key: %w", err))
		} else if len(key) < 16 {
			errs = append(errs, errors.New("client_secret_key: must be at least 16 bytes"))
		}
	}
	keys := c.apiKeys()
	if c.AnyAPIKey && !c.AllowAnonymous {
		errs = append(errs, errors.New("accepting any API key needs allow_anonymous"))
	}
	if len(keys) == 0 && !c.AllowAnonymous {
		errs = append(errs, fmt.Errorf("no API keys (api_keys, keys or $%s): set some, or allow_anonymous: true for a dev world", EnvAPIKeys))
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if len(k.Key) < 16 || strings.HasPrefix(k.Key, secretPrefix) {
			errs = append(errs, errors.New("API keys must be at least 16 characters and not start with ek_"))
		} else if seen[k.Key] {
			errs = append(errs, errors.New("an API key is listed twice"))
		}
		seen[k.Key] = true
		if k.RatePerSecond < 0 || k.RateBurst < 0 {
			errs = append(errs, fmt.Errorf("API key of tenant %q: negative quota", k.Tenant))
		}
		errs = append(errs, validTenant(k.Tenant))
	}
	return errs
}

// secretKey is ClientSecretKey decoded (validateServer has checked it),
// or a random key when it is unset.
func (c *Config) secretKey() []byte {
	if c.ClientSecretKey != "" {
		key, _ := base64.StdEncoding.DecodeString(c.ClientSecretKey)
		return key
	}
	c.Logger.Warn("no client secret key configured: secrets minted here verify only on this replica")
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails
	return key
}

// proxies returns the Cloudflare ranges and the internal proxies. Entries
// of the former trusted_proxies list are sorted into the two: those inside
// Cloudflare's published ranges are Cloudflare's, any other (an ingress the
// old docs told operators to list) an internal proxy, so an old config no
// longer lets whoever reaches the ingress choose their CF-* headers.
func (c *Config) proxies() (cloudflare, internal []netip.Prefix, err error) {
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
