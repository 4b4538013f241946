package signaling

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/internal/apierr"
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

// clientSecretRequest is the optional JSON body of POST /v1/realtime/client_secrets.
type clientSecretRequest struct {
	ExpiresAfter *struct {
		Anchor  string `json:"anchor"`
		Seconds int    `json:"seconds"`
	} `json:"expires_after,omitempty"`
	Session json.RawMessage `json:"session,omitempty"`
}

// ClientSecret is the JSON answer of POST /v1/realtime/client_secrets,
// shaped like OpenAI's.
type ClientSecret struct {
	Value     string          `json:"value"`
	ExpiresAt int64           `json:"expires_at"`
	Session   json.RawMessage `json:"session,omitempty"`
}

func (s *Server) handleClientSecret(w http.ResponseWriter, r *http.Request) {
	_, kind, ok := s.precheck(w, r, false)
	if !ok {
		return
	}
	if kind == credSecret {
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
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_expiry",
				"expires_after.anchor must be created_at", 0)
			return
		}
		if ea.Seconds < 10 || ea.Seconds > 7200 {
			apierr.Write(w, http.StatusBadRequest, apierr.TypeInvalidRequest, "invalid_expiry",
				"expires_after.seconds must be between 10 and 7200", 0)
			return
		}
		ttl = time.Duration(ea.Seconds) * time.Second
	}
	val, exp, err := s.secrets.mint(ttl)
	if err != nil {
		s.log.Error("mint client secret", "err", err)
		apierr.Write(w, http.StatusInternalServerError, apierr.TypeServer, "internal", "could not mint a secret", 0)
		return
	}
	s.m.secretsMinted.Inc()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(ClientSecret{Value: val, ExpiresAt: exp.Unix(), Session: req.Session})
}
