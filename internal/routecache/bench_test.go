package routecache

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/testredis"
)

// runB starts c's workers until the end of the benchmark.
func runB(b *testing.B, c Cache) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-errc
		_ = c.Close()
	})
}

func benchAddrs(n int) []netip.AddrPort {
	a := make([]netip.AddrPort, n)
	for i := range a {
		a[i] = addr(i)
	}
	return a
}

// emptyQueues stands in for the workers between timed stretches: it
// empties the queues and the in-flight table without a store behind them,
// so the benchmarks below time the callers' side only.
func emptyQueues(e *engine) {
	for {
		select {
		case <-e.writes:
		case a := <-e.lookups:
			e.mu.Lock()
			delete(e.inflight, a)
			e.mu.Unlock()
		default:
			return
		}
	}
}

// benchEnqueue times call(i) for b.N values of i, emptying the queues with
// the timer stopped before they fill, so that every call enqueues.
func benchEnqueue(b *testing.B, c *Memory, call func(i int)) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%DefaultQueueLen == 0 {
			b.StopTimer()
			emptyQueues(c.e)
			b.StartTimer()
		}
		call(i)
	}
	b.StopTimer()
	if s := c.Stats(); s.WritesDropped+s.LookupsDropped+s.LookupsCoalesced+s.LookupsRateLimited > 0 {
		b.Fatalf("stats %+v; want every call enqueued", s)
	}
}

// BenchmarkStore is the callers' cost of Store: what the packet path pays
// when it creates a flow, with room in the queue ("enqueued") and, from all
// cores at once, with the queue full ("dropped").
func BenchmarkStore(b *testing.B) {
	addrs := benchAddrs(DefaultQueueLen)
	b.Run("enqueued", func(b *testing.B) {
		c := NewMemory(Config{})
		b.Cleanup(func() { _ = c.Close() })
		benchEnqueue(b, c, func(i int) { c.Store(addrs[i%len(addrs)], Route{Cluster: 1, Pod: 2}) })
	})
	b.Run("dropped", func(b *testing.B) {
		c := NewMemory(Config{QueueLen: 1})
		b.Cleanup(func() { _ = c.Close() })
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				c.Store(addrs[i%len(addrs)], Route{Cluster: 1, Pod: 2})
			}
		})
	})
}

// BenchmarkLookup is the callers' cost of Lookup: rate limiter, in-flight
// table and queue, for a new address ("enqueued"), one already in flight
// ("coalesced", past the waiter cap so that no list grows), and over the
// rate ("rate_limited").
func BenchmarkLookup(b *testing.B) {
	addrs := benchAddrs(DefaultQueueLen)
	done := func(Route) {}
	b.Run("enqueued", func(b *testing.B) {
		c := NewMemory(Config{LookupsPerSec: 1e12})
		b.Cleanup(func() { _ = c.Close() })
		benchEnqueue(b, c, func(i int) { c.Lookup(addrs[i%len(addrs)], done) })
	})
	for _, tc := range []struct {
		name string
		cfg  Config
		addr func(i int) netip.AddrPort
	}{
		{"coalesced", Config{LookupsPerSec: 1e12}, func(int) netip.AddrPort { return addrs[0] }},
		{"rate_limited", Config{LookupsPerSec: 1}, func(i int) netip.AddrPort { return addrs[i%len(addrs)] }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := NewMemory(tc.cfg)
			b.Cleanup(func() { _ = c.Close() })
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				c.Lookup(tc.addr(i), done)
			}
		})
	}
}

// BenchmarkRedisWrites is write throughput against a real redis-server on
// loopback: stores are enqueued as fast as the queue takes them and the
// benchmark ends when Redis has answered all of them.
func BenchmarkRedisWrites(b *testing.B) {
	srv := testredis.Start(b)
	c, err := Open(srv.URL(), Config{})
	if err != nil {
		b.Fatal(err)
	}
	runB(b, c)
	addrs := benchAddrs(1 << 16)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		c.Store(addrs[i%len(addrs)], Route{Cluster: 1, Pod: uint16(i)})
		if i%DefaultQueueLen == DefaultQueueLen-1 { // keep the queue from overflowing
			if err := c.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := c.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	s := c.Stats()
	if s.WritesError+s.WritesDropped > 0 {
		b.Fatalf("stats %+v; want every write ok", s)
	}
	b.ReportMetric(float64(s.WritesOK)/elapsed.Seconds(), "writes/s")
	b.ReportMetric(float64(s.WritesOK)/float64(max(s.WriteRoundTrips, 1)), "writes/roundtrip")
}

// BenchmarkRedisLookups is lookup throughput against a real redis-server:
// batches of distinct addresses, each batch awaited.
func BenchmarkRedisLookups(b *testing.B) {
	srv := testredis.Start(b)
	c, err := Open(srv.URL(), Config{LookupsPerSec: 1e12})
	if err != nil {
		b.Fatal(err)
	}
	const batch = 1024
	answered := make(chan struct{}, 1)
	e := engineOf(c)
	e.afterLookups = func() {
		select {
		case answered <- struct{}{}:
		default:
		}
	}
	runB(b, c)
	addrs := benchAddrs(batch)
	for _, a := range addrs {
		c.Store(a, Route{Cluster: 1, Pod: 1})
	}
	if err := c.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	done := func(Route) {}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var want uint64
	for i := 0; b.Loop(); i++ {
		c.Lookup(addrs[i%batch], done)
		want++
		if i%batch == batch-1 {
			for s := c.Stats(); s.LookupsHit+s.LookupsCoalesced < want; s = c.Stats() {
				<-answered
			}
		}
	}
	for s := c.Stats(); s.LookupsHit+s.LookupsCoalesced < want; s = c.Stats() {
		<-answered
	}
	elapsed := time.Since(start)
	b.StopTimer()
	s := c.Stats()
	b.ReportMetric(float64(s.LookupsHit)/elapsed.Seconds(), "hits/s")
	b.ReportMetric(float64(s.LookupsHit)/float64(max(s.LookupRoundTrips, 1)), "lookups/roundtrip")
}

// BenchmarkRedisLoad is a starting replica's bulk load (Load) of 100,000
// entries from a real redis-server: the time per load, and its round
// trips.
func BenchmarkRedisLoad(b *testing.B) {
	const n = 100_000
	srv := testredis.Start(b)
	w, err := Open(srv.URL(), Config{})
	if err != nil {
		b.Fatal(err)
	}
	runB(b, w)
	for i := range n {
		w.Store(addr(i), Route{Cluster: 1, Pod: uint16(i), KeyID: 1, Tag: uint64(i)})
		if i%4096 == 4095 {
			if err := w.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := w.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	found := 0
	c, err := Open(srv.URL(), Config{Logger: slog.New(slog.DiscardHandler), OnFound: func(netip.AddrPort, Route) { found++ }})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	for b.Loop() {
		found = 0
		k, err := c.(Loader).Load(context.Background())
		if err != nil || k != n || found != n {
			b.Fatalf("loaded %d (%d found), %v; want %d", k, found, err, n)
		}
	}
	b.ReportMetric(float64(n), "entries/op")
}
