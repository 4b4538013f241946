package routecache

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/testredis"
)

// waitLimit bounds every wait in these tests; it is a hang guard, not a
// timing goal.
const waitLimit = 10 * time.Second

// world makes cache replicas that share one store, as relay replicas share
// one Redis.
type world interface {
	// replica returns a new cache over the shared store, closed at the end
	// of the test, with a lookup-batch event for awaitStats.
	replica(t *testing.T, cfg Config) Cache
}

type impl struct {
	name     string
	newWorld func(t *testing.T) world
}

var impls = []impl{
	{"memory", func(*testing.T) world { return &memoryWorld{store: NewMemoryStore()} }},
	{"redis", func(t *testing.T) world { return &redisWorld{srv: testredis.Start(t)} }},
}

type memoryWorld struct{ store *MemoryStore }

func (w *memoryWorld) replica(t *testing.T, cfg Config) Cache {
	t.Helper()
	c, err := NewMemoryOn(w.store, cfg)
	if err != nil {
		t.Fatalf("NewMemoryOn: %v", err)
	}
	return prepare(t, c)
}

type redisWorld struct{ srv *testredis.Server }

func (w *redisWorld) replica(t *testing.T, cfg Config) Cache {
	t.Helper()
	c, err := Open(w.srv.URL(), cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", w.srv.URL(), err)
	}
	return prepare(t, c)
}

// events carries one signal per lookup batch of a cache (coalesced: a
// waiter only needs to know that something happened since it last looked).
var events sync.Map // *engine → chan struct{}

func engineOf(c Cache) *engine {
	switch c := c.(type) {
	case *Redis:
		return c.e
	case *Memory:
		return c.e
	}
	panic(fmt.Sprintf("unknown cache type %T", c))
}

// prepare installs the lookup event and registers Close with t.Cleanup.
// It must run before Run.
func prepare(t *testing.T, c Cache) Cache {
	e := engineOf(c)
	ch := make(chan struct{}, 1)
	events.Store(e, ch)
	e.afterLookups = func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		events.Delete(e)
	})
	return c
}

// run starts c's workers until the end of the test.
func run(t *testing.T, c Cache) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func flush(t *testing.T, c Cache) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// awaitStats waits, one lookup batch at a time, until cond holds.
func awaitStats(t *testing.T, c Cache, cond func(Stats) bool) Stats {
	t.Helper()
	v, _ := events.Load(engineOf(c))
	ch := v.(chan struct{})
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	for {
		if s := c.Stats(); cond(s) {
			return s
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("condition not met after %v; stats %+v", waitLimit, c.Stats())
		}
	}
}

// lookup asks c for client and waits for the answer: the route on a hit,
// false on a miss or an error.
func lookup(t *testing.T, c Cache, client netip.AddrPort) (Route, bool) {
	t.Helper()
	before := c.Stats()
	got := make(chan Route, 1)
	c.Lookup(client, func(r Route) { got <- r })
	s := awaitStats(t, c, func(s Stats) bool { return answered(s) > answered(before) || dropped(s) > dropped(before) })
	if dropped(s) > dropped(before) {
		t.Fatalf("lookup of %v not sent: stats %+v", client, s)
	}
	select {
	case r := <-got:
		return r, true
	default:
		return Route{}, false
	}
}

func answered(s Stats) uint64 { return s.LookupsHit + s.LookupsMiss + s.LookupsError }
func dropped(s Stats) uint64  { return s.LookupsDropped + s.LookupsRateLimited }

// addr returns a distinct client address for i.
func addr(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), uint16(10000+i%50000))
}

// metricValue returns the value of the series of name whose labels include
// want, from reg; ok is false when there is no such series.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}
