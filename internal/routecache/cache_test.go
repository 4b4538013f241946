package routecache

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestBehaviour runs the behaviour both implementations share, each case
// on a fresh store (a fresh redis-server for Redis).
func TestBehaviour(t *testing.T) {
	x := netip.MustParseAddrPort("203.0.113.7:50000")
	r1, r2 := Route{Cluster: 3, Pod: 17}, Route{Cluster: 4, Pod: 65535}
	cases := []struct {
		name string
		test func(t *testing.T, w world)
	}{
		{"store then lookup from another replica", func(t *testing.T, w world) {
			a, b := w.replica(t, Config{}), w.replica(t, Config{})
			run(t, a)
			run(t, b)
			a.Store(x, r1)
			flush(t, a)
			if got, ok := lookup(t, b, x); !ok || got != r1 {
				t.Fatalf("lookup = %v, %v; want %v, true", got, ok, r1)
			}
			if s := b.Stats(); s.LookupsHit != 1 || s.LookupRoundTrips != 1 || !s.Up {
				t.Fatalf("stats %+v; want 1 hit in 1 round trip, up", s)
			}
			if s := a.Stats(); s.WritesOK != 1 || s.WriteRoundTrips != 1 {
				t.Fatalf("writer stats %+v; want 1 write in 1 round trip", s)
			}
		}},
		{"miss calls nothing", func(t *testing.T, w world) {
			c := w.replica(t, Config{})
			run(t, c)
			if got, ok := lookup(t, c, x); ok {
				t.Fatalf("lookup of unknown address = %v", got)
			}
			if s := c.Stats(); s.LookupsMiss != 1 || s.LookupsHit != 0 {
				t.Fatalf("stats %+v; want 1 miss", s)
			}
		}},
		{"later store replaces", func(t *testing.T, w world) {
			c := w.replica(t, Config{})
			run(t, c)
			c.Store(x, r1)
			c.Store(x, r2)
			flush(t, c)
			if got, ok := lookup(t, c, x); !ok || got != r2 {
				t.Fatalf("lookup = %v, %v; want %v", got, ok, r2)
			}
		}},
		{"delete", func(t *testing.T, w world) {
			c := w.replica(t, Config{})
			run(t, c)
			c.Store(x, r1)
			c.Delete(x)
			flush(t, c)
			if got, ok := lookup(t, c, x); ok {
				t.Fatalf("lookup after delete = %v", got)
			}
			if s := c.Stats(); s.WritesOK != 2 {
				t.Fatalf("stats %+v; want 2 writes ok (store, delete)", s)
			}
		}},
		{"IPv4-mapped address is the IPv4 address", func(t *testing.T, w world) {
			c := w.replica(t, Config{})
			run(t, c)
			mapped := netip.AddrPortFrom(netip.AddrFrom16(x.Addr().As16()), x.Port())
			c.Store(mapped, r1)
			flush(t, c)
			if got, ok := lookup(t, c, x); !ok || got != r1 {
				t.Fatalf("lookup = %v, %v; want %v", got, ok, r1)
			}
		}},
		{"IPv6 address", func(t *testing.T, w world) {
			c := w.replica(t, Config{})
			run(t, c)
			v6 := netip.MustParseAddrPort("[2001:db8::1]:3478")
			c.Store(v6, r2)
			flush(t, c)
			if got, ok := lookup(t, c, v6); !ok || got != r2 {
				t.Fatalf("lookup = %v, %v; want %v", got, ok, r2)
			}
		}},
		{"full queues drop and count", func(t *testing.T, w world) {
			const n, queue = 20, 8
			c := w.replica(t, Config{QueueLen: queue, BatchMax: 4})
			for i := range n { // not running: nothing leaves the queues
				c.Store(addr(i), r1)
				c.Lookup(addr(i), nil)
			}
			s := c.Stats()
			if s.WritesDropped != n-queue || s.QueuedWrites != queue || s.LookupsDropped != n-queue || s.QueuedLookups != queue {
				t.Fatalf("stats %+v; want %d of %d writes and lookups dropped", s, n-queue, n)
			}
			run(t, c)
			flush(t, c)
			awaitStats(t, c, func(s Stats) bool { return answered(s) == queue })
			if s := c.Stats(); s.WritesOK != queue || s.WriteRoundTrips != queue/4 {
				t.Fatalf("stats %+v; want %d writes in %d round trips", s, queue, queue/4)
			}
		}},
		{"lookups over the rate are refused", func(t *testing.T, w world) {
			const rate, n = 5, 20
			now := time.Unix(1e9, 0) // a stopped clock: no tokens come back
			c := w.replica(t, Config{LookupsPerSec: rate, Now: func() time.Time { return now }})
			for i := range n {
				c.Lookup(addr(i), nil)
			}
			if s := c.Stats(); s.LookupsRateLimited != n-rate || s.QueuedLookups != rate {
				t.Fatalf("stats %+v; want %d rate limited, %d queued", s, n-rate, rate)
			}
		}},
		{"duplicate lookups in flight are coalesced", func(t *testing.T, w world) {
			a, b := w.replica(t, Config{}), w.replica(t, Config{})
			run(t, a)
			a.Store(x, r1)
			flush(t, a)
			var mu sync.Mutex
			var got []Route
			for range 3 { // b is not running yet: the first stays in flight
				b.Lookup(x, func(r Route) { mu.Lock(); got = append(got, r); mu.Unlock() })
			}
			if s := b.Stats(); s.QueuedLookups != 1 || s.LookupsCoalesced != 2 {
				t.Fatalf("stats %+v; want 1 queued, 2 coalesced", s)
			}
			run(t, b)
			awaitStats(t, b, func(s Stats) bool { return answered(s) == 1 })
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 3 || got[0] != r1 || got[1] != r1 || got[2] != r1 {
				t.Fatalf("callbacks got %v; want %v three times", got, r1)
			}
			if s := b.Stats(); s.LookupsHit != 1 {
				t.Fatalf("stats %+v; want the one request sent to hit", s)
			}
		}},
		{"OnFound gets the address of each hit", func(t *testing.T, w world) {
			a := w.replica(t, Config{})
			found := make(chan netip.AddrPort, 2)
			b := w.replica(t, Config{OnFound: func(c netip.AddrPort, r Route) {
				if r != r1 {
					t.Errorf("OnFound(%v, %v); want route %v", c, r, r1)
				}
				found <- c
			}})
			run(t, a)
			run(t, b)
			a.Store(x, r1)
			flush(t, a)
			lookup(t, b, addr(1)) // a miss: no call
			b.Lookup(x, nil)
			b.Lookup(x, nil) // coalesced or a second request: at most one call each
			awaitStats(t, b, func(s Stats) bool { return s.LookupsHit+s.LookupsCoalesced == 2 })
			hits, n := b.Stats().LookupsHit, len(found)
			if n != int(hits) || (<-found) != x {
				t.Fatalf("OnFound called %d times for %d hits; want once per hit, for %v", n, hits, x)
			}
		}},
		{"coalescing is bounded", func(t *testing.T, w world) {
			c := w.replica(t, Config{})
			for range 1 + maxWaiters + 5 {
				c.Lookup(x, func(Route) {})
			}
			if s := c.Stats(); s.LookupsCoalesced != maxWaiters || s.LookupsDropped != 5 {
				t.Fatalf("stats %+v; want %d coalesced, 5 dropped", s, maxWaiters)
			}
		}},
		{"batches hold at most BatchMax writes", func(t *testing.T, w world) {
			const n, batch = 95, 10
			c := w.replica(t, Config{BatchMax: batch, QueueLen: 128})
			for i := range n {
				c.Store(addr(i), r1)
			}
			run(t, c)
			flush(t, c)
			if s := c.Stats(); s.WritesOK != n || s.WriteRoundTrips != (n+batch-1)/batch {
				t.Fatalf("stats %+v; want %d writes in %d round trips", s, n, (n+batch-1)/batch)
			}
		}},
		{"after Close work is dropped", func(t *testing.T, w world) {
			c := w.replica(t, Config{})
			run(t, c)
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			c.Store(x, r1)
			c.Delete(x)
			c.Lookup(x, func(Route) { t.Error("callback after Close") })
			if s := c.Stats(); s.WritesDropped != 2 || s.LookupsDropped != 1 {
				t.Fatalf("stats %+v; want 2 writes and 1 lookup dropped", s)
			}
			if err := c.Flush(context.Background()); !errors.Is(err, ErrClosed) {
				t.Fatalf("Flush after Close = %v; want ErrClosed", err)
			}
			if err := c.Run(context.Background()); err != nil {
				t.Fatalf("Run after Close = %v; want nil", err)
			}
		}},
		{"second Run is refused", func(t *testing.T, w world) {
			c := w.replica(t, Config{})
			run(t, c)
			flush(t, c) // the first Run's workers are up
			if err := c.Run(context.Background()); !errors.Is(err, ErrRunning) {
				t.Fatalf("second Run = %v; want ErrRunning", err)
			}
		}},
		{"metrics exist at zero and count", func(t *testing.T, w world) {
			reg := prometheus.NewRegistry()
			c := w.replica(t, Config{Registerer: reg})
			for _, s := range []struct {
				name   string
				labels []string // values of the one label
				key    string
			}{
				{"rtcedge_routecache_writes_total", []string{"ok", "error", "dropped"}, "result"},
				{"rtcedge_routecache_lookups_total", []string{"hit", "miss", "error", "dropped", "rate_limited", "coalesced"}, "result"},
				{"rtcedge_routecache_round_trip_seconds", []string{"write", "lookup"}, "op"},
				{"rtcedge_routecache_queue_depth", []string{"writes", "lookups"}, "queue"},
			} {
				for _, l := range s.labels {
					if v, ok := metricValue(t, reg, s.name, map[string]string{s.key: l}); !ok || v != 0 {
						t.Errorf("%s{%s=%q} = %v, %v; want 0, present", s.name, s.key, l, v, ok)
					}
				}
			}
			if _, ok := metricValue(t, reg, "rtcedge_routecache_redis_up", nil); !ok {
				t.Errorf("rtcedge_routecache_redis_up missing")
			}
			run(t, c)
			c.Store(x, r1)
			flush(t, c)
			lookup(t, c, x)
			for name, want := range map[string]float64{
				"rtcedge_routecache_writes_total":       1,
				"rtcedge_routecache_lookups_total":      1,
				"rtcedge_routecache_round_trip_seconds": 1,
				"rtcedge_routecache_redis_up":           1,
			} {
				labels := map[string]string{"result": "ok"}
				switch name {
				case "rtcedge_routecache_lookups_total":
					labels = map[string]string{"result": "hit"}
				case "rtcedge_routecache_round_trip_seconds":
					labels = map[string]string{"op": "write"}
				}
				if v, _ := metricValue(t, reg, name, labels); v != want {
					t.Errorf("%s%v = %v; want %v", name, labels, v, want)
				}
			}
			if _, err := NewMemoryOn(NewMemoryStore(), Config{Registerer: reg}); err == nil {
				t.Errorf("registering twice on one registry: no error")
			}
		}},
	}
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) { tc.test(t, im.newWorld(t)) })
			}
		})
	}
}

func TestConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero is all defaults", Config{}, true},
		{"TTL below a millisecond", Config{TTL: time.Microsecond}, false},
		{"negative TTL", Config{TTL: -time.Second}, false},
		{"negative queue", Config{QueueLen: -1}, false},
		{"negative rate", Config{LookupsPerSec: -1}, false},
		{"fractional rate", Config{LookupsPerSec: 0.5}, true},
		{"negative batch", Config{BatchMax: -1}, false},
		{"negative flush interval", Config{FlushInterval: -1}, false},
		{"negative timeout", Config{Timeout: -1}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewMemoryOn(NewMemoryStore(), tc.cfg)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Fatalf("NewMemoryOn(%+v) = %v; want ok=%v or ErrInvalidConfig", tc.cfg, err, tc.ok)
			}
			// NewMemory never fails: invalid fields fall back to defaults.
			m := NewMemory(tc.cfg)
			if err := m.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		})
	}
}

func TestOpen(t *testing.T) {
	cases := []struct {
		url     string
		wantErr error
		memory  bool
	}{
		{"", nil, true},
		{"redis://127.0.0.1:1/0", nil, false}, // no connection is made before Run
		{"unix:///nonexistent/redis.sock", nil, false},
		{"http://127.0.0.1:6379", ErrUnsupportedURL, false},
		{"redis://127.0.0.1:6379/notanumber", ErrUnsupportedURL, false},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			c, err := Open(tc.url, Config{})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Open(%q) error = %v; want %v", tc.url, err, tc.wantErr)
			}
			if err != nil {
				return
			}
			defer c.Close()
			if _, isMem := c.(*Memory); isMem != tc.memory {
				t.Fatalf("Open(%q) = %T", tc.url, c)
			}
		})
	}
}

// TestMemoryTTL checks expiry and refresh with a controlled clock.
func TestMemoryTTL(t *testing.T) {
	x := netip.MustParseAddrPort("192.0.2.1:4000")
	var mu sync.Mutex
	now := time.Unix(1e9, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	const ttl = time.Minute
	c, err := NewMemoryOn(NewMemoryStore(), Config{TTL: ttl, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	prepare(t, c)
	run(t, c)
	steps := []struct {
		name    string
		do      func()
		wantTTL time.Duration // 0: no entry
	}{
		{"stored", func() { c.Store(x, Route{Cluster: 1, Pod: 1}) }, ttl},
		{"half a TTL later", func() { advance(ttl / 2) }, ttl / 2},
		{"refreshed", func() { c.Store(x, Route{Cluster: 1, Pod: 1}) }, ttl},
		{"expired", func() { advance(ttl) }, 0},
	}
	for _, st := range steps {
		st.do()
		flush(t, c)
		got, ok := c.MemoryStore().TTL(x, clock())
		if got != st.wantTTL || ok != (st.wantTTL != 0) {
			t.Fatalf("%s: TTL = %v, %v; want %v", st.name, got, ok, st.wantTTL)
		}
	}
	if r, ok := lookup(t, c, x); ok {
		t.Fatalf("lookup of expired entry = %v", r)
	}
	c.Store(addr(1), Route{Cluster: 2, Pod: 2}) // a write after a TTL sweeps the expired entry
	flush(t, c)
	if n := c.MemoryStore().Len(); n != 1 {
		t.Fatalf("store holds %d entries after a sweep; want 1", n)
	}
}

// TestEnqueueDoesNotAllocate guards the callers' side: it runs on the
// packet path.
func TestEnqueueDoesNotAllocate(t *testing.T) {
	const n = 1000
	c := prepare(t, NewMemory(Config{QueueLen: 4 * n, LookupsPerSec: 1e9}))
	addrs := make([]netip.AddrPort, 2*n)
	for i := range addrs {
		addrs[i] = addr(i)
	}
	done := func(Route) {}
	i := 0
	cases := []struct {
		name string
		f    func()
	}{
		{"Store", func() { c.Store(addrs[i%len(addrs)], Route{Cluster: 1, Pod: 2}); i++ }},
		{"Delete", func() { c.Delete(addrs[i%len(addrs)]); i++ }},
		{"Lookup", func() { c.Lookup(addrs[i%n], done); i++ }},
		{"Lookup coalesced or dropped", func() { c.Lookup(addrs[0], done) }},
	}
	for _, tc := range cases {
		i = 0
		if a := testing.AllocsPerRun(n-1, tc.f); a != 0 {
			t.Errorf("%s: %v allocations per call; want 0", tc.name, a)
		}
	}
}

// TestGlobalLimitSpendsNoPrefixBudget: a lookup the global budget refuses
// gives its prefix's token back. A flood spoofed across many prefixes
// empties the global bucket; a legitimate /24 whose lookups were refused
// meanwhile must not find its own budget spent when the bucket refills.
func TestGlobalLimitSpendsNoPrefixBudget(t *testing.T) {
	now := time.Unix(1e9, 0)
	c := NewMemory(Config{LookupsPerSec: 10, PrefixLookupsPerSec: 5, Now: func() time.Time { return now }})
	defer c.Close()
	for i := range 10 { // spoofed: exhausts the global bucket
		c.Lookup(netip.MustParseAddrPort(fmt.Sprintf("203.0.%d.1:1", i)), nil)
	}
	for i := range 5 { // the victim's /24, refused by the global limit
		c.Lookup(netip.MustParseAddrPort(fmt.Sprintf("198.51.100.%d:1", i+1)), nil)
	}
	now = now.Add(500 * time.Millisecond) // the global bucket refills 5 tokens
	for i := range 3 {
		c.Lookup(netip.MustParseAddrPort(fmt.Sprintf("198.51.100.%d:1", 50+i)), nil)
	}
	if s := c.Stats(); s.LookupsPrefixLimited > 0 {
		t.Errorf("the victim's prefix was limited %d times, though none of its lookups had gone out", s.LookupsPrefixLimited)
	}
}
