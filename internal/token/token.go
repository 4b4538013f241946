// Package token implements the routing token: the server ICE ufrag that a
// transceiver mints for every session (docs/wire.md section 1).
//
// The token carries the cluster and pod that own the session, a random
// nonce and a truncated HMAC-SHA256. A global relay that sees a STUN
// Binding Request from an unknown client reads the server ufrag from the
// USERNAME attribute and calls Keyring.Verify; only a token that verifies
// may create flow state, so forged ufrags can neither fill the flow table
// nor steer floods at arbitrary pods. Verify is on that hot path and does
// not allocate.
//
// Layout (15 bytes, base64 standard alphabet without padding, 20 chars):
//
//	0      version<<4 | keyID
//	1..2   cluster ID (big-endian, 0 invalid)
//	3..4   pod ID (big-endian)
//	5..6   mint hour: hours since the Unix epoch, mod 65536 (part of the
//	       nonce; a coarse mint time so relays refuse old tokens)
//	7..10  nonce: 32 random bits
//	11..14 first 4 bytes of HMAC-SHA256(key[keyID], bytes 0..10)
package token

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rtcedge/rtcedge/internal/keyspec"
)

const (
	// EncodedLen is the length in characters of an encoded token (the ufrag).
	EncodedLen = 20
	// RawLen is the length in bytes of a decoded token.
	RawLen = 15
	// Version is the token format version this package mints and accepts.
	Version = 1
	// KeyLen is the length in bytes of every MAC key.
	KeyLen = 32

	// maxKeyID is the largest key ID: it must fit in the low nibble of byte 0.
	maxKeyID = 15
	// signedLen is the number of leading bytes covered by the MAC.
	signedLen = 11
	// macLen is the number of MAC bytes kept in the token.
	macLen = RawLen - signedLen
	// passwordLen is the length of the server ICE password; RFC 8839 wants
	// at least 22 ice-chars, which Pion enforces.
	passwordLen = 24
	// blockSize is the SHA-256 block size, the HMAC pad length.
	blockSize = sha256.BlockSize
)

// alphabet is the standard base64 alphabet (RFC 4648 section 4); every
// character is also an ICE ice-char (RFC 8839).
const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// inAlphabet marks the bytes of alphabet. Checked before decoding because
// encoding/base64 silently skips CR and LF, which would let a 22-byte
// ufrag with two newlines pass as 20.
var inAlphabet = func() (t [256]bool) {
	for i := 0; i < len(alphabet); i++ {
		t[alphabet[i]] = true
	}
	return t
}()

// Token is the decoded routing token.
type Token struct {
	// KeyID selects the MAC key (0..15).
	KeyID uint8
	// Cluster is the cluster that owns the session; 0 is invalid.
	Cluster uint16
	// Pod is the transceiver pod that owns the session, unique among the
	// live pods of its cluster.
	Pod uint16
	// Nonce makes every token unique: its first two bytes are the mint
	// hour (see MintHour), the other four are random.
	Nonce [6]byte
}

// hourOf returns t's hour counter: hours since the Unix epoch, mod 65536.
func hourOf(t time.Time) uint16 { return uint16(t.Unix() / 3600) }

// MintHour returns the hour counter the token was minted in.
func (t Token) MintHour() uint16 { return binary.BigEndian.Uint16(t.Nonce[0:2]) }

// Expired reports whether the token is at least lifetime old at now, at
// the hour counter's resolution: a token is refused from the start of the
// hour in which it is certainly lifetime old, so at most lifetime + 1h
// after minting. A token minted up to one hour "ahead" (clock skew
// between pod and relay) is not expired. The counter wraps after about
// 7.5 years, far longer than any key is kept.
func (t Token) Expired(now time.Time, lifetime time.Duration) bool {
	age := int(hourOf(now) - t.MintHour()) // mod 65536
	if age == 0xffff {
		return false
	}
	return time.Duration(age-1)*time.Hour >= lifetime
}

// macKey holds the HMAC pads of one key, precomputed so that Verify needs
// no hash.Hash (hmac.New allocates).
type macKey struct {
	ipad [blockSize]byte
	opad [blockSize]byte
}

// Keyring holds MAC keys by key ID (0..15) and the ID used to mint.
// It is immutable after NewKeyring and safe for concurrent use. Key
// rotation is done by building a new Keyring and swapping it in.
type Keyring struct {
	current uint8
	keys    [maxKeyID + 1]*macKey
	derived *tokenMasters // per-pod keys (derived.go); nil: none
}

// NewKeyring returns a keyring holding keys, minting with key ID current.
// Every ID must be at most 15, every key exactly KeyLen bytes, and current
// must be one of the IDs. The key bytes are not retained.
func NewKeyring(current uint8, keys map[uint8][]byte) (*Keyring, error) {
	k := &Keyring{current: current}
	for id, key := range keys {
		if id > maxKeyID {
			return nil, fmt.Errorf("token: key ID %d out of range 0..%d", id, maxKeyID)
		}
		if len(key) != KeyLen {
			return nil, fmt.Errorf("token: key ID %d is %d bytes, want %d", id, len(key), KeyLen)
		}
		k.keys[id] = newMACKey(key)
	}
	if current > maxKeyID || k.keys[current] == nil {
		return nil, fmt.Errorf("token: current key ID %d is not configured", current)
	}
	return k, nil
}

// newMACKey precomputes the pads of key (at most blockSize bytes).
func newMACKey(key []byte) *macKey {
	m := new(macKey)
	// KeyLen < blockSize, so the key is zero-padded, never hashed first.
	copy(m.ipad[:], key)
	copy(m.opad[:], key)
	for i := range blockSize {
		m.ipad[i] ^= 0x36
		m.opad[i] ^= 0x5c
	}
	return m
}

// ParseKeySpec parses a key given as "ID:BASE64" (standard base64, padding
// optional), as found in config files and flags, e.g. "3:AAECAwQF...".
func ParseKeySpec(spec string) (id uint8, key []byte, err error) {
	return keyspec.Parse("token", spec, maxKeyID, KeyLen)
}

// CurrentKeyID returns the key ID that Mint uses.
func (k *Keyring) CurrentKeyID() uint8 { return k.current }

// Mint returns a fresh token for (cluster, pod) under the current key,
// minted now. Cluster 0 is rejected with ErrCluster.
func (k *Keyring) Mint(cluster, pod uint16) (string, error) {
	return k.MintAt(cluster, pod, time.Now())
}

// MintAt is Mint with the mint time given: the nonce is the hour counter
// of now and 32 bits from crypto/rand.
func (k *Keyring) MintAt(cluster, pod uint16, now time.Time) (string, error) {
	t := Token{KeyID: k.current, Cluster: cluster, Pod: pod}
	binary.BigEndian.PutUint16(t.Nonce[0:2], hourOf(now))
	if _, err := rand.Read(t.Nonce[2:]); err != nil {
		return "", fmt.Errorf("token: read nonce: %w", err)
	}
	return k.Encode(t)
}

// Encode returns the encoding of t, deterministic in every field of t
// (including KeyID and Nonce); Mint is the normal way to make a token, this
// exists for test vectors and tools.
func (k *Keyring) Encode(t Token) (string, error) {
	if t.Cluster == 0 {
		return "", fmt.Errorf("token: encode: %w", ErrCluster)
	}
	key, cached := k.key(t.KeyID, t.Cluster, t.Pod)
	if key == nil {
		return "", fmt.Errorf("token: encode with key ID %d for cluster %d: %w", t.KeyID, t.Cluster, ErrUnknownKey)
	}
	if !cached && k.isDerived(t.KeyID) {
		k.derived.remember(t.KeyID, t.Cluster, t.Pod, key)
	}
	var raw [RawLen]byte
	raw[0] = Version<<4 | t.KeyID
	binary.BigEndian.PutUint16(raw[1:3], t.Cluster)
	binary.BigEndian.PutUint16(raw[3:5], t.Pod)
	copy(raw[5:signedLen], t.Nonce[:])
	mac := key.sum(&raw)
	copy(raw[signedLen:], mac[:macLen])
	return base64.RawStdEncoding.EncodeToString(raw[:]), nil
}

// Verify decodes and authenticates a ufrag. It checks, in order: length,
// alphabet, version, key ID, MAC, cluster ID; the first failure is returned
// as the bare sentinel (ErrLength, ErrAlphabet, ErrVersion, ErrUnknownKey,
// ErrMAC, ErrCluster). Verify does not retain ufrag, and does not allocate
// once the key it needs is known: a static key, or a derived pod key
// cached by an earlier token of that pod (the first one allocates it).
func (k *Keyring) Verify(ufrag []byte) (Token, error) {
	if len(ufrag) != EncodedLen {
		return Token{}, ErrLength
	}
	for _, c := range ufrag {
		if !inAlphabet[c] {
			return Token{}, ErrAlphabet
		}
	}
	var raw [RawLen]byte
	// EncodedLen*6 == RawLen*8, so there are no trailing bits to be
	// non-canonical and the decode cannot fail after the checks above.
	if n, err := base64.RawStdEncoding.Decode(raw[:], ufrag); err != nil || n != RawLen {
		return Token{}, ErrAlphabet
	}
	if raw[0]>>4 != Version {
		return Token{}, ErrVersion
	}
	id := raw[0] & 0x0f
	// Under a derived ID, the key of the cluster and pod the token names:
	// a token verifies only in its own pod's name.
	key, cached := k.key(id, binary.BigEndian.Uint16(raw[1:3]), binary.BigEndian.Uint16(raw[3:5]))
	if key == nil {
		return Token{}, ErrUnknownKey
	}
	mac := key.sum(&raw)
	if subtle.ConstantTimeCompare(mac[:macLen], raw[signedLen:]) != 1 {
		return Token{}, ErrMAC
	}
	if !cached && k.isDerived(id) {
		k.derived.remember(id, binary.BigEndian.Uint16(raw[1:3]), binary.BigEndian.Uint16(raw[3:5]), key)
	}
	// Checked after the MAC so that "cluster" counts only tokens we minted
	// ourselves (a bug), not random garbage.
	t := Token{
		KeyID:   id,
		Cluster: binary.BigEndian.Uint16(raw[1:3]),
		Pod:     binary.BigEndian.Uint16(raw[3:5]),
	}
	if t.Cluster == 0 {
		return Token{}, ErrCluster
	}
	copy(t.Nonce[:], raw[5:signedLen])
	return t, nil
}

// key returns the MAC key of key ID id for a token of (cluster, pod):
// the static key, or the pod's derived key; nil when there is none.
// cached is false when a derived key was computed just now.
func (k *Keyring) key(id uint8, cluster, pod uint16) (m *macKey, cached bool) {
	if id > maxKeyID {
		return nil, false
	}
	if k.keys[id] != nil {
		return k.keys[id], true
	}
	if k.isDerived(id) {
		return k.derived.podKey(id, cluster, pod)
	}
	return nil, false
}

// hmac returns HMAC-SHA256 of a short message (at most 64 bytes) under
// m, using stack arrays only.
func (m *macKey) hmac(msg []byte) [sha256.Size]byte {
	var inner [2 * blockSize]byte
	n := copy(inner[:], m.ipad[:])
	n += copy(inner[n:], msg)
	ih := sha256.Sum256(inner[:n])
	var outer [blockSize + sha256.Size]byte
	copy(outer[:], m.opad[:])
	copy(outer[blockSize:], ih[:])
	return sha256.Sum256(outer[:])
}

// sum returns HMAC-SHA256 over the signed prefix of raw, using stack
// arrays only.
func (m *macKey) sum(raw *[RawLen]byte) [sha256.Size]byte {
	var inner [blockSize + signedLen]byte
	copy(inner[:], m.ipad[:])
	copy(inner[blockSize:], raw[:signedLen])
	ih := sha256.Sum256(inner[:])
	var outer [blockSize + sha256.Size]byte
	copy(outer[:], m.opad[:])
	copy(outer[blockSize:], ih[:])
	return sha256.Sum256(outer[:])
}

// NewPassword returns a server ICE password: 24 characters of the base64
// alphabet (all ice-chars) from crypto/rand, 144 bits of entropy.
func NewPassword() (string, error) {
	var b [passwordLen]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("token: read password: %w", err)
	}
	for i, v := range b {
		// 256 is a multiple of 64, so masking keeps the choice uniform.
		b[i] = alphabet[v&63]
	}
	return string(b[:]), nil
}
