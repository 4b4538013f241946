package routecache

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Recovery at scale. A restarted replica of a busy POP must not restore its
// flows one lookup at a time behind one rate limit: it loads every entry
// of the POP's cache in bulk at start (Load), before it reports ready; and
// lookups for unknown sources are budgeted per source prefix as well as in
// total, so a flood of RTP-looking datagrams from one network cannot use up
// the budget everyone else's recovery needs.

// Loader is implemented by caches that can hand over all their entries at
// once (Redis and Memory).
type Loader interface {
	// Load calls Config.OnFound for every live entry and returns how many
	// it found. It blocks (a few round trips per thousand entries), so it
	// is for start-up, not for the packet path; ctx bounds it.
	Load(ctx context.Context) (int, error)
}

var (
	_ Loader = (*Redis)(nil)
	_ Loader = (*Memory)(nil)
)

// loadPage is how many keys one SCAN asks for and one MGET fetches.
const loadPage = 1000

// loadRoundTrip bounds each round trip of a Load (the cache's own Timeout
// is for single small pipelines; a page of a thousand values on a loaded
// machine takes longer).
const loadRoundTrip = 2 * time.Second

// loadClient returns the client a Load's round trips use: c with read and
// write timeouts of loadRoundTrip, on the same connection pool. go-redis
// bounds a round trip by the smaller of the context's deadline and the
// client's read timeout (the cache's Timeout, 100 ms by default), so the
// load's context alone cannot give a page more time.
func loadClient(c redis.UniversalClient) redis.UniversalClient {
	if c, ok := c.(*redis.Client); ok {
		return c.WithTimeout(loadRoundTrip)
	}
	return c // a cluster or ring client: its own timeouts apply
}

// Load implements Loader: SCAN for the key prefix, one MGET per page, with
// the next page's SCAN in the same pipeline as this page's MGET.
func (c *Redis) Load(ctx context.Context) (int, error) { return c.e.load(ctx) }

// Load implements Loader.
func (c *Memory) Load(ctx context.Context) (int, error) { return c.e.load(ctx) }

// scanner is a backend that can list its entries.
type scanner interface {
	scan(ctx context.Context, found func(netip.AddrPort, Route)) error
}

func (e *engine) load(ctx context.Context) (int, error) {
	s, ok := e.be.(scanner)
	if !ok {
		return 0, errors.New("routecache: this backend cannot load in bulk")
	}
	start := time.Now()
	n := 0
	err := s.scan(ctx, func(a netip.AddrPort, r Route) {
		n++
		if e.cfg.OnFound != nil {
			e.cfg.OnFound(a, r)
		}
	})
	e.loaded.Add(uint64(n))
	e.setUp(err)
	if err != nil {
		return n, fmt.Errorf("routecache: load: %w", err)
	}
	e.log.Info("route cache loaded", "entries", n, "took", time.Since(start).Round(time.Millisecond))
	return n, nil
}

func (b *redisBackend) scan(ctx context.Context, found func(netip.AddrPort, Route)) error {
	match := b.prefix + "*"
	client := loadClient(b.client)
	rctx, cancel := context.WithTimeout(ctx, loadRoundTrip)
	keys, cursor, err := client.Scan(rctx, 0, match, loadPage).Result()
	cancel()
	if err != nil {
		return fmt.Errorf("redis scan: %w", err)
	}
	for {
		var vals *redis.SliceCmd
		var next *redis.ScanCmd
		rctx, cancel := context.WithTimeout(ctx, loadRoundTrip)
		pipe := client.Pipeline()
		if len(keys) > 0 {
			vals = pipe.MGet(rctx, keys...)
		}
		if cursor != 0 {
			next = pipe.Scan(rctx, cursor, match, loadPage)
		}
		if vals == nil && next == nil {
			cancel()
			return nil
		}
		_, err := pipe.Exec(rctx)
		cancel()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("redis scan/mget: %w", err)
		}
		if vals != nil {
			for i, v := range vals.Val() {
				s, ok := v.(string)
				if !ok {
					continue // expired between SCAN and MGET
				}
				a, err := netip.ParseAddrPort(strings.TrimPrefix(keys[i], b.prefix))
				if err != nil {
					continue
				}
				if r, err := decodeRoute([]byte(s)); err == nil {
					found(a, r)
				}
			}
		}
		if next == nil {
			return nil
		}
		keys, cursor = next.Val()
	}
}

func (b *memoryBackend) scan(_ context.Context, found func(netip.AddrPort, Route)) error {
	now := b.now()
	s := b.store
	s.mu.Lock()
	live := make(map[netip.AddrPort]Route, len(s.m))
	for a, e := range s.m {
		if now.Before(e.expires) {
			live[a] = e.route
		}
	}
	s.mu.Unlock()
	for a, r := range live {
		found(a, r)
	}
	return nil
}

// Per-prefix lookup budget: a fixed table of token buckets indexed by a
// hash of the source's /24 (IPv4) or /48 (IPv6), so the callers' path
// allocates nothing and the table cannot grow. Prefixes that share a
// bucket share its budget.
const (
	prefixBuckets = 4096
	prefixBits4   = 24
	prefixBits6   = 48
)

// prefixBudget is guarded by the engine's mu.
type prefixBudget struct {
	rate, burst float64
	seed        maphash.Seed
	tokens      [prefixBuckets]float64
	last        [prefixBuckets]int64 // unix nanos of the last refill
}

func newPrefixBudget(rate float64) *prefixBudget {
	return &prefixBudget{rate: rate, burst: max(rate, 1), seed: maphash.MakeSeed()}
}

// bucket is the index of a's prefix bucket. The seed is random per cache,
// so which prefixes share a bucket differs from replica to replica and
// cannot be chosen by a sender.
func (p *prefixBudget) bucket(a netip.Addr) uint64 {
	bits := prefixBits6
	if a.Is4() {
		bits = prefixBits4
	}
	pfx, _ := a.Prefix(bits)
	b := pfx.Addr().As16()
	return maphash.Bytes(p.seed, b[:]) % prefixBuckets
}

// allow takes one token from a's prefix bucket at now (unix nanos).
func (p *prefixBudget) allow(a netip.Addr, now int64) bool {
	i := p.bucket(a)
	if p.last[i] == 0 {
		p.tokens[i] = p.burst
	} else if dt := now - p.last[i]; dt > 0 {
		p.tokens[i] = min(p.burst, p.tokens[i]+p.rate*float64(dt)/1e9)
	}
	p.last[i] = now
	if p.tokens[i] < 1 {
		return false
	}
	p.tokens[i]--
	return true
}

// refund gives back the token allow took for a lookup that did not happen
// (the global budget refused it): a flood spoofed across many prefixes must
// not spend the budgets of prefixes whose lookups never went out.
func (p *prefixBudget) refund(a netip.Addr) {
	i := p.bucket(a)
	p.tokens[i] = min(p.burst, p.tokens[i]+1)
}
