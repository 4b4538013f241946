package token

import (
	"encoding/binary"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
)

// Per-pod token keys (docs/operations.md, "Deployment authority"). A key
// ID of a Keyring is either static (what a pod holds: its own key, which
// mints only its own tokens) or derived: the keyring holds clusters'
// token masters and derives the key of the (cluster, pod) a token names,
// so a token verifies only under the key of the pod it names. Relays hold
// the masters; pods never do. The token's layout does not change.

// derivedLabel starts the input of a per-pod key derivation.
const derivedLabel = "rtcedge token pod v1"

// maxCachedPods bounds the cache of derived keys; beyond it keys are
// derived on every use, never stored.
const maxCachedPods = 1 << 16

// DerivePodKey returns the token key (KeyLen bytes) of pod in cluster
// under the cluster's token master (KeyLen bytes): HMAC-SHA256 of the
// label, cluster and pod. This is what the key issuer writes for a pod
// (internal/authority).
func DerivePodKey(master []byte, cluster, pod uint16) []byte {
	m := newMACKey(master)
	k := m.derive(cluster, pod)
	return k[:]
}

// derive is DerivePodKey on precomputed pads; it does not allocate.
func (m *macKey) derive(cluster, pod uint16) [KeyLen]byte {
	var in [len(derivedLabel) + 4]byte
	copy(in[:], derivedLabel)
	binary.BigEndian.PutUint16(in[len(derivedLabel):], cluster)
	binary.BigEndian.PutUint16(in[len(derivedLabel)+2:], pod)
	return m.hmac(in[:])
}

// tokenMasters is the derived part of a keyring: token masters by key ID
// and cluster, and the pod keys derived so far.
type tokenMasters struct {
	by [maxKeyID + 1]map[uint16]*macKey
	// cache maps keyID<<32|cluster<<16|pod to the pod's key. Readers load
	// it without a lock; a writer copies it under mu. Only keys under
	// which a token verified or was encoded are stored, so forged tokens
	// cannot fill it.
	cache atomic.Pointer[map[uint64]*macKey]
	mu    sync.Mutex
}

// podKey returns the key of (id, cluster, pod), nil when cluster has no
// master under id; cached reports whether it came from the cache.
func (t *tokenMasters) podKey(id uint8, cluster, pod uint16) (k *macKey, cached bool) {
	ck := uint64(id)<<32 | uint64(cluster)<<16 | uint64(pod)
	if k := (*t.cache.Load())[ck]; k != nil {
		return k, true
	}
	m := t.by[id][cluster]
	if m == nil {
		return nil, false
	}
	key := m.derive(cluster, pod)
	return newMACKey(key[:]), false
}

// remember stores a pod key that has proved itself.
func (t *tokenMasters) remember(id uint8, cluster, pod uint16, k *macKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.cache.Load()
	if len(old) >= maxCachedPods {
		return
	}
	m := make(map[uint64]*macKey, len(old)+1)
	maps.Copy(m, old)
	m[uint64(id)<<32|uint64(cluster)<<16|uint64(pod)] = k
	t.cache.Store(&m)
}

// WithMasters returns a copy of k (nil: an empty keyring) that also
// derives per-pod keys: masters holds token masters (KeyLen bytes) by key
// ID and cluster. current, static or derived, becomes the minting ID. A
// token naming a cluster without a master under its key ID fails with
// ErrUnknownKey. IDs may not be both static and derived.
func (k *Keyring) WithMasters(current uint8, masters map[uint8]map[uint16][]byte) (*Keyring, error) {
	out := &Keyring{current: current}
	if k != nil {
		out.keys = k.keys
	}
	t := &tokenMasters{}
	t.cache.Store(&map[uint64]*macKey{})
	for id, by := range masters {
		if id > maxKeyID {
			return nil, fmt.Errorf("token: master key ID %d out of range 0..%d", id, maxKeyID)
		}
		if out.keys[id] != nil {
			return nil, fmt.Errorf("token: key ID %d is both static and derived", id)
		}
		t.by[id] = map[uint16]*macKey{}
		for cl, key := range by {
			if len(key) != KeyLen || cl == 0 {
				return nil, fmt.Errorf("token: master of cluster %d, key ID %d: want a non-zero cluster and %d bytes", cl, id, KeyLen)
			}
			t.by[id][cl] = newMACKey(key)
		}
	}
	if current > maxKeyID || (out.keys[current] == nil && t.by[current] == nil) {
		return nil, fmt.Errorf("token: current key ID %d is not configured", current)
	}
	out.derived = t
	return out, nil
}

// isDerived reports whether key ID id is derived per pod.
func (k *Keyring) isDerived(id uint8) bool { return k.derived != nil && k.derived.by[id] != nil }
