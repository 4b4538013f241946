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

const (
	callTagLen  = 12
	callCapLen  = secretIDLen + callTagLen
	callCapInfo = "rtcedge call id v1"
)

type callMinter struct{ key []byte }

func newCallMinter(secretKey []byte) callMinter {
	k, err := hkdf.Key(sha256.New, secretKey, nil, callCapInfo, 32)
	if err != nil {
		// hkdf.Key fails only for an output longer than 255 hashes.
		panic("derive call ID key: " + err.Error())
	}
	return callMinter{key: k}
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
	return session + "." + base64.RawURLEncoding.EncodeToString(raw)
}

// owner checks that c may hang up the call named by public and returns
// the session ID to send to the cluster.
func (m callMinter) owner(public string, c credential) (string, sessionid.ID, bool) {
	session, capa, ok := strings.Cut(public, ".")
	if !ok {
		return "", sessionid.ID{}, false
	}
	id, err := sessionid.Parse(session)
	if err != nil {
		return "", sessionid.ID{}, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(capa)
	if err != nil || len(raw) != callCapLen {
		return "", sessionid.ID{}, false
	}
	var sid [secretIDLen]byte
	copy(sid[:], raw[:secretIDLen])
	if c.kind == credSecret && sid != c.secret.id {
		return "", sessionid.ID{}, false
	}
	if !hmac.Equal(raw[secretIDLen:], m.tag(session, c.tenant, sid)) {
		return "", sessionid.ID{}, false
	}
	return session, id, true
}
