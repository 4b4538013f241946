package signaling

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Ephemeral client secrets let a server that holds an API key hand a
// browser a credential that is good for a short time and nothing else:
//
//	"ek_" + base64url(expiry unix seconds (8 bytes) | nonce (8 bytes)) + "." + base64url(HMAC-SHA256(key, payload)[:16])
//
// They are stateless: any signaling replica with the same key verifies them.
const secretPrefix = "ek_"

// maxCallAfterExpiry is how long after its expiry a client secret may still
// hang up a call it started (calls outlive their short-lived secrets).
const maxCallAfterExpiry = 12 * time.Hour

var (
	errSecretMalformed = errors.New("malformed client secret")
	errSecretMAC       = errors.New("client secret does not verify")
	errSecretExpired   = errors.New("client secret expired")
)

type secretMinter struct {
	key []byte
	now func() time.Time
}

func (m secretMinter) mint(ttl time.Duration) (string, time.Time, error) {
	exp := m.now().Add(ttl).Truncate(time.Second)
	var payload [16]byte
	binary.BigEndian.PutUint64(payload[:8], uint64(exp.Unix()))
	if _, err := rand.Read(payload[8:]); err != nil {
		return "", time.Time{}, fmt.Errorf("client secret nonce: %w", err)
	}
	enc := base64.RawURLEncoding
	return secretPrefix + enc.EncodeToString(payload[:]) + "." + enc.EncodeToString(m.mac(payload[:])), exp, nil
}

func (m secretMinter) mac(payload []byte) []byte {
	h := hmac.New(sha256.New, m.key)
	h.Write(payload)
	return h.Sum(nil)[:16]
}

// verify checks a secret's MAC and, unless allowExpired, its expiry.
func (m secretMinter) verify(s string, allowExpired bool) error {
	rest, ok := strings.CutPrefix(s, secretPrefix)
	if !ok {
		return errSecretMalformed
	}
	p64, m64, ok := strings.Cut(rest, ".")
	if !ok || len(p64) != 22 || len(m64) != 22 {
		return errSecretMalformed
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(p64)
	mac, err2 := base64.RawURLEncoding.DecodeString(m64)
	if err1 != nil || err2 != nil || len(payload) != 16 || len(mac) != 16 {
		return errSecretMalformed
	}
	if subtle.ConstantTimeCompare(mac, m.mac(payload)) != 1 {
		return errSecretMAC
	}
	exp := time.Unix(int64(binary.BigEndian.Uint64(payload[:8])), 0)
	if !allowExpired && !m.now().Before(exp) {
		return errSecretExpired
	}
	// A DELETE may come after the secret that started the call expired,
	// but not forever: a leaked old secret must not end calls for good.
	if allowExpired && !m.now().Before(exp.Add(maxCallAfterExpiry)) {
		return errSecretExpired
	}
	return nil
}
