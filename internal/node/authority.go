package node

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/rtcedge/rtcedge/internal/authority"
)

// EnvAuthorityKeys holds a relay's cluster authority secrets as
// "CLUSTER/ID:BASE64[,...]" (internal/authority): a cluster relay needs
// its own cluster's, a global relay every cluster's it serves. Pods never
// get them.
const EnvAuthorityKeys = "RTCEDGE_AUTHORITY_KEYS"

// Authority configures a relay's cluster authority secrets, from which it
// derives every pod's token, hop, member and session API keys on demand.
// Unset: the relay uses the deployment's shared token and hop keys, and
// cannot tell one pod from another (docs/operations.md).
type Authority struct {
	// Keys are "CLUSTER/ID:BASE64" specs; prefer $RTCEDGE_AUTHORITY_KEYS.
	// Per cluster the first listed is current.
	Keys []string `yaml:"keys"`
	// File, when set, holds further specs (commas or newlines), e.g. a
	// mounted Kubernetes Secret. The node re-reads it every KeysReload
	// (and on SIGHUP) and swaps in a changed, valid set without a
	// restart (WatchAuthority): this is how authority keys rotate.
	File string `yaml:"file"`

	// loaded is the file's content the last Secrets built from (the
	// watcher's baseline).
	loaded []byte
}

// ApplyEnv adds the keys of $RTCEDGE_AUTHORITY_KEYS when set: secrets in
// the environment, public keys in the config file.
func (a *Authority) ApplyEnv() {
	if env := os.Getenv(EnvAuthorityKeys); env != "" {
		a.Keys = append(a.Keys, env)
	}
}

// Set reports whether any key is configured.
func (a *Authority) Set() bool { return len(a.Keys) > 0 || a.File != "" }

// Secrets parses the keys; nil, nil when none are configured.
func (a *Authority) Secrets() (*authority.Secrets, error) {
	if !a.Set() {
		return nil, nil
	}
	specs := a.Keys
	if a.File != "" {
		b, err := os.ReadFile(a.File)
		if err != nil {
			return nil, fmt.Errorf("authority.file: %w", err)
		}
		specs = append(slices.Clip(specs), string(b))
		a.loaded = b
	}
	return authority.Parse(specs)
}

// WatchAuthority re-reads a.File (WatchFile) until ctx ends and hands
// every changed set that parses (with a.Keys) to apply, which swaps it in
// or refuses it (the keys in use stay). Without a file it returns at once.
func WatchAuthority(ctx context.Context, a Authority, env Env, apply func(*authority.Secrets) error) error {
	if a.File == "" {
		return nil
	}
	return WatchFile(ctx, a.File, "authority", a.loaded, env, func(b []byte) error {
		sec, err := authority.Parse(append(slices.Clip(a.Keys), string(b)))
		if err != nil {
			return err
		}
		return apply(sec)
	})
}
