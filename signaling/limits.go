package signaling

import (
	"net/netip"
	"sync"
	"time"
)

// Rate limits are kept per credential, so that an app backend's key is
// never throttled by the address it shares with others, and per client
// address only for requests without valid credentials. All tables are
// bounded. The address table degrades by aggregation: when it fills, new
// clients are counted by their /24 (IPv4) or /48 (IPv6), then by /16 or
// /32, then /8 or /16, each aggregate with a proportionally larger budget,
// so a flood from many prefixes costs honest clients elsewhere nothing
// rather than pushing them all into one shared bucket.

// Values of the "limit" label of rtcedge_signaling_rate_limited_total.
const (
	limitAddress = "address"
	limitAPIKey  = "api_key"
	limitSecret  = "client_secret"
)

var limitLabels = []string{limitAddress, limitAPIKey, limitSecret}

// Aggregation levels of the address table: prefix lengths per family, and
// the share of the table each level may fill (the last is bounded by the
// address space itself: at most 256 IPv4 /8s and 65536 IPv6 /16s).
var (
	v4Levels   = [...]int{32, 24, 16, 8}
	v6Levels   = [...]int{64, 48, 32, 16}
	levelShare = [...]float64{0.75, 0.875, 1}
)

// idleAfter is when an idle bucket is forgotten: a full bucket refills
// well within it. Sweeps run at most every sweepEvery, never per request.
const (
	idleAfter  = time.Minute
	sweepEvery = 10 * time.Second
)

// bucket is a token bucket; the zero value is a new, full one.
type bucket struct {
	tokens float64
	last   int64 // unix nanoseconds of the last take; 0: never
}

func (b *bucket) take(now int64, rate, burst float64) bool {
	if b.last == 0 {
		b.tokens = burst
	} else if dt := now - b.last; dt > 0 {
		b.tokens = min(burst, b.tokens+float64(dt)/1e9*rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// table is a map of buckets with periodic forgetting of idle ones.
type table[K comparable] struct {
	m     map[K]bucket
	swept int64
}

func (t *table[K]) sweep(now int64) {
	if now-t.swept < int64(sweepEvery) {
		return
	}
	t.swept = now
	for k, b := range t.m {
		if now-b.last > int64(idleAfter) {
			delete(t.m, k)
		}
	}
}

func (t *table[K]) take(k K, now int64, rate, burst float64) bool {
	b := t.m[k]
	ok := b.take(now, rate, burst)
	t.m[k] = b
	return ok
}

// limits holds every rate limiter of a Server.
type limits struct {
	// Static after newLimits.
	addrRate, addrBurst     float64
	secretRate, secretBurst float64
	max                     int
	keyRate, keyBurst       []float64 // per Server.keys index

	mu      sync.Mutex
	keys    []bucket                 // per Server.keys index; guarded by mu
	addrs   table[netip.Prefix]      // guarded by mu
	secrets table[[secretIDLen]byte] // guarded by mu
	// tenants aggregate secrets when the secret table is full; guarded by mu.
	tenants table[string]
}

func newLimits(cfg *Config, keys []APIKey) *limits {
	l := &limits{
		addrRate: cfg.RatePerSecond, addrBurst: float64(cfg.RateBurst),
		secretRate: cfg.SecretRatePerSecond, secretBurst: float64(cfg.SecretRateBurst),
		max:     cfg.MaxLimiters,
		keys:    make([]bucket, len(keys)),
		addrs:   table[netip.Prefix]{m: map[netip.Prefix]bucket{}},
		secrets: table[[secretIDLen]byte]{m: map[[secretIDLen]byte]bucket{}},
		tenants: table[string]{m: map[string]bucket{}},
	}
	for _, k := range keys {
		l.keyRate = append(l.keyRate, k.RatePerSecond)
		l.keyBurst = append(l.keyBurst, float64(k.RateBurst))
	}
	return l
}

func (l *limits) allowKey(i int, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keys[i].take(now.UnixNano(), l.keyRate[i], l.keyBurst[i])
}

// allowSecret limits one client secret; when the table is full, new
// secrets share their tenant's bucket (with room for 16 secrets' bursts).
func (l *limits) allowSecret(c secretClaims, now time.Time) bool {
	n := now.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.secrets.sweep(n)
	if _, ok := l.secrets.m[c.id]; ok || len(l.secrets.m) < l.max {
		return l.secrets.take(c.id, n, l.secretRate, l.secretBurst)
	}
	l.tenants.sweep(n)
	return l.tenants.take(c.tenant, n, 16*l.secretRate, 16*l.secretBurst)
}

// allowAddr limits a client address: at its own key (IPv4 address, IPv6
// /64) while the table has room, else at the narrowest aggregate that
// already has a bucket or still has room.
func (l *limits) allowAddr(ip netip.Addr, now time.Time) bool {
	ip = ip.Unmap()
	levels := v6Levels[:]
	if ip.Is4() {
		levels = v4Levels[:]
	}
	n := now.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addrs.sweep(n)
	scale := 1.0
	for i, bits := range levels {
		p, err := ip.Prefix(bits)
		if err != nil { // the invalid Addr of an unparsable peer
			p = netip.Prefix{}
		}
		_, have := l.addrs.m[p]
		if have || i == len(levels)-1 || float64(len(l.addrs.m)) < levelShare[i]*float64(l.max) {
			return l.addrs.take(p, n, scale*l.addrRate, scale*l.addrBurst)
		}
		scale *= 4
	}
	return false // not reached: the last level always answers
}
