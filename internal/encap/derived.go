package encap

import (
	"encoding/binary"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
)

// Per-pod hop keys (docs/operations.md, "Deployment authority"). A key ID
// of a Keyring is either static (one key for every header, what a pod
// holds: its own key) or derived: the keyring holds the cluster's hop
// master and derives the key of the (cluster, pod) a header names, so a
// header verifies only under the key of the pod it names, and a pod that
// holds only its own key can seal headers in no other pod's name.
// Relays hold the masters; pods never do.

// derivedDomain starts the input of a per-pod key derivation; it differs
// from Magic and routeDomain, so no derivation input is ever a header or
// a route entry.
const derivedDomain = 'P'

// maxCachedPods bounds a keyring's cache of derived keys; beyond it keys
// are derived on every use (two SipHash calls), never stored.
const maxCachedPods = 1 << 16

// DerivePodKey returns the hop key (KeyLen bytes) of pod in cluster under
// the cluster's hop master key (KeyLen bytes): the two 64-bit halves are
// SipHash-2-4 outputs under the master, a PRF, so a pod's key tells
// nothing of the master or of another pod's key. This is what the key
// issuer writes for a pod (internal/authority).
func DerivePodKey(master []byte, cluster, pod uint16) []byte {
	m := hopKey{k0: binary.LittleEndian.Uint64(master[:8]), k1: binary.LittleEndian.Uint64(master[8:])}
	k := m.derive(cluster, pod)
	out := make([]byte, KeyLen)
	binary.LittleEndian.PutUint64(out[:8], k.k0)
	binary.LittleEndian.PutUint64(out[8:], k.k1)
	return out
}

// derive is DerivePodKey on split keys; it does not allocate.
func (m *hopKey) derive(cluster, pod uint16) hopKey {
	var in [6]byte
	in[0] = derivedDomain
	binary.BigEndian.PutUint16(in[1:3], cluster)
	binary.BigEndian.PutUint16(in[3:5], pod)
	k0 := sipHash24(m.k0, m.k1, in[:])
	in[5] = 1
	return hopKey{k0: k0, k1: sipHash24(m.k0, m.k1, in[:])}
}

// masterSet is the derived part of a keyring: one cluster's hop masters
// and route-cache keys by key ID, and the keys derived so far.
type masterSet struct {
	cluster uint16
	hop     [MaxKeyID + 1]*hopKey
	route   [MaxKeyID + 1]*hopKey
	// cache maps keyID<<16|pod to the pod's derived key. Readers load it
	// without a lock; a writer copies it under mu (pods come and go
	// rarely, packets all the time). Only keys whose header verified, or
	// that a relay sealed with, are stored, so forged headers cannot
	// fill it.
	cache atomic.Pointer[map[uint32]*hopKey]
	mu    sync.Mutex
}

// podKey returns the derived key of (id, pod), from the cache when it is
// there; cached reports whether it was.
func (s *masterSet) podKey(id uint8, pod uint16) (k hopKey, cached bool) {
	if p := (*s.cache.Load())[uint32(id)<<16|uint32(pod)]; p != nil {
		return *p, true
	}
	return s.hop[id].derive(s.cluster, pod), false
}

// remember stores a derived key that has proved itself.
func (s *masterSet) remember(id uint8, pod uint16, k hopKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.cache.Load()
	if len(old) >= maxCachedPods {
		return
	}
	m := make(map[uint32]*hopKey, len(old)+1)
	maps.Copy(m, old)
	m[uint32(id)<<16|uint32(pod)] = &k
	s.cache.Store(&m)
}

// WithMasters returns a copy of k (nil: an empty keyring) that also
// derives per-pod keys of cluster: hop holds the cluster's hop masters
// by key ID, route its route-cache keys (both KeyLen bytes), and current,
// one of hop's IDs, becomes the ID Seal and SealRoute use. A header of
// another cluster never verifies under a derived ID. IDs may not be both
// static in k and derived.
func (k *Keyring) WithMasters(cluster uint16, current uint8, hop, route map[uint8][]byte) (*Keyring, error) {
	out := &Keyring{current: current}
	if k != nil {
		out.keys = k.keys
	}
	s := &masterSet{cluster: cluster}
	s.cache.Store(&map[uint32]*hopKey{})
	for id, key := range hop {
		if id > MaxKeyID || len(key) != KeyLen || len(route[id]) != KeyLen {
			return nil, fmt.Errorf("encap: hop master ID %d: want ID 0..%d and %d-byte hop and route keys", id, MaxKeyID, KeyLen)
		}
		if out.keys[id] != nil {
			return nil, fmt.Errorf("encap: hop key ID %d is both static and derived", id)
		}
		s.hop[id] = &hopKey{k0: binary.LittleEndian.Uint64(key[:8]), k1: binary.LittleEndian.Uint64(key[8:])}
		r := route[id]
		s.route[id] = &hopKey{k0: binary.LittleEndian.Uint64(r[:8]), k1: binary.LittleEndian.Uint64(r[8:])}
	}
	if current > MaxKeyID || s.hop[current] == nil {
		return nil, fmt.Errorf("encap: current hop master ID %d is not configured", current)
	}
	out.derived = s
	return out, nil
}

// isDerived reports whether key ID id is derived per pod.
func (k *Keyring) isDerived(id uint8) bool { return k.derived != nil && k.derived.hop[id] != nil }
