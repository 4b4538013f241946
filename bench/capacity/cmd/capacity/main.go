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
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
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
	stepsFlag := flag.String("steps", "50,100,200,300,400,500,600,700", "session counts to hold, ascending")
	window := flag.Duration("window", 8*time.Second, "measurement window per step")
	idle := flag.Duration("idle", 3*time.Second, "also measure each step with the audio stopped for this long (0: skip)")
	settle := flag.Duration("settle", 3*time.Second, "wait after setting up a step before measuring")
	dc := flag.Bool("datachannel", true, "open the oai-events data channel in every session")
	maxLoss := flag.Float64("max-loss", 0.005, "loss limit for a step to count as held")
	cores := flag.Int("cores", 2, "cores of the machine the projection is for")
	target := flag.Float64("target", 0.8, "CPU share of those cores the projection allows the pod")
	limit := flag.Duration("timeout", 6*time.Minute, "bound on the whole run")
	flag.Parse()

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

	start := time.Now()
	fmt.Printf("transceiver capacity: %s, %d CPUs, %s, load before %.2f\n",
		start.UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), runtime.Version(), capacity.LoadAvg())
	fmt.Printf("50 pps x 80 B Opus-like audio each way per session, data channel %v, window %v, idle %v\n", *dc, *window, *idle)
	steps2, err := capacity.Run(ctx, capacity.RunConfig{
		Bin: *bin, Dir: dir, Steps: steps, Settle: *settle, Window: *window, IdleWindow: *idle,
		DataChannel: *dc, Progress: os.Stderr,
	})
	fmt.Println()
	fmt.Print(capacity.Table(steps2, capacity.Summarize(steps2, *maxLoss, *cores, *target)))
	fmt.Printf("took %.0f s\n", time.Since(start).Seconds())
	return err
}
