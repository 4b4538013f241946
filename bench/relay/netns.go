package relay

// The -veth topology: every process of a trial on a host of its own, a
// network namespace joined to one bridge by a veth pair, so that the
// datagrams cross real interfaces (and the fast path's programs can
// attach, docs/fastpath.md) instead of loopback.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Hosts of the LAN and their addresses (10.79.0.0/24).
const (
	hostGen  = "gen"  // the load generator (this process, on a thread inside)
	hostHop1 = "hop1" // the first hop
	hostHop2 = "hop2" // a chain's second hop
	hostEcho = "echo"
)

var lanHosts = map[string]netip.Addr{
	hostGen:  netip.MustParseAddr("10.79.0.50"),
	hostHop1: netip.MustParseAddr("10.79.0.10"),
	hostHop2: netip.MustParseAddr("10.79.0.20"),
	hostEcho: netip.MustParseAddr("10.79.0.30"),
}

// lan is the bridge and its hosts.
type lan struct {
	id    string
	names map[string]string // host → namespace
}

// newLAN makes the namespaces. Every host has transmit checksum offload
// off on its eth0, as a NIC delivers datagrams checksummed in full, and
// IPv4 forwarding on, which the programs' route lookups need. cpus, when
// set, says on which CPUs each host receives (RPS on its eth0): a veth
// delivers on the sender's CPU, so without it a hop's receive work, and
// all of the fast path's, would run on the load generator's core; with
// it each host's receive runs where its process runs, as a NIC's queue
// with its interrupt on the hop's core would.
func newLAN(cpus map[string][]int) (_ *lan, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("-veth makes network namespaces and loads BPF programs: run it as root")
	}
	for _, tool := range []string{"ip", "ethtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("-veth needs %s: apt-get install iproute2 ethtool", tool)
		}
	}
	sweepLANs()
	var b [3]byte
	_, _ = rand.Read(b[:])
	l := &lan{id: fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b[:])), names: map[string]string{}}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	sw := lanPrefix + l.id + "-sw"
	l.names["sw"] = sw
	steps := [][]string{{"netns", "add", sw},
		{"-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", sw, "link", "set", "br0", "up"}}
	i := 0
	for host, a := range lanHosts {
		i++
		ns := lanPrefix + l.id + "-" + host
		l.names[host] = ns
		port := fmt.Sprintf("p%d", i)
		steps = append(steps, []string{"netns", "add", ns},
			[]string{"link", "add", port, "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"-n", sw, "link", "set", port, "master", "br0"},
			[]string{"-n", sw, "link", "set", port, "up"},
			[]string{"-n", ns, "addr", "add", a.String() + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
			[]string{"netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.eth0.forwarding=1"},
			[]string{"netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off"})
		if mask := cpuMask(cpus[host]); mask != "" {
			steps = append(steps, []string{"netns", "exec", ns, "sh", "-c", "echo " + mask + " > /sys/class/net/eth0/queues/rx-0/rps_cpus"})
		}
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return l, nil
}

// cpuMask is cpus as a hexadecimal mask ("" for none).
func cpuMask(cpus []int) string {
	var m uint64
	for _, c := range cpus {
		m |= 1 << c
	}
	if m == 0 {
		return ""
	}
	return strconv.FormatUint(m, 16)
}

// lanPrefix starts every namespace's name; the creating process's ID
// follows.
const lanPrefix = "relaybench-"

// sweepLANs removes the namespaces of runs whose process is gone (killed
// before it could remove them).
func sweepLANs() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		pid, _, ok := strings.Cut(strings.TrimPrefix(e.Name(), lanPrefix), "-")
		if !strings.HasPrefix(e.Name(), lanPrefix) || !ok {
			continue
		}
		if id, err := strconv.Atoi(pid); err == nil && id > 0 && unix.Kill(id, 0) == unix.ESRCH {
			_ = exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
}

// close removes every namespace (and with them the veth pairs).
func (l *lan) close() {
	for _, ns := range l.names {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// wrap turns exe args into the command line that runs them on host.
func (l *lan) wrap(host, exe string, args []string) (string, []string) {
	return "ip", append([]string{"netns", "exec", l.names[host], exe}, args...)
}

// in runs f on a thread inside host's namespace (to open sockets there).
// The thread is never unlocked: it ends with its goroutine instead of
// going back to the pool inside the namespace.
func (l *lan) in(host string, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := os.Open("/run/netns/" + l.names[host])
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("setns %s: %w", host, err)
			return
		}
		done <- f()
	}()
	return <-done
}

// raiseSoftirqThreads runs the kernel's softirq threads (ksoftirqd/N)
// under SCHED_FIFO at priority rt for a -veth run with real-time hops, and
// returns what puts them back. Over veth most of a datagram's work is
// softirq; under load the kernel defers it to these threads, which in the
// normal class wait behind the SCHED_FIFO hops until the RT throttle
// (50 ms a second) lets them run: every path then shows 50 ms round trips
// and loss (measured once). Above the hops they run when work is pending,
// as softirq runs on an interrupt's exit when it is not deferred.
func raiseSoftirqThreads(rt int) (restore func(), err error) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	type saved struct {
		pid  int
		attr *unix.SchedAttr
	}
	var done []saved
	restore = func() {
		for _, s := range done {
			_ = unix.SchedSetAttr(s.pid, s.attr, 0)
		}
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
		if err != nil || !strings.HasPrefix(string(comm), "ksoftirqd/") {
			continue
		}
		old, err := unix.SchedGetAttr(pid, 0)
		if err != nil {
			restore()
			return nil, fmt.Errorf("%s: %w", strings.TrimSpace(string(comm)), err)
		}
		if err := unix.SchedSetAttr(pid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(rt)}, 0); err != nil {
			restore()
			return nil, fmt.Errorf("SCHED_FIFO for %s: %w", strings.TrimSpace(string(comm)), err)
		}
		done = append(done, saved{pid, old})
	}
	return restore, nil
}
