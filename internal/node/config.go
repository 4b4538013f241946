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
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
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
	// Key is the pool's base64 encryption key (the primary: it
	// encrypts). Give every pool its own, e.g. key: ${RTCEDGE_GLOBAL_GOSSIP_KEY}
	// and key: ${RTCEDGE_CLUSTER_GOSSIP_KEY}, so that a transceiver never
	// holds the global pool's key; $RTCEDGE_GOSSIP_KEY is used only for a
	// pool whose key is unset.
	Key string `yaml:"key"`
	// Keys are further base64 keys accepted during a rotation
	// (docs/operations.md: install, use, remove).
	Keys     []string `yaml:"keys"`
	Insecure bool     `yaml:"insecure"` // allow no key (dev only)
	Fast     bool     `yaml:"fast"`     // loopback-tight timings (tests, dev)
	// CheckMeta vets members' metadata (membership.Config.CheckMeta); set
	// by the role from its catalogue, not from the file.
	CheckMeta func(membership.Meta) error `yaml:"-"`
}

// ApplyEnv takes the key from $RTCEDGE_GOSSIP_KEY when the pool's own key
// is unset.
func (g *Gossip) ApplyEnv() {
	if env := os.Getenv(EnvGossipKey); env != "" && g.Key == "" {
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
		return fmt.Errorf("%s: no gossip key: set %s.key (or $%s; insecure: true, dev only)", what, what, EnvGossipKey)
	}
	for i, k := range g.Keys {
		if _, err := base64.StdEncoding.DecodeString(k); err != nil {
			return fmt.Errorf("%s.keys[%d]: %w", what, i, err)
		}
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
	var keys [][]byte
	for _, k := range g.Keys {
		b, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			return nil, fmt.Errorf("gossip keys: %w", err)
		}
		keys = append(keys, b)
	}
	return membership.New(membership.Config{
		Name: name + suffix, Bind: bind, Advertise: adv, WAN: wan, SecretKey: key, Keys: keys,
		AllowInsecure: g.Insecure, Fast: g.Fast, CheckMeta: g.CheckMeta, Logger: log,
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
func DataSocket(conn *net.UDPConn, bind, advertise string, log *slog.Logger) (*net.UDPConn, netip.AddrPort, error) {
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
	WarnSmallBuffer(log, conn)
	return conn, data, nil
}

// bufferCapped reports the receive buffer the kernel granted c and
// whether it is below udpio.SocketBuffer.
func bufferCapped(c *net.UDPConn) (int, bool) {
	if runtime.GOOS != "linux" {
		return 0, false // only Linux reports the buffer it granted so
	}
	got := udpio.ReceiveBuffer(c) / 2
	return got, got > 0 && got < udpio.SocketBuffer
}

// WarnSmallBuffer logs a warning when the kernel gave c less receive
// buffer than udpio.SocketBuffer: net.core.rmem_max is below it on this
// node, and a reader's short stall (GC, scheduling) then loses datagrams
// instead of queueing them (docs/deploy.md). It reports whether it warned.
// Sockets on loopback (the dev world, tests) are not reported.
func WarnSmallBuffer(log *slog.Logger, c *net.UDPConn) bool {
	got, capped := bufferCapped(c)
	if !capped || udpio.LocalAddrPort(c).Addr().IsLoopback() {
		return false
	}
	log.Warn("UDP receive buffer capped by net.core.rmem_max: set it (and wmem_max) to at least 4 MiB on this node, or bursts are dropped",
		"granted_bytes", got, "wanted_bytes", udpio.SocketBuffer, "socket", udpio.LocalAddrPort(c))
	return true
}

// Advertised is advertise when set, else bound; a wildcard is refused. The
// result is unmapped (::ffff:a.b.c.d becomes a.b.c.d): packet sources are
// always unmapped, so a mapped advertised address would match none of them
// and every reply would be dropped.
func Advertised(what string, bound netip.AddrPort, advertise string) (netip.AddrPort, error) {
	ap := bound
	if advertise != "" {
		var err error
		if ap, err = netip.ParseAddrPort(advertise); err != nil {
			return netip.AddrPort{}, fmt.Errorf("%s_advertise %q: %w", what, advertise, err)
		}
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
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

// EnvHopKeys holds the inter-tier MAC keys (docs/wire.md §2) as
// "CLUSTER/ID:BASE64[,...]": a global relay needs every cluster it serves,
// a transceiver or cluster relay uses its own cluster's (and should be
// given only those). Per cluster the first key listed signs; all are
// accepted.
const EnvHopKeys = "RTCEDGE_HOP_KEYS"

// HopKeys configures the inter-tier datagram MAC keys.
type HopKeys struct {
	// Keys are "CLUSTER/ID:BASE64" specs; prefer $RTCEDGE_HOP_KEYS.
	Keys []string `yaml:"keys"`
	// File, when set, holds the specs instead (separated by commas or
	// newlines, e.g. a mounted Kubernetes Secret). The node reads it again
	// every HopKeysReload and applies a changed, valid set without a
	// restart: this is how keys rotate (docs/operations.md).
	File string `yaml:"file"`

	// loaded is the file's content the last ClusterKeys built its keys
	// from: WatchHopKeys compares against it, so a change made between
	// that read and the watcher's start is not taken for the baseline.
	loaded []byte
}

// HopKeysReload is how often a node re-reads HopKeys.File.
const HopKeysReload = 10 * time.Second

// ApplyEnv takes the keys from $RTCEDGE_HOP_KEYS when set.
func (k *HopKeys) ApplyEnv() {
	if env := os.Getenv(EnvHopKeys); env != "" {
		k.Keys = strings.Split(env, ",")
	}
}

// ClusterKeys builds the keyrings of every cluster listed (global relay);
// it is also HopKeys' validation.
func (k *HopKeys) ClusterKeys() (*encap.ClusterKeys, error) {
	specs := k.Keys
	if k.File != "" {
		b, err := os.ReadFile(k.File)
		if err != nil {
			return nil, fmt.Errorf("hop_keys.file: %w", err)
		}
		k.loaded = b
		specs = strings.FieldsFunc(string(b), func(r rune) bool { return r == ',' || r == '\n' || r == '\r' })
	}
	var clean []string
	for _, s := range specs {
		if s = strings.TrimSpace(s); s != "" {
			clean = append(clean, s)
		}
	}
	if len(clean) == 0 {
		return nil, fmt.Errorf("no inter-tier hop keys: set hop_keys.keys, hop_keys.file or $%s", EnvHopKeys)
	}
	return encap.ParseClusterKeys(clean)
}

// WatchHopKeys re-reads k.File every period (nodes use HopKeysReload)
// until ctx ends and
// hands every changed, valid key set to apply; an unreadable or invalid
// file is logged and the keys in use stay. Without a file it returns at
// once.
func WatchHopKeys(ctx context.Context, k HopKeys, period time.Duration, log *slog.Logger, apply func(*encap.ClusterKeys)) error {
	if k.File == "" {
		return nil
	}
	last := k.loaded
	if last == nil {
		last, _ = os.ReadFile(k.File)
	}
	for Sleep(ctx, period) {
		b, err := os.ReadFile(k.File)
		if err != nil || string(b) == string(last) {
			if err != nil {
				log.Error("hop keys file unreadable; keeping the keys in use", "err", err)
			}
			continue
		}
		keys, err := k.ClusterKeys()
		if err != nil {
			log.Error("hop keys file invalid; keeping the keys in use", "err", err)
			continue
		}
		last = b
		apply(keys)
		log.Info("hop keys reloaded", "file", k.File)
	}
	return nil
}

// Keyring builds one cluster's keyring (transceiver, cluster relay).
func (k *HopKeys) Keyring(cluster uint16) (*encap.Keyring, error) {
	all, err := k.ClusterKeys()
	if err != nil {
		return nil, err
	}
	if r := all.For(cluster); r != nil {
		return r, nil
	}
	return nil, fmt.Errorf("no inter-tier hop key for cluster %d in hop_keys.keys or $%s", cluster, EnvHopKeys)
}
