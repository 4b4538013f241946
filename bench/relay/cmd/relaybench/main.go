// Command relaybench runs the relay benchmark (package bench/relay,
// `make bench-relay`): the direct path, a minimal C recvmmsg/sendmmsg
// forwarder, the same forwarder's loops written in Go (goblock, goepoll), a
// naive Go forwarder, the global relay, and the global →
// cluster relay chain against two chained C forwarders, at voice and flood
// load, each forwarder pinned to its own core. It prints a table and writes
// the report as JSON. With -veth (root), every process runs on a host of
// its own over veth pairs, and the relays' in-kernel fast path joins
// (fp-globalrelay, fp-chain), measured by the whole machine's CPU. See
// docs/benchmarks.md.
//
//	go run ./bench/relay/cmd/relaybench -json bin/bench-relay.json
//	go run ./bench/relay/cmd/relaybench -veth -voice 500x50 -flood 128x500
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rtcedge/rtcedge/bench/relay"
)

func main() {
	relay.MaybeRunRole()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "relaybench:", err)
		os.Exit(1)
	}
}

func run() error {
	paths := flag.String("paths", strings.Join(relay.AllPaths, ","), "paths to measure")
	voice := flag.String("voice", "500x50", "voice load: flows x pps per flow (empty: skip)")
	flood := flag.String("flood", "64x500", "flood load: flows x pps per flow (empty: skip)")
	window := flag.Duration("window", 5*time.Second, "measurement window per trial")
	warmup := flag.Duration("warmup", time.Second, "load before each window")
	quiet := flag.Float64("quiet", 0.25, "CPU (cores) other processes may use in a window before the trial is repeated")
	attempts := flag.Int("attempts", 3, "tries per trial to find a quiet window")
	nice := flag.Int("nice", -10, "nice value of every process of a trial; below 0 needs root (else it runs at 0)")
	rt := flag.Int("rt", 1, "SCHED_FIFO priority of the forwarding processes (0: normal class; needs root)")
	jsonOut := flag.String("json", "bin/bench-relay.json", "write the report here (empty: do not)")
	rounds := flag.Int("rounds", 1, "runs of every path, one after another; more than 1 also prints each path's median and range against each run's C path")
	limit := flag.Duration("timeout", 10*time.Minute, "bound on the whole run (on each run, with -rounds)")
	veth := flag.Bool("veth", false, "every process on a host of its own (network namespaces, veth pairs, a bridge; root), the fast path's paths included; paths default to "+strings.Join(relay.VethPaths, ","))
	flag.Parse()

	cfg := relay.Config{Window: *window, Warmup: *warmup, Quiet: *quiet, Attempts: *attempts, Nice: *nice, RT: *rt, Veth: *veth, Progress: os.Stderr}
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "paths" })
	if *paths != "" && (explicit || !*veth) {
		cfg.Paths = strings.Split(*paths, ",")
	}
	if *veth && !explicit {
		cfg.Paths = relay.VethPaths
	}
	for _, l := range []struct{ name, spec string }{{"voice", *voice}, {"flood", *flood}} {
		if l.spec == "" {
			continue
		}
		f, p, ok := strings.Cut(l.spec, "x")
		flows, err1 := strconv.Atoi(f)
		pps, err2 := strconv.Atoi(p)
		if !ok || err1 != nil || err2 != nil || flows < 1 || pps < 1 {
			return fmt.Errorf("-%s: want <flows>x<pps>, got %q", l.name, l.spec)
		}
		cfg.Loads = append(cfg.Loads, relay.Load{Name: l.name, Flows: flows, PPS: pps})
	}
	if len(cfg.Loads) == 0 {
		return fmt.Errorf("no load: set -voice or -flood")
	}
	if *rounds < 1 {
		return fmt.Errorf("-rounds: want at least 1, got %d", *rounds)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var reps []*relay.Report
	var err error
	for i := 0; i < *rounds && err == nil; i++ {
		rctx, cancel := context.WithTimeout(ctx, *limit)
		var rep *relay.Report
		rep, err = relay.Run(rctx, cfg)
		cancel()
		if rep != nil {
			fmt.Print(relay.Table(rep))
			reps = append(reps, rep)
		}
	}
	if len(reps) > 1 {
		fmt.Print(relay.SummaryTable(relay.Summarize(reps)))
	}
	if *jsonOut != "" && len(reps) > 0 {
		werr := relay.WriteJSON(reps[0], *jsonOut)
		if len(reps) > 1 {
			werr = relay.WriteRoundsJSON(reps, *jsonOut)
		}
		if werr != nil {
			return werr
		}
		fmt.Println("report:", *jsonOut)
	}
	return err
}
