package relay

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	MaybeRunRole() // the trials' children are this test binary
	goleak.VerifyTestMain(m)
}

// TestSmoke runs every path briefly at two small loads and checks that the
// report is well-formed JSON and that every path carried traffic both ways
// with every echo on its own flow. It asserts nothing about timing.
func TestSmoke(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The deadline only stops a run that hangs: 22 trials of processes
	// built with -race took over 2 min at load 30, and nothing here is
	// timed. go test's own -timeout is the guard, less a minute to report.
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(-time.Minute))
	defer cancel()
	rep, err := Run(ctx, Config{
		Exe: exe, Dir: t.TempDir(),
		Loads:  []Load{{Name: "voice", Flows: 8, PPS: 50}, {Name: "flood", Flows: 4, PPS: 500}},
		Warmup: 100 * time.Millisecond, Window: 400 * time.Millisecond, Drain: 100 * time.Millisecond,
		Attempts: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "report.json")
	if err := WriteJSON(rep, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("report is not JSON: %v", err)
	}
	if want := len(AllPaths) * 2; len(back.Trials) != want {
		t.Fatalf("%d trials, want %d", len(back.Trials), want)
	}
	wantHops := map[string]int{PathDirect: 0, PathC: 1, PathGoBlock: 1, PathGoEpoll: 1, PathNaive: 1, PathGlobalRelay: 1, PathGlobalRelayPoller: 1, PathCChain: 2, PathChain: 2, PathChainBundle: 2, PathChainPollerBundle: 2}
	for _, tr := range back.Trials {
		if tr.Sent == 0 || tr.Echoed == 0 {
			t.Errorf("%s/%s: sent %d, echoed %d: nothing went through", tr.Path, tr.Load.Name, tr.Sent, tr.Echoed)
		}
		if tr.Stray != 0 {
			t.Errorf("%s/%s: %d echoes malformed or on the wrong flow", tr.Path, tr.Load.Name, tr.Stray)
		}
		if len(tr.Hops) != wantHops[tr.Path] {
			t.Errorf("%s: %d hops measured, want %d", tr.Path, len(tr.Hops), wantHops[tr.Path])
		}
		if runtime.NumCPU() >= 2 && (tr.GenBusy <= 0 || tr.GenBusy > 1.05) {
			t.Errorf("%s/%s: generator core %.2f busy, want a fraction in (0, 1]", tr.Path, tr.Load.Name, tr.GenBusy)
		}
		for _, h := range tr.Hops {
			if h.CPUs == "" {
				t.Errorf("%s: hop %s has no CPU list", tr.Path, h.Name)
			}
		}
	}
	if tb := Table(rep); len(tb) == 0 {
		t.Error("empty table")
	}
}

// TestSmokeVeth runs the -veth paths briefly: every path carries traffic
// both ways without loss at a small load, the fast path's programs ran on
// every datagram through each relay of the fp paths and on none
// elsewhere (the other relays run with fast_path off, not the node's
// auto, which would attach here), and every trial has the machine columns.
func TestSmokeVeth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the -veth run makes network namespaces and loads BPF programs: run as root")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{
		Exe: exe, Dir: t.TempDir(), Veth: true, Paths: VethPaths,
		Loads:  []Load{{Name: "voice", Flows: 8, PPS: 50}},
		Warmup: 300 * time.Millisecond, Window: 500 * time.Millisecond, Drain: 200 * time.Millisecond,
		Attempts: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	relays := map[string]uint64{PathFPGlobalRelay: 1, PathFPChain: 2}
	for _, tr := range rep.Trials {
		if tr.Sent == 0 || tr.Echoed != tr.Sent || tr.Stray != 0 {
			t.Errorf("%s: sent %d, echoed %d, stray %d", tr.Path, tr.Sent, tr.Echoed, tr.Stray)
		}
		if tr.MachinePerPkt <= 0 {
			t.Errorf("%s: no machine CPU measured", tr.Path)
		}
		n := relays[tr.Path]
		// The window's counts and the programs' are read a moment apart:
		// a datagram or two in flight at either end is in one and not the
		// other (402 runs for 404 datagrams), so 90 % of them, and none
		// without the fast path.
		if forwarded := uint64(tr.Sent + tr.Echoed); tr.BPFRuns < n*forwarded*9/10 || (n == 0) != (tr.BPFRuns == 0) {
			t.Errorf("%s: the fast path programs ran %d times for %d datagrams through %d relays", tr.Path, tr.BPFRuns, forwarded, n)
		}
	}
	t.Log("\n" + Table(rep))
}
