package capacity

import (
	"math"
	"testing"
)

// TestSummarize: the per-session fit uses only held steps with the machine
// under the busy limit; the per-datagram fit uses every held step, so it
// still projects on a loaded machine.
func TestSummarize(t *testing.T) {
	// A pod costing 10 % of a core plus 20 µs per datagram in; 50 pps per
	// session.
	step := func(n int, busy, loss float64) Step {
		pps := 50 * float64(n)
		return Step{Sessions: n, Loss: loss, PodPPSIn: pps, PodCPU: 0.10 + 20e-6*pps, BoxBusy: busy, PodIdleCPU: -1}
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9*math.Max(1, math.Abs(want)) }
	for _, tc := range []struct {
		name                string
		steps               []Step
		fitSteps, dgSteps   int
		wantPerSession      float64
		wantProjectedDgrams int
		wantMaxHeld         int
	}{
		{"quiet machine", []Step{step(100, 0.5, 0), step(200, 0.9, 0), step(400, 1.7, 0.001), step(500, 1.9, 0.02)},
			2, 3, 0.001, 1500, 400},
		{"loaded machine", []Step{step(100, 1.9, 0), step(300, 2.0, 0)}, 0, 2, 0, 1500, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Summarize(tc.steps, 0.005, 2, 0.8)
			if s.Steps != tc.fitSteps || s.DatagramSteps != tc.dgSteps || s.MaxHeldSessions != tc.wantMaxHeld {
				t.Errorf("steps %d/%d, held %d; want %d/%d, %d", s.Steps, s.DatagramSteps, s.MaxHeldSessions, tc.fitSteps, tc.dgSteps, tc.wantMaxHeld)
			}
			if !near(s.CPUPerSession, tc.wantPerSession) {
				t.Errorf("per session %v, want %v", s.CPUPerSession, tc.wantPerSession)
			}
			if s.BaselineSteps != 0 {
				t.Errorf("baseline fit over %d steps without an idle window", s.BaselineSteps)
			}
			if !near(s.CPUPerDatagram, 20e-6) || !near(s.DatagramBase, 0.10) || s.ProjectedDatagrams != tc.wantProjectedDgrams {
				t.Errorf("per datagram %v base %v projected %d; want 20e-6, 0.10, %d", s.CPUPerDatagram, s.DatagramBase, s.ProjectedDatagrams, tc.wantProjectedDgrams)
			}
		})
	}
}

// TestSummarizeBaseline: with the idle window measured, the per-session
// cost is the idle slope plus 50 datagrams' cost above the step's own
// baseline, whatever the load generator managed to send.
func TestSummarizeBaseline(t *testing.T) {
	// 0.1 % of a core per session idle, 80 µs per datagram; the generator
	// sends 50, 30 and 20 pps per session.
	var steps []Step
	for _, c := range []struct {
		n   int
		pps float64
	}{{100, 50}, {200, 30}, {300, 20}} {
		idle := 0.05 + 0.001*float64(c.n)
		pps := c.pps * float64(c.n)
		steps = append(steps, Step{Sessions: c.n, PodPPSIn: pps, PodIdleCPU: idle, PodCPU: idle + 80e-6*pps, BoxBusy: 2})
	}
	s := Summarize(steps, 0.005, 2, 0.8)
	if s.BaselineSteps != 3 || math.Abs(s.IdleCPUPerSession-0.001) > 1e-9 || math.Abs(s.AudioCPUPerDatagram-80e-6) > 1e-12 {
		t.Fatalf("baseline fit %d steps, idle %v, per datagram %v; want 3, 0.001, 80e-6", s.BaselineSteps, s.IdleCPUPerSession, s.AudioCPUPerDatagram)
	}
	if want := 0.001 + 50*80e-6; math.Abs(s.BaselinePerSession-want) > 1e-9 || s.ProjectedBaseline != 320 {
		t.Errorf("per session %v projected %d, want %v and 320", s.BaselinePerSession, s.ProjectedBaseline, want)
	}
}

// TestSummarizeFullRate: a step counts as held at full rate only when the
// load generator sent its frames, set every call up and lost none; the
// generator's and the reference server's cost per session come from the
// largest such step.
func TestSummarizeFullRate(t *testing.T) {
	steps := []Step{
		{Sessions: 100, SentRatio: 1, GenCPU: 0.1, RefCPU: 0.2, GenMakeCPU: 2e-6, PodIdleCPU: -1},
		{Sessions: 200, SentRatio: 0.99, GenCPU: 0.3, RefCPU: 0.5, GenMakeCPU: 2e-6, PodIdleCPU: -1},
		{Sessions: 300, SentRatio: 0.6, GenCPU: 0.3, RefCPU: 0.5, PodIdleCPU: -1},
		{Sessions: 400, SentRatio: 1, Lost: 3, PodIdleCPU: -1},
	}
	s := Summarize(steps, 0.005, 2, 0.8)
	if s.MaxHeldSessions != 400 || s.MaxFullRate != 200 {
		t.Errorf("held %d, at full rate %d; want 400 and 200", s.MaxHeldSessions, s.MaxFullRate)
	}
	if math.Abs(s.GenPerSession-0.0015) > 1e-12 || math.Abs(s.RefPerSession-0.0025) > 1e-12 || math.Abs(s.GenMakePerSession-1e-4) > 1e-12 {
		t.Errorf("per session: generator %v (+%v), reference server %v; want 0.0015 (+1e-4), 0.0025", s.GenPerSession, s.GenMakePerSession, s.RefPerSession)
	}
}
