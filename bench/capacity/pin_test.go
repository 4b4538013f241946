package capacity

import (
	"slices"
	"strings"
	"testing"
)

// TestVerdict: a pinned step is held only within every limit; a failing
// step goes to the load side only while the pod stayed within its CPU.
func TestVerdict(t *testing.T) {
	ok := Step{Sessions: 150, SentRatio: 1, PodShare: 0.5, ToBackend: 1, ToCaller: 0.4}
	cases := []struct {
		name string
		mod  func(*Step)
		want string
	}{
		{"held", func(*Step) {}, HeldByPod},
		{"reply loss", func(s *Step) { s.Loss = 0.02 }, NotHeldByPod},
		{"pod busy", func(s *Step) { s.PodShare = 0.85 }, NotHeldByPod},
		{"lost call", func(s *Step) { s.Lost = 1 }, NotHeldByPod},
		{"audio to the server short", func(s *Step) { s.ToBackend = 0.9 }, NotHeldByPod},
		{"generator late", func(s *Step) { s.SentRatio = 0.95 }, NotHeldByLoad},
		{"generator late, loss", func(s *Step) { s.Underruns = 10; s.Loss = 0.03 }, NotHeldByLoad},
		{"replies short", func(s *Step) { s.ToCaller = 0.2 }, NotHeldByLoad},
		{"generator late, pod busy", func(s *Step) { s.SentRatio = 0.9; s.PodShare = 0.9 }, NotHeldByPod},
	}
	for _, tc := range cases {
		st := ok
		tc.mod(&st)
		got, why := Verdict(st, 0.4)
		if got != tc.want {
			t.Errorf("%s: %q (%s), want %q", tc.name, got, why, tc.want)
		}
		if (got == HeldByPod) != (why == "") {
			t.Errorf("%s: verdict %q with reason %q", tc.name, got, why)
		}
	}
}

// TestSummarizePinned: the largest step the pod held, per pod core; a
// larger step the load side failed marks the run as load-limited.
func TestSummarizePinned(t *testing.T) {
	steps := []Step{{Sessions: 50, Verdict: HeldByPod}, {Sessions: 100, Verdict: HeldByPod}, {Sessions: 150, Verdict: NotHeldByLoad}}
	var s Summary
	SummarizePinned(&s, steps, 1, 150)
	if s.PinnedHeld != 100 || s.PinnedPerCore != 100 || !s.LoadLimited {
		t.Fatalf("got held %d, per core %.0f, load-limited %v; want 100, 100, true", s.PinnedHeld, s.PinnedPerCore, s.LoadLimited)
	}
	steps = append(steps, Step{Sessions: 200, Verdict: NotHeldByPod})
	s = Summary{}
	SummarizePinned(&s, steps, 2, 150)
	if s.PinnedPerCore != 50 || s.LoadLimited {
		t.Fatalf("got per core %.0f, load-limited %v; want 50, false", s.PinnedPerCore, s.LoadLimited)
	}
	if tab := Table(steps, s); !strings.Contains(tab, "held 100 calls on 2 pinned pod core(s) -> 50 per core (goal 150 per core: not met)") {
		t.Fatalf("table:\n%s", tab)
	}
}

// TestPinning: the pod gets the last CPUs, the load side the rest, and the
// pinned command runs under taskset with GOMAXPROCS set.
func TestPinning(t *testing.T) {
	p, err := NewPinning(1)
	if err != nil {
		t.Skipf("one CPU: %v", err)
	}
	if len(p.PodCPUs) != 1 || len(p.LoadCPUs) == 0 || slices.Contains(p.LoadCPUs, p.PodCPUs[0]) {
		t.Fatalf("pinning %+v", p)
	}
	if _, err := NewPinning(len(p.LoadCPUs) + 1); err == nil {
		t.Fatal("no CPU left for the load side, yet no error")
	}
	argv, env := pinnedCommand([]int{1, 3}, "bin", "transceiver")
	if strings.Join(argv, " ") != "taskset -c 1,3 bin transceiver" || !slices.Equal(env, []string{"GOMAXPROCS=2"}) {
		t.Fatalf("argv %q env %q", argv, env)
	}
	a, err := ReadCPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a[p.PodCPUs[0]]; !ok {
		t.Fatalf("no /proc/stat line for CPU %d: %v", p.PodCPUs[0], a)
	}
	b := CPUTimes{}
	for c, ms := range a {
		ms.Busy += 50e6 // 50 ms
		ms.Total += 100e6
		b[c] = ms
	}
	if got := Busy(a, b, p.PodCPUs); got != 0.5 {
		t.Fatalf("Busy %.3f, want 0.5", got)
	}
}
