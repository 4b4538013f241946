package signaling

import (
	"bytes"
	"compress/flate"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/placement"
)

// Ephemeral client secrets let a server that holds an API key hand a
// browser a credential that is good for a short time, for calls only, and
// with the session configuration the server chose:
//
//	"ek_" + base64url(nonce (12 bytes) | AES-256-GCM(expiry unix seconds (8) | len(tenant) (1) | tenant | flags (1) [| owner (16)] [| policy] | session))
//
// The policy (flags bit 2) is the minting key's caller policy when the key
// has one of its own (which session fields the browser may set, and
// whether sealed fields win silently; sessionapi.Caller): policy flags (1;
// bit 0 SealedWins) | count (1) | count × (len (1) | field name). A secret
// without one gets the configured default.
//
// The session is the server's JSON object, deflated when that is shorter
// (flags bit 0). The owner (flags bit 1) is the fingerprint of the API key
// that minted the secret (callMinter.fingerprint): a call placed with the
// secret takes it as its sideband owner, so the app server's key, not the
// browser's secret, attaches to the call (sideband.go). The AEAD both authenticates the claims (a browser cannot
// change the model or instructions the server fixed) and hides them (the
// instructions are the app's prompt, not the browser's business). The nonce
// doubles as the secret's ID, which per-secret rate limits and hang-up
// capabilities are keyed by. Secrets are stateless: any signaling replica
// with the same ClientSecretKey verifies them.
const secretPrefix = "ek_"

// maxCallAfterExpiry is how long after its expiry a client secret may still
// hang up a call it started (calls outlive their short-lived secrets).
const maxCallAfterExpiry = 12 * time.Hour

// Bounds on what a secret carries. A secret travels in an Authorization
// header (16 KiB of headers at most), so its session is capped both before
// (maxSessionJSON) and after encoding (maxSecretLen).
const (
	maxSessionJSON = 32 << 10
	maxSecretLen   = 8 << 10
	maxTenantLen   = 64
	secretIDLen    = 12
	secretAAD      = "rtcedge client secret v2"
	flagDeflated   = 1
	flagOwner      = 2
	flagPolicy     = 4
)

// Sentinel errors of secret verification.
var (
	// errSecretMalformed: not a secret of this format.
	errSecretMalformed = errors.New("malformed client secret")
	// errSecretMAC: the secret was not minted with this deployment's key,
	// or was changed.
	errSecretMAC = errors.New("client secret does not verify")
	// errSecretExpired: past its expiry (for a hang-up, past the grace).
	errSecretExpired = errors.New("client secret expired")
)

// secretClaims is what a verified client secret says.
type secretClaims struct {
	id      [secretIDLen]byte
	expires time.Time
	tenant  string
	// session is the server's session configuration, canonical JSON, or
	// nil when the server set none.
	session json.RawMessage
	// owner is the fingerprint of the credential that minted the secret
	// (zero for a secret minted before secrets carried one: no key owns
	// its calls' sideband).
	owner fingerprint
	// policy is the caller policy sealed at minting, or nil (a secret
	// minted before secrets carried one: the configured default).
	policy *sessionapi.Caller
}

type secretMinter struct {
	aead cipher.AEAD
	now  func() time.Time
}

// newSecretMinter derives the secret key from the configured key, so that
// the same configured key can also key other MACs (call IDs) without reuse.
func newSecretMinter(key []byte, now func() time.Time) (secretMinter, error) {
	k, err := hkdf.Key(sha256.New, key, nil, secretAAD, 32)
	if err != nil {
		return secretMinter{}, fmt.Errorf("derive client secret key: %w", err)
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return secretMinter{}, fmt.Errorf("client secret cipher: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return secretMinter{}, fmt.Errorf("client secret cipher: %w", err)
	}
	return secretMinter{aead: aead, now: now}, nil
}

// errSecretTooLarge is returned by mint when the session does not fit in a
// secret.
var errSecretTooLarge = errors.New("session configuration too large for a client secret")

// mint seals a secret; policy is nil for a key without a caller policy of
// its own (the secret then gets the configured default where it is used,
// and a replica that predates policies reads it as before).
func (m secretMinter) mint(ttl time.Duration, tenant string, owner fingerprint, policy *sessionapi.Caller, session json.RawMessage) (string, time.Time, error) {
	exp := m.now().Add(ttl).Truncate(time.Second)
	if len(tenant) > maxTenantLen {
		return "", time.Time{}, fmt.Errorf("tenant %q too long", tenant)
	}
	flags := byte(flagOwner)
	var pol []byte
	if policy != nil {
		var err error
		if pol, err = appendPolicy(nil, *policy); err != nil {
			return "", time.Time{}, err
		}
		flags |= flagPolicy
	}
	pt := binary.BigEndian.AppendUint64(make([]byte, 0, 16+len(tenant)+len(pol)+len(session)), uint64(exp.Unix()))
	pt = append(pt, byte(len(tenant)))
	pt = append(pt, tenant...)
	body := []byte(session)
	if d, err := deflate(session); err == nil && len(d) < len(session) {
		flags, body = flags|flagDeflated, d
	}
	pt = append(pt, flags)
	pt = append(pt, owner[:]...)
	pt = append(pt, pol...)
	pt = append(pt, body...)
	nonce := make([]byte, secretIDLen, secretIDLen+len(pt)+m.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", time.Time{}, fmt.Errorf("client secret nonce: %w", err)
	}
	out := secretPrefix + base64.RawURLEncoding.EncodeToString(m.aead.Seal(nonce, nonce, pt, []byte(secretAAD)))
	if len(out) > maxSecretLen {
		return "", time.Time{}, errSecretTooLarge
	}
	return out, exp, nil
}

// verify opens a secret and checks, unless allowExpired, its expiry.
func (m secretMinter) verify(s string, allowExpired bool) (secretClaims, error) {
	rest, ok := strings.CutPrefix(s, secretPrefix)
	if !ok || len(s) > maxSecretLen {
		return secretClaims{}, errSecretMalformed
	}
	raw, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(raw) < secretIDLen+m.aead.Overhead()+10 {
		return secretClaims{}, errSecretMalformed
	}
	pt, err := m.aead.Open(nil, raw[:secretIDLen], raw[secretIDLen:], []byte(secretAAD))
	if err != nil {
		return secretClaims{}, errSecretMAC
	}
	// The AEAD vouches for the plaintext: a layout error here is a bug of
	// the minter, still answered as malformed rather than trusted.
	var c secretClaims
	copy(c.id[:], raw[:secretIDLen])
	c.expires = time.Unix(int64(binary.BigEndian.Uint64(pt[:8])), 0)
	tl := int(pt[8])
	if len(pt) < 10+tl {
		return secretClaims{}, errSecretMalformed
	}
	c.tenant = string(pt[9 : 9+tl])
	flags, body := pt[9+tl], pt[10+tl:]
	if flags&flagOwner != 0 {
		if len(body) < len(c.owner) {
			return secretClaims{}, errSecretMalformed
		}
		body = body[copy(c.owner[:], body):]
	}
	if flags&flagPolicy != 0 {
		p, rest, ok := readPolicy(body)
		if !ok {
			return secretClaims{}, errSecretMalformed
		}
		c.policy, body = &p, rest
	}
	if flags&flagDeflated != 0 {
		if body, err = inflate(body); err != nil {
			return secretClaims{}, errSecretMalformed
		}
	}
	if len(body) > 0 {
		c.session = json.RawMessage(body)
	}
	now := m.now()
	if !allowExpired && !now.Before(c.expires) {
		return secretClaims{}, errSecretExpired
	}
	// A hang-up may come after the secret that started the call expired,
	// but not forever: a leaked old secret must not end calls for good.
	if allowExpired && !now.Before(c.expires.Add(maxCallAfterExpiry)) {
		return secretClaims{}, errSecretExpired
	}
	return c, nil
}

// appendPolicy appends a caller policy in a secret's layout.
func appendPolicy(b []byte, p sessionapi.Caller) ([]byte, error) {
	if len(p.SessionFields) > 255 {
		return nil, fmt.Errorf("%d client session fields: at most 255", len(p.SessionFields))
	}
	var flags byte
	if p.SealedWins {
		flags = 1
	}
	b = append(b, flags, byte(len(p.SessionFields)))
	for _, f := range p.SessionFields {
		if len(f) == 0 || len(f) > 255 {
			return nil, fmt.Errorf("client session field %q: 1 to 255 bytes", f)
		}
		b = append(append(b, byte(len(f))), f...)
	}
	return b, nil
}

// readPolicy reads what appendPolicy wrote at the start of b.
func readPolicy(b []byte) (sessionapi.Caller, []byte, bool) {
	if len(b) < 2 {
		return sessionapi.Caller{}, nil, false
	}
	p := sessionapi.Caller{SealedWins: b[0]&1 != 0, SessionFields: make([]string, 0, b[1])}
	n, b := int(b[1]), b[2:]
	for range n {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return sessionapi.Caller{}, nil, false
		}
		p.SessionFields = append(p.SessionFields, string(b[1:1+int(b[0])]))
		b = b[1+int(b[0]):]
	}
	return p, b, true
}

func deflate(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	fw, err := flate.NewWriter(&buf, flate.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := fw.Write(b); err != nil {
		return nil, err
	}
	if err := fw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// inflate undoes deflate, refusing output over maxSessionJSON.
func inflate(b []byte) ([]byte, error) {
	out, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(b)), maxSessionJSON+1))
	if err != nil {
		return nil, err
	}
	if len(out) > maxSessionJSON {
		return nil, errors.New("inflated session too large")
	}
	return out, nil
}

// clientSecretRequest is the optional JSON body of POST /v1/realtime/client_secrets.
type clientSecretRequest struct {
	ExpiresAfter *struct {
		Anchor  string `json:"anchor"`
		Seconds int    `json:"seconds"`
	} `json:"expires_after,omitempty"`
	Session json.RawMessage `json:"session,omitempty"`
}

// ClientSecret is the JSON answer of POST /v1/realtime/client_secrets,
// shaped like OpenAI's. Session is the effective session configuration
// every call placed with the secret gets (the request's session in
// canonical form) as OpenAI's session object: with its "id"
// ("sess_" and the secret's ID in hex), "object" ("realtime.session", or
// "realtime.transcription_session" for type "transcription") and "type"
// (default "realtime"), which OpenAI's SDK types require. Clients may add
// only the fields of the minting key's caller policy
// (APIKey.ClientSessionFields, else Config.ClientSessionFields), which the
// secret seals.
type ClientSecret struct {
	Value     string          `json:"value"`
	ExpiresAt int64           `json:"expires_at"`
	Session   json.RawMessage `json:"session,omitempty"`
}

func (s *Server) handleClientSecret(w http.ResponseWriter, r *http.Request) {
	_, cred, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	if cred.kind == credSecret {
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "api_key_required",
			"client secrets are minted with an API key, not with another client secret", 0)
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req clientSecretRequest
	if len(bytes.TrimSpace(body)) > 0 {
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			unsupportedMediaType(w, "send the request as Content-Type: application/json")
			return
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_json", "request body is not valid JSON: "+err.Error(), 0)
			return
		}
	}
	ttl := s.cfg.ClientSecretTTL
	if ea := req.ExpiresAfter; ea != nil {
		if ea.Anchor != "" && ea.Anchor != "created_at" {
			apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_expiry",
				"expires_after.anchor must be created_at", "expires_after.anchor")
			return
		}
		if ea.Seconds < 10 || ea.Seconds > 7200 {
			apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_expiry",
				"expires_after.seconds must be between 10 and 7200", "expires_after.seconds")
			return
		}
		ttl = time.Duration(ea.Seconds) * time.Second
	}
	session, err := canonicalSession(req.Session)
	if err != nil {
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_session", err.Error(), "session")
		return
	}
	val, exp, err := s.secrets.mint(ttl, cred.tenant, cred.owner, s.ownPolicy(cred), session)
	switch {
	case errors.Is(err, errSecretTooLarge):
		apierr.WriteParam(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "session_too_large",
			fmt.Sprintf("the session does not fit in a client secret of %d bytes", maxSecretLen), "session")
		return
	case err != nil:
		s.log.Error("mint client secret", "err", err)
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not mint a secret", 0)
		return
	}
	s.m.secretsMinted.Inc()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(ClientSecret{Value: val, ExpiresAt: exp.Unix(), Session: sessionObject(val, session)})
}

// sessionObject is the session of a client secret's answer as OpenAI
// shapes it (ClientSecret): the canonical session with id, object and
// type. The session is a JSON object or empty (canonicalSession).
func sessionObject(secret string, session json.RawMessage) json.RawMessage {
	obj := map[string]any{}
	if len(session) > 0 {
		var err error
		if obj, err = placement.DecodeObject(session); err != nil {
			return session // canonicalSession made it: cannot happen
		}
	}
	var id [secretIDLen]byte
	raw, _ := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(secret, secretPrefix))
	copy(id[:], raw) // the nonce leads the secret
	obj["id"] = "sess_" + hex.EncodeToString(id[:])
	if _, ok := obj["type"]; !ok {
		obj["type"] = "realtime"
	}
	obj["object"] = "realtime.session"
	if obj["type"] == "transcription" {
		obj["object"] = "realtime.transcription_session"
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return session
	}
	return out
}
