package routecache

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// Memory is a Cache over an in-process table, for the dev world and tests.
// It has the same queues, batching, coalescing, rate limit and counters as
// Redis, so a relay behaves the same over either; several Memory caches on
// one MemoryStore behave like replicas sharing one Redis.
type Memory struct {
	e     *engine
	store *MemoryStore
}

var _ Cache = (*Memory)(nil)

// NewMemory returns a cache over a new MemoryStore of its own. It does not
// fail: invalid Config fields fall back to their defaults and a metrics
// registration error leaves the cache unregistered, each with an error
// logged (NewMemoryOn returns such errors instead).
func NewMemory(cfg Config) *Memory {
	store := NewMemoryStore()
	m, err := NewMemoryOn(store, cfg)
	if err == nil {
		return m
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log.Error("routecache: memory cache: falling back", "err", err)
	cfg = cfg.sanitized()
	if m, err = NewMemoryOn(store, cfg); err == nil {
		return m
	}
	cfg.Registerer = nil
	m, err = NewMemoryOn(store, cfg)
	if err != nil {
		panic(err) // unreachable: a sanitized config without metrics is valid
	}
	return m
}

// NewMemoryOn returns a cache over store, which other caches may share.
func NewMemoryOn(store *MemoryStore, cfg Config) (*Memory, error) {
	full, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e, err := newEngine(cfg, &memoryBackend{store: store, ttl: full.TTL, now: full.Now}, "memory")
	if err != nil {
		return nil, err
	}
	e.up.Store(1)
	return &Memory{e: e, store: store}, nil
}

// MemoryStore returns the table the cache writes to.
func (c *Memory) MemoryStore() *MemoryStore { return c.store }

// Store implements Cache.
func (c *Memory) Store(client netip.AddrPort, r Route) { c.e.store(client, r) }

// Lookup implements Cache.
func (c *Memory) Lookup(client netip.AddrPort, done func(Route)) { c.e.lookup(client, done) }

// Delete implements Cache.
func (c *Memory) Delete(client netip.AddrPort) { c.e.delete(client) }

// Flush implements Cache.
func (c *Memory) Flush(ctx context.Context) error { return c.e.flush(ctx) }

// Stats implements Cache.
func (c *Memory) Stats() Stats { return c.e.stats() }

// Run implements Cache.
func (c *Memory) Run(ctx context.Context) error { return c.e.run(ctx) }

// Close implements Cache.
func (c *Memory) Close() error { return c.e.close() }

// MemoryStore is an in-process route table with per-entry expiry, safe for
// concurrent use. Expired entries are invisible at once and removed by a
// sweep at most once per TTL of the writer that triggers it, so the table
// holds at most about two TTLs' worth of writes.
type MemoryStore struct {
	mu        sync.Mutex
	m         map[netip.AddrPort]memEntry
	lastSweep time.Time
}

type memEntry struct {
	route   Route
	expires time.Time
}

// NewMemoryStore returns an empty table.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{m: make(map[netip.AddrPort]memEntry)}
}

// Len returns the number of entries, expired ones not yet swept included.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// TTL returns the time left before client's entry expires, and false if
// there is no live entry (like Redis's TTL command, for tests).
func (s *MemoryStore) TTL(client netip.AddrPort, now time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[canonical(client)]
	if !ok || !now.Before(e.expires) {
		return 0, false
	}
	return e.expires.Sub(now), true
}

type memoryBackend struct {
	store *MemoryStore
	ttl   time.Duration
	now   func() time.Time
}

func (b *memoryBackend) write(_ context.Context, ops []writeOp) (int, error) {
	now := b.now()
	s := b.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, op := range ops {
		if op.del {
			delete(s.m, op.client)
		} else {
			s.m[op.client] = memEntry{route: op.route, expires: now.Add(b.ttl)}
		}
	}
	if now.Sub(s.lastSweep) >= b.ttl {
		s.lastSweep = now
		for a, e := range s.m {
			if !now.Before(e.expires) {
				delete(s.m, a)
			}
		}
	}
	return 0, nil
}

func (b *memoryBackend) get(_ context.Context, keys []netip.AddrPort, out []getResult) error {
	now := b.now()
	s := b.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, a := range keys {
		if e, ok := s.m[a]; ok && now.Before(e.expires) {
			out[i] = getResult{route: e.route, result: lookupHit}
		} else {
			out[i] = getResult{result: lookupMiss}
		}
	}
	return nil
}
