package udpio

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
)

// DefaultBatch is a relay's datagrams per recvmmsg/sendmmsg call.
const DefaultBatch = 32

// Tuning is how a relay moves its datagrams (Runner): the knobs and YAML
// keys both relays' configs share. The zero value reads one datagram per
// call on the runtime's poller; Defaults gives production's settings.
type Tuning struct {
	// Batch > 1 reads and writes up to that many datagrams per system
	// call (recvmmsg/sendmmsg); 0 or 1: one per call. Neither allocates.
	Batch int `yaml:"batch"`
	// LockThreads runs every read loop on an OS thread of its own
	// (runtime.LockOSThread). See docs/benchmarks.md for what it costs.
	LockThreads bool `yaml:"lock_threads"`
	// CPUs, when set, pins worker i's loops to CPU CPUs[i mod len(CPUs)]
	// (sched_setaffinity on their locked threads; implies LockThreads).
	// Pair with SteerCPU on a worker group's public sockets.
	CPUs []int `yaml:"cpus"`
	// Bundle sends the datagrams of one receive batch that go to the same
	// next hop as one bundle (docs/bundle.md) on the paths that name a
	// format (Hooks.Bundle). Turn it on once every next hop reads them.
	Bundle bool `yaml:"bundle"`
	// EventLoop (Linux) serves each worker's sockets from one OS thread
	// in a raw epoll_pwait (Loop): less CPU per datagram than the
	// poller's read loops, for one more GOMAXPROCS per worker. Needs
	// Batch > 1 and Linux (else the poller's loops run). nil is off;
	// Defaults turns it on. See docs/benchmarks.md, "An event loop".
	EventLoop *bool `yaml:"event_loop"`
}

// Defaults fills what a config file leaves unset.
func (t *Tuning) Defaults() {
	if t.Batch == 0 {
		t.Batch = DefaultBatch
	}
	if t.EventLoop == nil {
		t.EventLoop = new(true)
	}
}

// Validate refuses a negative batch or CPU, naming the key.
func (t *Tuning) Validate() error {
	if t.Batch < 0 {
		return fmt.Errorf("batch %d must not be negative", t.Batch)
	}
	for _, c := range t.CPUs {
		if c < 0 {
			return fmt.Errorf("cpus: CPU %d must not be negative", c)
		}
	}
	return nil
}

// Path is one direction a relay forwards, as Forward describes: read on
// From, write to To (maybe From). Hooks.Bundle applies with Tuning.Bundle.
type Path struct {
	From, To        *net.UDPConn
	Headroom, Limit int
	Decide          Decide
	Hooks           Hooks
}

// Writer sends one datagram; *net.UDPConn and *RawConn are Writers.
type Writer interface {
	WriteToUDPAddrPort(b []byte, to netip.AddrPort) (int, error)
}

// Runner forwards a relay's paths as its Tuning says, in workers each run
// on one CPU: one Loop per worker with the event loop, else a read loop
// per path (ForwardBatch, or Forward for batches of one). It owns the
// paths' sockets.
type Runner struct {
	// Static after NewRunner.
	t       Tuning
	log     *slog.Logger
	workers [][]Path
	loops   []*Loop                   // with the event loop: worker i's
	raws    map[*net.UDPConn]*RawConn // the detached sockets, by conn

	closeOnce sync.Once
}

// NewRunner takes the workers' sockets, with the event loop out of the
// runtime's poller. On error they are closed. log reports failed pinning.
func NewRunner(t Tuning, log *slog.Logger, workers ...[]Path) (*Runner, error) {
	r := &Runner{t: t, log: log, workers: workers, raws: map[*net.UDPConn]*RawConn{}}
	for _, paths := range workers {
		for i := range paths {
			if !t.Bundle {
				paths[i].Hooks.Bundle = nil
			}
		}
	}
	err := t.Validate()
	if err == nil && t.EventLoop != nil && *t.EventLoop && t.Batch > 1 && LoopSupported {
		err = r.makeLoops()
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// makeLoops detaches every socket and makes each worker's Loop.
func (r *Runner) makeLoops() error {
	for _, paths := range r.workers {
		lps := make([]LoopPath, len(paths))
		for i, p := range paths {
			for _, c := range []*net.UDPConn{p.From, p.To} {
				if r.raws[c] == nil {
					raw, err := Detach(c)
					if err != nil {
						return err
					}
					r.raws[c] = raw
				}
			}
			lps[i] = LoopPath{From: r.raws[p.From], To: r.raws[p.To], Headroom: p.Headroom, Limit: p.Limit,
				Batch: r.t.Batch, Decide: p.Decide, Hooks: p.Hooks}
		}
		l, err := NewLoop(lps)
		if err != nil {
			return err
		}
		r.loops = append(r.loops, l)
	}
	return nil
}

// EventLoop reports whether the workers run on event loops.
func (r *Runner) EventLoop() bool { return r.loops != nil }

// Writer sends on c, a path's socket, from outside the read loops.
func (r *Runner) Writer(c *net.UDPConn) Writer {
	if raw := r.raws[c]; raw != nil {
		return raw
	}
	return c
}

// Run forwards until Close (nil) or a loop fails, which ends every loop
// and is returned. Each loop's goroutine ends with it, so a locked thread
// retires with it. Run once.
func (r *Runner) Run() error {
	var wg sync.WaitGroup
	var first error
	var once sync.Once
	end := func(err error) {
		if err != nil {
			once.Do(func() { first = err })
		}
		r.Close()
	}
	for i, paths := range r.workers {
		cpu := -1
		if len(r.t.CPUs) > 0 {
			cpu = r.t.CPUs[i%len(r.t.CPUs)]
		}
		if r.loops != nil {
			wg.Go(func() {
				r.pin(cpu) // Run then keeps the thread locked for good
				end(r.loops[i].Run())
			})
			continue
		}
		for _, p := range paths {
			wg.Go(func() {
				r.pin(cpu)
				if r.t.Batch > 1 {
					end(ForwardBatch(p.From, p.To, p.Headroom, p.Limit, r.t.Batch, p.Decide, p.Hooks))
				} else {
					end(Forward(p.From, p.To, p.Headroom, p.Limit, p.Decide, p.Hooks))
				}
			})
		}
	}
	wg.Wait()
	return first
}

// pin locks the goroutine's thread, pinned to cpu >= 0, when asked to:
// for good (the thread ends with its loop).
func (r *Runner) pin(cpu int) {
	if cpu >= 0 || r.t.LockThreads {
		if err := LockThread(cpu); err != nil {
			r.log.Warn("read loop not pinned", "err", err)
		}
	}
}

// Close ends the loops and closes the sockets (an event loop's once it
// stops). Idempotent; it does not wait for Run.
func (r *Runner) Close() error {
	r.closeOnce.Do(func() {
		for _, l := range r.loops {
			_ = l.Close()
		}
		for _, raw := range r.raws {
			_ = raw.Close() // refused for a loop's own: the loop closes it
		}
		for _, paths := range r.workers {
			for _, p := range paths {
				_ = p.From.Close()
				_ = p.To.Close()
			}
		}
	})
	return nil
}
