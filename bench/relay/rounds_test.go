package relay

import (
	"strings"
	"testing"
)

// TestSummarize checks that each path's figures are taken against the C
// path of the same run (c-chain for chains), as medians with their range.
func TestSummarize(t *testing.T) {
	run := func(cP50, chainCP50 float64, gr, grP50, chain float64, quiet bool) *Report {
		voice := Load{Name: "voice"}
		return &Report{Trials: []Trial{
			{Path: PathDirect, Load: voice, RTTp50: 40, Quiet: true},
			{Path: PathC, Load: voice, VsC: 1, RTTp50: cP50, Quiet: true},
			{Path: PathGlobalRelay, Load: voice, VsC: gr, RTTp50: grP50, RTTp99: grP50 * 3, Loss: 0.001, Quiet: quiet},
			{Path: PathCChain, Load: voice, VsC: 1, RTTp50: chainCP50, Quiet: true},
			{Path: PathChain, Load: voice, VsC: chain, RTTp50: chainCP50 + 10, Quiet: true},
		}}
	}
	ss := Summarize([]*Report{
		run(60, 100, 1.3, 70, 0.9, true),
		run(50, 120, 1.1, 90, 1.1, false),
		run(70, 110, 1.2, 75, 1.0, true),
	})
	if len(ss) != 5 {
		t.Fatalf("%d summaries, want 5", len(ss))
	}
	gr, chain := ss[2], ss[4]
	if gr.Path != PathGlobalRelay || gr.Runs != 3 {
		t.Fatalf("third summary %+v", gr)
	}
	if gr.VsC != 1.2 || gr.VsCMin != 1.1 || gr.VsCMax != 1.3 {
		t.Errorf("global relay xC %v (%v-%v), want 1.2 (1.1-1.3)", gr.VsC, gr.VsCMin, gr.VsCMax)
	}
	// p50 minus the same run's c: 10, 40, 5.
	if gr.P50OverC != 10 || gr.P50OverCMin != 5 || gr.P50OverCMax != 40 {
		t.Errorf("global relay p50 over C %v (%v..%v), want 10 (5..40)", gr.P50OverC, gr.P50OverCMin, gr.P50OverCMax)
	}
	if gr.AllQuiet || gr.P99Max != 270 || gr.LossMax != 0.001 {
		t.Errorf("global relay quiet %v, p99 max %v, loss max %v", gr.AllQuiet, gr.P99Max, gr.LossMax)
	}
	// Chains against c-chain: always +10.
	if chain.VsC != 1.0 || chain.P50OverC != 10 || chain.P50OverCMin != 10 {
		t.Errorf("chain %+v", chain)
	}
	if ss[0].VsC != 0 || ss[0].P50OverC != 0 {
		t.Errorf("direct %+v: nothing to compare", ss[0])
	}
	if tb := SummaryTable(ss); !strings.Contains(tb, "1.20 (1.10-1.30)") || !strings.Contains(tb, "+10 (+5..+40)") {
		t.Errorf("table:\n%s", tb)
	}
	if med, _, _ := medianRange([]float64{4, 1, 3, 2}); med != 2.5 {
		t.Errorf("median of 1..4 = %v, want 2.5", med)
	}
}
