package routecache

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/testredis"
)

// TestLoad: a new replica gets every live entry of the shared store in
// bulk through OnFound (several SCAN pages with Redis); entries under
// another key prefix are not among them.
func TestLoad(t *testing.T) {
	const n = 2500 // > 2 SCAN pages
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			w := im.newWorld(t)
			writer := w.replica(t, Config{})
			run(t, writer)
			want := map[netip.AddrPort]Route{}
			for i := range n {
				r := Route{Cluster: uint16(1 + i%7), Pod: uint16(i % 300), KeyID: 1, Tag: uint64(i)}
				writer.Store(addr(i), r)
				want[addr(i)] = r
			}
			flush(t, writer)
			if im.name == "redis" { // the in-process store has no key prefix
				other := w.replica(t, Config{KeyPrefix: "other:"})
				run(t, other)
				other.Store(addr(n+1), Route{Cluster: 9})
				flush(t, other)
			}

			var mu sync.Mutex
			got := map[netip.AddrPort]Route{}
			fresh := w.replica(t, Config{OnFound: func(a netip.AddrPort, r Route) {
				mu.Lock()
				got[a] = r
				mu.Unlock()
			}})
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			start := time.Now()
			k, err := fresh.(Loader).Load(ctx)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			t.Logf("%s: loaded %d entries in %v", im.name, k, time.Since(start))
			mu.Lock()
			defer mu.Unlock()
			if k != n || len(got) != n {
				t.Fatalf("Load found %d (%d distinct), want %d", k, len(got), n)
			}
			for a, r := range want {
				if got[a] != r {
					t.Fatalf("entry %v = %+v, want %+v", a, got[a], r)
				}
			}
			if s := fresh.Stats(); s.Loaded != n {
				t.Errorf("Stats.Loaded = %d, want %d", s.Loaded, n)
			}
		})
	}
}

// TestLoadOutlastsSlowRoundTrip: a bulk load whose round trips take longer
// than the cache's Timeout (100 ms, for the packet path's small pipelines)
// still completes: each page has loadRoundTrip. Here Redis freezes for
// 300 ms while the first page is being handed over, as a loaded machine
// would deschedule it. (go-redis bounds a round trip by the smaller of the
// context deadline and its read timeout, so the load's own deadline alone
// did not help: the load failed with an i/o timeout.)
func TestLoadOutlastsSlowRoundTrip(t *testing.T) {
	const n = 5000 // several SCAN pages after the first
	w := &redisWorld{srv: testredis.Start(t)}
	writer := w.replica(t, Config{})
	run(t, writer)
	for i := range n {
		writer.Store(addr(i), Route{Cluster: 1, Pod: uint16(i), KeyID: 1, Tag: uint64(i)})
		if i%1000 == 999 { // within the write queue
			flush(t, writer)
		}
	}
	flush(t, writer)

	var once sync.Once
	resumed := make(chan struct{})
	got := 0
	fresh := w.replica(t, Config{OnFound: func(netip.AddrPort, Route) {
		got++
		once.Do(func() {
			w.srv.Pause()
			time.AfterFunc(300*time.Millisecond, func() { w.srv.Resume(); close(resumed) })
		})
	}})
	defer func() { <-resumed }()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	start := time.Now()
	k, err := fresh.(Loader).Load(ctx)
	t.Logf("loaded %d entries in %v with Redis frozen for 300 ms", k, time.Since(start))
	if err != nil {
		t.Fatalf("Load with one slow round trip: %v", err)
	}
	if k != n || got != n {
		t.Fatalf("Load found %d (%d handed over), want %d", k, got, n)
	}
}

// TestPrefixBudget: a flood of lookups from one /24 spends only that
// prefix's share; lookups from other prefixes still get through, and the
// refused ones are counted as prefix_limited.
//
// Prefixes share budgets by a seeded hash (prefixBuckets buckets), so the
// test picks its other prefixes among those whose bucket is not the
// flood's: with 200 arbitrary prefixes one of them shares the flood's
// bucket about one run in twenty, and is rightly refused. That a prefix
// sharing the flood's bucket shares its budget is asserted too.
func TestPrefixBudget(t *testing.T) {
	now := time.Unix(1000, 0)
	c := NewMemory(Config{LookupsPerSec: 10000, PrefixLookupsPerSec: 100, QueueLen: 20000, Now: func() time.Time { return now }})
	defer c.Close()
	flood := netip.MustParseAddr("198.51.100.7")
	budget := c.e.prefix
	floodBucket := budget.bucket(flood)

	// 200 prefixes in buckets of their own, and one in the flood's.
	var others []netip.Addr
	seen := map[uint64]bool{floodBucket: true}
	var sharing netip.Addr
	for i := 0; i < 1<<20 && (len(others) < 200 || !sharing.IsValid()); i++ {
		a := netip.AddrFrom4([4]byte{byte(1 + i>>16), byte(i >> 8), byte(i), 1})
		switch b := budget.bucket(a); {
		case b == floodBucket && !sharing.IsValid():
			sharing = a
		case !seen[b] && len(others) < 200:
			seen[b] = true
			others = append(others, a)
		}
	}
	if len(others) < 200 || !sharing.IsValid() {
		t.Fatalf("found %d prefixes in buckets of their own and sharing=%v among 2^20 prefixes", len(others), sharing)
	}

	for port := range 5000 {
		c.Lookup(netip.AddrPortFrom(flood, uint16(1000+port)), nil)
	}
	s := c.Stats()
	if s.QueuedLookups != 100 || s.LookupsPrefixLimited != 4900 {
		t.Fatalf("flood from one /24: %d queued, %d prefix-limited; want 100 and 4900", s.QueuedLookups, s.LookupsPrefixLimited)
	}
	for _, a := range others {
		c.Lookup(netip.AddrPortFrom(a, 5000), nil)
	}
	if s := c.Stats(); s.QueuedLookups != 300 || s.LookupsPrefixLimited != 4900 {
		t.Errorf("200 lookups from 200 other prefixes during the flood: %d queued in all, %d prefix-limited; want 300 and 4900", s.QueuedLookups, s.LookupsPrefixLimited)
	}
	// A prefix hashed to the flood's bucket shares its (spent) budget.
	c.Lookup(netip.AddrPortFrom(sharing, 5000), nil)
	if s := c.Stats(); s.QueuedLookups != 300 || s.LookupsPrefixLimited != 4901 {
		t.Errorf("a lookup from %v, which shares the flood's bucket: %d queued, %d prefix-limited; want 300 and 4901", sharing, s.QueuedLookups, s.LookupsPrefixLimited)
	}
	// The prefix's budget refills at its rate.
	now = now.Add(100 * time.Millisecond)
	for port := range 50 {
		c.Lookup(netip.AddrPortFrom(flood, uint16(9000+port)), nil)
	}
	if s := c.Stats(); s.QueuedLookups != 310 {
		t.Errorf("100 ms later the flooding prefix got %d more lookups, want 10", s.QueuedLookups-300)
	}
}
