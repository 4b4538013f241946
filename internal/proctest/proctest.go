// Package proctest runs the project's binaries as child processes in tests:
// it builds a main package once per test binary, starts it with arguments
// and environment, parses its log/slog text lines into fields, waits for a
// log message instead of sleeping, stops it with SIGTERM and awaits the exit,
// and in t.Cleanup kills and reaps whatever is still running and, when the
// test failed, prints the tail of the process's log.
//
// Methods that take a testing.TB fail the test on error (t.Fatal), so they
// must be called from the test's goroutine. Everything else is safe for
// concurrent use.
package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// maxLines bounds the log lines kept per process; older lines are dropped
// first, so a chatty process cannot grow a long test's memory without end.
const maxLines = 100_000

// dumpLines is how many of a process's last log lines a failed test prints.
const dumpLines = 200

// TestingM is what a TestMain hands to goleak.VerifyTestMain or runs itself.
type TestingM interface{ Run() int }

// builds caches binaries for the lifetime of a test binary. It is active
// only inside Main, which removes the directory when the tests are done;
// without Main every Build compiles into the test's own temp directory.
var builds struct {
	mu     sync.Mutex
	active bool
	dir    string
	done   map[string]buildResult // by package path
}

type buildResult struct {
	path string
	err  error
}

type mainRunner struct{ m TestingM }

// Main wraps m so that Build compiles each package once for the whole test
// binary and the binaries are removed after the tests ran:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(proctest.Main(m)) }
func Main(m TestingM) TestingM { return mainRunner{m} }

func (r mainRunner) Run() int {
	builds.mu.Lock()
	builds.active = true
	builds.mu.Unlock()
	code := r.m.Run()
	builds.mu.Lock()
	defer builds.mu.Unlock()
	builds.active = false
	if builds.dir != "" {
		if err := os.RemoveAll(builds.dir); err != nil {
			fmt.Fprintf(os.Stderr, "proctest: remove builds: %v\n", err)
		}
		builds.dir, builds.done = "", nil
	}
	return code
}

// Build compiles the main package pkg (an import path such as
// "github.com/rtcedge/rtcedge/cmd/rtcedge", or a path relative to the test's
// package directory) and returns the binary's path. Under Main a package is
// built once and shared by every test; otherwise it is built into
// t.TempDir().
func Build(t testing.TB, pkg string) string {
	t.Helper()
	builds.mu.Lock()
	defer builds.mu.Unlock() // concurrent tests wait for the one build
	if !builds.active {
		path, err := build(t.TempDir(), pkg)
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
	if r, ok := builds.done[pkg]; ok {
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.path
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "proctest-")
		if err != nil {
			t.Fatalf("proctest: build dir: %v", err)
		}
		builds.dir, builds.done = dir, map[string]buildResult{}
	}
	dir := filepath.Join(builds.dir, strconv.Itoa(len(builds.done)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("proctest: build dir: %v", err)
	}
	path, err := build(dir, pkg)
	builds.done[pkg] = buildResult{path, err}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func build(dir, pkg string) (string, error) {
	// Name the binary after its package directory ("." is the test's own).
	name := pkg
	if abs, err := filepath.Abs(pkg); err == nil && (pkg == "." || strings.HasPrefix(pkg, "./") || strings.HasPrefix(pkg, "../")) {
		name = abs
	}
	out := filepath.Join(dir, filepath.Base(name))
	if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("proctest: go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// Spec describes a process to start.
type Spec struct {
	Name string   // names the process in failures and log dumps
	Args []string // arguments after the binary
	Env  []string // "KEY=value" added to the test's environment
}

// Proc is one running (or exited) child process and its log.
type Proc struct {
	name string
	cmd  *exec.Cmd

	mu      sync.Mutex
	lines   []string      // guarded by mu; stdout and stderr interleaved
	dropped int           // guarded by mu; lines beyond maxLines
	changed chan struct{} // guarded by mu; closed (and replaced) on every new line

	done chan struct{} // closed once the process was reaped
	err  error         // the exit status; written before done closes
}

// Start starts bin as described by spec. The process is killed and reaped
// in t.Cleanup if it is still running then.
func Start(t testing.TB, bin string, spec Spec) *Proc {
	t.Helper()
	name := spec.Name
	if name == "" {
		name = filepath.Base(bin)
	}
	p := &Proc{name: name, changed: make(chan struct{}), done: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("proctest: pipe for %s: %v", name, err)
	}
	p.cmd = exec.Command(bin, spec.Args...)
	p.cmd.Env = append(os.Environ(), spec.Env...)
	p.cmd.Stdout, p.cmd.Stderr = w, w
	p.cmd.SysProcAttr = sysProcAttr()
	err = p.cmd.Start()
	w.Close() // the child holds its own copy; EOF then means it exited
	if err != nil {
		r.Close()
		t.Fatalf("proctest: start %s: %v", name, err)
	}
	go p.read(r)
	t.Cleanup(func() {
		if !p.Exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s log (last %d lines):\n%s", name, dumpLines, p.tail(dumpLines))
		}
	})
	return p
}

// read collects lines until the child closes its output, then reaps it.
func (p *Proc) read(r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p.mu.Lock()
		if len(p.lines) == maxLines {
			p.lines = append(p.lines[:0], p.lines[maxLines/2:]...)
			p.dropped += maxLines / 2
		}
		p.lines = append(p.lines, sc.Text())
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
	p.err = p.cmd.Wait()
	close(p.done)
}

// Name is the process's name from its Spec.
func (p *Proc) Name() string { return p.name }

// Pid is the process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and was reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited and was reaped.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the exit status (nil for a clean exit); valid once Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// Signal sends sig to the process; a process that already exited is not an
// error.
func (p *Proc) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("proctest: signal %s: %w", p.name, err)
	}
	return nil
}

// Lines returns a copy of the log lines so far.
func (p *Proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

func (p *Proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lines[max(0, len(p.lines)-n):]
	return strings.Join(l, "\n")
}

// Find returns the fields of the first log line that match accepts.
func (p *Proc) Find(match func(Fields) bool) (Fields, bool) {
	f, ok, _ := p.find(match)
	return f, ok
}

// Count returns how many log lines so far have msg as their message.
func (p *Proc) Count(msg string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if ParseLine(l)["msg"] == msg {
			n++
		}
	}
	return n
}

func (p *Proc) find(match func(Fields) bool) (Fields, bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if f := ParseLine(l); match(f) {
			return f, true, nil
		}
	}
	return nil, false, p.changed
}

// WaitLog waits up to limit for a log line whose message is msg and returns
// its fields. It fails the test if the process exits or the time runs out
// first.
func (p *Proc) WaitLog(t testing.TB, msg string, limit time.Duration) Fields {
	t.Helper()
	return p.WaitFor(t, limit, strconv.Quote(msg), func(f Fields) bool { return f["msg"] == msg })
}

// WaitFor waits up to limit for a log line that match accepts (what
// describes it in failures) and returns its fields.
func (p *Proc) WaitFor(t testing.TB, limit time.Duration, what string, match func(Fields) bool) Fields {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		f, ok, changed := p.find(match)
		if ok {
			return f
		}
		select {
		case <-changed:
		case <-p.done:
			// The last lines may have arrived together with the exit.
			if f, ok := p.Find(match); ok {
				return f
			}
			t.Fatalf("%s exited (%v) before logging %s", p.name, p.err, what)
		case <-timer.C:
			t.Fatalf("%s did not log %s within %v", p.name, what, limit)
		}
	}
}

// Wait waits up to limit for the process to exit and fails the test if it
// does not, or exits with an error.
func (p *Proc) Wait(t testing.TB, limit time.Duration) {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	p.exited(t, timer.C, limit, "")
}

// exited reports whether p exited before deadline, failing the test if not
// or if it failed; after names what the exit follows.
func (p *Proc) exited(t testing.TB, deadline <-chan time.Time, limit time.Duration, after string) bool {
	t.Helper()
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("%s exited with %v%s", p.name, p.err, after)
		}
		return true
	case <-deadline:
		t.Errorf("%s did not exit within %v%s", p.name, limit, after)
		return false
	}
}

// Stop sends SIGTERM and waits up to limit for a clean exit; see StopAll.
func (p *Proc) Stop(t testing.TB, limit time.Duration) {
	t.Helper()
	StopAll(t, limit, p)
}

// StopAll sends SIGTERM to every process first, so their graceful stops
// overlap, then waits up to limit in all for each to exit cleanly. A process
// still running at the deadline fails the test and is left to Cleanup to
// kill.
func StopAll(t testing.TB, limit time.Duration, procs ...*Proc) {
	t.Helper()
	for _, p := range procs {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Error(err)
		}
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for _, p := range procs {
		if !p.exited(t, deadline.C, limit, " after SIGTERM") {
			return
		}
	}
}

// Fields are the key=value pairs of one log/slog text line ("time", "level",
// "msg" and the attributes). A line that is not slog text yields the pairs
// up to the first token it cannot parse.
type Fields map[string]string

// ParseLine parses a log/slog text line: space-separated key=value pairs
// whose keys or values are Go-quoted when they hold spaces, quotes or other
// special characters.
func ParseLine(line string) Fields {
	out := Fields{}
	for {
		line = strings.TrimLeft(line, " ")
		if line == "" {
			return out
		}
		k, rest, ok := token(line, '=')
		if !ok || !strings.HasPrefix(rest, "=") {
			return out
		}
		v, rest, ok := token(rest[1:], ' ')
		if !ok {
			return out
		}
		out[k], line = v, rest
	}
}

// token reads one bare or quoted token from s, ending before stop (or at
// the end of s for a bare token).
func token(s string, stop byte) (tok, rest string, ok bool) {
	if strings.HasPrefix(s, `"`) {
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return "", "", false
		}
		tok, err = strconv.Unquote(q)
		return tok, s[len(q):], err == nil
	}
	i := strings.IndexByte(s, stop)
	switch {
	case stop == ' ' && i < 0:
		return s, "", true
	case i < 0 || strings.IndexByte(s[:i], ' ') >= 0:
		return "", "", false // a bare key holds no space: not slog text
	}
	return s[:i], s[i:], true
}

// WriteFile writes content to dir/name (mode 0600, for configs that may name
// secrets) and returns the path.
func WriteFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatalf("proctest: %v", err)
	}
	return path
}

// Await polls cond every 50ms until it holds, failing the test after limit.
// For states that live in other processes, with no event to subscribe to.
func Await(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
