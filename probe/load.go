package probe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// LoadConfig configures a load run: Sessions calls started evenly over
// Ramp, all held until Ramp+Duration, then hung up.
type LoadConfig struct {
	Call     Config
	Sessions int
	// Duration is how long the full load lasts after the ramp.
	Duration time.Duration
	// Ramp spreads the session starts evenly over this time; 0 starts all
	// at once.
	Ramp time.Duration
	// SetupTimeout bounds each session's setup (offer to first echo);
	// default DefaultSetupTimeout.
	SetupTimeout time.Duration
	// Grace is added to Ramp+Duration for the overall deadline, so that the
	// last sessions can finish setting up and hang up; default
	// SetupTimeout + 5s.
	Grace time.Duration
	// Progress, when set, is called every ProgressInterval (default 1s)
	// and once at the end, from one goroutine.
	Progress         func(LoadProgress)
	ProgressInterval time.Duration
}

// LoadProgress is a live view of a load run.
type LoadProgress struct {
	Elapsed time.Duration
	Started int // sessions started so far
	Up      int // sessions echoing now
	Failed  int
	Done    int // sessions that ended, either way
	// SetupP50 and SetupP99 are over the sessions set up so far, offer
	// to first echo.
	SetupP50, SetupP99 time.Duration
	// RTTP50 is the median of the live sessions' latest echo RTT.
	RTTP50 time.Duration
	// Loss is the share of packets the live sessions sent that have not
	// come back; packets in flight count, so it reads slightly high.
	Loss float64
}

func (p LoadProgress) String() string {
	return fmt.Sprintf("%5.1fs  started %d  up %d  failed %d  done %d  setup p50 %.0f ms p99 %.0f ms  rtt %.2f ms  loss %.2f%%",
		p.Elapsed.Seconds(), p.Started, p.Up, p.Failed, p.Done, ms(p.SetupP50), ms(p.SetupP99), ms(p.RTTP50), 100*p.Loss)
}

// Dist summarises durations, in milliseconds.
type Dist struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

func distOf(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Dist{
		Count: len(s), Mean: ms(sum / time.Duration(len(s))),
		P50: ms(nearestRank(s, 50)), P90: ms(nearestRank(s, 90)), P99: ms(nearestRank(s, 99)), Max: ms(s[len(s)-1]),
	}
}

// nearestRank is the p-th percentile of sorted s.
func nearestRank(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// LoadReport is the outcome of a load run. Durations are in milliseconds,
// as in Report.
type LoadReport struct {
	Target       string  `json:"target"`
	Sessions     int     `json:"sessions"`  // asked for
	Started      int     `json:"started"`   // actually started before the deadline
	Connected    int     `json:"connected"` // reached DTLS connected
	Echoed       int     `json:"echoed"`    // heard their first echo
	Completed    int     `json:"completed"` // held to the end and hung up cleanly
	Failed       int     `json:"failed"`
	RampSecs     float64 `json:"ramp_s"`
	DurationSecs float64 `json:"duration_s"`
	ElapsedSecs  float64 `json:"elapsed_s"`
	Interrupted  bool    `json:"interrupted,omitempty"` // the caller's context ended early
	// Setup is time from posting the offer to each stage, over the
	// sessions that echoed; keys are SetupStages.
	Setup map[string]Dist `json:"setup"`
	// RTT is over every echoed packet of every session (sampled down to
	// maxRTTSamples for the percentiles; count, mean and max are exact).
	RTT Dist `json:"rtt"`
	// Jitter is over the sessions' smoothed jitter at their end.
	Jitter      Dist    `json:"jitter"`
	EventReply  Dist    `json:"event_reply"`
	PacketsSent int     `json:"packets_sent"`
	PacketsLost int     `json:"packets_lost"`
	LossRatio   float64 `json:"loss_ratio"`
	// WorstLoss is the highest loss ratio of any one session.
	WorstLoss float64 `json:"worst_session_loss_ratio"`
	// Failures counts failed sessions by FailureReason.
	Failures map[string]int `json:"failures,omitempty"`
	// Placements counts sessions by "region/pop/cluster".
	Placements map[string]int `json:"placements,omitempty"`

	// Samples kept for the HTML histograms.
	setupSamples []time.Duration // offer to first echo
	rttSamples   []time.Duration
}

// maxRTTSamples bounds the RTT samples a report keeps (a reservoir), so a
// long run with many sessions stays within a few MB.
const maxRTTSamples = 200_000

// loader is one load run's shared state.
type loader struct {
	cfg   LoadConfig
	start time.Time
	end   time.Time // all sessions hang up here

	mu        sync.Mutex
	live      map[*Call]struct{}         // guarded by mu: echoing now
	upSetups  []time.Duration            // guarded by mu: offer to first echo, as sessions come up
	started   int                        // guarded by mu
	done      int                        // guarded by mu
	rep       LoadReport                 // guarded by mu
	stages    map[string][]time.Duration // guarded by mu
	rttCount  int                        // guarded by mu: all RTT samples seen
	rttSum    time.Duration              // guarded by mu
	rttMax    time.Duration              // guarded by mu
	jitters   []time.Duration            // guarded by mu
	events    []time.Duration            // guarded by mu
	reservoir *rand.Rand                 // guarded by mu
}

// Load runs a load test and reports on it. Every session is bounded by
// SetupTimeout and the whole run by Ramp+Duration+Grace. Failed sessions
// are counted in the report, not returned; Load returns an error only for
// an invalid config. If ctx ends early the sessions hang up and the report
// covers what ran (Interrupted).
func Load(ctx context.Context, cfg LoadConfig) (LoadReport, error) {
	if cfg.SetupTimeout == 0 {
		cfg.SetupTimeout = DefaultSetupTimeout
	}
	if cfg.Grace == 0 {
		cfg.Grace = cfg.SetupTimeout + hangupTimeout
	}
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = time.Second
	}
	switch {
	case cfg.Sessions < 1:
		return LoadReport{}, errors.New("probe: load needs at least one session")
	case cfg.Duration < 0 || cfg.Ramp < 0 || cfg.SetupTimeout < 0 || cfg.Grace < 0 || cfg.ProgressInterval < 0:
		return LoadReport{}, errors.New("probe: negative duration, ramp, setup timeout, grace or progress interval")
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, cfg.Ramp+cfg.Duration+cfg.Grace)
	defer cancel()
	ld := &loader{
		cfg: cfg, start: time.Now(), live: map[*Call]struct{}{}, stages: map[string][]time.Duration{},
		reservoir: rand.New(rand.NewPCG(1, 2)),
		rep: LoadReport{
			Target: cfg.Call.SignalingURL, Sessions: cfg.Sessions, RampSecs: cfg.Ramp.Seconds(), DurationSecs: cfg.Duration.Seconds(),
			Failures: map[string]int{}, Placements: map[string]int{},
		},
	}
	ld.end = ld.start.Add(cfg.Ramp + cfg.Duration)

	stopProgress := make(chan struct{})
	var progress sync.WaitGroup
	if cfg.Progress != nil {
		progress.Add(1)
		go func() {
			defer progress.Done()
			tick := time.NewTicker(cfg.ProgressInterval)
			defer tick.Stop()
			for {
				select {
				case <-stopProgress:
					return
				case <-tick.C:
					cfg.Progress(ld.progress())
				}
			}
		}()
	}

	var sessions sync.WaitGroup
	timer := time.NewTimer(time.Hour)
	timer.Stop()
launch:
	for i := range cfg.Sessions {
		at := ld.start.Add(time.Duration(int64(cfg.Ramp) * int64(i) / int64(cfg.Sessions)))
		if wait := time.Until(at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break launch
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		ld.mu.Lock()
		ld.started++
		ld.mu.Unlock()
		sessions.Add(1)
		go func() {
			defer sessions.Done()
			ld.session(ctx)
		}()
	}
	timer.Stop()
	sessions.Wait()
	close(stopProgress)
	progress.Wait()
	if cfg.Progress != nil {
		cfg.Progress(ld.progress())
	}
	return ld.report(parent.Err() != nil), nil
}

// session runs one call of the load and records it.
func (ld *loader) session(ctx context.Context) {
	var call *Call
	res, err := runCall(ctx, ld.cfg.Call, plan{
		setupTimeout: ld.cfg.SetupTimeout,
		until:        ld.end,
		onUp: func(c *Call) {
			call = c
			setup := c.Timings().FirstEcho
			ld.mu.Lock()
			ld.live[c] = struct{}{}
			ld.upSetups = append(ld.upSetups, setup)
			ld.mu.Unlock()
		},
	})
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if call != nil {
		delete(ld.live, call)
	}
	ld.done++
	r, tm := &ld.rep, res.Timings
	if tm.DTLSConnected > 0 {
		r.Connected++
	}
	if tm.FirstEcho > 0 {
		r.Echoed++
		for _, s := range []struct {
			stage string
			d     time.Duration
		}{{StageSignaling, tm.Signaling}, {StageICE, tm.ICEConnected}, {StageDTLS, tm.DTLSConnected}, {StageFirstEcho, tm.FirstEcho}} {
			ld.stages[s.stage] = append(ld.stages[s.stage], s.d)
		}
	}
	if res.Report.Region != "" || res.Report.POP != "" {
		r.Placements[res.Report.Region+"/"+res.Report.POP+"/"+res.Report.Cluster]++
	}
	if err != nil {
		r.Failed++
		r.Failures[FailureReason(err)]++
	} else {
		r.Completed++
	}
	a := res.Audio
	if a.Sent == 0 {
		return
	}
	r.PacketsSent += a.Sent
	r.PacketsLost += a.Lost
	r.WorstLoss = max(r.WorstLoss, a.LossRatio())
	ld.jitters = append(ld.jitters, a.Jitter)
	if res.Report.EventReplyMs > 0 {
		ld.events = append(ld.events, time.Duration(res.Report.EventReplyMs*float64(time.Millisecond)))
	}
	for _, d := range a.RTTs {
		ld.rttCount++
		ld.rttSum += d
		ld.rttMax = max(ld.rttMax, d)
		// Reservoir sampling keeps a uniform sample of every RTT seen.
		if len(r.rttSamples) < maxRTTSamples {
			r.rttSamples = append(r.rttSamples, d)
		} else if j := ld.reservoir.IntN(ld.rttCount); j < maxRTTSamples {
			r.rttSamples[j] = d
		}
	}
}

func (ld *loader) progress() LoadProgress {
	ld.mu.Lock()
	p := LoadProgress{Elapsed: time.Since(ld.start), Started: ld.started, Up: len(ld.live), Failed: ld.rep.Failed, Done: ld.done}
	setup := slices.Clone(ld.upSetups)
	calls := make([]*Call, 0, len(ld.live))
	for c := range ld.live {
		calls = append(calls, c)
	}
	ld.mu.Unlock()
	slices.Sort(setup)
	p.SetupP50, p.SetupP99 = nearestRank(setup, 50), nearestRank(setup, 99)
	var rtts []time.Duration
	sent, recv := 0, 0
	for _, c := range calls {
		l := c.stats.live()
		if l.lastRTT > 0 {
			rtts = append(rtts, l.lastRTT)
		}
		sent += l.sent
		recv += l.received
	}
	slices.Sort(rtts)
	p.RTTP50 = nearestRank(rtts, 50)
	if sent > 0 {
		p.Loss = max(0, float64(sent-recv)/float64(sent))
	}
	return p
}

func (ld *loader) report(interrupted bool) LoadReport {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	r := ld.rep
	r.Started = ld.started
	r.ElapsedSecs = time.Since(ld.start).Seconds()
	r.Interrupted = interrupted
	if notStarted := r.Sessions - r.Started; notStarted > 0 {
		r.Failed += notStarted
		r.Failures["not_started"] += notStarted
	}
	r.Setup = map[string]Dist{}
	for _, s := range SetupStages {
		r.Setup[s] = distOf(ld.stages[s])
	}
	r.setupSamples = slices.Clone(ld.stages[StageFirstEcho])
	r.rttSamples = slices.Clone(r.rttSamples)
	r.RTT = distOf(r.rttSamples)
	if ld.rttCount > 0 {
		r.RTT.Count, r.RTT.Mean, r.RTT.Max = ld.rttCount, ms(ld.rttSum/time.Duration(ld.rttCount)), ms(ld.rttMax)
	}
	r.Jitter = distOf(ld.jitters)
	r.EventReply = distOf(ld.events)
	if r.PacketsSent > 0 {
		r.LossRatio = float64(r.PacketsLost) / float64(r.PacketsSent)
	}
	r.Failures = cloneMap(r.Failures)
	r.Placements = cloneMap(r.Placements)
	return r
}

func cloneMap(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// sortedKeys returns m's keys, most frequent first.
func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return keys
}

// String renders the report for a terminal.
func (r LoadReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "load against %s: %d sessions, ramp %.0f s, %.0f s at full load, %.1f s in all", r.Target, r.Sessions, r.RampSecs, r.DurationSecs, r.ElapsedSecs)
	if r.Interrupted {
		b.WriteString(" (interrupted)")
	}
	fmt.Fprintf(&b, "\nsessions: %d started, %d connected, %d echoed, %d completed, %d failed\n", r.Started, r.Connected, r.Echoed, r.Completed, r.Failed)
	for _, k := range sortedKeys(r.Placements) {
		fmt.Fprintf(&b, "  placed in %s: %d\n", k, r.Placements[k])
	}
	fmt.Fprintf(&b, "%-22s %9s %9s %9s %9s %9s\n", "(ms)", "p50", "p90", "p99", "max", "mean")
	row := func(name string, d Dist) {
		fmt.Fprintf(&b, "%-22s %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, d.P50, d.P90, d.P99, d.Max, d.Mean)
	}
	for _, s := range SetupStages {
		row("setup "+s, r.Setup[s])
	}
	row("echo RTT", r.RTT)
	row("jitter (per session)", r.Jitter)
	row("event reply", r.EventReply)
	fmt.Fprintf(&b, "loss: %.3f%% (%d of %d packets), worst session %.3f%%\n", 100*r.LossRatio, r.PacketsLost, r.PacketsSent, 100*r.WorstLoss)
	if len(r.Failures) == 0 {
		b.WriteString("failures: none\n")
	} else {
		b.WriteString("failures:\n")
		for _, k := range sortedKeys(r.Failures) {
			fmt.Fprintf(&b, "  %-20s %d\n", k, r.Failures[k])
		}
	}
	return b.String()
}
