package routecache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Redis is a Cache over Redis (standalone, Sentinel or Cluster, through
// redis.UniversalClient), shared by all global relay replicas. Entries are
// plain keys: KeyPrefix + "ip:port" → 4 bytes (cluster, pod; big-endian),
// written with SET … PX TTL.
type Redis struct{ e *engine }

var _ Cache = (*Redis)(nil)

// NewRedis returns a cache over client. The caller builds the client (for
// example from redis.ParseURL) and closes it after Close; it should honour
// context deadlines and not retry (see Open for the options that suit a
// best-effort cache).
func NewRedis(cfg Config, client redis.UniversalClient) (*Redis, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e, err := newEngine(cfg, &redisBackend{client: client, prefix: cfg.KeyPrefix, ttl: cfg.TTL}, "redis")
	if err != nil {
		return nil, err
	}
	return &Redis{e: e}, nil
}

// Open returns the cache a relay should use for url: "" gives an in-memory
// cache (dev); "redis://", "rediss://" or "unix://" URLs (redis.ParseURL
// syntax) give a Redis cache over a client that Open builds and Close
// closes. Options the URL leaves unset are chosen for a best-effort cache:
// dial, read, write and pool timeouts of cfg.Timeout, context deadlines
// honoured, a pool of 4 connections, no retries (a retry is only latency:
// the next packet asks again), and no maintenance notifications.
func Open(url string, cfg Config) (Cache, error) {
	if url == "" {
		return NewMemory(cfg), nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnsupportedURL, err)
	}
	full, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	applyClientDefaults(opt, full)
	client := redis.NewClient(opt)
	c, err := NewRedis(cfg, client)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	c.e.onClose = client.Close
	return c, nil
}

// applyClientDefaults sets the options a URL left at zero.
func applyClientDefaults(opt *redis.Options, cfg Config) {
	if opt.DialTimeout == 0 {
		opt.DialTimeout = cfg.Timeout
	}
	if opt.ReadTimeout == 0 {
		opt.ReadTimeout = cfg.Timeout
	}
	if opt.WriteTimeout == 0 {
		opt.WriteTimeout = cfg.Timeout
	}
	if opt.PoolTimeout == 0 {
		opt.PoolTimeout = cfg.Timeout
	}
	if opt.PoolSize == 0 {
		// Two workers, one round trip each at a time; the rest is slack
		// for connections being replaced after a timeout.
		opt.PoolSize = 4
	}
	if opt.MaxRetries == 0 {
		opt.MaxRetries = -1 // go-redis: 0 means its default of 3, -1 means none
	}
	// One dial attempt per round trip; while Redis is down the pool fails
	// fast and probes in the background once a second.
	opt.DialerRetries = 1
	// Pipelines on the main pool, so that the pool's fail-fast state
	// covers them and PoolSize bounds all connections.
	opt.PipelinePoolSize = -1
	opt.ContextTimeoutEnabled = true
	opt.DisableIdentity = true
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// SetRedisLogger sends go-redis's own log lines (such as each failed dial
// while Redis is down) to l at debug level instead of the standard logger:
// the cache already logs each change between reachable and unreachable.
// go-redis has one logger per process, so main calls this once.
func SetRedisLogger(l *slog.Logger) { redis.SetLogger(redisLogger{l}) }

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// Store implements Cache.
func (c *Redis) Store(client netip.AddrPort, r Route) { c.e.store(client, r) }

// Lookup implements Cache.
func (c *Redis) Lookup(client netip.AddrPort, done func(Route)) { c.e.lookup(client, done) }

// Delete implements Cache.
func (c *Redis) Delete(client netip.AddrPort) { c.e.delete(client) }

// Flush implements Cache.
func (c *Redis) Flush(ctx context.Context) error { return c.e.flush(ctx) }

// Stats implements Cache.
func (c *Redis) Stats() Stats { return c.e.stats() }

// Run implements Cache.
func (c *Redis) Run(ctx context.Context) error { return c.e.run(ctx) }

// Close implements Cache. It closes the client only if Open built it.
func (c *Redis) Close() error { return c.e.close() }

// redisBackend sends each batch as one pipeline. Its methods are called by
// one worker each (write by the write worker, get by the lookup worker).
type redisBackend struct {
	client redis.UniversalClient
	prefix string
	ttl    time.Duration
}

// routeLen is the size of an encoded Route: cluster, pod, token nonce,
// stored, key ID, tag.
const routeLen = 2 + 2 + 6 + 4 + 1 + 8

func encodeRoute(b []byte, r Route) {
	binary.BigEndian.PutUint16(b[0:2], r.Cluster)
	binary.BigEndian.PutUint16(b[2:4], r.Pod)
	copy(b[4:10], r.Token[:])
	binary.BigEndian.PutUint32(b[10:14], r.Stored)
	b[14] = r.KeyID
	binary.BigEndian.PutUint64(b[15:23], r.Tag)
}

func decodeRoute(b []byte) (Route, error) {
	if len(b) != routeLen {
		return Route{}, fmt.Errorf("%w: %d bytes, want %d", errBadValue, len(b), routeLen)
	}
	r := Route{Cluster: binary.BigEndian.Uint16(b[0:2]), Pod: binary.BigEndian.Uint16(b[2:4]),
		Stored: binary.BigEndian.Uint32(b[10:14]), KeyID: b[14], Tag: binary.BigEndian.Uint64(b[15:23])}
	copy(r.Token[:], b[4:10])
	return r, nil
}

// key returns prefix + "ip:port", using buf as scratch space.
func (b *redisBackend) key(buf []byte, a netip.AddrPort) ([]byte, string) {
	buf = a.AppendTo(append(buf[:0], b.prefix...))
	return buf, string(buf)
}

func (b *redisBackend) write(ctx context.Context, ops []writeOp) (int, error) {
	pipe := b.client.Pipeline()
	vals := make([]byte, routeLen*len(ops))
	var buf []byte
	var key string
	for i, op := range ops {
		buf, key = b.key(buf, op.client)
		if op.del {
			pipe.Del(ctx, key)
			continue
		}
		v := vals[i*routeLen : (i+1)*routeLen]
		encodeRoute(v, op.route)
		pipe.Set(ctx, key, v, b.ttl)
	}
	cmds, _ := pipe.Exec(ctx) // per-command errors are read below
	failed := 0
	var down error
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			failed++
			if down == nil && !isReply(err) {
				down = err
			}
		}
	}
	if down != nil {
		return failed, fmt.Errorf("redis write pipeline: %w", down)
	}
	return failed, nil
}

func (b *redisBackend) get(ctx context.Context, keys []netip.AddrPort, out []getResult) error {
	pipe := b.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	var buf []byte
	var key string
	for i, a := range keys {
		buf, key = b.key(buf, a)
		cmds[i] = pipe.Get(ctx, key)
	}
	_, _ = pipe.Exec(ctx) // per-command errors are read below
	var down error
	for i, cmd := range cmds {
		v, err := cmd.Bytes()
		switch {
		case err == nil:
			r, derr := decodeRoute(v)
			if derr != nil {
				out[i] = getResult{result: lookupError}
				continue
			}
			out[i] = getResult{route: r, result: lookupHit}
		case errors.Is(err, redis.Nil):
			out[i] = getResult{result: lookupMiss}
		default:
			out[i] = getResult{result: lookupError}
			if down == nil && !isReply(err) {
				down = err
			}
		}
	}
	if down != nil {
		return fmt.Errorf("redis lookup pipeline: %w", down)
	}
	return nil
}

// isReply reports whether err is an error reply from the server (which
// therefore answered) rather than a network failure or timeout.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}
