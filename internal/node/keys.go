package node

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/keyspec"
	"github.com/rtcedge/rtcedge/internal/token"
)

// Environment variables that carry the routing-token keys, so config
// files need none.
const (
	EnvTokenKeys    = "RTCEDGE_TOKEN_KEYS"    // "ID:BASE64[,ID:BASE64...]"
	EnvTokenCurrent = "RTCEDGE_TOKEN_CURRENT" // key ID that mints
)

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
	// every KeysReload (and on SIGHUP) and applies a changed, valid set
	// without a restart: this is how keys rotate (docs/operations.md).
	File string `yaml:"file"`

	// loaded is the file's content the last ClusterKeys built its keys
	// from: WatchHopKeys compares against it, so a change made between
	// that read and the watcher's start is not taken for the baseline.
	loaded []byte
}

// Set reports whether any hop key is configured.
func (k *HopKeys) Set() bool { return len(k.Keys) > 0 || k.File != "" }

// ApplyEnv takes the keys from $RTCEDGE_HOP_KEYS when set.
func (k *HopKeys) ApplyEnv() {
	if env := os.Getenv(EnvHopKeys); env != "" {
		k.Keys = strings.Split(env, ",")
	}
}

// ClusterKeys builds the keyrings of every cluster listed (global relay);
// it is also HopKeys' validation.
func (k *HopKeys) ClusterKeys() (*encap.ClusterKeys, error) {
	if k.File == "" {
		return parseHopKeys(k.Keys)
	}
	b, err := os.ReadFile(k.File)
	if err != nil {
		return nil, fmt.Errorf("hop_keys.file: %w", err)
	}
	k.loaded = b
	return parseHopFile(b)
}

// parseHopFile parses a hop keys file: specs separated by commas or
// newlines.
func parseHopFile(b []byte) (*encap.ClusterKeys, error) { return parseHopKeys([]string{string(b)}) }

func parseHopKeys(specs []string) (*encap.ClusterKeys, error) {
	clean := keyspec.Split(specs...)
	if len(clean) == 0 {
		return nil, fmt.Errorf("no inter-tier hop keys: set hop_keys.keys, hop_keys.file or $%s", EnvHopKeys)
	}
	return encap.ParseClusterKeys(clean)
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

// WatchHopKeys re-reads k.File (WatchFile) until ctx ends and hands every
// changed, valid key set to apply; a file that does not parse, or that
// apply refuses, keeps the keys in use. Without a file it returns at once.
func WatchHopKeys(ctx context.Context, k HopKeys, env Env, apply func(*encap.ClusterKeys) error) error {
	if k.File == "" {
		return nil
	}
	return WatchFile(ctx, k.File, "hop_keys", k.loaded, env, func(b []byte) error {
		keys, err := parseHopFile(b)
		if err != nil {
			return err
		}
		return apply(keys)
	})
}
