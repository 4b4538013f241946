package netsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// tcpChunk is what one read from a connection returned, held until due.
type tcpChunk struct {
	due time.Time
	buf *[]byte // nil marks end of stream
	n   int
}

// tcpChunkSize is the most one read takes; it is also the buffer size of
// the TCP pool.
const tcpChunkSize = 32 << 10

var tcpPool = sync.Pool{New: func() any { b := make([]byte, tcpChunkSize); return &b }}

// tcpQueue bounds the chunks in flight per direction and connection; a full
// queue stops the reader, so TCP flow control pushes back on the sender
// instead of the link dropping bytes from a stream.
const tcpQueue = 64

// TCPLink proxies TCP connections to a target, delaying each direction's
// bytes by its LinkConfig (Delay and Jitter; Loss does not apply to a
// stream). Bytes keep their order. While partitioned nothing is delivered
// and no new upstream connection is made; held bytes flow again when the
// link heals, as TCP retransmissions would.
type TCPLink struct {
	// Static after construction.
	ln       net.Listener
	target   string
	up, down LinkConfig
	log      *slog.Logger
	ctx      context.Context // cancelled by Close
	cancel   context.CancelFunc
	done     <-chan struct{} // ctx.Done()

	upDraw, downDraw drawer     // each guarded by drawMu
	drawMu           sync.Mutex // the draws are shared by all connections

	partMu sync.Mutex
	healed chan struct{} // guarded by partMu; closed while not partitioned

	mu        sync.Mutex
	conns     map[net.Conn]struct{} // guarded by mu
	closed    bool                  // guarded by mu
	closeOnce sync.Once

	wg sync.WaitGroup // connection handlers

	handshake time.Duration // static: held after accept (tcphandshake.go); 0 for none

	accepted         atomic.Uint64
	upBytes, dnBytes atomic.Uint64
}

// NewTCPLink returns a link that accepts on ln and proxies each connection
// to target (host:port), up being client → target. The link owns ln and
// closes it in Close.
func NewTCPLink(ln net.Listener, target string, up, down LinkConfig, log *slog.Logger) (*TCPLink, error) {
	if err := up.Validate(); err != nil {
		return nil, fmt.Errorf("up: %w", err)
	}
	if err := down.Validate(); err != nil {
		return nil, fmt.Errorf("down: %w", err)
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("netsim: target %q: %w", target, err)
	}
	if log == nil {
		log = slog.Default()
	}
	healed := make(chan struct{})
	close(healed)
	ctx, cancel := context.WithCancel(context.Background())
	return &TCPLink{
		ln: ln, target: target, up: up, down: down, ctx: ctx, cancel: cancel, done: ctx.Done(),
		log:    log.With("component", "netsim", "link", "tcp", "target", target),
		upDraw: newDrawer(up.Seed, 1), downDraw: newDrawer(down.Seed, 2),
		healed: healed, conns: map[net.Conn]struct{}{},
	}, nil
}

// Addr is the address clients connect to.
func (l *TCPLink) Addr() net.Addr { return l.ln.Addr() }

// SetPartitioned holds every byte (true) until the link heals (false).
func (l *TCPLink) SetPartitioned(on bool) {
	l.partMu.Lock()
	defer l.partMu.Unlock()
	select {
	case <-l.healed:
		if on {
			l.healed = make(chan struct{})
		}
	default:
		if !on {
			close(l.healed)
		}
	}
}

// waitHealed returns false if the link closed while partitioned.
func (l *TCPLink) waitHealed() bool {
	l.partMu.Lock()
	h := l.healed
	l.partMu.Unlock()
	select {
	case <-h:
		return true
	case <-l.done:
		return false
	}
}

// TCPStats is a snapshot of a TCPLink's counters.
type TCPStats struct {
	Accepted  uint64 // connections accepted
	Open      int    // connections open now (both sides counted)
	UpBytes   uint64 // client → target, delivered
	DownBytes uint64 // target → client, delivered
}

// Stats returns the link's counters.
func (l *TCPLink) Stats() TCPStats {
	l.mu.Lock()
	n := len(l.conns)
	l.mu.Unlock()
	return TCPStats{Accepted: l.accepted.Load(), Open: n, UpBytes: l.upBytes.Load(), DownBytes: l.dnBytes.Load()}
}

// Run accepts until ctx ends or Close is called, then closes every proxied
// connection and returns nil. It must be called once.
func (l *TCPLink) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var err error
	for {
		c, aerr := l.ln.Accept()
		if aerr != nil {
			select {
			case <-l.done:
			default:
				if !errors.Is(aerr, net.ErrClosed) {
					err = fmt.Errorf("netsim: accept: %w", aerr)
				}
			}
			break
		}
		if !l.track(c) {
			c.Close()
			break
		}
		l.accepted.Add(1)
		l.wg.Add(1)
		go l.handle(c, time.Now())
	}
	l.Close()
	l.wg.Wait()
	return err
}

// Close stops accepting and closes every connection. Idempotent.
func (l *TCPLink) Close() error {
	var err error
	l.closeOnce.Do(func() {
		l.cancel()
		err = l.ln.Close()
		l.mu.Lock()
		l.closed = true
		for c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
	})
	return err
}

// track registers a connection so Close can reach it; false once closed.
func (l *TCPLink) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *TCPLink) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	c.Close()
}

func (l *TCPLink) handle(client net.Conn, accepted time.Time) {
	defer l.wg.Done()
	defer l.untrack(client)
	if !l.holdHandshake(accepted) || !l.waitHealed() {
		return
	}
	var d net.Dialer
	server, err := d.DialContext(l.ctx, "tcp", l.target)
	if err != nil {
		l.log.Debug("dial target", "err", err)
		return
	}
	if !l.track(server) {
		server.Close()
		return
	}
	defer l.untrack(server)
	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() { defer pipes.Done(); l.pipe(client, server, &l.up, &l.upDraw, &l.upBytes) }()
	go func() { defer pipes.Done(); l.pipe(server, client, &l.down, &l.downDraw, &l.dnBytes) }()
	pipes.Wait()
}

// pipe copies src to dst through a delay queue: this goroutine reads and
// stamps each chunk with its due time, a second one writes it when due.
// When either side fails both connections close, which ends the other pipe.
func (l *TCPLink) pipe(src, dst net.Conn, cfg *LinkConfig, draw *drawer, counter *atomic.Uint64) {
	q := make(chan tcpChunk, tcpQueue)
	var writer sync.WaitGroup
	writer.Add(1)
	go func() {
		defer writer.Done()
		l.write(dst, src, q, counter)
	}()
	defer writer.Wait()
	defer close(q)
	var last time.Time
	for {
		buf := tcpPool.Get().(*[]byte)
		n, err := src.Read(*buf)
		if n > 0 {
			l.drawMu.Lock()
			delay := draw.delay(cfg)
			l.drawMu.Unlock()
			// A stream cannot reorder: jitter only ever delays a chunk
			// behind its predecessor.
			due := time.Now().Add(delay)
			if due.Before(last) {
				due = last
			}
			last = due
			select {
			case q <- tcpChunk{due: due, buf: buf, n: n}:
			case <-l.done:
				tcpPool.Put(buf)
				return
			}
		} else {
			tcpPool.Put(buf)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// Forward the half-close once the bytes before it arrived.
				select {
				case q <- tcpChunk{due: last}:
				case <-l.done:
				}
			} else {
				src.Close()
				dst.Close()
			}
			return
		}
	}
}

// write delivers chunks from q to dst when due. On a write failure it
// closes both sides, so the reader of src stops too.
func (l *TCPLink) write(dst, src net.Conn, q <-chan tcpChunk, counter *atomic.Uint64) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	failed := false
	for c := range q {
		if !failed {
			failed = !l.deliver(dst, c, timer, counter)
			if failed {
				dst.Close()
				src.Close()
			}
		}
		if c.buf != nil {
			tcpPool.Put(c.buf)
		}
	}
}

func (l *TCPLink) deliver(dst net.Conn, c tcpChunk, timer *time.Timer, counter *atomic.Uint64) bool {
	if wait := time.Until(c.due); wait > 0 {
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-l.done:
			return false
		}
	}
	if !l.waitHealed() {
		return false
	}
	if c.buf == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			return cw.CloseWrite() == nil
		}
		return dst.Close() == nil
	}
	if _, err := dst.Write((*c.buf)[:c.n]); err != nil {
		return false
	}
	counter.Add(uint64(c.n))
	return true
}
