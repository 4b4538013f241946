// Package relay is the relay benchmark behind `make bench-relay`: in one
// run it drives the same load through, side by side,
//
//	direct       load generator → echo
//	c            → minimal C recvmmsg/sendmmsg forwarder (cfwd/fwd.c, built with gcc at run time) → echo
//	goblock      → the C forwarder written in Go: a locked thread per direction in a raw blocking recvmmsg → echo
//	goepoll      → the same in one raw epoll loop on a locked thread → echo
//	naive        → naive Go forwarder (one datagram per system call) → echo
//	globalrelay  → the global relay (package globalrelay, production defaults) → echo as its cluster
//	c-chain      → C forwarder → C forwarder → echo
//	chain        → global relay → cluster relay → echo as the pod
//	chain-bundle   the chain with both relays sending bundles (docs/bundle.md)
//	fp-globalrelay the global relay with its in-kernel fast path (fast_path: tc, -veth only)
//	fp-chain       the chain with both relays' fast paths (-veth only)
//
// at voice load (many flows at 50 pps) and at a flood (few flows, high
// rate), and reports per path the CPU each forwarding process spends per
// forwarded datagram (utime+stime from /proc/<pid>/stat), the round-trip
// time added over the direct path (p50, p99) and the loss. Every process is
// its own, pinned to a CPU: the first hop alone on one core, the load
// generator, the echo and a chain's second hop on the other. A trial during
// which the rest of the machine (other processes) used more than a
// threshold of CPU is repeated, and the quietest attempt kept; the report
// records the load average before and after. See docs/benchmarks.md.
//
// With Config.Veth every process runs on a host of its own, a network
// namespace on one bridge (netns.go), so that datagrams cross veth pairs
// instead of loopback and the fast path can attach. Its work then runs in
// softirq, charged to whichever process raised it (these kernels have no
// IRQ time accounting), so each trial also counts the whole machine's
// non-idle CPU per datagram, reported minus the direct path's, beside the
// programs' own run time (kernel.bpf_stats_enabled).
package relay

import (
	"context"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rtcedge/rtcedge/bench/capacity"
	"github.com/rtcedge/rtcedge/internal/token"
)

//go:embed cfwd/fwd.c
var cSource []byte

// Paths, in the order the report lists them.
const (
	PathDirect      = "direct"
	PathC           = "c"
	PathNaive       = "naive"
	PathGoEpoll     = "goepoll"
	PathGoBlock     = "goblock"
	PathGlobalRelay = "globalrelay"
	PathCChain      = "c-chain"
	PathChain       = "chain"
	PathChainBundle = "chain-bundle"
	// PathChainPoller and PathChainPollerBundle run both relays with
	// event_loop: false (the runtime's poller), without and with bundles.
	PathChainPoller       = "chain-poller"
	PathChainPollerBundle = "chain-poller-bundle"
)

// AllPaths is every path of a full run.
var AllPaths = []string{PathDirect, PathC, PathGoBlock, PathGoEpoll, PathNaive, PathGlobalRelay, PathGlobalRelayPoller, PathCChain, PathChain, PathChainBundle, PathChainPollerBundle}

// PathGlobalRelayPoller is the global relay with event_loop: false.
const PathGlobalRelayPoller = "globalrelay-poller"

// The fast path's paths (Config.Veth only): the global relay alone and
// the chain, each relay with fast_path: tc.
const (
	PathFPGlobalRelay = "fp-globalrelay"
	PathFPChain       = "fp-chain"
)

// VethPaths is every path of a -veth run; the others bind loopback.
var VethPaths = []string{PathDirect, PathC, PathGlobalRelay, PathFPGlobalRelay, PathCChain, PathChain, PathFPChain}

// chainOptions are the options (grEnv and crEnv alike) of each chain path.
var chainOptions = map[string]string{PathChain: "", PathChainBundle: "bundle=1", PathChainPoller: "loop=0", PathChainPollerBundle: "bundle=1 loop=0",
	PathFPChain: "fp=tc"}

// isChain reports whether path is a chain of two hops.
func isChain(path string) bool {
	_, ok := chainOptions[path]
	return ok || path == PathCChain
}

// Variants of the global relay alone, measured when asked for by name
// (-paths): the relay's worker placement options. "2w" variants run two
// workers with the process on every CPU; the others one, on the hop's core.
var Variants = map[string]struct {
	Options    string // grEnv
	AllCPUs    bool   // the process may use every CPU
	EchoBundle bool   // the echo (as the cluster relay) bundles its replies
}{
	"globalrelay-bundle":         {"bundle=1", false, true},
	PathGlobalRelayPoller:        {"loop=0", false, false},
	"globalrelay-poller-bundle":  {"bundle=1 loop=0", false, true},
	"globalrelay-locked":         {"lock=1", false, false},
	"globalrelay-batch1":         {"batch=1", false, false},
	"globalrelay-batch8":         {"batch=8", false, false},
	"globalrelay-batch128":       {"batch=128", false, false},
	"globalrelay-2w-hash":        {"workers=2", true, false},
	"globalrelay-2w-hash-pinned": {"workers=2 cpus=0:1", true, false},
	"globalrelay-2w-cpu":         {"workers=2 cpus=0:1 steer=cpu", true, false},
	"globalrelay-2w-incoming":    {"workers=2 cpus=0:1 steer=incoming_cpu", true, false},
	PathFPGlobalRelay:            {"fp=tc", false, false},
}

// Load is one offered load: Flows client addresses sending PPS datagrams a
// second each.
type Load struct {
	Name  string `json:"name"`
	Flows int    `json:"flows"`
	PPS   int    `json:"pps"`
}

// Config configures a run. Zero fields take the defaults in brackets.
type Config struct {
	// Exe is the binary the children run as (with RoleEnv set): the
	// harness's own, or a test binary whose TestMain calls MaybeRunRole.
	Exe string
	// Dir holds the compiled C forwarder. [a temporary directory]
	Dir   string
	CC    string   // C compiler [gcc]
	Paths []string // [AllPaths]
	Loads []Load   // [voice 500×50, flood 64×500]
	// Warmup runs the load before the window; Window is measured; Drain
	// waits for the window's last echoes. [1s, 5s, 300ms]
	Warmup, Window, Drain time.Duration
	// GenCPUs is where the load generator, the echo and a chain's second
	// hop run; HopCPU is the first hop's core. [CPU 0 / CPU 1 on a
	// machine with two or more, everything unpinned on one]
	GenCPUs []int
	HopCPU  int
	// Quiet is the CPU (in cores) the rest of the machine may use during a
	// window before the trial is repeated, at most Attempts times in all;
	// the quietest attempt is kept. [0.25, 3]
	Quiet    float64
	Attempts int
	// Nice is the nice value of every process of a trial (the generator
	// too): negative values (root only) let them win the CPU over the
	// rest of a shared machine. [0]
	Nice int
	// RT > 0 runs every process of a trial under SCHED_FIFO at priority
	// RT (root only), all at the same one: none preempts another (a
	// higher one for the hops starved the generator and the echo that
	// share a core with a chain's second hop, which then lost datagrams).
	// On a shared machine, where other users' processes sit in other
	// cgroups that nice values do not reach, this is what gives each
	// process its core for the length of a trial; the kernel's RT
	// throttling still leaves the rest of the machine 5 %. [0]
	RT int
	// Veth runs every process on a host of its own over veth pairs and a
	// bridge (netns.go; root only), the paths of VethPaths. [false]
	Veth     bool
	Progress io.Writer // one line per trial [discarded]
}

// DefaultLoads are voice (500 flows × 50 pps: 25 000 datagrams/s each
// way) and a flood (64 flows × 500 pps: 32 000/s each way).
var DefaultLoads = []Load{{Name: "voice", Flows: 500, PPS: 50}, {Name: "flood", Flows: 64, PPS: 500}}

// Report is a run's result, written as JSON.
type Report struct {
	Date       time.Time `json:"date"`
	CPUs       int       `json:"cpus"`
	Go         string    `json:"go"`
	Kernel     string    `json:"kernel"`
	LoadBefore string    `json:"load_before"` // /proc/loadavg at the start
	LoadAfter  string    `json:"load_after"`
	Window     string    `json:"window"`
	Quiet      float64   `json:"quiet_threshold_cores"`
	Nice       int       `json:"nice"`
	RT         int       `json:"rt_priority"` // SCHED_FIFO priority of the hops, 0: normal
	Trials     []Trial   `json:"trials"`
}

// Trial is one path at one load.
type Trial struct {
	Path     string  `json:"path"`
	Load     Load    `json:"load"`
	Offered  int     `json:"offered_pps"` // each way
	Sent     int64   `json:"sent"`        // datagrams sent in the window
	Echoed   int64   `json:"echoed"`      // their echoes received
	Loss     float64 `json:"loss"`
	Stray    int64   `json:"stray"` // echoes malformed or on the wrong flow
	RTTp50   float64 `json:"rtt_p50_us"`
	RTTp99   float64 `json:"rtt_p99_us"`
	AddedP50 float64 `json:"added_p50_us"` // over direct at the same load
	AddedP99 float64 `json:"added_p99_us"`
	Hops     []Hop   `json:"hops,omitempty"`
	// CPUPerPkt is the hops' CPU per forwarded datagram, summed over the
	// hops, in ns; VsC divides it by the same run's C path (c for c,
	// naive and globalrelay; c-chain for chain). 0 when not measured.
	CPUPerPkt float64 `json:"cpu_ns_per_pkt"`
	VsC       float64 `json:"vs_c,omitempty"`
	// OtherLoad is the CPU the rest of the machine used in the window
	// (cores); Attempts how many tries it took to get one under the
	// threshold (or all of them, Quiet false, the quietest kept).
	OtherLoad    float64 `json:"other_load_cores"`
	Softirq      float64 `json:"softirq_cores"` // machine-wide softirq time in the window
	Attempts     int     `json:"attempts"`
	Quiet        bool    `json:"quiet"`
	RcvbufErrors int64   `json:"rcvbuf_errors"` // machine-wide UDP receive-buffer overflows in the window
	// GenBusy is how busy the load generator's core(s) were in the window
	// (0–1, softirq included). Near 1, the generator, the echo and a
	// chain's second hop, which share it, queue behind each other, and
	// the RTTs measure that queue rather than the hops.
	GenBusy float64 `json:"gen_core_busy"`
	// MachinePerPkt is the whole machine's non-idle CPU (every process,
	// softirq included) per forwarded datagram in ns; MachineAdded is it
	// minus the direct path's at the same load (what the hops cost, with
	// the same generator and echo), MachineVsC that over the same run's C
	// path's (c-chain for chains). BPFPerPkt is the fast path programs'
	// own run time per forwarded datagram, BPFRuns how often they ran.
	// Set in -veth runs.
	MachinePerPkt float64 `json:"machine_ns_per_pkt,omitempty"`
	MachineAdded  float64 `json:"machine_added_ns_per_pkt,omitempty"`
	MachineVsC    float64 `json:"machine_vs_c,omitempty"`
	BPFPerPkt     float64 `json:"bpf_ns_per_pkt,omitempty"`
	BPFRuns       uint64  `json:"bpf_runs,omitempty"`
}

// Hop is one forwarding process of a trial.
type Hop struct {
	Name      string  `json:"name"`
	CPUs      string  `json:"cpus"` // Cpus_allowed_list as the kernel has it
	CPU       float64 `json:"cpu_cores"`
	CPUPerPkt float64 `json:"cpu_ns_per_pkt"`
	// SocketDrops is what the kernel dropped in the window on this hop's
	// sockets because the hop did not read in time.
	SocketDrops int64 `json:"socket_drops"`
}

func (c *Config) defaults() error {
	if c.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.Exe = exe
	}
	if c.CC == "" {
		c.CC = "gcc"
	}
	if len(c.Paths) == 0 {
		c.Paths = AllPaths
	}
	if len(c.Loads) == 0 {
		c.Loads = DefaultLoads
	}
	if c.Warmup == 0 {
		c.Warmup = time.Second
	}
	if c.Window == 0 {
		c.Window = 5 * time.Second
	}
	if c.Drain == 0 {
		c.Drain = 300 * time.Millisecond
	}
	if c.GenCPUs == nil && runtime.NumCPU() >= 2 {
		c.GenCPUs, c.HopCPU = []int{0}, 1
	}
	if c.Quiet == 0 {
		c.Quiet = 0.25
	}
	if c.Attempts == 0 {
		c.Attempts = 3
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	for _, p := range c.Paths {
		if _, ok := Variants[p]; !ok && !contains(AllPaths, p) && !isChain(p) {
			return fmt.Errorf("unknown path %q (want %s or a variant)", p, strings.Join(AllPaths, ", "))
		}
		if c.Veth != contains(VethPaths, p) && (c.Veth || p == PathFPGlobalRelay || p == PathFPChain) {
			return fmt.Errorf("path %q: -veth runs %s, and those only", p, strings.Join(VethPaths, ", "))
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// buildC compiles the C forwarder into dir.
func buildC(cc, dir string) (string, error) {
	src := filepath.Join(dir, "fwd.c")
	bin := filepath.Join(dir, "fwd")
	if err := os.WriteFile(src, cSource, 0o644); err != nil {
		return "", err
	}
	if _, err := exec.LookPath(cc); err != nil {
		return "", fmt.Errorf("the C forwarder needs %s (apt-get install gcc): %w", cc, err)
	}
	out, err := exec.Command(cc, "-O2", "-pthread", "-o", bin, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s fwd.c: %v\n%s", cc, err, out)
	}
	return bin, nil
}

// Run runs every path at every load and returns the report. It stops
// early, with what it has, when ctx ends.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "relaybench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.Dir = dir
	}
	cbin, err := buildC(cfg.CC, cfg.Dir)
	if err != nil {
		return nil, err
	}
	if cfg.Nice < 0 && unix.Setpriority(unix.PRIO_PROCESS, 0, cfg.Nice) != nil {
		fmt.Fprintf(cfg.Progress, "cannot raise priority to nice %d (needs root): running at nice 0\n", cfg.Nice)
		cfg.Nice = 0
	}
	if cfg.RT > 0 && unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: uint32(cfg.RT)}, 0) != nil {
		fmt.Fprintf(cfg.Progress, "cannot use SCHED_FIFO (needs root): running in the normal class\n")
		cfg.RT = 0
	}
	if cfg.GenCPUs != nil || cfg.Nice != 0 || cfg.RT > 0 {
		if err := pinSelf(cfg.GenCPUs, cfg.Nice, cfg.RT); err != nil {
			return nil, err
		}
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	rep := &Report{
		Date: time.Now().UTC(), CPUs: runtime.NumCPU(), Go: runtime.Version(),
		Kernel: unix.ByteSliceToString(uts.Release[:]), LoadBefore: loadavg(),
		Window: cfg.Window.String(), Quiet: cfg.Quiet, Nice: cfg.Nice,
	}
	key := make([]byte, token.KeyLen)
	for i := range key {
		key[i] = byte(i*7 + 1)
	}
	keys, err := token.NewKeyring(1, map[uint8][]byte{1: key})
	if err != nil {
		return nil, err
	}
	r := runner{cfg: cfg, cbin: cbin, keys: keys, keyHex: hex.EncodeToString(key)}
	if cfg.Veth {
		var rx map[string][]int
		if cfg.GenCPUs != nil { // where each host's process runs (trial)
			rx = map[string][]int{hostGen: cfg.GenCPUs, hostEcho: cfg.GenCPUs, hostHop1: {cfg.HopCPU}, hostHop2: cfg.GenCPUs}
		}
		if r.lan, err = newLAN(rx); err != nil {
			return nil, err
		}
		defer r.lan.close()
		stats, err := enableBPFStats()
		if err != nil {
			return nil, fmt.Errorf("kernel.bpf_stats_enabled: %w", err)
		}
		defer stats.Close()
		if cfg.RT > 0 {
			restore, err := raiseSoftirqThreads(cfg.RT + 1)
			if err != nil {
				return nil, err
			}
			defer restore()
		}
	}
	for _, load := range cfg.Loads {
		for _, path := range cfg.Paths {
			if ctx.Err() != nil {
				rep.LoadAfter = loadavg()
				return rep, ctx.Err()
			}
			var best *Trial
			for a := 1; a <= cfg.Attempts; a++ {
				t, err := r.trial(path, load)
				if err != nil {
					rep.LoadAfter = loadavg()
					return rep, fmt.Errorf("%s at %s: %w", path, load.Name, err)
				}
				t.Attempts = a
				if best == nil || t.OtherLoad < best.OtherLoad {
					best = t
				}
				best.Attempts = a
				if t.OtherLoad <= cfg.Quiet {
					best.Quiet = true
					break
				}
			}
			rep.Trials = append(rep.Trials, *best)
			fmt.Fprintf(cfg.Progress, "%-11s %-5s loss %.4f p50 %6.0f us cpu %6.0f ns/pkt other %.2f cores (%d tries)\n",
				path, load.Name, best.Loss, best.RTTp50, best.CPUPerPkt, best.OtherLoad, best.Attempts)
		}
	}
	rep.LoadAfter = loadavg()
	compare(rep.Trials)
	return rep, nil
}

// compare fills the columns that relate trials of the same load.
func compare(ts []Trial) {
	find := func(path, load string) *Trial {
		for i := range ts {
			if ts[i].Path == path && ts[i].Load.Name == load {
				return &ts[i]
			}
		}
		return nil
	}
	for i := range ts {
		t := &ts[i]
		if d := find(PathDirect, t.Load.Name); d != nil {
			t.AddedP50, t.AddedP99 = t.RTTp50-d.RTTp50, t.RTTp99-d.RTTp99
		}
		base := PathC
		if isChain(t.Path) {
			base = PathCChain
		}
		if c := find(base, t.Load.Name); c != nil && c.CPUPerPkt > 0 && t.CPUPerPkt > 0 {
			t.VsC = t.CPUPerPkt / c.CPUPerPkt
		}
		if d := find(PathDirect, t.Load.Name); d != nil && t.MachinePerPkt > 0 {
			t.MachineAdded = t.MachinePerPkt - d.MachinePerPkt
		}
	}
	for i := range ts {
		t := &ts[i]
		base := PathC
		if isChain(t.Path) {
			base = PathCChain
		}
		if c := find(base, t.Load.Name); c != nil && c.MachineAdded > 0 && t.Path != PathDirect {
			t.MachineVsC = t.MachineAdded / c.MachineAdded
		}
	}
}

type runner struct {
	cfg    Config
	cbin   string
	keys   *token.Keyring
	keyHex string
	lan    *lan // -veth: the hosts; nil on loopback
}

// sample is what is read at the start and the end of a window.
type sample struct {
	at      time.Time
	hops    []time.Duration
	drops   []int64       // per hop, its sockets' kernel drop counters
	ours    time.Duration // generator, echo and hops
	machine capacity.MachineStat
	softirq time.Duration
	rcvbuf  int64
	gen     time.Duration               // busy time of the generator's cores
	bpf     map[ebpf.ProgramID]progStat // the hops' fast path programs
}

func (r *runner) sample(hops []*child, echo *child) (sample, error) {
	s := sample{at: time.Now()}
	for _, pid := range append([]int{os.Getpid(), echo.pid()}, pids(hops)...) {
		cpu, err := procCPU(pid)
		if err != nil {
			return s, err
		}
		s.ours += cpu
	}
	for _, h := range hops {
		cpu, _ := procCPU(h.pid())
		s.hops = append(s.hops, cpu)
		s.drops = append(s.drops, socketDrops(h.pid()))
	}
	var err error
	if s.machine, err = capacity.ReadMachineStat(); err != nil {
		return s, err
	}
	s.softirq = softirqTime()
	s.gen = cpusBusy(r.cfg.GenCPUs)
	s.rcvbuf = capacity.UDPRcvbufErrors()
	if r.lan != nil {
		s.bpf = bpfRuntime(pids(hops))
	}
	return s, nil
}

func pids(cs []*child) []int {
	out := make([]int, len(cs))
	for i, c := range cs {
		out[i] = c.pid()
	}
	return out
}

// trial runs one path at one load once.
func (r *runner) trial(path string, load Load) (_ *Trial, err error) {
	cfg := r.cfg
	var stops []*child
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i].stop()
		}
	}()
	// start starts a child on host (-veth; else on loopback).
	start := func(host, name string, cpus []int, rt int, exe string, env []string, args ...string) (*child, error) {
		if r.lan != nil {
			env = append(env, bindEnv+"="+lanHosts[host].String())
			exe, args = r.lan.wrap(host, exe, args)
		}
		c, err := startChild(name, cpus, cfg.Nice, rt, exe, env, args...)
		if err == nil {
			stops = append(stops, c)
		}
		return c, err
	}
	grOpts, crOpts, echoOpts := "", "", ""
	chainOpts, relayChain := chainOptions[path]
	if relayChain {
		grOpts, crOpts = chainOpts, chainOpts
	}
	if Variants[path].EchoBundle {
		echoOpts = "bundle=1"
	}
	goRole := func(host, role string, cpus []int, rt int, target string) (*child, error) {
		return start(host, role, cpus, rt, cfg.Exe, []string{RoleEnv + "=" + role, keyEnv + "=" + r.keyHex,
			grEnv + "=" + grOpts, crEnv + "=" + crOpts, echoEnv + "=" + echoOpts}, target)
	}
	hopRT := 0
	if cfg.RT > 0 {
		hopRT = cfg.RT
	}
	hopCPUs := []int{cfg.HopCPU}
	if cfg.GenCPUs == nil {
		hopCPUs = nil
	}
	// On the direct path the echo takes the hop's core, so that every
	// path crosses between the cores the same way.
	echoCPUs := cfg.GenCPUs
	if path == PathDirect {
		echoCPUs = hopCPUs
	}
	echo, err := goRole(hostEcho, roleEcho, echoCPUs, cfg.RT, "-")
	if err != nil {
		return nil, err
	}
	// hops[0] is the first hop (the one the generator sends to).
	var hops []*child
	var keys *token.Keyring
	add := func(c *child, err error) error {
		if err != nil {
			return err
		}
		hops = append([]*child{c}, hops...)
		return nil
	}
	target := echo.rd.Addr
	cfwd := func(host string, cpus []int, to string) (*child, error) {
		ap, err := netip.ParseAddrPort(to)
		if err != nil {
			return nil, err
		}
		if r.lan == nil {
			return start(host, "c", cpus, hopRT, r.cbin, nil, ap.Addr().String(), strconv.Itoa(int(ap.Port())), "32")
		}
		bind := lanHosts[host]
		c, err := start(host, "c", cpus, hopRT, r.cbin, nil, ap.Addr().String(), strconv.Itoa(int(ap.Port())), "32", bind.String())
		if err == nil { // it reports its ports only
			_, port, _ := strings.Cut(c.rd.Addr, ":")
			c.rd.Addr = bind.String() + ":" + port
		}
		return c, err
	}
	switch {
	case path == PathDirect:
	case path == PathC:
		err = add(cfwd(hostHop1, hopCPUs, target))
	case path == PathNaive:
		err = add(goRole(hostHop1, roleNaive, hopCPUs, hopRT, target))
	case path == PathGoEpoll:
		err = add(goRole(hostHop1, roleGoEpoll, hopCPUs, hopRT, target))
	case path == PathGoBlock:
		err = add(goRole(hostHop1, roleGoBlock, hopCPUs, hopRT, target))
	case path == PathGlobalRelay:
		keys = r.keys
		err = add(goRole(hostHop1, roleGlobalRelay, hopCPUs, hopRT, target))
	case path == PathCChain:
		if err = add(cfwd(hostHop2, cfg.GenCPUs, target)); err == nil {
			err = add(cfwd(hostHop1, hopCPUs, hops[0].rd.Addr))
		}
	case relayChain:
		keys = r.keys
		if err = add(goRole(hostHop2, roleClusterRelay, cfg.GenCPUs, hopRT, target)); err == nil {
			err = add(goRole(hostHop1, roleGlobalRelay, hopCPUs, hopRT, hops[0].rd.Addr))
		}
	default: // a variant of the global relay alone (defaults checked it)
		keys = r.keys
		v := Variants[path]
		grOpts = v.Options
		cpus := hopCPUs
		if v.AllCPUs {
			cpus = nil
			for c := range runtime.NumCPU() {
				cpus = append(cpus, c)
			}
		}
		err = add(goRole(hostHop1, roleGlobalRelay, cpus, hopRT, target))
	}
	if err != nil {
		return nil, err
	}
	if len(hops) > 0 {
		target = hops[0].rd.Addr
	}
	to, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, err
	}
	var g *gen
	if r.lan == nil {
		g, err = newGen(load.Flows, netip.AddrFrom4([4]byte{127, 0, 0, 1}))
	} else {
		err = r.lan.in(hostGen, func() error {
			var err error
			g, err = newGen(load.Flows, lanHosts[hostGen])
			return err
		})
	}
	if err != nil {
		return nil, err
	}
	defer g.close()
	if err := g.setup(to, keys); err != nil {
		return nil, err
	}
	g.start()
	stop := make(chan struct{})
	sendErr := make(chan error, 1)
	go func(stop <-chan struct{}) { sendErr <- g.send(to, load.PPS, stop) }(stop)
	stopSend := func() error {
		if stop == nil {
			return nil
		}
		close(stop)
		stop = nil
		return <-sendErr
	}
	defer stopSend()

	time.Sleep(cfg.Warmup)
	s0, err := r.sample(hops, echo)
	if err != nil {
		return nil, err
	}
	g.winEnd.Store(1 << 62)
	g.winStart.Store(time.Since(g.epoch).Nanoseconds())
	time.Sleep(cfg.Window)
	g.winEnd.Store(time.Since(g.epoch).Nanoseconds())
	s1, err := r.sample(hops, echo)
	if err != nil {
		return nil, err
	}
	time.Sleep(cfg.Drain)
	if err := stopSend(); err != nil {
		return nil, err
	}
	wall := s1.at.Sub(s0.at).Seconds()
	t := &Trial{
		Path: path, Load: load, Offered: load.Flows * load.PPS,
		Sent: g.sent.Load(), Echoed: g.recv.Load(), Stray: g.stray.Load(),
		RTTp50: g.percentile(0.50), RTTp99: g.percentile(0.99),
		RcvbufErrors: s1.rcvbuf - s0.rcvbuf,
		Softirq:      (s1.softirq - s0.softirq).Seconds() / wall,
	}
	if n := len(cfg.GenCPUs); n > 0 {
		t.GenBusy = (s1.gen - s0.gen).Seconds() / wall / float64(n)
	}
	if t.Sent > 0 {
		t.Loss = 1 - float64(t.Echoed)/float64(t.Sent)
	}
	// Every datagram sent crosses each hop once, every echo once more.
	forwarded := float64(t.Sent + t.Echoed)
	for i, h := range hops {
		d := s1.hops[i] - s0.hops[i]
		hop := Hop{Name: h.name, CPUs: allowedCPUs(h.pid()), CPU: d.Seconds() / wall, SocketDrops: s1.drops[i] - s0.drops[i]}
		if forwarded > 0 {
			hop.CPUPerPkt = float64(d.Nanoseconds()) / forwarded
		}
		t.CPUPerPkt += hop.CPUPerPkt
		t.Hops = append(t.Hops, hop)
	}
	if forwarded > 0 {
		t.MachinePerPkt = float64((s1.machine.Busy - s0.machine.Busy).Nanoseconds()) / forwarded
		var bpf time.Duration
		bpf, t.BPFRuns = bpfDelta(s0.bpf, s1.bpf)
		t.BPFPerPkt = float64(bpf.Nanoseconds()) / forwarded
	}
	busy := (s1.machine.Busy - s0.machine.Busy) - (s1.softirq - s0.softirq)
	t.OtherLoad = max(0, (busy-(s1.ours-s0.ours)).Seconds()/wall)
	return t, nil
}

// softirqTime returns the machine's softirq time (/proc/stat, field 7).
// Loopback delivery runs there; it is no other process's load.
func softirqTime() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 {
		return 0
	}
	v, _ := strconv.ParseInt(f[7], 10, 64)
	return time.Duration(v) * time.Second / clockTicks
}

// cpusBusy returns the busy time (everything but idle and iowait) of the
// given CPUs so far (/proc/stat).
func cpusBusy(cpus []int) time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	var busy int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(f[0][3:])
		if err != nil || !slices.Contains(cpus, n) {
			continue
		}
		for i, v := range f[1:] {
			if i == 3 || i == 4 { // idle, iowait
				continue
			}
			x, _ := strconv.ParseInt(v, 10, 64)
			busy += x
		}
	}
	return time.Duration(busy) * time.Second / clockTicks
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Table formats the report for a terminal.
func Table(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "relay benchmark %s, %d CPUs, %s, kernel %s, load %s -> %s, window %s\n",
		rep.Date.Format("2006-01-02 15:04 UTC"), rep.CPUs, rep.Go, rep.Kernel, rep.LoadBefore, rep.LoadAfter, rep.Window)
	fmt.Fprintf(&b, "%-11s %-5s %7s %8s %7s %6s %8s %8s %8s %8s %9s %6s %-23s %6s %5s %4s\n",
		"path", "load", "pps", "loss%", "stray", "rcvbuf", "rtt50us", "rtt99us", "+p50us", "+p99us", "ns/pkt", "xC", "hop ns/pkt@cpu/drops", "other", "tries", "gen%")
	for _, t := range rep.Trials {
		var hops []string
		for _, h := range t.Hops {
			hops = append(hops, fmt.Sprintf("%.0f@%s/%d", h.CPUPerPkt, h.CPUs, h.SocketDrops))
		}
		vs := "-"
		if t.VsC > 0 {
			vs = fmt.Sprintf("%.2f", t.VsC)
		}
		quiet := ""
		if !t.Quiet {
			quiet = "!"
		}
		fmt.Fprintf(&b, "%-11s %-5s %7d %8.3f %7d %6d %8.0f %8.0f %8.0f %8.0f %9.0f %6s %-23s %5.2f%1s %5d %4.0f\n",
			t.Path, t.Load.Name, t.Offered, 100*t.Loss, t.Stray, t.RcvbufErrors, t.RTTp50, t.RTTp99, t.AddedP50, t.AddedP99,
			t.CPUPerPkt, vs, strings.Join(hops, " "), t.OtherLoad, quiet, t.Attempts, 100*t.GenBusy)
	}
	b.WriteString("ns/pkt: CPU (utime+stime) of the forwarding processes per forwarded datagram; xC: against c (c-chain for chain);\n")
	b.WriteString("+p50/+p99: round trip added over direct; other: cores the rest of the machine used (! = over the threshold in every try)\n")
	b.WriteString("gen%: how busy the generator's core was (it also runs the echo and a chain's second hop); near 100 the RTTs are its queue\n")
	machineTable(&b, rep)
	return b.String()
}

// machineTable adds the -veth columns: the whole machine's CPU per
// datagram, minus the direct path's, against C, and the fast path
// programs' own run time.
func machineTable(b *strings.Builder, rep *Report) {
	if !slices.ContainsFunc(rep.Trials, func(t Trial) bool { return t.MachinePerPkt > 0 }) {
		return
	}
	fmt.Fprintf(b, "\n%-15s %-5s %8s %12s %10s %6s %10s %9s\n", "path", "load", "loss%", "machine ns", "-direct", "xC", "bpf ns", "bpf runs")
	for _, t := range rep.Trials {
		vs := "-"
		if t.MachineVsC > 0 {
			vs = fmt.Sprintf("%.2f", t.MachineVsC)
		}
		fmt.Fprintf(b, "%-15s %-5s %8.3f %12.0f %10.0f %6s %10.1f %9d\n",
			t.Path, t.Load.Name, 100*t.Loss, t.MachinePerPkt, t.MachineAdded, vs, t.BPFPerPkt, t.BPFRuns)
	}
	b.WriteString("machine ns: every CPU's non-idle time (all processes, softirq included) per forwarded datagram; -direct: minus the\n")
	b.WriteString("direct path's (the hops' cost); xC: that against c (c-chain for chains); bpf ns: the programs' own run time per datagram\n")
}

// WriteJSON writes the report to path.
func WriteJSON(rep *Report, path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
