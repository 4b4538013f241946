package udpio

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LoopSupported reports whether Loop works here (Linux only).
const LoopSupported = true

// RawConn is a UDP socket taken out of the runtime's poller (Detach), so
// that a datagram wakes only the Loop that reads it. Other goroutines may
// send on it (WriteToUDPAddrPort) until it is closed.
type RawConn struct {
	mu    sync.RWMutex
	fd    int // -1 once closed
	v6    bool
	local netip.AddrPort
	owned bool // a Loop reads it: only the Loop closes it (under mu)
}

// Detach takes c's socket out of the runtime's poller: it keeps a
// duplicate of the descriptor and closes c, which removes c from the
// poller's epoll set (a duplicate alone would stay in it: epoll watches
// the open file, and every datagram would wake the poller as well). c is
// closed when Detach returns, even on error; its LocalAddr still answers.
// The duplicate is non-blocking and only a Loop reads it.
func Detach(c *net.UDPConn) (*RawConn, error) {
	defer c.Close()
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &RawConn{fd: -1, local: LocalAddrPort(c)}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		var dom int
		if dom, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN); serr != nil {
			return
		}
		r.v6 = dom == unix.AF_INET6
		r.fd, serr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("udpio: detach %v: %w", r.local, serr)
	}
	if err := unix.SetNonblock(r.fd, true); err != nil {
		unix.Close(r.fd)
		return nil, fmt.Errorf("udpio: detach %v: %w", r.local, err)
	}
	return r, nil
}

// LocalAddrPort is the socket's local address, unmapped.
func (r *RawConn) LocalAddrPort() netip.AddrPort { return r.local }

// WriteToUDPAddrPort sends b to `to` without allocating. A full send
// buffer is waited for briefly (writableWait), then an error (EAGAIN);
// after Close it fails with net.ErrClosed.
func (r *RawConn) WriteToUDPAddrPort(b []byte, to netip.AddrPort) (int, error) {
	var sa unix.RawSockaddrInet6
	l := putSockaddr(&sa, to, r.v6)
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.fd < 0 {
		return 0, net.ErrClosed
	}
	waited := false
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(r.fd), uintptr(p), uintptr(len(b)), unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&sa)), uintptr(l))
		switch {
		case e == 0:
			return int(n), nil
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN && !waited:
			waited = true
			if waitWritable(r.fd) {
				continue
			}
		}
		return 0, errnoErr("sendto", e)
	}
}

// writableWait is how long a send on a raw socket waits for room in its
// full send buffer before it gives up (EAGAIN): long enough for a NIC
// queue to drain, short against a voice frame.
const writableWait = 5 // ms

// waitWritable waits up to writableWait for fd to take a datagram.
func waitWritable(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(pfd, writableWait)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && pfd[0].Revents&unix.POLLOUT != 0
	}
}

// errOwned: a Loop's socket is closed by closing the Loop, never under it
// (the loop would go on using a descriptor number the kernel may reuse).
var errOwned = errors.New("udpio: the socket belongs to a loop: close the loop")

// Close closes the socket; a send in progress finishes first. Idempotent.
// A socket a Loop owns is closed with the Loop, not here.
func (r *RawConn) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owned {
		return errOwned
	}
	return r.closeLocked()
}

func (r *RawConn) closeLocked() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// own marks r as the Loop's; false if another Loop has it already.
func (r *RawConn) own() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owned || r.fd < 0 {
		return false
	}
	r.owned = true
	return true
}

// closeOwned is the owning Loop's Close.
func (r *RawConn) closeOwned() {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.closeLocked()
}

// batchConn is a BatchConn over the raw socket, for the Loop that owns it.
func (r *RawConn) batchConn(size int) *BatchConn {
	m := newRawMmsg(r.fd, r.v6, size)
	return &BatchConn{size: size, mm: m}
}

// Loop forwards the paths of one relay worker from one OS thread that
// waits in a raw epoll_pwait, as a C event loop does: a datagram costs the
// wake-up of that thread and the batch system calls, and nothing of the
// Go scheduler (the runtime's poller, the hand-over of a goroutine to a
// thread) that ForwardBatch pays for each wake-up. A raw wait keeps its
// P, so Run adds one to GOMAXPROCS while it runs: the rest of the process
// keeps the Ps it had. See docs/benchmarks.md, "An event loop".
type Loop struct {
	paths []loopPath
	ep    int // epoll; index len(paths) is the wake-up eventfd
	wake  int
	conns []*RawConn // every socket of the paths, closed when the loop ends

	mu      sync.Mutex
	running bool
	closed  bool
	ran     bool
}

type loopPath struct {
	rd *BatchConn
	f  *batchForwarder
}

// loopBatches bounds the batches one path reads per wake-up before the
// loop looks at the others (the wait is level-triggered: the rest is read
// on the next turn).
const loopBatches = 8

// NewLoop sets up a Loop over paths; the Loop owns their sockets from
// then on (RawConn.Close refuses them) and closes them when it is closed,
// or at once if NewLoop fails.
func NewLoop(paths []LoopPath) (*Loop, error) {
	l := &Loop{ep: -1, wake: -1}
	seen := map[*RawConn]bool{}
	var taken error
	for _, p := range paths {
		for _, c := range []*RawConn{p.From, p.To} {
			if seen[c] {
				continue
			}
			seen[c] = true
			if !c.own() {
				taken = errors.New("udpio: a loop path's socket is closed or another loop's")
				continue
			}
			l.conns = append(l.conns, c)
		}
	}
	fail := func(err error) (*Loop, error) {
		l.closeAll()
		return nil, err
	}
	if taken != nil {
		return fail(taken)
	}
	if len(paths) == 0 {
		return fail(errors.New("udpio: a loop needs a path"))
	}
	var err error
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fail(fmt.Errorf("udpio: epoll: %w", err))
	}
	if l.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return fail(fmt.Errorf("udpio: eventfd: %w", err))
	}
	reads := map[*RawConn]bool{}
	for i, p := range paths {
		if reads[p.From] {
			return fail(errors.New("udpio: two loop paths read one socket"))
		}
		reads[p.From] = true
		f, err := newBatchForwarder(p.To.batchConn, p.Headroom, p.Limit, p.Batch, p.Decide, p.Hooks)
		if err != nil {
			return fail(err)
		}
		l.paths = append(l.paths, loopPath{rd: p.From.batchConn(len(f.in)), f: f})
		if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, p.From.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(i)}); err != nil {
			return fail(fmt.Errorf("udpio: epoll_ctl: %w", err))
		}
	}
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, l.wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(len(paths))}); err != nil {
		return fail(fmt.Errorf("udpio: epoll_ctl: %w", err))
	}
	return l, nil
}

// Run forwards until Close is called (nil) or a socket fails. It locks the
// calling goroutine to its thread for good (pin it first with LockThread
// if it should run on one CPU), so call it from a goroutine that ends with
// it. The sockets are closed when Run returns. Run once.
func (l *Loop) Run() error {
	l.mu.Lock()
	if l.ran {
		l.mu.Unlock()
		return errors.New("udpio: loop run twice")
	}
	l.ran = true
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.running = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.running = false
		l.closeAll()
		l.mu.Unlock()
	}()
	runtime.LockOSThread() // never undone: the thread ends with the goroutine
	addProcs(1)
	defer addProcs(-1)
	return l.serve()
}

// loopWait bounds one wait, so that a loop that no signal interrupts
// (GODEBUG=asyncpreemptoff=1) still reaches a point where the runtime can
// stop it for a collection.
const loopWait = 50 // ms

func (l *Loop) serve() error {
	events := make([]unix.EpollEvent, len(l.paths)+1)
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), loopWait, 0, 0)
		if e == unix.EINTR || (e == 0 && r == 0) {
			// A signal (often the runtime asking this thread to stop, for
			// a collection or because it ran 10 ms without yielding) or
			// a quiet spell. Raw calls never yield; let it.
			runtime.Gosched()
			continue
		}
		if e != 0 {
			return errnoErr("epoll_pwait", e)
		}
		for _, ev := range events[:r] {
			if int(ev.Fd) == len(l.paths) {
				return nil // Close
			}
			if err := l.paths[ev.Fd].drain(); err != nil {
				return err
			}
		}
	}
}

// drain reads up to loopBatches batches, stopping at one that was not full
// (the queue is empty), and forwards each.
func (p *loopPath) drain() error {
	for range loopBatches {
		n, err := p.rd.mm.readNow(p.f.in)
		if err != nil || n == 0 {
			return err
		}
		p.f.handle(n)
		if n < len(p.f.in) {
			return nil
		}
	}
	return nil
}

// Close ends Run, which closes the sockets when it returns; a Loop that
// is not running closes them at once. Idempotent; it does not wait.
func (l *Loop) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.running {
		one := uint64(1)
		_, err := unix.Write(l.wake, (*[8]byte)(unsafe.Pointer(&one))[:])
		return err
	}
	l.closeAll()
	return nil
}

// closeAll closes the sockets and the loop's own descriptors.
func (l *Loop) closeAll() {
	for _, c := range l.conns {
		c.closeOwned()
	}
	for _, fd := range []*int{&l.ep, &l.wake} {
		if *fd >= 0 {
			_ = unix.Close(*fd)
			*fd = -1
		}
	}
}
