//go:build soak

// The soak and chaos run (`make soak`, not part of `make
// test`): calls through the dev world at production gossip timings, with
// real Redis, while cluster relays, global relay replicas, Redis and one
// whole POP are killed and restarted on a schedule. At the end it reports
// per-call loss and gaps, the loss outside the injected faults, and leaks
// (goroutines, file descriptors, RSS, Redis keys without expiry).
//
//	go test -tags soak -count=1 -timeout 0 -v ./bench/soak -args -duration 10m -calls 20

package soak

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testredis"
	"github.com/rtcedge/rtcedge/probe"
)

var (
	duration = flag.Duration("duration", 10*time.Minute, "how long the calls run")
	calls    = flag.Int("calls", 20, "concurrent calls")
	period   = flag.Duration("period", 60*time.Second, "one round of the fault schedule")
)

// fault is one step of the schedule, at offset into each period.
type fault struct {
	at   time.Duration
	name string
	do   func(w *devworld.World, redis *testredis.Server, round int) error
}

// schedule: every period, in turn, a cluster relay dies (and a new one
// starts), the POP's replica carrying the calls restarts, Redis dies for
// 5 s, and the whole nearest POP is down for 3 s.
var schedule = []fault{
	{5 * time.Second, "cluster relay killed and replaced", func(w *devworld.World, _ *testredis.Server, round int) error {
		return w.RestartClusterRelay(0, round%2)
	}},
	{15 * time.Second, "global relay replica restarted", func(w *devworld.World, _ *testredis.Server, _ int) error {
		return w.RestartPOP(0)
	}},
	{25 * time.Second, "Redis down for 5 s", func(_ *devworld.World, r *testredis.Server, _ int) error {
		r.Kill()
		time.Sleep(5 * time.Second)
		r.Restart()
		return nil
	}},
	{40 * time.Second, "nearest POP down for 3 s", func(w *devworld.World, _ *testredis.Server, _ int) error {
		w.KillPOP(0)
		time.Sleep(3 * time.Second)
		return w.StartPOP(0)
	}},
}

// settle is how long after a fault's end the loss still counts as the
// fault's.
const settle = 5 * time.Second

type snapshot struct {
	at    time.Time
	stats []probe.AudioStats
}

func TestSoak(t *testing.T) {
	if *period < 50*time.Second {
		t.Fatalf("-period %v: the schedule needs at least 50 s", *period)
	}
	baseG, baseFD, baseRSS := runtime.NumGoroutine(), fds(t), rss(t)
	before := goleak.IgnoreCurrent()
	redisSrv := testredis.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tr := newTracer()
	w, err := devworld.Start(devworld.Config{RedisURL: redisSrv.URL(), ProductionGossip: true, Logger: log, OnRepick: tr.onRepick})
	if err != nil {
		t.Fatal(err)
	}
	tr.learn(w)
	ctx, cancel := context.WithTimeout(context.Background(), *duration+5*time.Minute)
	defer cancel()
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() { defer close(sampled); tr.sample(sctx, w) }()
	var cs []*probe.Call
	var began []time.Time // about when each call's clock started
	for i := range *calls {
		began = append(began, time.Now())
		c, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Logger: log})
		if err == nil {
			err = c.WaitEcho(ctx)
		}
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		cs = append(cs, c)
	}
	t.Logf("%d calls up; soak for %v, fault schedule every %v", len(cs), *duration, *period)
	snap := func() snapshot {
		s := snapshot{at: time.Now()}
		for _, c := range cs {
			s.stats = append(s.stats, c.Stats())
		}
		return s
	}

	// Quiet windows: from settle after a fault's end to the next fault.
	var quietLost, quietSent int
	var faults []string
	start := time.Now()
	var clients []netip.AddrPort
	for _, c := range cs {
		local, _, _ := c.SelectedPair()
		clients = append(clients, local)
	}
	watched := make(chan struct{})
	go func() { defer close(watched); tr.watchCalls(sctx, cs, clients) }()
	windowStart := snap()
	for round := 0; time.Since(start) < *duration; round++ {
		for _, f := range schedule {
			at := start.Add(time.Duration(round)*(*period) + f.at)
			if at.After(start.Add(*duration)) {
				break
			}
			time.Sleep(time.Until(at))
			end := snap()
			for i := range cs {
				quietLost += end.stats[i].Lost - windowStart.stats[i].Lost
				quietSent += end.stats[i].Sent - windowStart.stats[i].Sent
			}
			began := time.Now()
			if err := f.do(w, redisSrv, round); err != nil {
				t.Errorf("round %d, %s: %v", round, f.name, err)
			}
			tr.learn(w)
			tr.mu.Lock()
			tr.faults = append(tr.faults, faultRun{start: began, end: time.Now(), name: f.name})
			tr.mu.Unlock()
			faults = append(faults, fmt.Sprintf("%6.1fs %s (%v)", began.Sub(start).Seconds(), f.name, time.Since(began).Round(time.Millisecond)))
			time.Sleep(settle)
			windowStart = snap()
		}
		time.Sleep(time.Until(start.Add(time.Duration(round+1) * (*period))))
	}
	// A call whose ICE went "disconnected" during the last fault needs a
	// moment to report connected again.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		up := 0
		for _, c := range cs {
			if c.ConnectionState().String() == "connected" {
				up++
			}
		}
		if up == len(cs) {
			break
		}
	}
	end := snap()
	for i := range cs {
		quietLost += end.stats[i].Lost - windowStart.stats[i].Lost
		quietSent += end.stats[i].Sent - windowStart.stats[i].Sent
	}

	t.Logf("faults injected:\n  %s", strings.Join(faults, "\n  "))
	var b strings.Builder
	fmt.Fprintf(&b, "%4s %8s %8s %7s %9s %s\n", "call", "sent", "lost", "loss%", "max gap", "state")
	totalSent, totalLost, dead := 0, 0, 0
	var worstGap time.Duration
	for i, c := range cs {
		s := end.stats[i]
		gap, _ := c.Gaps()
		// A call that went silent for good has no arrival to end its gap.
		gap = max(gap, end.at.Sub(began[i])-s.LastArrive)
		worstGap = max(worstGap, gap)
		st := c.ConnectionState().String()
		if st != "connected" {
			dead++
		}
		totalSent += s.Sent
		totalLost += s.Lost
		fmt.Fprintf(&b, "%4d %8d %8d %7.3f %9v %s\n", i, s.Sent, s.Lost, 100*s.LossRatio(), gap.Round(time.Millisecond), st)
	}
	t.Logf("per call:\n%s", b.String())
	stopSampling()
	<-sampled
	<-watched
	var gaps [][]probe.Gap
	for _, c := range cs {
		gaps = append(gaps, c.GapsOver(gapMin))
	}
	var gb strings.Builder
	sum := map[string]*gapSummary{}
	for i := range cs {
		tr.explain(&gb, i, clients[i], gaps, start, sum)
	}
	t.Logf("gaps over %v (the fault before each, then the path's events from 1 s before it, relative to its start):\n%s", gapMin, gb.String())
	var sb strings.Builder
	for _, f := range append(slices.Clone(schedule), fault{name: ""}) {
		if g := sum[f.name]; g != nil {
			name := f.name
			if name == "" {
				name = "outside the faults"
			}
			fmt.Fprintf(&sb, "  %-36s %4d gaps, longest %v\n", name, g.n, g.max.Round(time.Millisecond))
		}
	}
	t.Logf("gaps over %v by fault:\n%s", gapMin, sb.String())
	quiet := 100 * float64(quietLost) / float64(max(quietSent, 1))
	t.Logf("all calls: %d of %d packets lost (%.3f %%), longest gap %v, %d calls not connected; outside the faults: %d of %d lost (%.3f %%)",
		totalLost, totalSent, 100*float64(totalLost)/float64(max(totalSent, 1)), worstGap.Round(time.Millisecond), dead, quietLost, quietSent, quiet)
	if dead > 0 {
		t.Errorf("%d calls did not survive the soak", dead)
	}
	if quiet >= 0.1 {
		t.Errorf("loss outside the injected faults %.3f %%, want < 0.1 %%", quiet)
	}

	// Leaks: hang up, stop everything, compare with the start.
	for _, c := range cs {
		hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
		_ = c.Hangup(hctx)
		hcancel()
		c.Close()
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Addr()})
	keys, noTTL := redisKeys(t, rdb)
	rdb.Close()
	// Close returns once every gossip goroutine has ended (a probe in
	// flight outlives memberlist's Shutdown by up to 8 probe intervals,
	// 40 s with WAN timings): what is left after it is a leak.
	if err := w.Close(); err != nil {
		t.Errorf("close the dev world: %v", err)
	}
	if err := w.Err(); err != nil {
		t.Errorf("dev world component failed: %v", err)
	}
	redisSrv.Kill()
	gErr := goleak.Find(before)
	runtime.GC()
	t.Logf("leaks: goroutines %d → %d; fds %d → %d; RSS %d MB → %d MB; Redis keys at the end %d, %d without expiry",
		baseG, runtime.NumGoroutine(), baseFD, fds(t), baseRSS>>20, rss(t)>>20, keys, noTTL)
	if noTTL > 0 {
		t.Errorf("%d Redis keys have no expiry", noTTL)
	}
	if n := fds(t); n > baseFD+10 {
		t.Errorf("%d file descriptors open after the world stopped, %d at the start", n, baseFD)
	}
	if gErr != nil {
		t.Errorf("goroutines left after the world stopped: %v", gErr)
	}
}

// redisKeys counts the keys and those without a TTL.
func redisKeys(t *testing.T, rdb *redis.Client) (keys, noTTL int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		keys++
		if ttl, err := rdb.PTTL(ctx, iter.Val()).Result(); err == nil && ttl < 0 {
			noTTL++
		}
	}
	if err := iter.Err(); err != nil {
		t.Errorf("scan Redis: %v", err)
	}
	return keys, noTTL
}

func fds(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

func rss(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb << 10
		}
	}
	return 0
}
