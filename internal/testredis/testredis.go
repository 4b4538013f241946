// Package testredis starts a real redis-server for tests: on a free loopback
// port, in a t.TempDir(), without persistence, killed and reaped when the
// test ends. Tests that exercise failures can kill it, restart it on the same
// port, or freeze it (SIGSTOP) to simulate a slow server.
//
// Readiness is awaited, not slept for: the server logs to a pipe and Start
// returns once it has logged that it accepts connections.
package testredis

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// readyLine is what redis-server logs once it accepts connections (Redis 6
// and 7; 7.2 appends the transport).
const readyLine = "Ready to accept connections"

// startTimeout bounds how long one start may take before the test fails.
const startTimeout = 15 * time.Second

// portAttempts bounds retries when another process takes the free port
// between our probe and the server's bind.
const portAttempts = 5

// Server is one redis-server process owned by a test. Its methods are safe
// for concurrent use and fail the test (t.Fatal) on errors, so they must be
// called from the test's goroutine.
type Server struct {
	t   testing.TB
	dir string // static after Start

	mu   sync.Mutex
	port int
	proc *process // nil after Kill
}

// process is one run of redis-server.
type process struct {
	cmd    *exec.Cmd
	ready  chan struct{} // closed when readyLine was logged
	exited chan struct{} // closed after the process was reaped
	mu     sync.Mutex
	tail   []string // last log lines, for failure messages
}

// Start starts redis-server on a free loopback port and registers its
// shutdown with t.Cleanup. If redis-server is not installed the test fails
// with a hint on how to install it.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found: install redis-server (apt-get install redis-server): %v", err)
	}
	s := &Server{t: t, dir: t.TempDir()}
	t.Cleanup(s.Kill)
	var lastErr error
	for range portAttempts {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testredis: %v", err)
		}
		p, err := s.start(port)
		if err == nil {
			s.mu.Lock()
			s.port, s.proc = port, p
			s.mu.Unlock()
			return s
		}
		lastErr = err
	}
	t.Fatalf("testredis: start redis-server: %v", lastErr)
	return nil
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL returns a redis:// URL for database 0, as accepted by redis.ParseURL.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Kill stops the server with SIGKILL (no shutdown handshake, as in a crash)
// and waits until the process has been reaped. Idempotent.
func (s *Server) Kill() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Restart kills the server if it runs and starts a new, empty one on the
// same port, returning once it accepts connections.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.mu.Lock()
	port := s.port
	s.mu.Unlock()
	p, err := s.start(port)
	if err != nil {
		s.t.Fatalf("testredis: restart redis-server on port %d: %v", port, err)
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
}

// Pause freezes the server with SIGSTOP: connections still open (the kernel
// accepts them) but nothing is answered, like a server stuck in a long
// command. Resume undoes it; Kill works on a paused server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a server frozen by Pause.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		s.t.Fatalf("testredis: %v: server is not running", sig)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("testredis: send %v: %v", sig, err)
	}
}

// start runs redis-server on port and waits until it is ready or has exited.
func (s *Server) start(port int) (*process, error) {
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--logfile", "", // log to stdout, which we read for readiness
	)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	p := &process{cmd: cmd, ready: make(chan struct{}), exited: make(chan struct{})}
	go p.read(out)

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-p.ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("redis-server exited before it was ready: %s", p.log())
	case <-timer.C:
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
		return nil, fmt.Errorf("redis-server not ready after %v: %s", startTimeout, p.log())
	}
}

// read drains the server's log until the process ends, then reaps it. It
// must keep reading after readiness, or the server would block on a full
// pipe.
func (p *process) read(out io.Reader) {
	defer close(p.exited)
	sc := bufio.NewScanner(out)
	ready := false
	for sc.Scan() {
		line := sc.Text()
		p.mu.Lock()
		if len(p.tail) == 20 {
			p.tail = p.tail[1:]
		}
		p.tail = append(p.tail, line)
		p.mu.Unlock()
		if !ready && strings.Contains(line, readyLine) {
			ready = true
			close(p.ready)
		}
	}
	_ = p.cmd.Wait()
}

func (p *process) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// freePort asks the kernel for a free loopback TCP port. Another process may
// take it before redis-server binds it; Start retries then.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	return port, nil
}
