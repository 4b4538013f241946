package capacity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// RunConfig configures a stepped measurement.
type RunConfig struct {
	// Bin is the rtcedge binary; the pod runs as `Bin transceiver`.
	Bin string
	// Dir holds the pod's config file.
	Dir string
	// Steps are the session counts to hold, ascending.
	Steps []int
	// Settle is the wait after reaching a step before measuring, so that
	// setup work (DTLS handshakes) is out of the window; default 3s.
	Settle time.Duration
	// Window is how long each step's audio is measured; default 8s.
	Window time.Duration
	// IdleWindow, when non-zero, also measures the pod with the audio
	// stopped, which splits the per-session cost into what the sessions
	// cost just by existing and what the packets cost.
	IdleWindow time.Duration
	// SetupConcurrency is how many calls are set up at once; default 4.
	SetupConcurrency int
	// StopLoss ends the run after the first step whose loss exceeds it;
	// default 0.05.
	StopLoss float64
	// DataChannel opens the oai-events channel in every session.
	DataChannel bool
	// Progress, when set, gets one line per event worth telling.
	Progress io.Writer
	// ProfileDir and ProfileStep, when both set, profile the pod (CPU over
	// the measurement window, then heap and allocations), the reference
	// server (the same, in ProfileDir/ref) and the load generator (CPU
	// over the window, generator.pprof) at the first step
	// of at least ProfileStep sessions; the files land in ProfileDir.
	ProfileDir  string
	ProfileStep int
	// PodConfig is appended to the pod's YAML config (e.g. "dtls_role: server").
	PodConfig string
	// Backend makes the pod transcode both ways: "ref" runs the reference
	// Realtime server (`Bin realtime-ref`, its own process), a ws:// URL
	// names another; the callers then send real Opus turns (TurnFrames).
	// Empty: the echo.
	Backend string
	// Conversation shapes a transcoding call's audio; zero:
	// Conversations["turns"].
	Conversation Conversation
	// Pin, when set, runs the pod on its own cores and the load side
	// (this process and the reference server) on the others; each step
	// then gets a Verdict.
	Pin *Pinning
}

// The pod's session ends and refusals, by reason.
const (
	metricEnded    = "rtcedge_transceiver_sessions_ended_total"
	metricRejected = "rtcedge_transceiver_sessions_rejected_total"
)

// Step is what one session count measured.
type Step struct {
	Sessions      int     `json:"sessions"`
	SetupFailures int     `json:"setup_failures"`
	SetupSecs     float64 `json:"setup_seconds"` // time to add this step's sessions
	Sent          int64   `json:"sent"`
	Echoed        int64   `json:"echoed"`
	Loss          float64 `json:"loss"` // ratio, 0..1
	// SentRatio is the callers' frames sent in the window over 50 a
	// second per session: 1 when the load generator kept up.
	SentRatio float64 `json:"sent_ratio"`
	// Underruns are frames the load generator had not made in time
	// (sent late) during the window; Skipped the 1 ms slots its sender
	// skipped (a second behind); Lost the calls that failed after they
	// were up, so far.
	Underruns int64 `json:"underruns"`
	Skipped   int64 `json:"skipped_slots"`
	Lost      int   `json:"lost_calls"`
	// Ended is the pod's sessions ended and refused from the start of the
	// step to the end of its window, by reason (its metrics), and with a
	// Realtime backend the connector's own reasons (the pod's session end
	// says backend_closed for every call its backend ended, a stall too).
	Ended map[string]float64 `json:"pod_ended,omitempty"`
	// With a Realtime backend: SeqLoss is the reply frames missed by the
	// sequence numbers of those received (Loss); PacedLoss the frames
	// received against what the pod's metrics say it paced out (noisier:
	// the scrapes and the window span slightly different times).
	PacedLoss float64       `json:"paced_loss,omitempty"`
	RTTP50    time.Duration `json:"rtt_p50_ns"`
	RTTP99    time.Duration `json:"rtt_p99_ns"`

	PodCPU     float64 `json:"pod_cpu"`        // share of one core, audio on
	PodIdleCPU float64 `json:"pod_idle_cpu"`   // share of one core, audio off (-1: not measured)
	PodRSS     int64   `json:"pod_rss_bytes"`  // at the end of the window
	PodHeap    int64   `json:"pod_heap_bytes"` // go_memstats_heap_inuse_bytes
	Goroutines int     `json:"pod_goroutines"`
	PodPPSIn   float64 `json:"pod_pps_in"` // client datagrams into the pod per second
	PodPPSOut  float64 `json:"pod_pps_out"`
	PodDrops   float64 `json:"pod_drops"` // datagrams the pod dropped during the window
	// With a Realtime backend: audio seconds per second per session the
	// pod sent to the server (1 when it keeps up with the callers) and
	// paced out to the callers (the reply's share of the time), and the
	// connector's drops during the window.
	ToBackend    float64 `json:"to_backend,omitempty"`
	ToCaller     float64 `json:"to_caller,omitempty"`
	ReplyDropped float64 `json:"reply_dropped,omitempty"` // s/s per session the pod dropped (barge-in, full queue)
	BackendDrops float64 `json:"backend_drops,omitempty"`
	Rcvbuf       int64   `json:"rcvbuf_errors"` // UDP receive-buffer overflows on the machine during the window

	GenCPU float64 `json:"gen_cpu"` // load generator's share of one core over the window
	// GenMakeCPU is the load generator's CPU per packet it had Pion make
	// (encrypt) ahead of the window (Fleet.Prepare, the thread's CPU
	// time), seconds per packet; × 50 is what encryption adds per session
	// to GenCPU in steady state. PrepSecs is how long Prepare took.
	GenMakeCPU float64 `json:"gen_make_cpu_seconds_per_packet"`
	PrepSecs   float64 `json:"prepare_seconds"`
	RefCPU     float64 `json:"ref_cpu"`  // reference server's share of one core (-backend ref)
	BoxBusy    float64 `json:"box_busy"` // whole machine, cores busy (2.0 = both cores)
	// With RunConfig.Pin: how busy the pod kept its cores (PodShare: its
	// CPU over its cores, 0..1) and the load generator and reference
	// server theirs (LoadShare); how busy those cores were with every
	// process on them (the machine's other work included); and the
	// step's Verdict and what failed.
	PodShare     float64 `json:"pod_share,omitempty"`
	LoadShare    float64 `json:"load_share,omitempty"`
	PodCoreBusy  float64 `json:"pod_core_busy,omitempty"`
	LoadCoreBusy float64 `json:"load_core_busy,omitempty"`
	Verdict      string  `json:"verdict,omitempty"`
	Why          string  `json:"verdict_why,omitempty"`
	// BackendEnds is the calls the pod's connector ended from the
	// backend's side during the step, by "reason: error" (its log).
	BackendEnds map[string]int `json:"backend_ends,omitempty"`
	Load1       float64        `json:"load1"` // /proc/loadavg at the end of the window
}

// Run starts a pod, holds each step's session count with 50 pps voice
// both ways, and measures. It returns the steps measured so far even when
// it stops early with an error.
func Run(ctx context.Context, cfg RunConfig) ([]Step, error) {
	if cfg.Settle == 0 {
		cfg.Settle = 3 * time.Second
	}
	if cfg.Window == 0 {
		cfg.Window = 8 * time.Second
	}
	if cfg.SetupConcurrency <= 0 {
		cfg.SetupConcurrency = 4
	}
	if cfg.StopLoss == 0 {
		cfg.StopLoss = 0.05
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if len(cfg.Steps) == 0 {
		return nil, errors.New("capacity: no steps")
	}
	profile := ""
	if cfg.ProfileStep > 0 {
		profile = cfg.ProfileDir
	}
	if cfg.Conversation == (Conversation{}) {
		cfg.Conversation = Conversations["turns"]
	}
	refProfile := ""
	if profile != "" {
		refProfile = filepath.Join(profile, "ref")
	}
	var podCPUs, loadCPUs []int
	if cfg.Pin != nil {
		podCPUs, loadCPUs = cfg.Pin.PodCPUs, cfg.Pin.LoadCPUs
		if err := cfg.Pin.PinSelf(); err != nil {
			return nil, err
		}
		fmt.Fprintf(cfg.Progress, "pod pinned to CPU %s (GOMAXPROCS %d); load generator and reference server to CPU %s\n",
			cpuList(podCPUs), len(podCPUs), cpuList(loadCPUs))
	}
	backendCfg, frames, ref, err := startBackend(ctx, cfg.Bin, cfg.Backend, cfg.Conversation, refProfile, loadCPUs)
	if err != nil {
		return nil, err
	}
	if ref != nil {
		defer ref.Stop()
	}
	pod, err := StartPod(ctx, cfg.Bin, cfg.Dir, cfg.Steps[len(cfg.Steps)-1]+100, PodOptions{ProfileDir: profile, Extra: backendCfg + cfg.PodConfig, CPUs: podCPUs})
	if err != nil {
		return nil, err
	}
	defer pod.Stop()
	link, err := NewLink(LinkConfig{Pod: pod.Data, Cluster: 1, PodID: 1, POP: 1, HopKeys: pod.HopKeys})
	if err != nil {
		return nil, err
	}
	defer link.Close()
	fleet, err := NewFleet(FleetConfig{Link: link, API: pod.API, POP: 1, DataChannel: cfg.DataChannel, Opus: frames})
	if err != nil {
		return nil, err
	}
	// Close the clients before the link and the pod (defers run last-in
	// first-out), so the pod sees its sessions end rather than time out.
	defer fleet.Close()
	fleet.SetAudio(true)

	var steps []Step
	profiled := false
	for _, n := range cfg.Steps {
		prof := profile != "" && !profiled && n >= cfg.ProfileStep
		profiled = profiled || prof
		st, err := runStep(ctx, cfg, pod, ref, fleet, n, prof)
		if err != nil {
			return steps, err
		}
		steps = append(steps, st)
		fmt.Fprintln(cfg.Progress, st.line())
		if st.Verdict != "" {
			fmt.Fprintf(cfg.Progress, "step %d: %s %s\n", st.Sessions, st.Verdict, st.Why)
		}
		if err := pod.Died(); err != nil {
			return steps, err
		}
		if st.Loss > cfg.StopLoss {
			fmt.Fprintf(cfg.Progress, "loss %.2f%% over %.0f%%: stopping\n", 100*st.Loss, 100*cfg.StopLoss)
			break
		}
		if st.SetupFailures > max(2, n/20) {
			fmt.Fprintf(cfg.Progress, "%d setup failures: stopping\n", st.SetupFailures)
			break
		}
	}
	return steps, nil
}

// grow adds calls until the fleet holds n, with bounded concurrency and
// a bounded number of failures.
func grow(ctx context.Context, cfg RunConfig, fleet *Fleet, n int) (failures int, err error) {
	need := n - fleet.Size()
	if need <= 0 {
		return 0, nil
	}
	var failed atomic.Int64
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	for range cfg.SetupConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				actx, cancel := context.WithTimeout(ctx, 15*time.Second)
				if err := fleet.Add(actx); err != nil {
					failed.Add(1)
				}
				cancel()
			}
		}()
	}
	limit := int64(max(2, need/20))
	for i := 0; i < need && ctx.Err() == nil && failed.Load() <= limit; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	return int(failed.Load()), ctx.Err()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// snapshot is every counter a window needs, read at one moment.
type snapshot struct {
	at      time.Time
	pod     ProcStat
	gen     ProcStat
	ref     ProcStat
	box     MachineStat
	cpus    CPUTimes
	metrics map[string]float64
	rcvbuf  int64
}

func takeSnapshot(ctx context.Context, pod *Pod, ref *RefServer) (snapshot, error) {
	var s snapshot
	var err error
	s.at = time.Now()
	s.rcvbuf = UDPRcvbufErrors()
	if s.pod, err = pod.Stat(); err != nil {
		return s, err
	}
	if ref != nil {
		if s.ref, err = ref.Stat(); err != nil {
			return s, err
		}
	}
	if s.gen, err = SelfStat(); err != nil {
		return s, err
	}
	if s.box, err = ReadMachineStat(); err != nil {
		return s, err
	}
	if s.cpus, err = ReadCPUTimes(); err != nil {
		return s, err
	}
	s.metrics, err = pod.Scrape(ctx)
	return s, err
}

func runStep(ctx context.Context, cfg RunConfig, pod *Pod, ref *RefServer, fleet *Fleet, n int, profile bool) (Step, error) {
	st := Step{PodIdleCPU: -1}
	m0, err := pod.Scrape(ctx)
	if err != nil {
		return st, err
	}
	ends0 := pod.BackendEnds()
	fmt.Fprintf(cfg.Progress, "step %d: setting up %d calls\n", n, n-fleet.Size())
	t0 := time.Now()
	fails, err := grow(ctx, cfg, fleet, n)
	st.SetupSecs = time.Since(t0).Seconds()
	st.SetupFailures = fails
	st.Sessions = fleet.Size()
	if err != nil {
		return st, err
	}
	if err := sleepCtx(ctx, cfg.Settle); err != nil {
		return st, err
	}

	// Have Pion encrypt the window's audio now (and a second or two
	// more), so that none is made during it.
	tp := time.Now()
	made, makeCPU := fleet.Prepare(cfg.Window + 2*time.Second)
	st.PrepSecs = time.Since(tp).Seconds()
	if made > 0 {
		st.GenMakeCPU = makeCPU.Seconds() / float64(made)
	}
	underruns, skipped := fleet.Underruns.Load(), fleet.Skipped.Load()
	w := fleet.OpenWindow(cfg.Window)
	a, err := takeSnapshot(ctx, pod, ref)
	if err != nil {
		return st, err
	}
	var genProf *os.File
	if profile {
		if err := pod.StartProfile(); err != nil {
			return st, err
		}
		if ref != nil {
			if err := ref.StartProfile(); err != nil {
				return st, err
			}
		}
		// The load generator's own profile over the same window.
		if genProf, err = os.Create(filepath.Join(cfg.ProfileDir, "generator.pprof")); err != nil {
			return st, err
		}
		defer genProf.Close()
		if err := pprof.StartCPUProfile(genProf); err != nil {
			return st, err
		}
	}
	if err := sleepCtx(ctx, cfg.Window); err != nil {
		return st, err
	}
	b, err := takeSnapshot(ctx, pod, ref)
	if err != nil {
		return st, err
	}
	if profile {
		pprof.StopCPUProfile()
		if err := pod.StopProfile(ctx); err != nil {
			return st, err
		}
		if ref != nil {
			if err := ref.StopProfile(ctx); err != nil {
				return st, err
			}
		}
		fmt.Fprintf(cfg.Progress, "step %d: pod profiles in %s\n", n, cfg.ProfileDir)
	}
	st.Ended = map[string]float64{}
	for k, v := range b.metrics {
		if strings.HasPrefix(k, metricEnded+"{") || strings.HasPrefix(k, metricRejected+"{") || strings.HasPrefix(k, metricRTFailed+"{") {
			if d := v - m0[k]; d > 0 {
				st.Ended[k] = d
			}
		}
	}
	if len(st.Ended) > 0 {
		fmt.Fprintf(cfg.Progress, "step %d: the pod ended or refused calls since the step began: %v\n", n, st.Ended)
	}
	for k, v := range pod.BackendEnds() {
		if d := v - ends0[k]; d > 0 {
			if st.BackendEnds == nil {
				st.BackendEnds = map[string]int{}
			}
			st.BackendEnds[k] = d
		}
	}
	for k, v := range st.BackendEnds {
		fmt.Fprintf(cfg.Progress, "step %d: the connector ended %d calls: %s\n", n, v, k)
	}
	st.Underruns = fleet.Underruns.Load() - underruns
	st.Skipped = fleet.Skipped.Load() - skipped
	var failed int
	st.Lost, failed = fleet.Lost()
	if st.Lost > 0 {
		fmt.Fprintf(cfg.Progress, "step %d: %d calls lost so far (%d failed, the rest closed); the link dropped %d datagrams to full client queues or unknown clients\n",
			n, st.Lost, failed, fleet.cfg.Link.Dropped.Load())
	}
	// Let the reader finish the datagrams already queued.
	if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
		return st, err
	}
	st.Sent, st.Echoed, st.Loss = w.Loss()
	st.SentRatio = float64(st.Sent) / (50 * cfg.Window.Seconds() * float64(max(1, st.Sessions)))
	if cfg.Backend != "" {
		// The reply is not an echo: loss is what the callers missed of
		// the frames the pod paced out to them.
		perSession := func(m string) float64 {
			return (b.metrics[m] - a.metrics[m]) / b.at.Sub(a.at).Seconds() / float64(max(1, st.Sessions))
		}
		st.ToBackend, st.ToCaller = perSession(metricToBackend), perSession(metricReplySent)
		st.ReplyDropped = perSession(metricReplyDropped)
		st.BackendDrops = b.metrics[metricRTDropped] - a.metrics[metricRTDropped]
		// As rates: the window and the two scrapes span slightly
		// different times.
		if paced := st.ToCaller * float64(st.Sessions) * 50; paced > 0 {
			st.PacedLoss = math.Max(0, 1-float64(st.Echoed)/cfg.Window.Seconds()/paced)
		}
		_, st.Loss = w.SeqLoss()
		fmt.Fprintf(cfg.Progress, "step %d: per session %.3f s/s of audio to the server, %.3f s/s of reply sent to the caller (%.3f dropped); %.0f connector drops; reply loss %.3f %% by sequence numbers, %.3f %% against the pod's count\n",
			st.Sessions, st.ToBackend, st.ToCaller, st.ReplyDropped, st.BackendDrops, 100*st.Loss, 100*st.PacedLoss)
	}
	st.RTTP50, st.RTTP99 = fleet.RTT()
	secs := b.at.Sub(a.at).Seconds()
	st.PodCPU = (b.pod.CPU - a.pod.CPU).Seconds() / secs
	st.GenCPU = (b.gen.CPU - a.gen.CPU).Seconds() / secs
	st.RefCPU = (b.ref.CPU - a.ref.CPU).Seconds() / secs
	if dt := b.box.Total - a.box.Total; dt > 0 {
		// Total counts every core's time, so busy/total is a share of the
		// machine; scale by the wall time to get cores.
		st.BoxBusy = (b.box.Busy - a.box.Busy).Seconds() / secs
	}
	if cfg.Pin != nil {
		st.PodCoreBusy = Busy(a.cpus, b.cpus, cfg.Pin.PodCPUs)
		st.LoadCoreBusy = Busy(a.cpus, b.cpus, cfg.Pin.LoadCPUs)
	}
	st.PodRSS = b.pod.RSS
	st.PodHeap = int64(b.metrics["go_memstats_heap_inuse_bytes"])
	st.Goroutines = int(b.metrics["go_goroutines"])
	st.PodPPSIn = (b.metrics["rtcedge_transceiver_packets_in_total"] - a.metrics["rtcedge_transceiver_packets_in_total"]) / secs
	st.PodPPSOut = (b.metrics["rtcedge_transceiver_packets_out_total"] - a.metrics["rtcedge_transceiver_packets_out_total"]) / secs
	st.PodDrops = b.metrics["rtcedge_transceiver_dropped_packets_total"] - a.metrics["rtcedge_transceiver_dropped_packets_total"]
	st.Rcvbuf = b.rcvbuf - a.rcvbuf
	st.Load1 = LoadAvg()
	if cfg.Pin != nil {
		st.PodShare = st.PodCPU / float64(len(cfg.Pin.PodCPUs))
		st.LoadShare = (st.GenCPU + st.RefCPU) / float64(len(cfg.Pin.LoadCPUs))
		want := 0.0
		if cfg.Backend != "" {
			want = cfg.Conversation.ModelShare()
		}
		st.Verdict, st.Why = Verdict(st, want)
	}

	if cfg.IdleWindow > 0 {
		fleet.SetAudio(false)
		defer fleet.SetAudio(true)
		quiet := 500 * time.Millisecond
		if cfg.Backend != "" { // let the replies under way play out
			quiet = time.Duration(cfg.Conversation.ReplyMs+1000) * time.Millisecond
			if cfg.Conversation.ReplyMs == 0 {
				quiet = time.Duration(cfg.Conversation.TalkMs+2000) * time.Millisecond
			}
		}
		if err := sleepCtx(ctx, quiet); err != nil {
			return st, err
		}
		a, err := pod.Stat()
		if err != nil {
			return st, err
		}
		t := time.Now()
		if err := sleepCtx(ctx, cfg.IdleWindow); err != nil {
			return st, err
		}
		b, err := pod.Stat()
		if err != nil {
			return st, err
		}
		st.PodIdleCPU = (b.CPU - a.CPU).Seconds() / time.Since(t).Seconds()
	}
	return st, nil
}

func (s Step) line() string {
	idle := "   -"
	if s.PodIdleCPU >= 0 {
		idle = fmt.Sprintf("%4.0f", 100*s.PodIdleCPU)
	}
	return fmt.Sprintf("%5d  %6.3f %5.1f  %6.2f %7.2f  %5.0f %5s  %6.1f %6.1f  %7.0f %7.0f %5.0f %6d  %5.0f %4.0f %5d %4d  %4.2f  %4.1f  %4d",
		s.Sessions, 100*s.Loss, 100*s.SentRatio, ms(s.RTTP50), ms(s.RTTP99), 100*s.PodCPU, idle,
		float64(s.PodRSS)/(1<<20), float64(s.PodHeap)/(1<<20), s.PodPPSIn, s.PodPPSOut, s.PodDrops, s.Rcvbuf,
		100*s.GenCPU, 100*s.RefCPU, s.Underruns, s.Lost, s.BoxBusy, s.Load1, s.SetupFailures)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// tableHeader names the columns of Step.line.
const tableHeader = "  ses  loss%  sent%  rtt50ms rtt99ms  pod%  idle%  rssMB heapMB   pps-in pps-out drops rcvbuf  gen%  ref% under lost  box  load  fail"

// minSentRatio is the share of the callers' frames the load generator must
// send in a window for its step to count as held at full rate.
const minSentRatio = 0.98

// Summary is the per-session cost fitted over the steps.
type Summary struct {
	Steps           int     `json:"fit_steps"`        // steps in the fit (loss under MaxLoss)
	CPUPerSession   float64 `json:"cpu_per_session"`  // share of one core, audio on
	CPUBase         float64 `json:"cpu_base"`         // intercept: the pod with no sessions
	IdlePerSession  float64 `json:"idle_per_session"` // share of one core, audio off (0: not measured)
	RSSPerSession   float64 `json:"rss_per_session_bytes"`
	HeapPerSession  float64 `json:"heap_per_session_bytes"`
	Projected       int     `json:"projected_sessions"` // sessions at Target of Cores
	Cores           int     `json:"cores"`              // cores the projection gives the pod
	Target          float64 `json:"target"`             // share of those cores the projection allows
	MaxHeldSessions int     `json:"max_held_sessions"`  // the largest step held under MaxLoss on this machine
	MaxLoss         float64 `json:"max_loss"`
	// MaxFullRate is the largest step held under MaxLoss with the load
	// generator sending at full rate (minSentRatio) and no setup failure.
	MaxFullRate int `json:"max_full_rate_sessions"`
	// The load generator's and the reference server's CPU per session
	// (share of one core) at the largest step held at full rate (else the
	// largest held), their CPU over its sessions; GenMake is what the
	// encryption made ahead of the window adds per session (50 ×
	// GenMakeCPU).
	GenPerSession     float64 `json:"gen_cpu_per_session"`
	GenMakePerSession float64 `json:"gen_make_cpu_per_session"`
	RefPerSession     float64 `json:"ref_cpu_per_session"`
	// The same from the pod's CPU against the datagrams it took in, over
	// every held step whatever the machine's load: a starved load
	// generator sends less, and the pod's cost per datagram stays
	// measurable where the per-session fit has no step under the busy
	// limit. Per session = per datagram × 50 pps.
	DatagramSteps      int     `json:"datagram_fit_steps"`
	CPUPerDatagram     float64 `json:"cpu_seconds_per_datagram"`
	DatagramBase       float64 `json:"datagram_fit_base"`
	ProjectedDatagrams int     `json:"projected_sessions_from_datagrams"`
	// The same against each step's own baseline, where the idle window
	// was measured: the sessions' cost with the audio off (per session,
	// fitted over the held steps) plus the audio's, the pod's CPU above
	// that baseline per datagram in (through the origin: no datagrams, no
	// audio cost). Neither a starved load generator nor a busy machine
	// biases it, since both parts come from the pod's own CPU time in the
	// same step. Per session = idle + 50 × per datagram.
	BaselineSteps int `json:"baseline_fit_steps"`
	// With the pod pinned (SummarizePinned): its cores, the largest step
	// held on them (Verdict), that per core, and the per-core goal.
	PodCores      int     `json:"pod_cores,omitempty"`
	PinnedHeld    int     `json:"pinned_held_sessions,omitempty"`
	PinnedPerCore float64 `json:"pinned_per_core,omitempty"`
	PerCoreGoal   int     `json:"per_core_goal,omitempty"`
	// LoadLimited is set when a step beyond PinnedHeld was not held for
	// the load side's want of CPU, so the pod's limit was not reached.
	LoadLimited         bool    `json:"load_limited,omitempty"`
	IdleCPUPerSession   float64 `json:"idle_cpu_per_session"`
	AudioCPUPerDatagram float64 `json:"audio_cpu_seconds_per_datagram"`
	BaselinePerSession  float64 `json:"baseline_cpu_per_session"`
	ProjectedBaseline   int     `json:"projected_sessions_from_baseline"`
}

// Summarize fits cost = base + slope × sessions (least squares) over the
// steps whose loss stayed under maxLoss and whose machine was busy for less
// than target of its cores (beyond that the pod and the load generator
// starve each other, and the pod's CPU reads low), and projects how many
// sessions fit in target (e.g. 0.8) of cores whole cores given to the pod
// alone.
func Summarize(steps []Step, maxLoss float64, cores int, target float64) Summary {
	s := Summary{Cores: cores, Target: target, MaxLoss: maxLoss}
	var xs, cpu, idle, rss, heap, pps, dcpu []float64
	var costStep, fullStep *Step
	for i, st := range steps {
		if st.Loss > maxLoss {
			continue
		}
		s.MaxHeldSessions = max(s.MaxHeldSessions, st.Sessions)
		costStep = &steps[i]
		if st.SentRatio >= minSentRatio && st.SetupFailures == 0 && st.Lost == 0 {
			s.MaxFullRate = max(s.MaxFullRate, st.Sessions)
			fullStep = &steps[i]
		}
		pps = append(pps, st.PodPPSIn)
		dcpu = append(dcpu, st.PodCPU)
		if st.BoxBusy > target*float64(cores) {
			continue
		}
		xs = append(xs, float64(st.Sessions))
		cpu = append(cpu, st.PodCPU)
		idle = append(idle, st.PodIdleCPU)
		rss = append(rss, float64(st.PodRSS))
		heap = append(heap, float64(st.PodHeap))
	}
	s.Steps = len(xs)
	if fullStep != nil {
		costStep = fullStep
	}
	if costStep != nil && costStep.Sessions > 0 {
		n := float64(costStep.Sessions)
		s.GenPerSession, s.RefPerSession = costStep.GenCPU/n, costStep.RefCPU/n
		s.GenMakePerSession = 50 * costStep.GenMakeCPU
	}
	var bx, bidle, bpps, baudio []float64
	for _, st := range steps {
		if st.Loss <= maxLoss && st.PodIdleCPU >= 0 && st.PodPPSIn > 0 {
			bx, bidle = append(bx, float64(st.Sessions)), append(bidle, st.PodIdleCPU)
			bpps, baudio = append(bpps, st.PodPPSIn), append(baudio, st.PodCPU-st.PodIdleCPU)
		}
	}
	if s.BaselineSteps = len(bx); len(bx) >= 2 {
		s.IdleCPUPerSession, _ = fit(bx, bidle)
		var sxy, sxx float64
		for i := range bpps {
			sxy += bpps[i] * baudio[i]
			sxx += bpps[i] * bpps[i]
		}
		s.AudioCPUPerDatagram = sxy / sxx
		s.BaselinePerSession = max(0, s.IdleCPUPerSession) + 50*s.AudioCPUPerDatagram
		if s.BaselinePerSession > 0 {
			s.ProjectedBaseline = int(float64(cores) * target / s.BaselinePerSession)
		}
	}
	if s.DatagramSteps = len(pps); len(pps) >= 2 {
		s.CPUPerDatagram, s.DatagramBase = fit(pps, dcpu)
		if s.CPUPerDatagram > 0 {
			s.ProjectedDatagrams = int((float64(cores)*target - max(0, s.DatagramBase)) / (s.CPUPerDatagram * 50))
		}
	}
	if len(xs) < 2 {
		return s
	}
	s.CPUPerSession, s.CPUBase = fit(xs, cpu)
	if idle[0] >= 0 {
		s.IdlePerSession, _ = fit(xs, idle)
	}
	s.RSSPerSession, _ = fit(xs, rss)
	s.HeapPerSession, _ = fit(xs, heap)
	if s.CPUPerSession > 0 {
		s.Projected = int((float64(cores)*target - max(0, s.CPUBase)) / s.CPUPerSession)
	}
	return s
}

// SummarizePinned fills the pinned part of s from steps run with the pod on
// podCores cores of its own: the largest step held (Verdict HeldByPod)
// and that per core, against perCoreGoal calls a core.
func SummarizePinned(s *Summary, steps []Step, podCores, perCoreGoal int) {
	s.PodCores, s.PerCoreGoal = podCores, perCoreGoal
	for _, st := range steps {
		switch st.Verdict {
		case HeldByPod:
			s.PinnedHeld = max(s.PinnedHeld, st.Sessions)
		case NotHeldByLoad:
			if st.Sessions > s.PinnedHeld {
				s.LoadLimited = true
			}
		}
	}
	for _, st := range steps { // a later step the pod failed outranks the load side's
		if st.Verdict == NotHeldByPod && st.Sessions > s.PinnedHeld {
			s.LoadLimited = false
		}
	}
	if podCores > 0 {
		s.PinnedPerCore = float64(s.PinnedHeld) / float64(podCores)
	}
}

// fit returns the least-squares slope and intercept of y over x.
func fit(x, y []float64) (slope, intercept float64) {
	var sx, sy, sxx, sxy float64
	n := float64(len(x))
	for i := range x {
		sx += x[i]
		sy += y[i]
		sxx += x[i] * x[i]
		sxy += x[i] * y[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0, sy / n
	}
	slope = (n*sxy - sx*sy) / d
	return slope, (sy - slope*sx) / n
}

// Table renders the steps and the summary as text.
func Table(steps []Step, sum Summary) string {
	var b strings.Builder
	b.WriteString(tableHeader + "\n")
	for _, st := range steps {
		b.WriteString(st.line() + "\n")
	}
	if sum.DatagramSteps >= 2 {
		fmt.Fprintf(&b, "per datagram, over %d held steps whatever the load: %.1f µs of pod CPU (base %.1f %%); %.3f %% of a core per session at 50 pps; projected %d sessions on %d cores at %.0f %%\n",
			sum.DatagramSteps, 1e6*sum.CPUPerDatagram, 100*sum.DatagramBase, 100*50*sum.CPUPerDatagram,
			sum.ProjectedDatagrams, sum.Cores, 100*sum.Target)
	}
	if sum.BaselineSteps >= 2 {
		fmt.Fprintf(&b, "against each step's audio-off baseline, over %d held steps whatever the load: %.3f %% of a core per session with the audio off, %.1f µs of pod CPU per datagram in above it; %.3f %% of a core per session at 50 pps; projected %d sessions on %d cores at %.0f %%\n",
			sum.BaselineSteps, 100*sum.IdleCPUPerSession, 1e6*sum.AudioCPUPerDatagram, 100*sum.BaselinePerSession,
			sum.ProjectedBaseline, sum.Cores, 100*sum.Target)
	}
	fmt.Fprintf(&b, "held with loss <= %.1f%%: up to %d sessions; at full rate (>= %.0f %% of the frames sent) with no setup failure: up to %d\n",
		100*sum.MaxLoss, sum.MaxHeldSessions, 100*minSentRatio, sum.MaxFullRate)
	if sum.GenPerSession != 0 || sum.RefPerSession != 0 {
		fmt.Fprintf(&b, "per session beside the pod, at the largest step held (at full rate if any): load generator %.3f %% of a core in the window (+ %.3f %% encrypting ahead), reference server %.3f %%\n",
			100*sum.GenPerSession, 100*sum.GenMakePerSession, 100*sum.RefPerSession)
	}
	if sum.PodCores > 0 {
		for _, st := range steps {
			fmt.Fprintf(&b, "  %4d calls: %s: pod %.0f %% of its core(s) (%.3f %% of a core per call; the cores %.0f %% busy with every process), load side %.0f %% of its core(s) (the cores %.0f %% busy), reply %.3f s/s per call, loss %.3f %%",
				st.Sessions, st.Verdict, 100*st.PodShare, 100*st.PodCPU/float64(max(1, st.Sessions)), 100*st.PodCoreBusy,
				100*st.LoadShare, 100*st.LoadCoreBusy, st.ToCaller, 100*st.Loss)
			if st.Why != "" {
				fmt.Fprintf(&b, "; %s", st.Why)
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "held %d calls on %d pinned pod core(s) -> %.0f per core (goal %d per core: %s)",
			sum.PinnedHeld, sum.PodCores, sum.PinnedPerCore, sum.PerCoreGoal, map[bool]string{true: "met", false: "not met"}[sum.PinnedPerCore >= float64(sum.PerCoreGoal)])
		if sum.LoadLimited {
			b.WriteString("; a larger step was not held by the load side: the pod's own limit was not reached")
		}
		b.WriteString("\n")
	}
	if sum.Steps < 2 {
		b.WriteString("too few steps under the loss limit and the busy limit to fit a cost per session\n")
		return b.String()
	}
	fmt.Fprintf(&b, "fit over %d steps with loss <= %.1f%% and the machine under %.0f%% busy:\n", sum.Steps, 100*sum.MaxLoss, 100*sum.Target)
	fmt.Fprintf(&b, "  pod CPU per session  %.3f %% of a core with audio (base %.1f %%)", 100*sum.CPUPerSession, 100*sum.CPUBase)
	if sum.IdlePerSession != 0 {
		fmt.Fprintf(&b, ", %.3f %% idle", 100*sum.IdlePerSession)
	}
	fmt.Fprintf(&b, "\n  pod memory per session  %.0f KiB RSS, %.0f KiB Go heap in use\n", sum.RSSPerSession/1024, sum.HeapPerSession/1024)
	fmt.Fprintf(&b, "  projected sessions for a pod alone on %d cores at %.0f %% CPU: %d\n",
		sum.Cores, 100*sum.Target, sum.Projected)
	fmt.Fprintf(&b, "  held on this machine with the load generator beside the pod: %d sessions\n", sum.MaxHeldSessions)
	return b.String()
}
