package relay

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Summary is one path at one load over several runs (-rounds): the median
// and range of its CPU per datagram against each run's own C forwarder
// (c, or c-chain for the chains), and of its p50 round trip minus that C
// path's. On these shared machines a single run's ratio moves by ±15–30 %;
// a median over alternating runs is what a goal can be judged by.
type Summary struct {
	Path string `json:"path"`
	Load string `json:"load"`
	Runs int    `json:"runs"`
	// VsC is the median of the runs' Trial.VsC (0: not measured, the
	// direct path), VsCMin and VsCMax their range.
	VsC    float64 `json:"vs_c"`
	VsCMin float64 `json:"vs_c_min"`
	VsCMax float64 `json:"vs_c_max"`
	// P50OverC is the median of RTTp50 minus the same run's C path's, in
	// µs (negative: faster than C in that run).
	P50OverC    float64 `json:"p50_over_c_us"`
	P50OverCMin float64 `json:"p50_over_c_min_us"`
	P50OverCMax float64 `json:"p50_over_c_max_us"`
	P99Max      float64 `json:"rtt_p99_max_us"`
	LossMax     float64 `json:"loss_max"`
	AllQuiet    bool    `json:"all_quiet"` // every run's trial passed the quiet check
}

// Summarize reduces runs of the same paths and loads to one Summary per
// path and load, in the order of the first run.
func Summarize(reps []*Report) []Summary {
	type key struct{ path, load string }
	var order []key
	vs := map[key][]float64{}
	p50 := map[key][]float64{}
	out := map[key]*Summary{}
	for _, rep := range reps {
		base := map[key]float64{}
		for _, t := range rep.Trials {
			if t.Path == PathC || t.Path == PathCChain {
				base[key{t.Path, t.Load.Name}] = t.RTTp50
			}
		}
		for _, t := range rep.Trials {
			k := key{t.Path, t.Load.Name}
			s := out[k]
			if s == nil {
				s = &Summary{Path: t.Path, Load: t.Load.Name, AllQuiet: true}
				out[k] = s
				order = append(order, k)
			}
			s.Runs++
			s.P99Max = max(s.P99Max, t.RTTp99)
			s.LossMax = max(s.LossMax, t.Loss)
			s.AllQuiet = s.AllQuiet && t.Quiet
			if t.VsC > 0 {
				vs[k] = append(vs[k], t.VsC)
			}
			c := PathC
			if strings.Contains(t.Path, "chain") {
				c = PathCChain
			}
			if b, ok := base[key{c, t.Load.Name}]; ok && t.Path != PathDirect {
				p50[k] = append(p50[k], t.RTTp50-b)
			}
		}
	}
	res := make([]Summary, 0, len(order))
	for _, k := range order {
		s := out[k]
		s.VsC, s.VsCMin, s.VsCMax = medianRange(vs[k])
		s.P50OverC, s.P50OverCMin, s.P50OverCMax = medianRange(p50[k])
		res = append(res, *s)
	}
	return res
}

// medianRange returns the median, least and greatest of xs (zeros when
// empty).
func medianRange(xs []float64) (med, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

// SummaryTable prints summaries as a table.
func SummaryTable(ss []Summary) string {
	var b strings.Builder
	runs := 0
	for _, s := range ss {
		runs = max(runs, s.Runs)
	}
	fmt.Fprintf(&b, "over %d runs: median (range) of each run's figure against its own C path (c; c-chain for chains)\n", runs)
	fmt.Fprintf(&b, "%-20s %-5s %5s %-16s %-22s %8s %7s %5s\n", "path", "load", "runs", "xC", "p50-C us", "p99max", "loss%", "quiet")
	for _, s := range ss {
		vs, p := "-", "-"
		if s.VsC > 0 {
			vs = fmt.Sprintf("%.2f (%.2f-%.2f)", s.VsC, s.VsCMin, s.VsCMax)
		}
		if s.Path != PathDirect && s.Path != PathC && s.Path != PathCChain {
			p = fmt.Sprintf("%+.0f (%+.0f..%+.0f)", s.P50OverC, s.P50OverCMin, s.P50OverCMax)
		}
		quiet := "yes"
		if !s.AllQuiet {
			quiet = "no"
		}
		fmt.Fprintf(&b, "%-20s %-5s %5d %-16s %-22s %8.0f %7.3f %5s\n", s.Path, s.Load, s.Runs, vs, p, s.P99Max, 100*s.LossMax, quiet)
	}
	return b.String()
}

// WriteRoundsJSON writes several runs and their summary to path.
func WriteRoundsJSON(reps []*Report, path string) error {
	b, err := json.MarshalIndent(struct {
		Summary []Summary `json:"summary"`
		Runs    []*Report `json:"runs"`
	}{Summarize(reps), reps}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
