package encap

import (
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/rtcedge/rtcedge/internal/keyspec"
)

const (
	// KeyLen is the length in bytes of a hop key (SipHash's 128-bit key).
	KeyLen = 16
	// MaxKeyID is the largest hop key ID.
	MaxKeyID = 15
	// maxSigned bounds the bytes the tag covers: the longest header
	// without its tag, and the 2-byte payload length.
	maxSigned = MaxLen - TagLen + 2
)

// hopKey is one key, split into SipHash's two 64-bit halves.
type hopKey struct{ k0, k1 uint64 }

// Keyring holds one cluster's hop keys by key ID and the ID used to sign.
// Receivers accept every key it holds, so rotation is: add the new key
// everywhere (accepted, not yet used), make it current everywhere, then
// remove the old one; each step swaps in a new Keyring without a restart.
// A Keyring is immutable and safe for concurrent use.
type Keyring struct {
	current uint8
	keys    [MaxKeyID + 1]*hopKey
	derived *masterSet // per-pod keys of one cluster (derived.go); nil: none
}

// NewKeyring returns a keyring holding keys, signing with key ID current.
// Every ID must be at most MaxKeyID, every key exactly KeyLen bytes, and
// current must be one of the IDs. The key bytes are not retained.
func NewKeyring(current uint8, keys map[uint8][]byte) (*Keyring, error) {
	k := &Keyring{current: current}
	for id, key := range keys {
		if id > MaxKeyID {
			return nil, fmt.Errorf("encap: hop key ID %d out of range 0..%d", id, MaxKeyID)
		}
		if len(key) != KeyLen {
			return nil, fmt.Errorf("encap: hop key ID %d is %d bytes, want %d", id, len(key), KeyLen)
		}
		k.keys[id] = &hopKey{k0: binary.LittleEndian.Uint64(key[:8]), k1: binary.LittleEndian.Uint64(key[8:])}
	}
	if current > MaxKeyID || k.keys[current] == nil {
		return nil, fmt.Errorf("encap: current hop key ID %d is not configured", current)
	}
	return k, nil
}

// ParseKeyring builds a keyring from "ID:BASE64" specs (standard base64 of
// KeyLen bytes). The first spec is the key used to sign; the others are
// accepted too, which is how keys rotate.
func ParseKeyring(specs []string) (*Keyring, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("encap: no hop keys")
	}
	keys := make(map[uint8][]byte, len(specs))
	var current uint8
	for i, s := range specs {
		id, key, err := keyspec.Parse("encap: hop key", s, MaxKeyID, KeyLen)
		if err != nil {
			return nil, err
		}
		if _, dup := keys[id]; dup {
			return nil, fmt.Errorf("encap: hop key ID %d given twice", id)
		}
		keys[id] = key
		if i == 0 {
			current = id
		}
	}
	return NewKeyring(current, keys)
}

// CurrentKeyID returns the key ID that Seal uses.
func (k *Keyring) CurrentKeyID() uint8 { return k.current }

// tag computes the tag of the datagram pkt whose header is pkt[:hl], under
// key: SipHash-2-4 over the header up to its tag and the payload length.
func (key *hopKey) tag(pkt []byte, hl int) uint64 {
	var in [maxSigned]byte
	m := copy(in[:], pkt[:hl-TagLen])
	binary.BigEndian.PutUint16(in[m:], uint16(len(pkt)-hl))
	return sipHash24(key.k0, key.k1, in[:m+2])
}

// Seal signs the datagram pkt, whose first hl bytes are a header written
// by Put: it sets the key ID to the current one and writes the tag. The
// payload (pkt[hl:]) must be in place, as its length is covered. Seal does
// not allocate.
func (k *Keyring) Seal(pkt []byte, hl int) {
	pkt[offKeyID] = k.current
	if k.isDerived(k.current) {
		pod := binary.BigEndian.Uint16(pkt[6:8])
		key, cached := k.derived.podKey(k.current, pod)
		binary.BigEndian.PutUint64(pkt[hl-TagLen:hl], key.tag(pkt, hl))
		if !cached {
			k.derived.remember(k.current, pod, key)
		}
		return
	}
	binary.BigEndian.PutUint64(pkt[hl-TagLen:hl], k.keys[k.current].tag(pkt, hl))
}

// Verify authenticates the datagram pkt whose header Decode parsed as
// pkt[:hl]: the key ID must be one this keyring holds (ErrUnknownKey) and
// the tag must match (ErrMAC). A nil keyring holds no key. Verify does not
// allocate, except to cache a derived pod key the first time it verifies.
func (k *Keyring) Verify(pkt []byte, hl int) error {
	if k == nil || hl < MinLen || hl > len(pkt) {
		return ErrUnknownKey
	}
	id := pkt[offKeyID]
	if id > MaxKeyID {
		return ErrUnknownKey
	}
	if k.isDerived(id) {
		// The key of the pod the header names, of this keyring's cluster
		// only: a header verifies only in its own pod's name.
		if binary.BigEndian.Uint16(pkt[4:6]) != k.derived.cluster {
			return ErrUnknownKey
		}
		pod := binary.BigEndian.Uint16(pkt[6:8])
		key, cached := k.derived.podKey(id, pod)
		if !tagEqual(key.tag(pkt, hl), binary.BigEndian.Uint64(pkt[hl-TagLen:hl])) {
			return ErrMAC
		}
		if !cached {
			k.derived.remember(id, pod, key)
		}
		return nil
	}
	if k.keys[id] == nil {
		return ErrUnknownKey
	}
	if !tagEqual(k.keys[id].tag(pkt, hl), binary.BigEndian.Uint64(pkt[hl-TagLen:hl])) {
		return ErrMAC
	}
	return nil
}

// ClusterKeys holds the hop keyrings of several clusters, for a global
// relay, which talks to all of them. Immutable; swap a new one in to
// rotate.
type ClusterKeys struct {
	m map[uint16]*Keyring
}

// NewClusterKeys returns the keyrings by cluster ID (the map is copied).
func NewClusterKeys(m map[uint16]*Keyring) *ClusterKeys {
	c := &ClusterKeys{m: make(map[uint16]*Keyring, len(m))}
	for id, k := range m {
		c.m[id] = k
	}
	return c
}

// ParseClusterKeys builds cluster keyrings from "CLUSTER/ID:BASE64" specs;
// per cluster, the first spec listed is the key used to sign.
func ParseClusterKeys(specs []string) (*ClusterKeys, error) {
	by := map[uint16][]string{}
	for _, s := range specs {
		cl, rest, ok := strings.Cut(s, "/")
		n, err := strconv.ParseUint(cl, 10, 16)
		if !ok || err != nil || n == 0 {
			return nil, fmt.Errorf("encap: cluster hop key %q: want CLUSTER/ID:BASE64 with cluster 1..65535", keyspec.Redact(s))
		}
		by[uint16(n)] = append(by[uint16(n)], rest)
	}
	m := make(map[uint16]*Keyring, len(by))
	for cl, ss := range by {
		k, err := ParseKeyring(ss)
		if err != nil {
			return nil, fmt.Errorf("cluster %d: %w", cl, err)
		}
		m[cl] = k
	}
	return &ClusterKeys{m: m}, nil
}

// For returns the keyring of a cluster, nil if there is none (Verify on a
// nil keyring fails with ErrUnknownKey).
func (c *ClusterKeys) For(cluster uint16) *Keyring {
	if c == nil {
		return nil
	}
	return c.m[cluster]
}

// routeDomain starts every route-cache MAC input; it differs from Magic,
// so a route tag can never be replayed as a header tag or the reverse.
const routeDomain = 'R'

// routeInput lays out what a route-cache tag covers: the client address
// (unmapped, as 16 bytes and port), cluster, pod, token nonce and the time
// the entry was written (unix seconds).
func routeInput(client netip.AddrPort, cluster, pod uint16, token [6]byte, stored uint32) [33]byte {
	var in [33]byte
	in[0] = routeDomain
	ip := client.Addr().Unmap().As16()
	copy(in[1:17], ip[:])
	binary.BigEndian.PutUint16(in[17:19], client.Port())
	binary.BigEndian.PutUint16(in[19:21], cluster)
	binary.BigEndian.PutUint16(in[21:23], pod)
	copy(in[23:29], token[:])
	binary.BigEndian.PutUint32(in[29:33], stored)
	return in
}

// SealRoute returns the key ID and tag that authenticate a route-cache
// entry client → (cluster, pod, token), written at stored (unix seconds),
// under the cluster's current key. The time is covered so that a reader
// can refuse old entries replayed by whoever can write to the cache.
// Under a derived key ID the tag is made with the cluster's route-cache
// key, which relays hold and pods do not.
func (k *Keyring) SealRoute(client netip.AddrPort, cluster, pod uint16, token [6]byte, stored uint32) (keyID uint8, tag uint64) {
	in := routeInput(client, cluster, pod, token, stored)
	key := k.relayKey(k.current)
	return k.current, sipHash24(key.k0, key.k1, in[:])
}

// relayKey is the key that route-cache entries and relay probes
// (probe.go) under key ID id are MAC'd with: the route key of a derived
// ID, which relays hold and pods do not, else the static hop key; nil:
// none. The inputs' first bytes ('R', ProbeMagic) keep the two apart.
func (k *Keyring) relayKey(id uint8) *hopKey {
	if k.isDerived(id) {
		return k.derived.route[id]
	}
	return k.keys[id]
}

// VerifyRoute checks a route-cache entry's key ID and tag (ErrUnknownKey,
// ErrMAC). A nil keyring holds no key. It does not allocate.
func (k *Keyring) VerifyRoute(client netip.AddrPort, cluster, pod uint16, token [6]byte, stored uint32, keyID uint8, tag uint64) error {
	if k == nil || keyID > MaxKeyID || k.relayKey(keyID) == nil {
		return ErrUnknownKey
	}
	in := routeInput(client, cluster, pod, token, stored)
	key := k.relayKey(keyID)
	if !tagEqual(sipHash24(key.k0, key.k1, in[:]), tag) {
		return ErrMAC
	}
	return nil
}

// tagEqual compares two tags in constant time.
func tagEqual(a, b uint64) bool {
	d := a ^ b
	return subtle.ConstantTimeEq(int32(uint32(d>>32)|uint32(d)), 0) == 1
}

// Clusters lists the clusters c holds keyrings of, ascending.
func (c *ClusterKeys) Clusters() []uint16 {
	if c == nil {
		return nil
	}
	out := make([]uint16, 0, len(c.m))
	for id := range c.m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
