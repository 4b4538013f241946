package capacity

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// clockTicks is USER_HZ, the unit of CPU times in /proc/<pid>/stat; it is
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// Pod is a transceiver running as its own process (`rtcedge transceiver`),
// so that its CPU time and memory can be read apart from the load
// generator's.
type Pod struct {
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	tailMu  sync.Mutex
	tail    []string // the pod's last log lines, guarded by tailMu
	// backendEnds counts the connector's "backend ended the call" log
	// lines by reason and error, guarded by tailMu.
	backendEnds map[string]int
	profileDir  string

	Data    netip.AddrPort // the pod's UDP socket
	API     string         // session API base URL
	Metrics string         // /metrics URL
	HopKeys *encap.Keyring // the pod's inter-tier key: what a Link must seal with
}

// PodOptions are the optional settings of StartPod.
type PodOptions struct {
	// ProfileDir, when set, lets Profile write CPU and heap profiles of the
	// pod there (the pod's RTCEDGE_PROFILE_DIR).
	ProfileDir string
	// Extra is appended to the pod's YAML config as is.
	Extra string
	// CPUs, when set, pins the pod to these CPUs (taskset) with
	// GOMAXPROCS equal to their count.
	CPUs []int
}

// podTailLines is how many of the pod's last log lines Died reports.
const podTailLines = 40

// keep remembers one line of the pod's log among the last podTailLines.
func (p *Pod) keep(line string) {
	p.tailMu.Lock()
	defer p.tailMu.Unlock()
	if len(p.tail) == podTailLines {
		p.tail = append(p.tail[:0], p.tail[1:]...)
	}
	p.tail = append(p.tail, line)
}

// BackendEnds returns how many calls the pod's Realtime connector ended
// from the backend's side so far, by "reason: error" (its log).
func (p *Pod) BackendEnds() map[string]int {
	p.tailMu.Lock()
	defer p.tailMu.Unlock()
	out := make(map[string]int, len(p.backendEnds))
	for k, v := range p.backendEnds {
		out[k] = v
	}
	return out
}

// Died reports, once the pod process has exited, how it ended and its last
// log lines; nil while it runs.
func (p *Pod) Died() error {
	select {
	case <-p.done:
	default:
		return nil
	}
	p.tailMu.Lock()
	defer p.tailMu.Unlock()
	return fmt.Errorf("capacity: the pod exited (%v); its last log lines:\n%s", p.waitErr, strings.Join(p.tail, "\n"))
}

// StartPod starts `bin transceiver` on loopback (every port 0) with a
// config written to dir, and waits until it is up. The pod takes up to
// maxSessions sessions. Stop it with Stop.
func StartPod(ctx context.Context, bin, dir string, maxSessions int, opts PodOptions) (*Pod, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	// The pod does not log where its metrics listener is, so it gets a
	// port that was free a moment ago (the only port not chosen by the
	// kernel at bind time; a clash fails the start, it does not mislead).
	metricsAddr, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "transceiver.yaml")
	cfg := fmt.Sprintf("region: capacity\ncluster: 1\npod: 1\ndata_addr: 127.0.0.1:0\napi_addr: 127.0.0.1:0\n"+
		"metrics_addr: %s\nmax_sessions: %d\ndrain_timeout: 2s\nlog_level: info\n"+
		"gossip:\n  name: capacity-pod\n  bind: 127.0.0.1:0\n  insecure: true\n  fast: true\n%s", metricsAddr, maxSessions, opts.Extra)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	hop := make([]byte, encap.KeyLen)
	if _, err := rand.Read(hop); err != nil {
		return nil, err
	}
	hopKeys, err := encap.NewKeyring(1, map[uint8][]byte{1: hop})
	if err != nil {
		return nil, err
	}
	p := &Pod{done: make(chan struct{}), HopKeys: hopKeys, profileDir: opts.ProfileDir, backendEnds: map[string]int{}}
	argv, env := pinnedCommand(opts.CPUs, bin, "transceiver", "-config", cfgPath)
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(append(os.Environ(), env...), "RTCEDGE_TOKEN_KEYS=1:"+base64.StdEncoding.EncodeToString(key),
		"RTCEDGE_HOP_KEYS=1/1:"+base64.StdEncoding.EncodeToString(hop))
	if opts.ProfileDir != "" {
		p.cmd.Env = append(p.cmd.Env, "RTCEDGE_PROFILE_DIR="+opts.ProfileDir)
	}
	p.cmd.Stdout = io.Discard
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start transceiver: %w", err)
	}
	type upInfo struct {
		data, api string
	}
	up := make(chan upInfo, 1)
	go func() {
		var info upInfo
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20) // a panic's goroutine dump has long lines
		for sc.Scan() {
			p.keep(sc.Text())
			f := logFields(sc.Text())
			switch f["msg"] {
			case "transceiver up":
				info.data, info.api = f["data"], f["api"]
				up <- info
			case "backend ended the call": // backend/realtime's call.fail
				p.tailMu.Lock()
				p.backendEnds[f["reason"]+": "+f["err"]]++
				p.tailMu.Unlock()
			}
		}
		// Keep draining so the pod never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, stderr)
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	select {
	case info := <-up:
		if p.Data, err = netip.ParseAddrPort(info.data); err != nil {
			p.Stop()
			return nil, fmt.Errorf("transceiver data address %q: %w", info.data, err)
		}
		p.API = info.api
		p.Metrics = "http://" + metricsAddr + "/metrics"
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("transceiver exited before it was up: %v", p.waitErr)
	case <-ctx.Done():
		p.Stop()
		return nil, fmt.Errorf("transceiver not up: %w", ctx.Err())
	}
}

// freeLoopbackPort returns a loopback address whose port was free.
func freeLoopbackPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Stop sends SIGTERM (the pod drains with a 2 s deadline) and kills the
// process if it has not exited 10 s later.
func (p *Pod) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// StartProfile starts a CPU profile of the pod (SIGUSR1, see PodOptions).
func (p *Pod) StartProfile() error { return startProfile(p.cmd.Process, p.profileDir, "pod") }

// startProfile has a process started with a profile directory (dir)
// start its CPU profile (SIGUSR1); who names it in the error.
func startProfile(proc *os.Process, dir, who string) error {
	if dir == "" {
		return fmt.Errorf("capacity: %s started without a profile directory", who)
	}
	return proc.Signal(syscall.SIGUSR1)
}

// StopProfile stops the CPU profile and has the pod write its heap and
// allocation profiles; it waits until they are written.
func (p *Pod) StopProfile(ctx context.Context) error {
	return stopProfile(ctx, p.cmd.Process, p.profileDir)
}

// stopProfile sends SIGUSR2 to a process started with RTCEDGE_PROFILE_DIR
// set to dir (cmd/rtcedge/profile.go) and waits until it has written its
// last profile there.
func stopProfile(ctx context.Context, proc *os.Process, dir string) error {
	last := filepath.Join(dir, "allocs.pprof")
	_ = os.Remove(last)
	if err := proc.Signal(syscall.SIGUSR2); err != nil {
		return err
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		if fi, err := os.Stat(last); err == nil && fi.Size() > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("profiles not written in %s: %w", dir, ctx.Err())
		case <-tick.C:
		}
	}
}

// ProcStat is a process's CPU time and memory from /proc.
type ProcStat struct {
	CPU     time.Duration // user + system
	RSS     int64         // bytes
	Threads int
}

// Stat reads the pod's /proc entries.
func (p *Pod) Stat() (ProcStat, error) { return readProcStat(p.cmd.Process.Pid) }

// SelfStat reads this process's /proc entries (the load generator).
func SelfStat() (ProcStat, error) { return readProcStat(os.Getpid()) }

func readProcStat(pid int) (ProcStat, error) {
	var st ProcStat
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15 (1-based).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return st, errors.New("short /proc stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	st.CPU = time.Duration(ut+stime) * time.Second / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fs[0], 10, 64)
		switch k {
		case "VmRSS":
			st.RSS = n << 10 // kB
		case "Threads":
			st.Threads = int(n)
		}
	}
	return st, nil
}

// MachineStat is the whole machine's CPU time from /proc/stat.
type MachineStat struct {
	Busy, Total time.Duration
}

// ReadMachineStat reads the aggregate cpu line of /proc/stat.
func ReadMachineStat() (MachineStat, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return MachineStat{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "cpu" {
		return MachineStat{}, errors.New("unexpected /proc/stat")
	}
	return parseCPULine(f)
}

// parseCPULine reads one cpu line of /proc/stat, split into fields.
func parseCPULine(f []string) (MachineStat, error) {
	if len(f) < 8 {
		return MachineStat{}, fmt.Errorf("unexpected /proc/stat line %q", strings.Join(f, " "))
	}
	var total, idle int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 { // guest time is already counted in user time
			break
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	tick := time.Second / clockTicks
	return MachineStat{Busy: time.Duration(total-idle) * tick, Total: time.Duration(total) * tick}, nil
}

// UDPRcvbufErrors returns the machine's count of UDP datagrams dropped
// because a socket's receive buffer was full (/proc/net/snmp). It is
// machine-wide: during a window it is mostly the pod's and the link's.
func UDPRcvbufErrors() int64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "Udp: ") {
			continue
		}
		f := strings.Fields(line)[1:]
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "RcvbufErrors" && i < len(f) {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				return v
			}
		}
	}
	return 0
}

// LoadAvg returns the first field of /proc/loadavg.
func LoadAvg() float64 { return LoadAvgs()[0] }

// Scrape reads the pod's /metrics and returns every sample summed by
// metric name (labels dropped), and each labelled sample under its exposed
// name too (e.g. `x_total{direction="to_caller"}`).
func (p *Pod) Scrape(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Metrics, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			out[name] = v // with its labels, as exposed
			name = name[:j]
		}
		out[name] += v
	}
	return out, sc.Err()
}

// logFields parses a slog text line (key=value, values quoted when they
// contain spaces).
func logFields(line string) map[string]string {
	out := map[string]string{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		k, rest, ok := strings.Cut(line, "=")
		if !ok {
			break
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				break
			}
			v, line = rest[1:end+1], rest[end+2:]
		} else {
			v, line, _ = strings.Cut(rest, " ")
		}
		out[k] = v
	}
	return out
}
