package signaling

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
)

// APIKey is one server-side credential.
type APIKey struct {
	// Key is the bearer token, at least 16 characters, not starting ek_.
	Key string `yaml:"key"`
	// Tenant groups keys: a call may be hung up by the credential that
	// placed it or by any API key of its tenant. Default DefaultTenant.
	Tenant string `yaml:"tenant"`
	// RatePerSecond and RateBurst are the key's quota over every endpoint
	// (client secrets it mints get their own, Config.SecretRatePerSecond);
	// zero: Config.KeyRatePerSecond and KeyRateBurst.
	RatePerSecond float64 `yaml:"rate_per_second"`
	RateBurst     int     `yaml:"rate_burst"`
	// SidebandTenant lets the key attach a sideband (GET
	// /v1/realtime?call_id=) to every call of its tenant, not only to the
	// calls it placed or whose client secret it minted: the operator's
	// monitoring or control server. Default false.
	SidebandTenant bool `yaml:"sideband_tenant"`
	// Probe marks the key of `rtcedge probe`'s synthetic clients: it may
	// post measured round trips (POST /v1/steering/samples) and read the
	// steering table (GET /v1/steering); docs/steering.md.
	Probe bool `yaml:"probe"`
	// ClientSessionFields and SealedFieldsWin are the key's own caller
	// policy (Config's are the default): for the calls it places and,
	// sealed into them, for the client secrets it mints.
	ClientSessionFields []string `yaml:"client_session_fields"`
	SealedFieldsWin     *bool    `yaml:"sealed_fields_win"`
}

// DefaultTenant is the tenant of keys that name none (all of
// Config.APIKeys).
const DefaultTenant = "default"

// apiKeys lists every configured key with defaults applied.
func (c *Config) apiKeys() []APIKey {
	out := make([]APIKey, 0, len(c.APIKeys)+len(c.Keys))
	for _, k := range c.APIKeys {
		out = append(out, APIKey{Key: k})
	}
	out = append(out, c.Keys...)
	for i := range out {
		if out[i].Tenant == "" {
			out[i].Tenant = DefaultTenant
		}
		if out[i].RatePerSecond == 0 {
			out[i].RatePerSecond = c.KeyRatePerSecond
		}
		if out[i].RateBurst == 0 {
			out[i].RateBurst = c.KeyRateBurst
		}
	}
	return out
}

// callerPolicy is the policy for the events (and the /calls session) of a
// call's caller: a client secret's sealed one, else its API key's, else
// the configured default.
func (s *Server) callerPolicy(c credential) sessionapi.Caller {
	switch {
	case c.kind == credSecret && c.secret.policy != nil:
		return *c.secret.policy
	case c.kind == credAPIKey:
		return s.keyPolicy(c.key)
	}
	return sessionapi.Caller{SessionFields: s.cfg.ClientSessionFields, SealedWins: s.cfg.SealedFieldsWin}
}

// ownPolicy is the caller policy a client secret minted with c seals: the
// API key's own, or nil for a key that has none (the default applies
// where the secret is used).
func (s *Server) ownPolicy(c credential) *sessionapi.Caller {
	if c.kind != credAPIKey {
		return nil
	}
	if k := s.keys[c.key]; k.ClientSessionFields == nil && k.SealedFieldsWin == nil {
		return nil
	}
	p := s.keyPolicy(c.key)
	return &p
}

// keyPolicy is API key i's caller policy.
func (s *Server) keyPolicy(i int) sessionapi.Caller {
	p := sessionapi.Caller{SessionFields: s.cfg.ClientSessionFields, SealedWins: s.cfg.SealedFieldsWin}
	k := s.keys[i]
	if k.ClientSessionFields != nil {
		p.SessionFields = k.ClientSessionFields
	}
	if k.SealedFieldsWin != nil {
		p.SealedWins = *k.SealedFieldsWin
	}
	return p
}

// validTenant accepts short printable names (they are MACed into call IDs
// and sealed into secrets).
func validTenant(t string) error {
	if len(t) > maxTenantLen {
		return fmt.Errorf("tenant %q is over %d characters", t, maxTenantLen)
	}
	for _, r := range t {
		if r <= ' ' || r > '~' {
			return fmt.Errorf("tenant %q: only printable ASCII without spaces", t)
		}
	}
	return nil
}

// credential kinds.
const (
	credNone = iota // no Authorization header, AllowAnonymous
	credAPIKey
	credSecret
)

// credential is who a request is from, as far as its bearer token says.
type credential struct {
	kind int
	// tenant is the key's tenant, the minting key's tenant for a secret,
	// and "" for anonymous requests and secrets minted anonymously.
	tenant string
	key    int          // index into Server.keys, credAPIKey only
	secret secretClaims // credSecret only
	// owner is who owns the sideband of a call placed with this
	// credential: the API key's fingerprint, the minting key's for a
	// secret, anonymous's for none.
	owner fingerprint
}

// authError is a refused credential: 401 with this code and message.
type authError struct{ code, msg string }

func (e *authError) Error() string { return e.msg }

// credential checks the bearer credential. allowExpired accepts client
// secrets expired less than maxCallAfterExpiry ago, for hang-ups: a call
// outlives the secret that started it.
func (s *Server) credential(r *http.Request, allowExpired bool) (credential, *authError) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		if s.cfg.AllowAnonymous {
			return credential{kind: credNone, owner: s.calls.keyFingerprint("", true)}, nil
		}
		return credential{}, &authError{"missing_credentials", "an Authorization: Bearer header with an API key or client secret is required"}
	}
	// The scheme is case-insensitive (RFC 9110 section 11.1).
	scheme, tok, ok := strings.Cut(auth, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return credential{}, &authError{"invalid_authorization", "the Authorization header must be \"Bearer <key>\""}
	}
	if strings.HasPrefix(tok, secretPrefix) {
		c, err := s.secrets.verify(tok, allowExpired)
		if err != nil {
			code := "invalid_client_secret"
			if errors.Is(err, errSecretExpired) {
				code = "expired_client_secret"
			}
			return credential{}, &authError{code, "client secret rejected: " + err.Error()}
		}
		return credential{kind: credSecret, tenant: c.tenant, secret: c, owner: c.owner}, nil
	}
	// Compare with every key, so the time taken says nothing about which
	// (or whether one) matched.
	match := -1
	for i, k := range s.keys {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(k.Key)) == 1 {
			match = i
		}
	}
	if match < 0 {
		if s.cfg.AnyAPIKey {
			// The dev world: an anonymous caller, but the key's own
			// sideband owner (Config.AnyAPIKey).
			return credential{kind: credNone, owner: s.calls.keyFingerprint(tok, false)}, nil
		}
		return credential{}, &authError{"invalid_api_key", "the API key is not valid"}
	}
	return credential{kind: credAPIKey, tenant: s.keys[match].Tenant, key: match, owner: s.calls.keyFingerprint(tok, false)}, nil
}

// precheck locates the client, authenticates it and applies the rate
// limit of its credential: an API key's quota, a client secret's, or, for
// anonymous requests and failed authentications, the client address's.
// A failed authentication is charged to the address before it is
// answered, so guessing credentials costs the guesser its budget, while a
// backend with a valid key never shares a budget with its address.
func (s *Server) precheck(w http.ResponseWriter, r *http.Request, allowExpired bool) (geo.Location, credential, bool) {
	loc := s.cfg.Locator.Locate(r)
	cred, aerr := s.credential(r, allowExpired)
	now := s.cfg.Now()
	var ok bool
	var by string
	switch {
	case aerr != nil || cred.kind == credNone:
		ok, by = s.limits.allowAddr(loc.IP, now), limitAddress
	case cred.kind == credAPIKey:
		ok, by = s.limits.allowKey(cred.key, now), limitAPIKey
	default:
		ok, by = s.limits.allowSecret(cred.secret, now), limitSecret
	}
	if !ok {
		s.m.rateLimited.WithLabelValues(by).Inc()
		apierr.Write(w, http.StatusTooManyRequests, apierr.TypeRateLimit, "rate_limited", "too many requests; slow down", time.Second)
		return loc, credential{}, false
	}
	if aerr != nil {
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, aerr.code, aerr.msg, 0)
		return loc, credential{}, false
	}
	return loc, cred, true
}
