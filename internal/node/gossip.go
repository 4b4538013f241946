package node

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// EnvGossipKey is the base64 gossip key (16/24/32 bytes) of a pool whose
// own key is unset.
const EnvGossipKey = "RTCEDGE_GOSSIP_KEY"

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
	// Prove and CheckMember prove this node's metadata and check other
	// members' (membership.Config); set by the role from its keys
	// (internal/authority), not from the file.
	Prove       func([]byte) []byte                   `yaml:"-"`
	CheckMember func(membership.Member, []byte) error `yaml:"-"`
	// Group gathers the pool with the others of a dev world, which waits
	// for all their goroutines when it closes (membership.Config.Group).
	Group *membership.Group `yaml:"-"`
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
	_, err := g.config(what)
	return err
}

// config parses g into the pool's config (without name, WAN, logger);
// errors name the settings under what.
func (g *Gossip) config(what string) (c membership.Config, err error) {
	if c.Bind, err = netip.ParseAddrPort(g.Bind); err != nil {
		return c, fmt.Errorf("%s.bind %q: want IP:port", what, g.Bind)
	}
	if g.Advertise != "" {
		if c.Advertise, err = netip.ParseAddrPort(g.Advertise); err != nil {
			return c, fmt.Errorf("%s.advertise %q: want IP:port", what, g.Advertise)
		}
	}
	if g.Key != "" {
		if c.SecretKey, err = base64.StdEncoding.DecodeString(g.Key); err != nil {
			return c, fmt.Errorf("%s.key: %w", what, err)
		}
	} else if !g.Insecure {
		return c, fmt.Errorf("%s: no gossip key: set %s.key (or $%s; insecure: true, dev only)", what, what, EnvGossipKey)
	}
	for i, k := range g.Keys {
		b, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			return c, fmt.Errorf("%s.keys[%d]: %w", what, i, err)
		}
		c.Keys = append(c.Keys, b)
	}
	c.AllowInsecure, c.Fast, c.CheckMeta = g.Insecure, g.Fast, g.CheckMeta
	c.Prove, c.CheckMember, c.Group = g.Prove, g.CheckMember, g.Group
	return c, nil
}

// Open creates the pool (it binds its sockets; JoinLoop joins it). The
// node name is Name, or the hostname, plus suffix.
func (g *Gossip) Open(suffix string, wan bool, meta membership.Meta, log *slog.Logger) (*membership.Pool, error) {
	c, err := g.config("gossip")
	if err != nil {
		return nil, err
	}
	name := g.Name
	if name == "" {
		if name, err = os.Hostname(); err != nil {
			return nil, err
		}
	}
	c.Name, c.WAN, c.Logger = name+suffix, wan, log
	return membership.New(c, meta)
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
		if err == nil || errors.Is(err, membership.ErrClosed) { // closed: by a stop racing the join
			return nil
		}
		log.Warn("gossip join failed; retrying", "pool", pool.Name(), "err", err, "in", delay)
		if !Sleep(ctx, delay) {
			return nil
		}
	}
}

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

// JoinPool opens g's pool (Open) for l: it closes with l, its metrics are
// registered in env under the label pool, and it joins g's seeds
// (JoinLoop) while l runs.
func (l *Life) JoinPool(g Gossip, pool, suffix string, wan bool, meta membership.Meta, env Env) (*membership.Pool, error) {
	p, err := g.Open(suffix, wan, meta, env.Logger)
	if err != nil {
		return nil, err
	}
	l.OnClose(p.Close)
	if err := env.Register(p.Collector(pool)); err != nil {
		return nil, err
	}
	l.Go(pool+" gossip join", func(ctx context.Context) error { return g.JoinLoop(ctx, p, env.Logger) })
	return p, nil
}
