// Package node is what every rtcedge role's node shares: the settings all
// config files have (Common in config.go; Gossip and its pool's lifecycle
// in gossip.go; TokenKeys, HopKeys and their rotation in keys.go), socket
// helpers (socket.go), the environment a node is given (Env), and Life,
// which owns a node's goroutines, HTTP servers and sockets and runs its
// one ordered shutdown path. Each role's package has
// its own Node type (globalrelay.Node, clusterrelay.Node,
// transceiver.Node, signaling.Node, netbackend.Node) built on these;
// cmd/rtcedge, the dev world and the simulation all run those nodes.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
)

// ErrRunning is returned by Run when the node already runs or has run.
var ErrRunning = errors.New("node: Run called twice")

// ErrClosed is returned by Ready once the node has been closed.
var ErrClosed = errors.New("node: closed")

// Env is what a node is given besides its config: logger, clock and metric
// registry. The zero value works (slog.Default, time.Now, no metrics).
type Env struct {
	Logger *slog.Logger // default slog.Default()
	// Registerer receives the node's metrics; nil: not registered.
	Registerer prometheus.Registerer
	// Gatherer is served at /metrics on the node's metrics listener (with
	// /livez and /readyz); nil: /metrics is not served.
	Gatherer prometheus.Gatherer
	Now      func() time.Time // default time.Now
	// HTTPClient makes the node's control-plane calls (session APIs);
	// nil: each component's default client.
	HTTPClient *http.Client
	// KeysReload is how often key files are re-read (WatchFile); default
	// KeysReload.
	KeysReload time.Duration
}

// WithDefaults fills the zero fields of e.
func (e Env) WithDefaults() Env {
	if e.Logger == nil {
		e.Logger = slog.Default()
	}
	if e.Now == nil {
		e.Now = time.Now
	}
	return e
}

// Register registers c with e's registerer, if any. A collector already
// registered there is an error: two nodes must not share metric names and
// labels.
func (e Env) Register(c prometheus.Collector) error {
	if e.Registerer == nil {
		return nil
	}
	return e.Registerer.Register(c)
}

// ShutdownTimeout bounds the graceful shutdown of each HTTP server (in-flight
// offers may try several clusters).
const ShutdownTimeout = 15 * time.Second

// Life owns a node's goroutines, HTTP servers and closers. A node
// registers them while it is built (Go, Serve, OnClose), then Run starts
// them and, when its context ends, runs the one shutdown path: the role's
// drain (which ends with leaving gossip), then the loops stop, then the
// servers and sockets close, newest first. A failing goroutine skips the
// drain and stops the rest; its error is what Run returns. The zero value
// is ready to use.
type Life struct {
	initOnce sync.Once
	ctx      context.Context // the loops' context; cancelled at stop
	cancel   context.CancelFunc

	mu      sync.Mutex
	loops   []loop
	servers []*http.Server
	closers []func() error

	ran       atomic.Bool
	done      chan struct{} // closed when Run's goroutines have all returned
	closeOnce sync.Once
	closed    atomic.Bool
	closeErr  error
}

type loop struct {
	name string
	run  func(context.Context) error
}

func (l *Life) init() {
	l.initOnce.Do(func() {
		l.ctx, l.cancel = context.WithCancel(context.Background())
		l.done = make(chan struct{})
	})
}

// Go registers a goroutine that Run starts. It runs until its context
// ends; returning nil before that is fine (a component closed on purpose),
// returning an error stops the node.
func (l *Life) Go(name string, run func(context.Context) error) {
	l.mu.Lock()
	l.loops = append(l.loops, loop{name, run})
	l.mu.Unlock()
}

// OnClose registers a closer; closers run in reverse order of registration
// after the loops have been told to stop.
func (l *Life) OnClose(f func() error) {
	l.mu.Lock()
	l.closers = append(l.closers, f)
	l.mu.Unlock()
}

// Serve registers an HTTP server for h on ln (project timeouts, see
// NewHTTPServer unless srv is given) that Run starts.
func (l *Life) Serve(name string, ln net.Listener, srv *http.Server) {
	l.mu.Lock()
	l.servers = append(l.servers, srv)
	l.mu.Unlock()
	l.OnClose(func() error { _ = ln.Close(); return nil }) // in case Run never starts it
	l.Go(name, func(context.Context) error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve %s: %w", ln.Addr(), err)
		}
		return nil
	})
}

// Closed reports whether Close has run (or Run has finished).
func (l *Life) Closed() bool { return l.closed.Load() }

// Run starts the registered goroutines and blocks until ctx ends or one of
// them fails. When ctx ended, drain runs first (given a context that ends
// if a goroutine fails meanwhile, or Close is called); then everything
// stops as in Close. Run returns the first goroutine error, if any.
func (l *Life) Run(ctx context.Context, log *slog.Logger, drain func(context.Context)) error {
	l.init()
	if !l.ran.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer close(l.done)
	if l.closed.Load() {
		return ErrClosed
	}
	g, gctx := errgroup.WithContext(l.ctx)
	l.mu.Lock()
	loops := l.loops
	l.mu.Unlock()
	for _, lp := range loops {
		g.Go(func() error {
			if err := lp.run(gctx); err != nil {
				log.Error("node component failed; stopping", "component", lp.name, "err", err)
				return fmt.Errorf("%s: %w", lp.name, err)
			}
			return nil
		})
	}
	select {
	case <-ctx.Done():
		if drain != nil && gctx.Err() == nil {
			drain(gctx)
		}
	case <-gctx.Done():
	}
	l.stop(true)
	return errors.Join(g.Wait(), l.closeErr)
}

// Close stops the node at once, without draining or leaving gossip (peers
// detect it as failed, as after a crash): the loops stop, servers and
// sockets close. It waits for Run's goroutines. Idempotent.
func (l *Life) Close() error {
	l.init()
	l.stop(false)
	if l.ran.Load() {
		<-l.done
	}
	return l.closeErr
}

// stop cancels the loops, then shuts down the servers (gracefully when
// graceful) and runs the closers newest first.
func (l *Life) stop(graceful bool) {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		l.cancel()
		l.mu.Lock()
		servers, closers := l.servers, l.closers
		l.mu.Unlock()
		for _, s := range servers {
			if graceful {
				ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
				err := s.Shutdown(ctx)
				cancel()
				if err == nil {
					continue
				}
			}
			_ = s.Close()
		}
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			if err := closers[i](); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
		l.closeErr = errors.Join(errs...)
	})
}

// NewHTTPServer returns a server for h with the project's timeouts (a
// slow or idle client cannot hold a connection for long).
func NewHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 15 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
}

// HealthHandler serves GET /livez (always ok), GET /readyz (200 when ready
// returns nil, else 503 with the reason) and, when g is not nil, GET
// /metrics. Load balancers and Kubernetes probe /readyz.
func HealthHandler(g prometheus.Gatherer, ready func() error) http.Handler {
	mux := http.NewServeMux()
	if g != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}

// ServeHealth registers the metrics/health server on ln (when ln is not
// nil) with l.
func (l *Life) ServeHealth(ln net.Listener, env Env, ready func() error) {
	if ln != nil {
		l.Serve("metrics", ln, NewHTTPServer(HealthHandler(env.Gatherer, ready), env.Logger))
	}
}

// Sleep waits d or until ctx ends, whichever is first; it reports whether
// the whole of d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
