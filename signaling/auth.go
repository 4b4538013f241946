package signaling

import (
	"crypto/subtle"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/apierr"
)

type limiter struct {
	l    *rate.Limiter
	seen time.Time
}

// credential kinds returned by authenticate.
const (
	credNone = iota
	credAPIKey
	credSecret
)

// authenticate checks the bearer credential. With no API keys configured,
// a missing credential is accepted (credNone) and a presented one must
// still be valid. allowExpired accepts expired client secrets, for DELETE:
// a call outlives the secret that started it.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, allowExpired bool) (int, bool) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		if len(s.cfg.APIKeys) == 0 {
			return credNone, true
		}
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "missing_credentials",
			"an Authorization: Bearer header with an API key or client secret is required", 0)
		return 0, false
	}
	// The scheme is case-insensitive (RFC 9110 section 11.1).
	scheme, tok, ok := strings.Cut(auth, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "invalid_authorization",
			"the Authorization header must be \"Bearer <key>\"", 0)
		return 0, false
	}
	if strings.HasPrefix(tok, secretPrefix) {
		if err := s.secrets.verify(tok, allowExpired); err != nil {
			code := "invalid_client_secret"
			if errors.Is(err, errSecretExpired) {
				code = "expired_client_secret"
			}
			apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, code, "client secret rejected: "+err.Error(), 0)
			return 0, false
		}
		return credSecret, true
	}
	for _, k := range s.cfg.APIKeys {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(k)) == 1 {
			return credAPIKey, true
		}
	}
	apierr.Write(w, http.StatusUnauthorized, apierr.TypeAuthentication, "invalid_api_key", "the API key is not valid", 0)
	return 0, false
}

// allow applies the per-client rate limit. ip is the client as located
// through trusted proxies, so clients behind one proxy do not share a
// budget.
func (s *Server) allow(w http.ResponseWriter, ip netip.Addr) bool {
	now := s.cfg.Now()
	key := limitKey(ip)
	s.limMu.Lock()
	// Forget clients idle for a minute (a full bucket refills well within
	// that), at most once every 10 s: never a scan per request.
	if now.Sub(s.limSwept) > 10*time.Second {
		s.limSwept = now
		for a, x := range s.limiters {
			if now.Sub(x.seen) > time.Minute {
				delete(s.limiters, a)
			}
		}
	}
	l := s.limiters[key]
	if l == nil {
		if len(s.limiters) >= maxLimiters {
			// Full of active clients: new ones share one bucket rather
			// than grow the table (or stall every request on a scan).
			key = netip.Addr{}
			l = s.limiters[key]
		}
		if l == nil {
			l = &limiter{l: rate.NewLimiter(rate.Limit(s.cfg.RatePerSecond), s.cfg.RateBurst)}
			s.limiters[key] = l
		}
	}
	l.seen = now
	ok := l.l.AllowN(now, 1)
	s.limMu.Unlock()
	if !ok {
		s.m.rateLimited.Inc()
		apierr.Write(w, http.StatusTooManyRequests, apierr.TypeRateLimit, "rate_limited", "too many requests; slow down", time.Second)
	}
	return ok
}

// maxLimiters bounds the rate limiter's table.
const maxLimiters = 200_000

// limitKey is what a client is rate-limited by: its IPv4 address, or the
// /64 of its IPv6 address (one subscriber holds a whole /64, and keying by
// /128 would let one client mint unlimited budgets).
func limitKey(ip netip.Addr) netip.Addr {
	if ip.Is4() || ip.Is4In6() {
		return ip.Unmap()
	}
	p, err := ip.Prefix(64)
	if err != nil {
		return ip
	}
	return p.Addr()
}

// precheck locates the client, rate-limits it and authenticates it, in
// that order: rate limiting first makes guessing credentials cost the
// guesser its budget.
func (s *Server) precheck(w http.ResponseWriter, r *http.Request, allowExpired bool) (geo.Location, int, bool) {
	loc := s.cfg.Locator.Locate(r)
	if !s.allow(w, loc.IP) {
		return loc, 0, false
	}
	kind, ok := s.authenticate(w, r, allowExpired)
	return loc, kind, ok
}
