package relay

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// clockTicks is USER_HZ, the unit of CPU times in /proc/<pid>/stat.
const clockTicks = 100

// startChild starts name (exe with args and extra environment) pinned to
// cpus and waits for its ready line. The affinity is set on a locked OS
// thread that then forks, so the child inherits it from its first
// instruction on and every thread it makes has it too; that thread is
// never unlocked and exits with its goroutine, so the narrowed mask goes
// nowhere else.
//
// rt > 0 runs the child under SCHED_FIFO at that priority (root only): on
// a shared machine, where other users' processes sit in other cgroups and
// nice values do not reach them, this is what gives a hop its core.
func startChild(name string, cpus []int, nice, rt int, exe string, env []string, args ...string) (*child, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if len(cpus) > 0 {
			if err := unix.SchedSetaffinity(0, cpuSet(cpus)); err != nil {
				started <- fmt.Errorf("pin %s to %v: %w", name, cpus, err)
				return
			}
		}
		if nice != 0 {
			if err := unix.Setpriority(unix.PRIO_PROCESS, 0, nice); err != nil {
				started <- fmt.Errorf("nice %s to %d: %w", name, nice, err)
				return
			}
		}
		if rt > 0 {
			if err := unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: uint32(rt)}, 0); err != nil {
				started <- fmt.Errorf("SCHED_FIFO for %s: %w", name, err)
				return
			}
		}
		started <- cmd.Start()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, in: stdin, done: make(chan struct{})}
	rdc := make(chan error, 1)
	go func() {
		rd, err := readReady(stdout)
		c.rd = rd
		rdc <- err
		_, _ = io.Copy(io.Discard, stdout)
		c.err = cmd.Wait()
		close(c.done)
	}()
	select {
	case err := <-rdc:
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	case <-time.After(10 * time.Second):
		c.stop()
		return nil, fmt.Errorf("%s: %w within 10s", name, errNotReady)
	}
	return c, nil
}

// stop ends the child (stdin EOF, then SIGKILL after 5 s) and reaps it.
func (c *child) stop() {
	_ = c.in.Close()
	_ = c.cmd.Process.Signal(unix.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func cpuSet(cpus []int) *unix.CPUSet {
	var s unix.CPUSet
	for _, c := range cpus {
		s.Set(c)
	}
	return &s
}

// pinSelf moves every thread of this process to cpus (none: leaves the
// affinity) and gives it the nice value, or SCHED_FIFO at rt > 0; threads made later inherit both
// from the thread that makes them.
func pinSelf(cpus []int, nice, rt int) error {
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tids {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if len(cpus) > 0 {
			if err := unix.SchedSetaffinity(tid, cpuSet(cpus)); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("pin thread %d: %w", tid, err)
			}
		}
		if rt > 0 {
			if err := unix.SchedSetAttr(tid, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: uint32(rt)}, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("SCHED_FIFO for thread %d: %w", tid, err)
			}
		} else if nice != 0 {
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("nice thread %d: %w", tid, err)
			}
		}
	}
	return nil
}

// allowedCPUs returns a process's Cpus_allowed_list from /proc (the
// report records it, so a pinning that did not take shows).
func allowedCPUs(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == "Cpus_allowed_list" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// procCPU returns a process's user + system CPU time from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (in parentheses, may hold spaces):
	// utime is field 14, stime 15 (1-based).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// socketDrops sums the kernel's drop counter (/proc/net/udp, last column)
// over the UDP sockets a process holds: datagrams lost because that
// process did not read in time.
func socketDrops(pid int) int64 {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[l[len("socket:["):len(l)-1]] = true
		}
	}
	var drops int64
	for _, tab := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		b, err := os.ReadFile(tab)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) >= 13 && inodes[f[9]] {
				n, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
				drops += n
			}
		}
	}
	return drops
}
