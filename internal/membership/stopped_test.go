package membership

import (
	"bytes"
	"context"
	"errors"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/testleak"
)

// poolStacks returns the goroutine profile records of p's goroutines.
func poolStacks(t *testing.T, p *Pool) [][]byte {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		t.Fatal(err)
	}
	needle := []byte(strconv.Quote(poolLabel) + ":" + strconv.Quote(p.label))
	var out [][]byte
	for rec := range bytes.SplitSeq(buf.Bytes(), []byte("\n\n")) {
		if bytes.Contains(rec, needle) {
			out = append(out, rec)
		}
	}
	return out
}

// awaitProbeInFlight waits until one of p's goroutines is inside
// memberlist's probeNode, polling: no event marks it.
func awaitProbeInFlight(t *testing.T, p *Pool, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, rec := range poolStacks(t, p) {
			if bytes.Contains(rec, []byte("(*Memberlist).probeNode")) {
				return
			}
		}
	}
	t.Fatalf("%s: no probe in flight within %v", p.Name(), within)
}

// TestGroupWaitOutlastsTheProbeInFlight closes a pool while it probes a
// member that is gone: memberlist's Shutdown returns while the probe waits
// out its interval, and Group.Wait must return only once that goroutine
// has ended too (make soak failed on such a probe outliving its world).
func TestGroupWaitOutlastsTheProbeInFlight(t *testing.T) {
	before := testleak.Running("hashicorp/memberlist.")
	g := NewGroup()
	// LAN timings, not Fast: the gone member stays suspect for seconds
	// (SuspicionMult 4 × a 1 s interval), probed in every round, each probe
	// waiting a whole interval for its ack.
	cfgA, cfgB := testConfig("prober"), testConfig("probed")
	cfgA.Fast, cfgB.Fast = false, false
	cfgA.Group, cfgB.Group = g, g
	a, err := New(cfgA, Meta{Role: RoleClusterRelay})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfgB, Meta{Role: RoleClusterRelay})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Join([]string{a.LocalAddr().String()}); err != nil {
		t.Fatal(err)
	}
	await(t, a, "probed alive", hasMember("probed", inState(StateAlive)))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	awaitProbeInFlight(t, a, 3*time.Second)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), MaxLinger(cfgA))
	defer cancel()
	if err := g.Wait(ctx); err != nil {
		t.Fatalf("Group.Wait: %v", err)
	}
	// Looked at once: what runs now has outlived the wait.
	for id, stack := range testleak.Running("hashicorp/memberlist.") {
		if _, ok := before[id]; !ok {
			t.Fatalf("a memberlist goroutine outlived Group.Wait:\n%s", stack)
		}
	}
	if err := a.Wait(ctx); err != nil {
		t.Fatalf("Pool.Wait after the group's: %v", err)
	}
}

// TestWaitGivesUpOnAnOpenPool: a pool that is not closed keeps its
// goroutines, and Wait says so when its context ends.
func TestWaitGivesUpOnAnOpenPool(t *testing.T) {
	p := newTestPool(t, "open", Meta{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*stoppedPoll)
	defer cancel()
	err := p.Wait(ctx)
	if !errors.Is(err, ErrLingering) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on an open pool = %v, want ErrLingering and the deadline", err)
	}
	if !strings.Contains(err.Error(), "memberlist") {
		t.Fatalf("the error does not show a memberlist stack: %v", err)
	}
}
