package e2e

import (
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testleak"
)

// TestWorldCloseEndsEveryGossipGoroutine: a world's Close returns only once
// every goroutine of its gossip pools has ended, including probes of
// members that died before it (memberlist's Shutdown returns while such a
// probe waits out its interval; make soak's goleak check caught one).
func TestWorldCloseEndsEveryGossipGoroutine(t *testing.T) {
	const memberlist = "hashicorp/memberlist."
	before := testleak.Running(memberlist)
	w, err := devworld.Start(devworld.Config{Logger: testLogger()})
	if err != nil {
		t.Fatalf("start dev world: %v", err)
	}
	// The POP's replicas die without a goodbye: every other member of the
	// global pool probes them, each probe waiting out its interval.
	w.KillPOP(0)
	probing := false
	for deadline := time.Now().Add(10 * time.Second); !probing && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for id := range testleak.Running("(*Memberlist).probeNode") {
			_, old := before[id]
			probing = probing || !old
		}
	}
	if !probing {
		t.Fatal("no probe of the world in flight within 10 s")
	}
	start := time.Now()
	if err := w.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	t.Logf("Close returned in %v", time.Since(start).Round(time.Millisecond))
	for id, stack := range testleak.Running(memberlist) {
		if _, old := before[id]; !old {
			t.Fatalf("a gossip goroutine of the world outlived its Close:\n%s", stack)
		}
	}
	if err := w.Err(); err != nil {
		t.Errorf("dev world component failed: %v", err)
	}
}
