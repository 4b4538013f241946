package routecache

import (
	"context"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/rtcedge/rtcedge/internal/testredis"
)

// adminClient is a separate connection for inspecting the server, as an
// operator would.
func adminClient(t *testing.T, srv *testredis.Server) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestRedisTTL(t *testing.T) {
	srv := testredis.Start(t)
	admin := adminClient(t, srv)
	ctx := context.Background()
	x := netip.MustParseAddrPort("203.0.113.9:6000")
	const ttl = 60 * time.Second
	c := w(t, srv, Config{TTL: ttl})
	run(t, c)

	key := DefaultKeyPrefix + "203.0.113.9:6000"
	c.Store(x, Route{Cluster: 0x0102, Pod: 0x0304, Token: [6]byte{5, 6, 7, 8, 9, 10}, Stored: 0x0c0d0e0f, KeyID: 11, Tag: 0x1213141516171819})
	flush(t, c)
	const want = "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0c\x0d\x0e\x0f\x0b\x12\x13\x14\x15\x16\x17\x18\x19"
	if v, err := admin.Get(ctx, key).Bytes(); err != nil || string(v) != want {
		t.Fatalf("GET %s = %q, %v; want %q (cluster, pod, token, stored, key ID, tag)", key, v, err, want)
	}
	steps := []struct {
		name string
		do   func()
		min  time.Duration // PTTL must lie in [min, ttl]
	}{
		{"stored with TTL", func() {}, ttl - 5*time.Second},
		{"shortened by an operator", func() { admin.PExpire(ctx, key, 5*time.Second) }, 0},
		{"refreshed by a later store", func() { c.Store(x, Route{Cluster: 0x0102, Pod: 0x0304}); flush(t, c) }, ttl - 5*time.Second},
	}
	for _, st := range steps {
		st.do()
		got, err := admin.PTTL(ctx, key).Result()
		if err != nil || got < st.min || got > ttl {
			t.Fatalf("%s: PTTL = %v, %v; want within [%v, %v]", st.name, got, err, st.min, ttl)
		}
		if st.min == 0 && got > 5*time.Second {
			t.Fatalf("%s: PTTL = %v; want ≤ 5s", st.name, got)
		}
	}
}

// w opens a Redis cache on srv, prepared for the helpers.
func w(t *testing.T, srv *testredis.Server, cfg Config) Cache {
	t.Helper()
	return (&redisWorld{srv: srv}).replica(t, cfg)
}

// pipelineCounter counts the pipelines a client sends.
type pipelineCounter struct {
	pipelines, cmds atomic.Int64
}

func (h *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func TestRedisPipelining(t *testing.T) {
	cases := []struct{ n, batchMax int }{
		{1, 256}, {256, 256}, {1000, 100}, {1000, 256}, {5000, 256},
	}
	for _, tc := range cases {
		t.Run(strconv.Itoa(tc.n)+"/"+strconv.Itoa(tc.batchMax), func(t *testing.T) {
			srv := testredis.Start(t)
			admin := adminClient(t, srv)
			opt, err := redis.ParseURL(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			// This test counts pipelines, not deadlines: a round trip slower
			// than the production 100 ms (-race on a loaded 2-core box) must
			// not turn into a write error.
			const timeout = 10 * time.Second
			applyClientDefaults(opt, Config{Timeout: timeout})
			client := redis.NewClient(opt)
			t.Cleanup(func() { _ = client.Close() })
			hook := &pipelineCounter{}
			client.AddHook(hook)
			reg := prometheus.NewRegistry()
			// Every store is queued before the writer starts, so batches are
			// full but the last; a flush interval far beyond the test keeps
			// a stalled writer (a loaded box) from sending a partial one.
			c, err := NewRedis(Config{BatchMax: tc.batchMax, QueueLen: tc.n, Timeout: timeout, FlushInterval: time.Hour, Registerer: reg}, client)
			if err != nil {
				t.Fatal(err)
			}
			prepare(t, c)
			admin.ConfigResetStat(context.Background())
			for i := range tc.n {
				c.Store(addr(i), Route{Cluster: 1, Pod: uint16(i)})
			}
			run(t, c)
			flush(t, c)

			maxTrips := int64((tc.n + tc.batchMax - 1) / tc.batchMax)
			trips, _ := metricValue(t, reg, "rtcedge_routecache_round_trip_seconds", map[string]string{"op": "write"})
			sets := commandCalls(t, admin, "set")
			t.Logf("%d stores, BatchMax %d: %d pipelines (%d commands), histogram count %v, SET calls %d",
				tc.n, tc.batchMax, hook.pipelines.Load(), hook.cmds.Load(), trips, sets)
			if p := hook.pipelines.Load(); p > maxTrips || int64(trips) != p {
				t.Fatalf("%d pipelines, histogram count %v; want at most %d, equal", p, trips, maxTrips)
			}
			if sets != int64(tc.n) {
				t.Fatalf("server counted %d SETs; want %d", sets, tc.n)
			}
			if s := c.Stats(); s.WritesOK != uint64(tc.n) {
				t.Fatalf("stats %+v; want %d ok", s, tc.n)
			}
		})
	}
}

// commandCalls reads calls=N for cmd from INFO commandstats.
func commandCalls(t *testing.T, admin *redis.Client, cmd string) int64 {
	t.Helper()
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		if err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		return n
	}
	return 0
}

// burst makes n calls of each kind and returns how long they took. The
// duration is for the log: the point is that the loop ends at all.
func burst(c Cache, n int) time.Duration {
	start := time.Now()
	for i := range n {
		c.Store(addr(i), Route{Cluster: 1, Pod: 1})
		c.Lookup(addr(i), nil)
	}
	return time.Since(start)
}

func TestRedisKilledAndRestarted(t *testing.T) {
	srv := testredis.Start(t)
	reg := prometheus.NewRegistry()
	a := w(t, srv, Config{Registerer: reg, QueueLen: 256})
	b := w(t, srv, Config{LookupsPerSec: 1e6})
	run(t, a)
	run(t, b)
	x := netip.MustParseAddrPort("203.0.113.20:7000")
	r := Route{Cluster: 9, Pod: 99}
	a.Store(x, r)
	flush(t, a)
	if got, ok := lookup(t, b, x); !ok || got != r {
		t.Fatalf("before the kill: lookup = %v, %v", got, ok)
	}

	srv.Kill()
	a.Store(x, r)
	flush(t, a) // one round trip that fails
	if up, _ := metricValue(t, reg, "rtcedge_routecache_redis_up", nil); up != 0 {
		t.Fatalf("redis_up = %v after a failed round trip; want 0", up)
	}
	if s := a.Stats(); s.WritesError == 0 || s.Up {
		t.Fatalf("stats %+v; want write errors, not up", s)
	}
	if _, ok := lookup(t, b, x); ok {
		t.Fatalf("lookup hit with Redis down")
	}
	const n = 10000
	d := burst(a, n)
	t.Logf("Redis down: %d stores + %d lookups returned in %v (%.0f ns per call)", n, n, d, float64(d.Nanoseconds())/(2*n))
	flush(t, a)
	s := a.Stats()
	t.Logf("Redis down: stats %+v", s)
	if s.WritesError == 0 || s.LookupsError+s.LookupsDropped+s.LookupsRateLimited == 0 {
		t.Fatalf("stats %+v; want write errors and failed or dropped lookups", s)
	}

	srv.Restart() // same port, empty
	restarted := time.Now()
	// The client finds the server again by itself (go-redis probes a dead
	// server once a second); nothing tells us when, so poll with a bound.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for attempt := 0; ; attempt++ {
		a.Store(x, r)
		flush(t, a)
		if got, ok := lookup(t, b, x); ok && got == r {
			t.Logf("recovered %v after the restart (%d attempts)", time.Since(restarted).Round(time.Millisecond), attempt+1)
			break
		}
		if attempt == 500 {
			t.Fatalf("no recovery after %d attempts; stats %+v / %+v", attempt, a.Stats(), b.Stats())
		}
		<-tick.C
	}
	if up, _ := metricValue(t, reg, "rtcedge_routecache_redis_up", nil); up != 1 {
		t.Fatalf("redis_up = %v after recovery; want 1", up)
	}
}

func TestRedisSlow(t *testing.T) {
	t.Run("timeout bounds a round trip", func(t *testing.T) {
		srv := testredis.Start(t)
		c := w(t, srv, Config{Timeout: 100 * time.Millisecond})
		run(t, c)
		t.Cleanup(srv.Kill) // runs before the workers are stopped: frees a round trip stuck on a paused server
		flush(t, c)
		c.Store(addr(1), Route{Cluster: 1, Pod: 1}) // a connection is open before the pause
		flush(t, c)
		srv.Pause()
		defer srv.Resume()
		start := time.Now()
		c.Store(addr(2), Route{Cluster: 1, Pod: 1})
		flush(t, c) // returns only once the round trip has given up
		t.Logf("a write round trip to a paused server ended after %v (Timeout 100ms)", time.Since(start).Round(time.Millisecond))
		if s := c.Stats(); s.WritesError != 1 || s.Up {
			t.Fatalf("stats %+v; want 1 write error, not up", s)
		}
		if _, ok := lookup(t, c, addr(1)); ok {
			t.Fatalf("lookup hit on a paused server")
		}
		if s := c.Stats(); s.LookupsError != 1 {
			t.Fatalf("stats %+v; want 1 lookup error", s)
		}
	})
	t.Run("queues drop rather than block", func(t *testing.T) {
		srv := testredis.Start(t)
		// A Timeout longer than the test: while the server is paused, the
		// workers are stuck in their first round trip.
		const queue, batch, n = 64, 16, 10000
		c := w(t, srv, Config{Timeout: time.Hour, QueueLen: queue, BatchMax: batch, LookupsPerSec: 1e6})
		run(t, c)
		t.Cleanup(srv.Kill) // runs before the workers are stopped: frees a round trip stuck on a paused server
		c.Store(addr(0), Route{Cluster: 1, Pod: 1})
		flush(t, c)
		srv.Pause()
		d := burst(c, n)
		s := c.Stats()
		t.Logf("Redis paused: %d stores + %d lookups returned in %v; stats %+v", n, n, d, s)
		// At most one batch left the queue before the workers blocked.
		if minDrop := uint64(n - queue - batch); s.WritesDropped < minDrop || s.LookupsDropped < minDrop {
			t.Fatalf("stats %+v; want at least %d writes and lookups dropped", s, minDrop)
		}
		srv.Resume()
		flush(t, c)
		if s := c.Stats(); s.WritesOK+s.WritesDropped != n+1 {
			t.Fatalf("stats %+v; want every write sent or dropped", s)
		}
	})
}

func TestRedisMalformedValue(t *testing.T) {
	srv := testredis.Start(t)
	admin := adminClient(t, srv)
	x := netip.MustParseAddrPort("203.0.113.30:8000")
	if err := admin.Set(context.Background(), DefaultKeyPrefix+x.String(), "not a route", 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := w(t, srv, Config{})
	run(t, c)
	if r, ok := lookup(t, c, x); ok {
		t.Fatalf("lookup of a malformed value = %v", r)
	}
	if s := c.Stats(); s.LookupsError != 1 || !s.Up {
		t.Fatalf("stats %+v; want 1 lookup error with the server up", s)
	}
}

func TestSetRedisLogger(t *testing.T) {
	var buf strings.Builder
	SetRedisLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { SetRedisLogger(slog.New(slog.DiscardHandler)) })
	opt, err := redis.ParseURL("redis://127.0.0.1:1/0") // nothing listens on port 1
	if err != nil {
		t.Fatal(err)
	}
	applyClientDefaults(opt, Config{Timeout: DefaultTimeout})
	client := redis.NewClient(opt)
	defer client.Close()
	_ = client.Ping(context.Background()).Err()
	if !strings.Contains(buf.String(), "component=go-redis") {
		t.Fatalf("go-redis log not routed to slog: %q", buf.String())
	}
}
