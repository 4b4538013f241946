package node

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// Environment variables that carry secrets, so config files need none.
const (
	EnvTokenKeys    = "RTCEDGE_TOKEN_KEYS"    // "ID:BASE64[,ID:BASE64...]"
	EnvTokenCurrent = "RTCEDGE_TOKEN_CURRENT" // key ID that mints
	EnvGossipKey    = "RTCEDGE_GOSSIP_KEY"    // base64, 16/24/32 bytes
)

// DefaultDrainTimeout bounds a graceful stop when drain_timeout is unset.
const DefaultDrainTimeout = 5 * time.Minute

// Common holds the settings every role's config file has.
type Common struct {
	LogLevel    string `yaml:"log_level"`    // debug, info, warn, error; default info
	MetricsAddr string `yaml:"metrics_addr"` // /metrics, /livez, /readyz; "" = none
	// DrainTimeout bounds a graceful stop after the first SIGTERM;
	// default 5m.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
}

// Defaults fills c's unset fields.
func (c *Common) Defaults() {
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
}

// Validate checks c after Defaults.
func (c *Common) Validate() error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(c.LogLevel))); err != nil {
		return fmt.Errorf("log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.DrainTimeout < 0 {
		return fmt.Errorf("drain_timeout %v must not be negative", c.DrainTimeout)
	}
	return CheckHostPort("metrics_addr", c.MetricsAddr, true)
}

// Level is c's log level (Validate has checked it).
func (c *Common) Level() slog.Level {
	var l slog.Level
	_ = l.UnmarshalText([]byte(strings.ToUpper(c.LogLevel)))
	return l
}

// CheckHostPort checks that s is host:port with a numeric port (host may be
// a name, an IP or empty for all addresses); "" is allowed when optional.
func CheckHostPort(what, s string, optional bool) error {
	if s == "" {
		if optional {
			return nil
		}
		return fmt.Errorf("%s is required", what)
	}
	_, port, err := net.SplitHostPort(s)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return fmt.Errorf("%s %q: want host:port", what, s)
	}
	return nil
}

// NotNegative returns an error naming what when v is negative (zero
// means the default).
func NotNegative[T int | int64 | float64 | time.Duration](what string, v T) error {
	if v < 0 {
		return fmt.Errorf("%s %v must not be negative", what, v)
	}
	return nil
}

// Gossip configures one memberlist pool.
type Gossip struct {
	Name      string   `yaml:"name"`      // default: hostname (+ a suffix per pool)
	Bind      string   `yaml:"bind"`      // e.g. 0.0.0.0:7946
	Advertise string   `yaml:"advertise"` // address others reach us at; default: bind
	Join      []string `yaml:"join"`      // seeds, e.g. a headless Service name
	// Key is the base64 gossip encryption key; prefer $RTCEDGE_GOSSIP_KEY.
	Key      string `yaml:"key"`
	Insecure bool   `yaml:"insecure"` // allow no key (dev only)
	Fast     bool   `yaml:"fast"`     // loopback-tight timings (tests, dev)
}

// ApplyEnv takes the key from $RTCEDGE_GOSSIP_KEY when set.
func (g *Gossip) ApplyEnv() {
	if env := os.Getenv(EnvGossipKey); env != "" {
		g.Key = env
	}
}

// Validate checks the addresses and the key.
func (g *Gossip) Validate(what string) error {
	if _, err := netip.ParseAddrPort(g.Bind); err != nil {
		return fmt.Errorf("%s.bind %q: want IP:port", what, g.Bind)
	}
	if g.Advertise != "" {
		if _, err := netip.ParseAddrPort(g.Advertise); err != nil {
			return fmt.Errorf("%s.advertise %q: want IP:port", what, g.Advertise)
		}
	}
	if g.Key != "" {
		if _, err := base64.StdEncoding.DecodeString(g.Key); err != nil {
			return fmt.Errorf("%s.key: %w", what, err)
		}
	} else if !g.Insecure {
		return fmt.Errorf("%s: no gossip key: set $%s (or insecure: true, dev only)", what, EnvGossipKey)
	}
	return nil
}

// Open creates the pool (it binds its sockets; JoinLoop joins it). The
// node name is Name, or the hostname, plus suffix.
func (g *Gossip) Open(suffix string, wan bool, meta membership.Meta, log *slog.Logger) (*membership.Pool, error) {
	name := g.Name
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, err
		}
		name = h
	}
	bind, err := netip.ParseAddrPort(g.Bind)
	if err != nil {
		return nil, fmt.Errorf("gossip bind %q: %w", g.Bind, err)
	}
	var adv netip.AddrPort
	if g.Advertise != "" {
		if adv, err = netip.ParseAddrPort(g.Advertise); err != nil {
			return nil, fmt.Errorf("gossip advertise %q: %w", g.Advertise, err)
		}
	}
	var key []byte
	if g.Key != "" {
		if key, err = base64.StdEncoding.DecodeString(g.Key); err != nil {
			return nil, fmt.Errorf("gossip key: %w", err)
		}
	}
	return membership.New(membership.Config{
		Name: name + suffix, Bind: bind, Advertise: adv, WAN: wan, SecretKey: key,
		AllowInsecure: g.Insecure, Fast: g.Fast, Logger: log,
	}, meta)
}

// JoinLoop joins pool to g's seeds, retrying with back-off while no seed
// answers (pods start in any order), until it succeeds or ctx ends. No
// seeds: nothing to do.
func (g *Gossip) JoinLoop(ctx context.Context, pool *membership.Pool, log *slog.Logger) error {
	if len(g.Join) == 0 {
		return nil
	}
	for delay := 200 * time.Millisecond; ; delay = min(delay*2, 10*time.Second) {
		_, err := pool.Join(g.Join)
		if err == nil {
			return nil
		}
		if errors.Is(err, membership.ErrClosed) {
			return nil // closed by a stop racing the join
		}
		log.Warn("gossip join failed; retrying", "pool", pool.Name(), "err", err, "in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// TokenKeys configures the routing-token keyring.
type TokenKeys struct {
	// Keys are "ID:BASE64" specs; prefer $RTCEDGE_TOKEN_KEYS.
	Keys    []string `yaml:"keys"`
	Current *uint8   `yaml:"current"` // minting key ID; default the highest
}

// ApplyEnv takes the keys from $RTCEDGE_TOKEN_KEYS and the current key
// from $RTCEDGE_TOKEN_CURRENT when set.
func (k *TokenKeys) ApplyEnv() error {
	if env := os.Getenv(EnvTokenKeys); env != "" {
		k.Keys = strings.Split(env, ",")
	}
	if env := os.Getenv(EnvTokenCurrent); env != "" {
		v, err := strconv.ParseUint(env, 10, 4)
		if err != nil {
			return fmt.Errorf("$%s: %w", EnvTokenCurrent, err)
		}
		c := uint8(v)
		k.Current = &c
	}
	return nil
}

// Keyring builds the keyring; it is also TokenKeys' validation.
func (k *TokenKeys) Keyring() (*token.Keyring, error) {
	if len(k.Keys) == 0 {
		return nil, fmt.Errorf("no routing-token keys: set token.keys or $%s", EnvTokenKeys)
	}
	keys := map[uint8][]byte{}
	var highest uint8
	for _, s := range k.Keys {
		id, key, err := token.ParseKeySpec(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		keys[id] = key
		highest = max(highest, id)
	}
	cur := highest
	if k.Current != nil {
		cur = *k.Current
	}
	return token.NewKeyring(cur, keys)
}

// DataSocket returns a role's data-plane UDP socket — conn when given,
// else one opened on bind — and the address others should send to:
// advertise when set, else the bound address. A wildcard result is
// refused: gossiped to others, "0.0.0.0" would send their datagrams to
// themselves. On error conn (given or opened) is closed.
func DataSocket(conn *net.UDPConn, bind, advertise string) (*net.UDPConn, netip.AddrPort, error) {
	if conn == nil {
		b, err := netip.ParseAddrPort(bind)
		if err != nil {
			return nil, netip.AddrPort{}, fmt.Errorf("data_addr %q: %w", bind, err)
		}
		if conn, err = udpio.Listen(b); err != nil {
			return nil, netip.AddrPort{}, err
		}
	}
	data, err := Advertised("data", udpio.LocalAddrPort(conn), advertise)
	if err != nil {
		conn.Close()
		return nil, netip.AddrPort{}, err
	}
	return conn, data, nil
}

// Advertised is advertise when set, else bound; a wildcard is refused.
func Advertised(what string, bound netip.AddrPort, advertise string) (netip.AddrPort, error) {
	ap := bound
	if advertise != "" {
		var err error
		if ap, err = netip.ParseAddrPort(advertise); err != nil {
			return netip.AddrPort{}, fmt.Errorf("%s_advertise %q: %w", what, advertise, err)
		}
	}
	if ap.Addr().IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("%s address %v is not one others can reach: set %s_advertise (e.g. \"${POD_IP}:%d\")", what, ap, what, ap.Port())
	}
	return ap, nil
}

// AdvertisedURL is "http://" + advertise (host:port, a name allowed), or
// ln's address when advertise is empty; a wildcard address is refused.
func AdvertisedURL(ln net.Listener, advertise string) (string, error) {
	if advertise != "" {
		if _, err := netip.ParseAddrPort(advertise); err != nil {
			if err := CheckHostPort("api_advertise", advertise, false); err != nil {
				return "", err
			}
			return "http://" + advertise, nil
		}
	}
	ap, err := netip.ParseAddrPort(ln.Addr().String())
	if err != nil {
		return "", err
	}
	if ap, err = Advertised("api", ap, advertise); err != nil {
		return "", err
	}
	return "http://" + ap.String(), nil
}

// Settings returns c; a role's config embeds Common, so the command that
// loads any of them can reach the common settings.
func (c *Common) Settings() *Common { return c }

// Leave leaves pool gracefully (others see the node as left, not dead),
// logging a failure: a stop goes on either way.
func Leave(pool *membership.Pool, log *slog.Logger) {
	if err := pool.Leave(time.Second); err != nil {
		log.Warn("gossip leave failed; peers will detect the node as dead", "pool", pool.Name(), "err", err)
	}
}

// SetDraining announces draining in pool, logging a failure.
func SetDraining(pool *membership.Pool, log *slog.Logger) {
	if err := pool.UpdateMeta(func(m *membership.Meta) { m.Draining = true }); err != nil {
		log.Warn("gossip draining announcement failed", "pool", pool.Name(), "err", err)
	}
}
