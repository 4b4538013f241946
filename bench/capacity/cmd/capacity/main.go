// Command capacity runs the transceiver capacity benchmark: it starts
// `rtcedge transceiver` as its own process on loopback, holds a rising
// number of 50 pps voice echo sessions against it with a cheap Pion load
// generator, and prints per step the echo loss and RTT, the pod's CPU and
// memory, and a per-session cost fitted over the steps. See the section
// "Transceiver capacity" in docs/benchmarks.md.
//
//	go run ./bench/capacity/cmd/capacity -bin bin/rtcedge -steps 50,100,200,400
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rtcedge/rtcedge/bench/capacity"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "capacity:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("bin", "", "rtcedge binary (default: build one into a temporary directory)")
	stepsFlag := flag.String("steps", "50,100,200,300,400,500,600,700,800,1000", "session counts to hold, ascending")
	window := flag.Duration("window", 8*time.Second, "measurement window per step")
	idle := flag.Duration("idle", 3*time.Second, "also measure each step with the audio stopped for this long (0: skip)")
	settle := flag.Duration("settle", 3*time.Second, "wait after setting up a step before measuring")
	dc := flag.Bool("datachannel", true, "open the oai-events data channel in every session")
	maxLoss := flag.Float64("max-loss", 0.005, "loss limit for a step to count as held")
	cores := flag.Int("cores", 2, "cores of the machine the projection is for")
	target := flag.Float64("target", 0.8, "CPU share of those cores the projection allows the pod")
	limit := flag.Duration("timeout", 10*time.Minute, "bound on the whole run")
	jsonPath := flag.String("json", "", "also write the run (machine, load, steps, fit) as JSON to this file")
	profDir := flag.String("profile", "", "write the pod's CPU, heap and allocation profiles (pprof) into this directory")
	profStep := flag.Int("profile-step", 300, "with -profile: profile the first step of at least this many sessions")
	podCfg := flag.String("pod-config", "", "YAML lines appended to the pod's config, e.g. 'dtls_role: server'")
	backend := flag.String("backend", "", "transcode both ways: ref (the reference Realtime server: rtcedge realtime-ref, its own process) or a ws:// Realtime URL; empty: the echo")
	convName := flag.String("conversation", "turns", "with -backend, the calls' audio: turns (caller talks 40 % of the time, the model 40 %) or continuous (caller 50 %, model 90 %)")
	podCPUs := flag.Int("pod-cpus", 0, "pin the pod to this many cores of its own (the last ones; GOMAXPROCS the same) and the load generator and reference server to the others, and judge each step against the pod's cores (0: no pinning)")
	perCore := flag.Int("per-core", 150, "with -pod-cpus: the goal in calls per pod core (300 calls on 2 cores = 150)")
	phone := flag.String("phone", "", "measure phone calls instead (PCMU RTP to the reference Realtime server): pcmu (G.711 passed through, backend_g711) or transcode")
	flag.Parse()
	var pin *capacity.Pinning
	if *podCPUs > 0 {
		var err error
		if pin, err = capacity.NewPinning(*podCPUs); err != nil {
			return err
		}
	}
	conv, ok := capacity.Conversations[*convName]
	if !ok {
		return fmt.Errorf("-conversation: want turns or continuous, got %q", *convName)
	}

	var steps []int
	for _, s := range strings.Split(*stepsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || (len(steps) > 0 && n <= steps[len(steps)-1]) {
			return fmt.Errorf("-steps: want ascending positive counts, got %q", *stepsFlag)
		}
		steps = append(steps, n)
	}
	dir, err := os.MkdirTemp("", "rtcedge-capacity-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if *bin == "" {
		*bin = filepath.Join(dir, "rtcedge")
		if out, err := exec.Command("go", "build", "-o", *bin, "./cmd/rtcedge").CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *limit)
	defer cancel()

	if *phone != "" {
		return runPhone(ctx, *phone, *bin, dir, steps, *settle, *window)
	}
	if *profDir != "" {
		if *profDir, err = filepath.Abs(*profDir); err != nil {
			return err
		}
		if err := os.MkdirAll(*profDir, 0o755); err != nil {
			return err
		}
	} else {
		*profStep = 0
	}

	rep := capacity.Report{Started: time.Now().UTC(), Before: capacity.ReadMachine()}
	rep.Settings.Window, rep.Settings.IdleWindow, rep.Settings.DataChannel, rep.Settings.PodConfig = *window, *idle, *dc, *podCfg
	rep.Settings.Backend = *backend
	rep.Settings.Pin = pin
	if *backend != "" {
		rep.Settings.Conversation = *convName
	}
	fmt.Printf("transceiver capacity: %s, %d CPUs (%s), %s, load before %.2f %.2f %.2f\n",
		rep.Started.Format("2006-01-02 15:04 UTC"), rep.Before.CPUs, rep.Before.CPUModel, rep.Before.GoVersion,
		rep.Before.Load[0], rep.Before.Load[1], rep.Before.Load[2])
	if *backend == "" {
		fmt.Printf("50 pps x 80 B Opus-like audio each way per session, data channel %v, window %v, idle %v\n", *dc, *window, *idle)
	} else {
		fmt.Printf("50 pps of Opus per session, conversation %q (caller talks %.0f %% of the time, the model %.0f %%: %d ms of 440 Hz, %d ms of silence, replies of at most %d ms), decoded and sent to the Realtime backend %s, its replies encoded back; loss = reply frames missed; data channel %v, window %v, idle %v\n",
			*convName, 100*conv.CallerShare(), 100*conv.ModelShare(), conv.TalkMs, conv.SilenceMs, conv.ReplyMs, *backend, *dc, *window, *idle)
	}
	steps2, err := capacity.Run(ctx, capacity.RunConfig{
		Bin: *bin, Dir: dir, Steps: steps, Settle: *settle, Window: *window, IdleWindow: *idle,
		DataChannel: *dc, Progress: os.Stderr, ProfileDir: *profDir, ProfileStep: *profStep, PodConfig: *podCfg, Backend: *backend,
		Conversation: conv, Pin: pin,
	})
	rep.Steps = steps2
	rep.Summary = capacity.Summarize(steps2, *maxLoss, *cores, *target)
	if pin != nil {
		capacity.SummarizePinned(&rep.Summary, steps2, len(pin.PodCPUs), *perCore)
	}
	rep.After = capacity.ReadMachine()
	rep.Seconds = time.Since(rep.Started).Seconds()
	if err != nil {
		rep.Error = err.Error()
	}
	fmt.Println()
	fmt.Print(capacity.Table(steps2, rep.Summary))
	fmt.Printf("took %.0f s; load after %.2f %.2f %.2f\n", rep.Seconds, rep.After.Load[0], rep.After.Load[1], rep.After.Load[2])
	if *jsonPath != "" {
		if werr := rep.WriteJSON(*jsonPath); werr != nil {
			return errors.Join(err, fmt.Errorf("write %s: %w", *jsonPath, werr))
		}
	}
	return err
}

// runPhone measures phone calls (capacity.RunPhone) and prints a line per
// step.
func runPhone(ctx context.Context, mode, bin, dir string, steps []int, settle, window time.Duration) error {
	if mode != "pcmu" && mode != "transcode" {
		return fmt.Errorf("-phone: want pcmu or transcode, got %q", mode)
	}
	m := capacity.ReadMachine()
	fmt.Printf("phone call capacity (%s): %s, %d CPUs (%s), %s, load before %.2f %.2f %.2f\n", mode,
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), m.CPUs, m.CPUModel, m.GoVersion, m.Load[0], m.Load[1], m.Load[2])
	fmt.Println("50 pps of PCMU per call (2 s of 440 Hz, 3 s of silence), to the reference Realtime server (its own process); settle", settle, "window", window)
	_, err := capacity.RunPhone(ctx, capacity.PhoneConfig{Bin: bin, Dir: dir, Steps: steps, Passthrough: mode == "pcmu",
		Settle: settle, Window: window, Progress: os.Stdout})
	m = capacity.ReadMachine()
	fmt.Printf("load after %.2f %.2f %.2f\n", m.Load[0], m.Load[1], m.Load[2])
	return err
}
