// Who may call: trunks by source address and digest, and the limits per
// source and per trunk.

package sipfront

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/icholy/digest"
	"golang.org/x/time/rate"
)

// digestRealm is the realm of every challenge.
const digestRealm = "rtcedge"

// nonceLife is how long a digest nonce is accepted after it was issued.
const nonceLife = 5 * time.Minute

// trunk is a Trunk ready for use: static after newTrunk but for its
// limiter and its call count, which are safe for concurrent use.
type trunk struct {
	// Static after the config is loaded.
	name     string
	sources  []netip.Prefix
	media    []netip.Prefix
	user     string // "" : no digest
	password string
	pop      string
	session  json.RawMessage
	maxCalls int64
	tenant   string   // owns the trunk's calls (call control)
	hook     *webhook // nil: the trunk's session answers every call

	// Shared by the handlers of every call of the trunk.
	limiter *rate.Limiter // new calls; safe for concurrent use
	calls   atomic.Int64  // live calls on this replica
}

func newTrunk(t Trunk) (*trunk, error) {
	out := &trunk{name: t.Name, user: t.DigestUser, password: t.password(), pop: t.POP, maxCalls: int64(t.MaxCalls),
		tenant: t.Tenant, limiter: rate.NewLimiter(rate.Limit(t.CallsPerSecond), t.CallBurst)}
	var err error
	if out.session, err = t.session(); err != nil {
		return nil, err
	}
	for _, s := range t.SourceCIDRs {
		out.sources = append(out.sources, netip.MustParsePrefix(s).Masked())
	}
	for _, s := range t.MediaCIDRs {
		out.media = append(out.media, netip.MustParsePrefix(s).Masked())
	}
	return out, nil
}

// mediaAllowed reports whether the carrier's media may be at a: inside the
// trunk's media CIDRs, and an address media can be sent to.
func (t *trunk) mediaAllowed(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() {
		return false
	}
	for _, p := range t.media {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// acquire takes one of the trunk's calls: false when the trunk is at
// MaxCalls or over its rate. Every true is matched by one release.
func (t *trunk) acquire(now time.Time) (ok bool, why string) {
	if !t.limiter.AllowN(now, 1) {
		return false, resultTrunkRate
	}
	if t.calls.Add(1) > t.maxCalls {
		t.calls.Add(-1)
		return false, resultTrunkFull
	}
	return true, ""
}

func (t *trunk) release() { t.calls.Add(-1) }

// trunkFor returns the trunk whose source CIDRs hold a, the most specific
// prefix winning; nil when none does.
func trunkFor(trunks []*trunk, a netip.Addr) *trunk {
	a = a.Unmap()
	var best *trunk
	bits := -1
	for _, t := range trunks {
		for _, p := range t.sources {
			if p.Contains(a) && p.Bits() > bits {
				best, bits = t, p.Bits()
			}
		}
	}
	return best
}

// nonces issues and checks digest nonces with no state: a nonce is its
// issue time and a MAC of it under a key of this replica.
type nonces struct {
	key [32]byte // static after newNonces
}

func newNonces() (*nonces, error) {
	n := &nonces{}
	if _, err := rand.Read(n.key[:]); err != nil {
		return nil, fmt.Errorf("digest nonce key: %w", err)
	}
	return n, nil
}

func (n *nonces) mac(b []byte) []byte {
	h := hmac.New(sha256.New, n.key[:])
	h.Write(b)
	return h.Sum(nil)[:16]
}

// issue returns a fresh nonce.
func (n *nonces) issue(now time.Time) string {
	var b [8 + 16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixNano()))
	copy(b[8:], n.mac(b[:8]))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// valid reports whether nonce was issued by this replica within nonceLife.
func (n *nonces) valid(nonce string, now time.Time) bool {
	b, err := base64.RawURLEncoding.DecodeString(nonce)
	if err != nil || len(b) != 24 || !hmac.Equal(b[8:], n.mac(b[:8])) {
		return false
	}
	age := now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(b[:8]))))
	return age >= -time.Second && age <= nonceLife
}

// challenge is the WWW-Authenticate value of a 401.
func (n *nonces) challenge(now time.Time) string {
	c := digest.Challenge{Realm: digestRealm, Nonce: n.issue(now), Algorithm: "MD5"}
	return c.String()
}

// Errors of checkDigest.
var (
	errNoCredentials  = errors.New("no digest credentials")
	errBadCredentials = errors.New("digest credentials do not verify")
)

// checkDigest verifies the Authorization value of a request (method, the
// request URI as sent) against the trunk's credentials and a nonce of
// ours: errNoCredentials (answer 401 with a challenge) or
// errBadCredentials (403).
func (n *nonces) checkDigest(t *trunk, authorization, method, uri string, now time.Time) error {
	if authorization == "" {
		return errNoCredentials
	}
	cr, err := digest.ParseCredentials(authorization)
	if err != nil {
		return errBadCredentials
	}
	if cr.Realm != digestRealm || cr.Username != t.user || cr.URI != uri || !n.valid(cr.Nonce, now) {
		if cr.Username == t.user && cr.Realm == digestRealm && cr.URI == uri {
			return errNoCredentials // a stale nonce: challenge again
		}
		return errBadCredentials
	}
	chal := &digest.Challenge{Realm: digestRealm, Nonce: cr.Nonce, Algorithm: cr.Algorithm, Opaque: cr.Opaque}
	if cr.QOP != "" {
		chal.QOP = []string{cr.QOP}
	}
	want, err := digest.Digest(chal, digest.Options{Method: method, URI: uri, Username: t.user, Password: t.password,
		Count: cr.Nc, Cnonce: cr.Cnonce})
	if err != nil || subtle.ConstantTimeCompare([]byte(want.Response), []byte(cr.Response)) != 1 {
		return errBadCredentials
	}
	return nil
}

// sourceLimits limits the requests of each source address (IPv4, or an
// IPv6 /64). The table holds at most max limiters; when full it is
// cleared (a flood of sources then costs everyone their burst once, never
// memory). Safe for concurrent use.
type sourceLimits struct {
	rate  rate.Limit // static
	burst int        // static
	max   int        // static

	mu sync.Mutex
	m  map[netip.Addr]*rate.Limiter // guarded by mu
}

func newSourceLimits(r float64, burst, max int) *sourceLimits {
	return &sourceLimits{rate: rate.Limit(r), burst: burst, max: max, m: map[netip.Addr]*rate.Limiter{}}
}

// allow reports whether a request from a fits the source's limit.
func (l *sourceLimits) allow(a netip.Addr, now time.Time) bool {
	a = a.Unmap()
	if a.Is6() {
		a = netip.PrefixFrom(a, 64).Masked().Addr()
	}
	l.mu.Lock()
	lim, ok := l.m[a]
	if !ok {
		if len(l.m) >= l.max {
			clear(l.m)
		}
		lim = rate.NewLimiter(l.rate, l.burst)
		l.m[a] = lim
	}
	l.mu.Unlock()
	return lim.AllowN(now, 1)
}
