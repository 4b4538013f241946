package signaling

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/rtcedge/rtcedge/internal/sessionid"
)

// A call's public ID (the last segment of its Location) is a hang-up
// capability checked without any signaling state:
//
//	session ID "." base64url(secret ID (12 bytes, zero unless a client secret placed the call) | tag (12 bytes))
//	tag = HMAC-SHA256(K, len|session ID | len|tenant | secret ID)[:12]
//
// K is derived from ClientSecretKey. A hang-up is accepted from the client
// secret that placed the call (its ID must match, even after it expired,
// within maxCallAfterExpiry) or from any API key of the tenant that placed
// it (directly or through a secret it minted). Anonymous calls belong to
// the anonymous tenant "". The session ID itself goes to the cluster.
//
// Since the sideband (sideband.go) a call ID carries a second tag, binding
// the call to the one credential that may attach to it:
//
//	... | sideband tag (12 bytes) = HMAC-SHA256(K', len|session ID | owner)[:12]
//
// owner is the fingerprint of the API key that placed the call, or that
// minted the client secret that placed it (sealed in the secret), or of
// "no credential" for calls placed anonymously. Attaching recomputes the
// tag from the presented credential: no state anywhere, and any signaling
// replica of any region decides alike. IDs without it (minted before)
// still hang up; no sideband attaches to them.

const (
	callTagLen   = 12
	callCapLen   = secretIDLen + callTagLen
	callCapLenSB = callCapLen + callTagLen
	callCapInfo  = "rtcedge call id v1"
	sidebandInfo = "rtcedge sideband owner v1"
)

// fingerprint names a credential without holding it: a keyed hash of an
// API key (or of the absence of one), sealed into client secrets and MACed
// into call IDs.
type fingerprint [16]byte

type callMinter struct {
	key  []byte // call ID tags
	side []byte // sideband tags and fingerprints
}

func newCallMinter(secretKey []byte) callMinter {
	k, err := hkdf.Key(sha256.New, secretKey, nil, callCapInfo, 32)
	if err != nil {
		// hkdf.Key fails only for an output longer than 255 hashes.
		panic("derive call ID key: " + err.Error())
	}
	side, err := hkdf.Key(sha256.New, secretKey, nil, sidebandInfo, 32)
	if err != nil {
		panic("derive sideband key: " + err.Error())
	}
	return callMinter{key: k, side: side}
}

// keyFingerprint is the fingerprint of an API key; anonymous (no
// credential) is keyFingerprint("") under a domain of its own.
func (m callMinter) keyFingerprint(key string, anonymous bool) fingerprint {
	h := hmac.New(sha256.New, m.side)
	if anonymous {
		h.Write([]byte{0})
	} else {
		h.Write([]byte{1})
		h.Write([]byte(key))
	}
	var f fingerprint
	copy(f[:], h.Sum(nil))
	return f
}

func (m callMinter) sideTag(session string, owner fingerprint) []byte {
	h := hmac.New(sha256.New, m.side)
	h.Write([]byte{byte(len(session))})
	h.Write([]byte(session))
	h.Write(owner[:])
	return h.Sum(nil)[:callTagLen]
}

func (m callMinter) tag(session, tenant string, secretID [secretIDLen]byte) []byte {
	h := hmac.New(sha256.New, m.key)
	h.Write([]byte{byte(len(session))})
	h.Write([]byte(session))
	h.Write([]byte{byte(len(tenant))})
	h.Write([]byte(tenant))
	h.Write(secretID[:])
	return h.Sum(nil)[:callTagLen]
}

// publicID is the call ID handed to the client that placed session.
func (m callMinter) publicID(session string, c credential) string {
	var sid [secretIDLen]byte
	if c.kind == credSecret {
		sid = c.secret.id
	}
	raw := append(sid[:], m.tag(session, c.tenant, sid)...)
	raw = append(raw, m.sideTag(session, c.owner)...)
	return session + "." + base64.RawURLEncoding.EncodeToString(raw)
}

// owner checks that c may hang up the call named by public and returns
// the session ID to send to the cluster.
func (m callMinter) owner(public string, c credential) (string, sessionid.ID, bool) {
	session, id, raw, ok := parseCallID(public)
	if !ok {
		return "", sessionid.ID{}, false
	}
	var sid [secretIDLen]byte
	copy(sid[:], raw[:secretIDLen])
	if c.kind == credSecret && sid != c.secret.id {
		return "", sessionid.ID{}, false
	}
	if !hmac.Equal(raw[secretIDLen:callCapLen], m.tag(session, c.tenant, sid)) {
		return "", sessionid.ID{}, false
	}
	return session, id, true
}

// sidebandOwner checks that c may attach a sideband to the call named by
// public: c is the call's owner credential (its fingerprint matches the
// call ID's sideband tag). It returns the session ID.
func (m callMinter) sidebandOwner(public string, c credential) (string, sessionid.ID, bool) {
	session, id, raw, ok := parseCallID(public)
	if !ok || len(raw) != callCapLenSB {
		return "", sessionid.ID{}, false
	}
	if !hmac.Equal(raw[callCapLen:], m.sideTag(session, c.owner)) {
		return "", sessionid.ID{}, false
	}
	return session, id, true
}

// parseCallID splits a call ID into its session ID, parsed, and its
// capability bytes (with or without the sideband tag).
func parseCallID(public string) (string, sessionid.ID, []byte, bool) {
	session, capa, ok := strings.Cut(public, ".")
	if !ok {
		return "", sessionid.ID{}, nil, false
	}
	id, err := sessionid.Parse(session)
	if err != nil {
		return "", sessionid.ID{}, nil, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(capa)
	if err != nil || (len(raw) != callCapLen && len(raw) != callCapLenSB) {
		return "", sessionid.ID{}, nil, false
	}
	return session, id, raw, true
}
