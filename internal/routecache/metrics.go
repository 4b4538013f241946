package routecache

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/metric"
)

// writeResult is the outcome of one write; its name is the "result" label of
// rtcedge_routecache_writes_total.
type writeResult uint8

const (
	writeOK      writeResult = iota // answered by the store
	writeError                      // the round trip failed or the store refused it
	writeDropped                    // queue full or cache closed: never sent
	numWriteResults
)

var writeResultNames = [numWriteResults]string{"ok", "error", "dropped"}

// lookupResult is the outcome of one lookup request; its name is the
// "result" label of rtcedge_routecache_lookups_total.
type lookupResult uint8

const (
	lookupHit           lookupResult = iota // found; done was called
	lookupMiss                              // no entry (or expired)
	lookupError                             // the round trip failed, or the value was malformed
	lookupDropped                           // queue full, too many waiters, or cache closed
	lookupRateLimited                       // over LookupsPerSec
	lookupCoalesced                         // joined a lookup already in flight
	lookupPrefixLimited                     // over the source prefix's PrefixLookupsPerSec
	numLookupResults
)

var lookupResultNames = [numLookupResults]string{"hit", "miss", "error", "dropped", "rate_limited", "coalesced", "prefix_limited"}

// roundTripOp is the "op" label of rtcedge_routecache_round_trip_seconds.
type roundTripOp uint8

const (
	opWrite roundTripOp = iota
	opLookup
)

var roundTripOpNames = [...]string{"write", "lookup"}

// registerMetrics builds the collectors and registers them when reg is not
// nil. Counters read the engine's atomics, so the callers' path increments
// one atomic and touches no label lookup; every label value exists at zero
// from the start.
func (e *engine) registerMetrics(reg prometheus.Registerer) error {
	var cs []prometheus.Collector
	for i, name := range writeResultNames {
		c := &e.writeCount[i]
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "rtcedge_routecache_writes_total",
			Help:        "Route cache writes (stores and deletes) by result: ok, error, dropped (queue full or closed).",
			ConstLabels: prometheus.Labels{"result": name},
		}, func() float64 { return float64(c.Load()) }))
	}
	for i, name := range lookupResultNames {
		c := &e.lookupCount[i]
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "rtcedge_routecache_lookups_total",
			Help:        "Route cache lookup requests by result: hit, miss, error, dropped, rate_limited (the whole budget), coalesced, prefix_limited (the source prefix's share).",
			ConstLabels: prometheus.Labels{"result": name},
		}, func() float64 { return float64(c.Load()) }))
	}
	cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "rtcedge_routecache_loaded_total",
		Help: "Route cache entries handed over in bulk at start (Load), before the relay reports ready.",
	}, func() float64 { return float64(e.loaded.Load()) }))
	rtt := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rtcedge_routecache_round_trip_seconds",
		Help:    "Duration of route cache round trips (one pipeline each), by op: write, lookup.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 10), // 100µs .. ~380ms, around the 100ms timeout
	}, []string{"op"})
	for i, name := range roundTripOpNames {
		e.rtt[i] = rtt.WithLabelValues(name)
	}
	cs = append(cs, rtt)
	for name, ch := range map[string]func() int{
		"writes":  func() int { return len(e.writes) },
		"lookups": func() int { return len(e.lookups) },
	} {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "rtcedge_routecache_queue_depth",
			Help:        "Route cache work waiting in a queue: writes, lookups.",
			ConstLabels: prometheus.Labels{"queue": name},
		}, func() float64 { return float64(ch()) }))
	}
	cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rtcedge_routecache_redis_up",
		Help: "1 if the last route cache round trip was answered, else 0 (the in-memory cache is always up).",
	}, func() float64 {
		if e.up.Load() == 1 {
			return 1
		}
		return 0
	}))
	return metric.Register(reg, "routecache", cs...)
}
