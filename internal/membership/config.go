package membership

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/hashicorp/memberlist"
)

// Fast timings, applied on top of the LAN or WAN base when Config.Fast is
// set. They suit loopback dev worlds and tests only: on a real network they
// would flap members on ordinary jitter. The failure detector's two
// (FastProbeInterval, FastProbeTimeout, and so the suspicion timeout) and
// FastTCPTimeout (joins and push-pulls) are applied fastScale times longer.
const (
	FastProbeInterval    = 200 * time.Millisecond
	FastProbeTimeout     = 100 * time.Millisecond
	FastGossipInterval   = 50 * time.Millisecond
	FastSuspicionMult    = 2
	FastPushPullInterval = 2 * time.Second
	FastTCPTimeout       = 1 * time.Second
	FastIndirectChecks   = 1
	// FastGossipToTheDead is how long dead members are still gossiped to
	// (and kept in Members) under Fast timings.
	FastGossipToTheDead = 5 * time.Second
)

// FastDetectionBound is the expected worst case, under Fast timings on
// loopback with a handful of members, between a member stopping hard
// (no Leave) and the others reporting it StateDead. It is the sum of:
// waiting for this member's turn in the probe round-robin (up to
// (n-1)·FastProbeInterval, 400 ms for three members), one failed probe
// (FastProbeInterval), the suspicion timeout (FastSuspicionMult ·
// FastProbeInterval = 400 ms; with SuspicionMult 2 no confirmations are
// awaited, so the minimum applies), and gossiping the dead message (a few
// FastGossipInterval), plus margin for a loaded test machine.
const FastDetectionBound = 2 * time.Second * fastScale

// fastScale stretches the Fast failure detector's probe interval and
// timeout and the TCP timeout. A loaded test machine answers a probe
// late: at 100 ms of probe timeout and 400 ms of suspicion, members that
// were alive were declared dead — first in -race test processes (a world's
// signaling then saw a POP down, flipped its first POP or answered 503;
// joins over TCP timed out at 1 s and a world's start-up stalled), then in
// the simulation's separate processes, built without -race, with two busy
// loops beside the suite (2026-12-08: hundreds of members declared dead a
// minute, every call 503). Three times longer, a starved member still
// refutes its suspicion and joins; a stopped one is still declared dead,
// within FastDetectionBound.
const fastScale = 3

// Config configures a Pool. Name and Bind are required; everything else has
// a usable zero value for tests with AllowInsecure.
type Config struct {
	Name          string         // unique node name within the pool
	Bind          netip.AddrPort // gossip bind address (UDP and TCP); port 0 picks a free port, see LocalAddr
	Advertise     netip.AddrPort // optional address others should use, e.g. behind NAT
	WAN           bool           // base timings: memberlist.DefaultWANConfig instead of DefaultLANConfig
	SecretKey     []byte         // AES key, 16/24/32 bytes: the primary key, which encrypts; every member of a pool must hold it
	AllowInsecure bool           // permit a nil SecretKey (dev and tests only)
	// Keys are further keys this member accepts (decrypts with) besides
	// SecretKey, for rotation without a partition (see README: install,
	// use, remove). Each is 16, 24 or 32 bytes.
	Keys [][]byte
	// CheckMeta, when set, vets every member's decoded meta (against the
	// region catalogue: known clusters and POPs, allowed addresses,
	// bounded capacity). A member it refuses is left out of Members and
	// counted like undecodable meta, so nothing routes to it.
	CheckMeta func(Meta) error
	// Prove, when set, makes the proof this node's metadata carries
	// (Meta.Proof) from ProofInput of its name and encoded metadata; it
	// runs on every metadata change.
	Prove func(input []byte) []byte
	// CheckMember, when set, vets every other member after CheckMeta: its
	// proof against input (ProofInput of the gossiped bytes) and its
	// metadata's addresses against its gossip address (m.Addr). A member
	// it refuses is left out like one CheckMeta refuses.
	CheckMember func(m Member, input []byte) error
	Fast        bool         // loopback timings, see the Fast* constants
	Logger      *slog.Logger // nil means slog.Default()
	// Group, when set, gathers this pool with others that stop as a whole
	// (Group.Wait).
	Group *Group
}

// validate checks cfg before anything is opened, so New fails without side
// effects.
func (cfg *Config) validate() error {
	if cfg.Name == "" {
		return fmt.Errorf("name is empty: %w", ErrInvalidConfig)
	}
	if !cfg.Bind.Addr().IsValid() {
		return fmt.Errorf("bind address %v: %w", cfg.Bind, ErrInvalidConfig)
	}
	switch len(cfg.SecretKey) {
	case 16, 24, 32:
	case 0:
		if !cfg.AllowInsecure {
			return fmt.Errorf("no secret key and AllowInsecure not set: %w", ErrInvalidConfig)
		}
	default:
		return fmt.Errorf("secret key is %d bytes, want 16, 24 or 32: %w", len(cfg.SecretKey), ErrInvalidConfig)
	}
	if len(cfg.Keys) > 0 && len(cfg.SecretKey) == 0 {
		return fmt.Errorf("keys without a primary secret key: %w", ErrInvalidConfig)
	}
	for i, k := range cfg.Keys {
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return fmt.Errorf("key %d is %d bytes, want 16, 24 or 32: %w", i, n, ErrInvalidConfig)
		}
	}
	return nil
}

// memberlistConfig builds the memberlist configuration; delegates and
// logger are filled in by New.
func (cfg *Config) memberlistConfig() *memberlist.Config {
	mc := memberlist.DefaultLANConfig()
	if cfg.WAN {
		mc = memberlist.DefaultWANConfig()
	}
	mc.Name = cfg.Name
	mc.BindAddr = cfg.Bind.Addr().Unmap().String()
	mc.BindPort = int(cfg.Bind.Port())
	mc.AdvertiseAddr, mc.AdvertisePort = "", mc.BindPort
	if cfg.Advertise.Addr().IsValid() {
		mc.AdvertiseAddr = cfg.Advertise.Addr().Unmap().String()
		mc.AdvertisePort = int(cfg.Advertise.Port())
	}
	if len(cfg.SecretKey) > 0 {
		// A keyring from the start, so keys can be installed and removed
		// while running; the primary encrypts, every key decrypts.
		mc.Keyring, _ = memberlist.NewKeyring(cloneKeys(cfg.Keys), append([]byte(nil), cfg.SecretKey...))
	}
	if cfg.Fast {
		mc.ProbeInterval = FastProbeInterval * fastScale
		mc.ProbeTimeout = FastProbeTimeout * fastScale
		mc.GossipInterval = FastGossipInterval
		mc.SuspicionMult = FastSuspicionMult
		mc.PushPullInterval = FastPushPullInterval
		mc.TCPTimeout = FastTCPTimeout * fastScale
		mc.IndirectChecks = FastIndirectChecks
		mc.GossipToTheDeadTime = FastGossipToTheDead
	}
	return mc
}

func cloneKeys(keys [][]byte) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = append([]byte(nil), k...)
	}
	return out
}
