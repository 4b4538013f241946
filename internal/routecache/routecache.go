// Package routecache is the global relays' shared route cache: client
// address → (cluster, pod), kept in Redis with a TTL so that a restarted or
// new relay replica, or the replica a load balancer moves a client to, can
// restore a flow from the client's first non-STUN packet.
//
// The cache is best-effort and sits beside the packet path, never on it.
// Store, Lookup and Delete only enqueue work into bounded queues and return
// at once; worker goroutines started by Run batch the work into pipelined
// round trips, each bounded by a timeout. When a queue is full, the lookup
// rate is exceeded, or Redis is down or slow, work is dropped and counted,
// and the caller carries on: a lost flow then comes back from the next STUN
// packet or from the transceiver's next reply. The Redis client reconnects
// by itself.
//
// Redis serves production; Memory (an in-process table with the same
// queues, batching and counters) serves the dev world and tests.
package routecache

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/rtcedge/rtcedge/internal/config"
)

// Route is what a cache stores for a client address: the flow's cluster
// and pod, the nonce of the routing token that opened it (so a restored
// flow counts against its token's cap), when it was written (unix
// seconds), and a MAC by the writer (key ID and tag, see
// encap.Keyring.SealRoute) so that a process able to write to the cache
// can neither point a client's flow elsewhere nor replay an old entry. The
// cache stores the fields as given; the global relay seals and verifies.
type Route struct {
	Cluster, Pod uint16
	Token        [6]byte
	Stored       uint32
	KeyID        uint8
	Tag          uint64
}

// Cache is used by global relays. Implementations never block the caller:
// Store, Lookup and Delete enqueue work and return at once (dropping, and
// counting, when a queue is full or the rate limit is hit). They are safe for
// concurrent use and may be called before Run (work waits in the queues)
// and after Close (work is dropped and counted).
type Cache interface {
	// Store records client → route with the cache's TTL (refreshing an
	// existing entry). Non-blocking.
	Store(client netip.AddrPort, r Route)
	// Lookup asks for client's route; when found, done(route) is called
	// from the cache's goroutine (at most once per request; not called on
	// miss/error). done must not block: it holds up the other lookups.
	// Non-blocking; duplicate lookups for an address already in flight are
	// coalesced (each duplicate's done is called with the same answer);
	// lookups are rate-limited (token bucket).
	Lookup(client netip.AddrPort, done func(Route))
	// Delete removes an entry (best effort). Non-blocking.
	Delete(client netip.AddrPort)
	// Flush waits until the writes enqueued before it have been sent and
	// answered (or have failed), or ctx ends. It blocks, so it is for
	// shutdown and tests, not for the packet path; it needs Run.
	Flush(ctx context.Context) error
	// Stats returns the counters behind the metrics.
	Stats() Stats
	// Run runs the worker goroutines until ctx ends or Close. It returns
	// nil then; ErrRunning if the workers already run.
	Run(ctx context.Context) error
	// Close stops the workers and waits for them. Idempotent. Work still
	// queued is dropped.
	Close() error
}

// Config configures a cache. The zero value of a field means its default.
type Config struct {
	TTL           time.Duration // default 60s (a flow lives 30s idle; consent checks refresh it)
	QueueLen      int           // pending writes and lookups each; default 4096
	LookupsPerSec float64       // default 20000, burst = same: the whole cache's budget
	// PrefixLookupsPerSec is each source prefix's (IPv4 /24, IPv6 /48)
	// share of the lookup budget, burst the same; default 1000. A flood
	// from one network then leaves the rest to everyone else.
	PrefixLookupsPerSec float64
	BatchMax            int           // max commands per pipeline; default 256
	FlushInterval       time.Duration // how long a write may wait to be batched; default 5ms
	// Timeout bounds each Redis round trip; default 100ms (a slow Redis
	// must not back up the queue). The client must honour context
	// deadlines (redis.Options.ContextTimeoutEnabled, as Open sets it), or
	// its own read/write timeouts bound the round trip instead.
	Timeout   time.Duration
	KeyPrefix string // default "rtcedge:flow:" (key: prefix + "ip:port", value: 4 bytes, cluster and pod big-endian)

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil: no metrics
	// Now is the clock of the lookup rate limiter and of Memory's expiry;
	// default time.Now.
	Now func() time.Time
	// OnFound, when set, is called from the lookup goroutine once for each
	// lookup request that hits, with the client's address, before the
	// request's done callbacks. A relay that restores flows here can pass
	// done == nil and so allocate no closure per packet. It must not block.
	OnFound func(client netip.AddrPort, r Route)
}

// EnvRedisURL names the route cache's Redis URL in the environment of
// every role that uses it (URLs with passwords stay out of config files).
const EnvRedisURL = "RTCEDGE_REDIS_URL"

// Default configuration values.
const (
	DefaultTTL           = 60 * time.Second
	DefaultQueueLen      = 4096
	DefaultLookupsPerSec = 20000
	// DefaultPrefixLookupsPerSec is Config.PrefixLookupsPerSec's default.
	DefaultPrefixLookupsPerSec = 1000
	DefaultBatchMax            = 256
	DefaultFlushInterval       = 5 * time.Millisecond
	DefaultTimeout             = 100 * time.Millisecond
	DefaultKeyPrefix           = "rtcedge:flow:"
)

// sanitized zeroes invalid fields, so that withDefaults replaces them.
func (c Config) sanitized() Config {
	if c.TTL < time.Millisecond {
		c.TTL = 0
	}
	c.QueueLen = max(c.QueueLen, 0)
	c.LookupsPerSec = max(c.LookupsPerSec, 0)
	c.PrefixLookupsPerSec = max(c.PrefixLookupsPerSec, 0)
	c.BatchMax = max(c.BatchMax, 0)
	c.FlushInterval = max(c.FlushInterval, 0)
	c.Timeout = max(c.Timeout, 0)
	return c
}

// withDefaults fills in zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	config.Default(&c.TTL, DefaultTTL)
	config.Default(&c.QueueLen, DefaultQueueLen)
	config.Default(&c.LookupsPerSec, DefaultLookupsPerSec)
	config.Default(&c.PrefixLookupsPerSec, DefaultPrefixLookupsPerSec)
	config.Default(&c.BatchMax, DefaultBatchMax)
	config.Default(&c.FlushInterval, DefaultFlushInterval)
	config.Default(&c.Timeout, DefaultTimeout)
	config.Default(&c.KeyPrefix, DefaultKeyPrefix)
	config.Default(&c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case c.TTL < time.Millisecond: // Redis expiries have millisecond resolution
		return c, fmt.Errorf("%w: TTL %v is below 1ms", ErrInvalidConfig, c.TTL)
	case c.QueueLen < 1:
		return c, fmt.Errorf("%w: QueueLen %d", ErrInvalidConfig, c.QueueLen)
	case c.LookupsPerSec < 0:
		return c, fmt.Errorf("%w: LookupsPerSec %v", ErrInvalidConfig, c.LookupsPerSec)
	case c.PrefixLookupsPerSec < 0:
		return c, fmt.Errorf("%w: PrefixLookupsPerSec %v", ErrInvalidConfig, c.PrefixLookupsPerSec)
	case c.BatchMax < 1:
		return c, fmt.Errorf("%w: BatchMax %d", ErrInvalidConfig, c.BatchMax)
	case c.FlushInterval < 0:
		return c, fmt.Errorf("%w: FlushInterval %v", ErrInvalidConfig, c.FlushInterval)
	case c.Timeout < 0:
		return c, fmt.Errorf("%w: Timeout %v", ErrInvalidConfig, c.Timeout)
	}
	return c, nil
}

// Stats are a cache's counters since it was made: the values behind the
// metrics. Lookup outcomes count requests: a coalesced duplicate counts as
// coalesced only, the request it joined as hit, miss or error.
type Stats struct {
	WritesOK, WritesError, WritesDropped uint64

	LookupsHit, LookupsMiss, LookupsError uint64
	LookupsDropped, LookupsRateLimited    uint64
	LookupsPrefixLimited                  uint64 // over the source prefix's share
	LookupsCoalesced                      uint64
	Loaded                                uint64 // entries handed over by Load
	WriteRoundTrips, LookupRoundTrips     uint64
	QueuedWrites, QueuedLookups           int
	Up                                    bool // the last round trip was answered
}

// backend is the store behind the queues: Redis or the in-process table.
// The engine calls write from its write worker and get from its lookup
// worker, never concurrently with itself.
type backend interface {
	// write applies ops in one round trip and returns how many of them
	// failed, and a non-nil error when the store did not answer (down,
	// timeout) as opposed to refusing single commands.
	write(ctx context.Context, ops []writeOp) (failed int, err error)
	// get looks keys up in one round trip, setting out[i] for keys[i]
	// (len(out) == len(keys)); the error is as for write.
	get(ctx context.Context, keys []netip.AddrPort, out []getResult) error
}

// writeOp is one queued write, or a flush marker (ack != nil).
type writeOp struct {
	client netip.AddrPort
	route  Route
	del    bool
	ack    chan struct{}
}

type getResult struct {
	route  Route
	result lookupResult // lookupHit, lookupMiss or lookupError
}

// maxWaiters bounds the callbacks coalesced onto one in-flight lookup, so a
// flood of packets from one address cannot grow a list without bound.
const maxWaiters = 16

// waiters are the callbacks of one in-flight lookup.
type waiters struct {
	first func(Route)
	more  []func(Route) // coalesced duplicates, allocated only when there are some
}

// engine is the part common to both implementations: queues, batching,
// coalescing, rate limiting, counters and lifecycle.
type engine struct {
	// Static after construction.
	cfg     Config
	log     *slog.Logger
	be      backend
	limiter *rate.Limiter
	prefix  *prefixBudget // guarded by mu
	writes  chan writeOp
	lookups chan netip.AddrPort
	rtt     [2]prometheus.Observer // by roundTripOp
	onClose func() error           // releases what the cache owns; may be nil
	// afterLookups, when set (by tests, before Run), is called by the
	// lookup worker after each batch has been counted and answered.
	afterLookups func()

	// Counters: incremented by callers and workers, read by Stats and the
	// metrics.
	writeCount  [numWriteResults]atomic.Uint64
	lookupCount [numLookupResults]atomic.Uint64
	roundTrips  [2]atomic.Uint64 // by roundTripOp
	loaded      atomic.Uint64
	up          atomic.Int32 // 1 answered, 0 not, -1 no round trip yet

	// Guarded by mu: the lookups queued or in a round trip, by address.
	mu       sync.Mutex
	inflight map[netip.AddrPort]waiters

	// Lifecycle. closed is set first so callers stop enqueueing; runMu
	// orders Run's start against Close.
	closed    atomic.Bool
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
	runMu     sync.Mutex
	running   bool
	runWG     sync.WaitGroup
}

func newEngine(cfg Config, be backend, kind string) (*engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	burst := int(cfg.LookupsPerSec)
	if burst < 1 {
		burst = 1
	}
	e := &engine{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "routecache", "backend", kind),
		be:      be,
		limiter: rate.NewLimiter(rate.Limit(cfg.LookupsPerSec), burst),
		prefix:  newPrefixBudget(cfg.PrefixLookupsPerSec),
		writes:  make(chan writeOp, cfg.QueueLen),
		lookups: make(chan netip.AddrPort, cfg.QueueLen),
		// Sized for the most lookups that can be in flight (a full queue
		// and a batch in a round trip), so the callers' path does not grow
		// the map.
		inflight: make(map[netip.AddrPort]waiters, cfg.QueueLen+cfg.BatchMax),
		done:     make(chan struct{}),
	}
	e.up.Store(-1)
	if err := e.registerMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	return e, nil
}

// canonical unmaps IPv4-mapped IPv6 addresses so that one client has one
// key whichever socket family saw it.
func canonical(a netip.AddrPort) netip.AddrPort {
	if a.Addr().Is4In6() {
		return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	}
	return a
}

func (e *engine) enqueueWrite(op writeOp) {
	if e.closed.Load() {
		e.writeCount[writeDropped].Add(1)
		return
	}
	select {
	case e.writes <- op:
	default:
		e.writeCount[writeDropped].Add(1)
	}
}

func (e *engine) store(client netip.AddrPort, r Route) {
	e.enqueueWrite(writeOp{client: canonical(client), route: r})
}

func (e *engine) delete(client netip.AddrPort) {
	e.enqueueWrite(writeOp{client: canonical(client), del: true})
}

func (e *engine) lookup(client netip.AddrPort, done func(Route)) {
	if e.closed.Load() {
		e.lookupCount[lookupDropped].Add(1)
		return
	}
	client = canonical(client)
	e.mu.Lock()
	if w, ok := e.inflight[client]; ok {
		if len(w.more) >= maxWaiters {
			e.mu.Unlock()
			e.lookupCount[lookupDropped].Add(1)
			return
		}
		if done != nil { // nothing to call back: no allocation
			w.more = append(w.more, done)
		}
		e.inflight[client] = w
		e.mu.Unlock()
		e.lookupCount[lookupCoalesced].Add(1)
		return
	}
	now := e.cfg.Now()
	if !e.prefix.allow(client.Addr(), now.UnixNano()) {
		e.mu.Unlock()
		e.lookupCount[lookupPrefixLimited].Add(1)
		return
	}
	if !e.limiter.AllowN(now, 1) {
		e.prefix.refund(client.Addr())
		e.mu.Unlock()
		e.lookupCount[lookupRateLimited].Add(1)
		return
	}
	// Enqueue under mu, so the worker cannot finish the lookup before its
	// waiters are recorded.
	select {
	case e.lookups <- client:
		e.inflight[client] = waiters{first: done}
		e.mu.Unlock()
	default:
		e.mu.Unlock()
		e.lookupCount[lookupDropped].Add(1)
	}
}

func (e *engine) flush(ctx context.Context) error {
	if e.closed.Load() {
		return ErrClosed
	}
	ack := make(chan struct{})
	select {
	case e.writes <- writeOp{ack: ack}:
	case <-ctx.Done():
		return fmt.Errorf("routecache: flush: %w", ctx.Err())
	case <-e.done:
		return ErrClosed
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("routecache: flush: %w", ctx.Err())
	case <-e.done:
		return ErrClosed
	}
}

func (e *engine) stats() Stats {
	return Stats{
		WritesOK:             e.writeCount[writeOK].Load(),
		WritesError:          e.writeCount[writeError].Load(),
		WritesDropped:        e.writeCount[writeDropped].Load(),
		LookupsHit:           e.lookupCount[lookupHit].Load(),
		LookupsMiss:          e.lookupCount[lookupMiss].Load(),
		LookupsError:         e.lookupCount[lookupError].Load(),
		LookupsDropped:       e.lookupCount[lookupDropped].Load(),
		LookupsRateLimited:   e.lookupCount[lookupRateLimited].Load(),
		LookupsCoalesced:     e.lookupCount[lookupCoalesced].Load(),
		LookupsPrefixLimited: e.lookupCount[lookupPrefixLimited].Load(),
		Loaded:               e.loaded.Load(),
		WriteRoundTrips:      e.roundTrips[opWrite].Load(),
		LookupRoundTrips:     e.roundTrips[opLookup].Load(),
		QueuedWrites:         len(e.writes),
		QueuedLookups:        len(e.lookups),
		Up:                   e.up.Load() == 1,
	}
}

func (e *engine) run(ctx context.Context) error {
	e.runMu.Lock()
	switch {
	case e.closed.Load():
		e.runMu.Unlock()
		return nil
	case e.running:
		e.runMu.Unlock()
		return ErrRunning
	}
	e.running = true
	e.runWG.Add(1)
	e.runMu.Unlock()
	defer func() {
		e.runMu.Lock()
		e.running = false
		e.runMu.Unlock()
		e.runWG.Done()
	}()

	// Cancelling wctx also aborts a round trip in progress, so Close does
	// not wait out a slow Redis.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); e.writeLoop(wctx) }()
	go func() { defer wg.Done(); e.lookupLoop(wctx) }()
	select {
	case <-ctx.Done():
	case <-e.done:
	}
	cancel()
	wg.Wait()
	return nil
}

func (e *engine) close() error {
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		e.runMu.Lock()
		close(e.done)
		e.runMu.Unlock()
		e.runWG.Wait()
		if e.onClose != nil {
			if err := e.onClose(); err != nil {
				e.closeErr = fmt.Errorf("routecache: close: %w", err)
			}
		}
	})
	return e.closeErr
}

// writeLoop batches writes: a batch is sent when it holds BatchMax writes,
// when its first write has waited FlushInterval, or at a flush marker.
func (e *engine) writeLoop(ctx context.Context) {
	batch := make([]writeOp, 0, e.cfg.BatchMax)
	var acks []chan struct{}
	add := func(op writeOp) {
		if op.ack != nil {
			acks = append(acks, op.ack)
		} else {
			batch = append(batch, op)
		}
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		batch, acks = batch[:0], acks[:0]
		select {
		case <-ctx.Done():
			return
		case op := <-e.writes:
			add(op)
		}
		timer.Reset(e.cfg.FlushInterval)
	collect:
		for len(batch) < e.cfg.BatchMax && len(acks) == 0 {
			select {
			case op := <-e.writes:
				add(op)
			case <-timer.C:
				break collect
			case <-ctx.Done():
				return
			}
		}
		timer.Stop()
		if len(batch) > 0 {
			e.sendWrites(ctx, batch)
		}
		for _, a := range acks {
			close(a)
		}
	}
}

func (e *engine) sendWrites(ctx context.Context, batch []writeOp) {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	start := time.Now()
	failed, err := e.be.write(rctx, batch)
	cancel()
	e.rtt[opWrite].Observe(time.Since(start).Seconds())
	e.roundTrips[opWrite].Add(1)
	e.writeCount[writeOK].Add(uint64(len(batch) - failed))
	e.writeCount[writeError].Add(uint64(failed))
	e.setUp(err)
}

// lookupLoop sends whatever lookups are queued, up to BatchMax, in one
// round trip: lookups do not wait to be batched, since packets are dropped
// until they are answered.
func (e *engine) lookupLoop(ctx context.Context) {
	keys := make([]netip.AddrPort, 0, e.cfg.BatchMax)
	res := make([]getResult, e.cfg.BatchMax)
	ws := make([]waiters, e.cfg.BatchMax)
	for {
		keys = keys[:0]
		select {
		case <-ctx.Done():
			return
		case a := <-e.lookups:
			keys = append(keys, a)
		}
	drain:
		for len(keys) < e.cfg.BatchMax {
			select {
			case a := <-e.lookups:
				keys = append(keys, a)
			default:
				break drain
			}
		}
		rctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
		start := time.Now()
		err := e.be.get(rctx, keys, res[:len(keys)])
		cancel()
		e.rtt[opLookup].Observe(time.Since(start).Seconds())
		e.roundTrips[opLookup].Add(1)
		e.setUp(err)

		e.mu.Lock()
		for i, k := range keys {
			ws[i] = e.inflight[k]
			delete(e.inflight, k)
		}
		e.mu.Unlock()
		for i := range keys {
			r := res[i]
			e.lookupCount[r.result].Add(1)
			if r.result == lookupHit {
				if e.cfg.OnFound != nil {
					e.cfg.OnFound(keys[i], r.route)
				}
				call(ws[i].first, r.route)
				for _, f := range ws[i].more {
					call(f, r.route)
				}
			}
			ws[i] = waiters{}
		}
		if e.afterLookups != nil {
			e.afterLookups()
		}
	}
}

func call(f func(Route), r Route) {
	if f != nil {
		f(r)
	}
}

// setUp records whether the last round trip was answered and logs changes
// only, which keeps an outage to two log lines however many round trips
// fail.
func (e *engine) setUp(err error) {
	now := int32(0)
	if err == nil {
		now = 1
	}
	switch before := e.up.Swap(now); {
	case before == now:
	case now == 0:
		e.log.Warn("route cache unreachable; flows recover from STUN until it is back", "err", err)
	case before == 0:
		e.log.Info("route cache reachable again")
	}
}
