package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/probe"
)

// TestBackupPOPWhenNearestDown closes the nearest POP's global relay
// before dialing: the client, given both POPs in the answer, connects
// through the backup with no extra delay (the setup times of a normal call
// and of the backup call are logged side by side).
func TestBackupPOPWhenNearestDown(t *testing.T) {
	w := startWorld(t, devworld.Config{FlowIdle: time.Second, RouteTTL: time.Second})
	// A loopback client is placed in the default region, the first one.
	nearest, backup := w.Regions[0], w.Regions[1]
	nearestVIP, backupVIP := nearest.GlobalRelay.PublicAddr(), backup.GlobalRelay.PublicAddr()

	dial := func(name string) (*probe.Call, probe.Timings) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		call, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Logger: testLogger()})
		if err != nil {
			t.Fatalf("%s: dial: %v", name, err)
		}
		t.Cleanup(func() { call.Close() })
		if err := call.WaitEcho(ctx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return call, call.Timings()
	}
	hangup := func(call *probe.Call) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := call.Hangup(ctx); err != nil {
			t.Errorf("hangup: %v", err)
		}
		call.Close()
	}

	// A normal call: both POPs advertised, the backup at a lower priority,
	// and the nearest one carries the call.
	call, normal := dial("normal call")
	prios := testsdp.CandidatePriorities(t, call.Answer)
	if prios[nearestVIP] == 0 || prios[backupVIP] == 0 {
		t.Fatalf("answer candidates %v, want the nearest POP %v and the backup %v", prios, nearestVIP, backupVIP)
	}
	if prios[backupVIP] >= prios[nearestVIP] {
		t.Errorf("backup POP candidate priority %d is not below the nearest POP's %d", prios[backupVIP], prios[nearestVIP])
	}
	if n := nearest.GlobalRelay.Flows(); n < 1 {
		t.Errorf("nearest POP holds %d flows during a normal call, want ≥ 1", n)
	}
	hangup(call)

	// The nearest POP is gone before the next call starts.
	if err := nearest.GlobalRelay.Close(); err != nil {
		t.Fatalf("close nearest POP: %v", err)
	}
	call, viaBackup := dial("call via backup")
	// Whether the dead POP is still advertised depends on how soon gossip
	// reports it down; the call must connect either way.
	t.Logf("answer with the nearest POP down advertises %v", testsdp.CandidatePriorities(t, call.Answer))
	if n := backup.GlobalRelay.Flows(); n < 1 {
		t.Errorf("backup POP holds %d flows, want the call's flow", n)
	}
	eventually(t, 10*time.Second, "25 echoed packets through the backup POP", func() bool { return call.Stats().Received >= 25 })
	t.Logf("setup, normal call:      signaling %v, ICE %v, DTLS %v, first echo %v",
		normal.Signaling, normal.ICEConnected, normal.DTLSConnected, normal.FirstEcho)
	t.Logf("setup, nearest POP down: signaling %v, ICE %v, DTLS %v, first echo %v",
		viaBackup.Signaling, viaBackup.ICEConnected, viaBackup.DTLSConnected, viaBackup.FirstEcho)
	hangup(call)
}

// TestNearestPOPDiesMidCall closes the nearest POP's relay during a call
// whose client (Pion with ICE renomination) also has the backup POP, at
// production gossip timings, and measures the media gap until echoes come
// back through the backup.
//
// The recovery depends on the transceiver switching POPs when checks
// arrive through another POP while the selected one has gone silent
// (ARCHITECTURE.md, "Two POPs in one answer"): the test asserts that the
// switch happened (its counter) and that the call goes on.
func TestNearestPOPDiesMidCall(t *testing.T) {
	w := startWorld(t, devworld.Config{FlowIdle: time.Second, RouteTTL: time.Second, ProductionGossip: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dialRenominating(ctx, t, w.SignalingURL)
	eventually(t, 10*time.Second, "echoes through the nearest POP", func() bool {
		after, _ := c.echoesSentAfter(0)
		return len(after) >= 25
	})
	switches := func() float64 { return metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil) }
	switchesBefore := switches()

	if err := w.Regions[0].GlobalRelay.Close(); err != nil {
		t.Fatal(err)
	}
	killed := time.Since(c.start)
	eventually(t, 15*time.Second, "audio sent after the nearest POP died to come back through the backup "+
		"(needs the transceiver's POP switch on silence)", func() bool {
		after, _ := c.echoesSentAfter(killed)
		return len(after) >= 50
	})
	after, lastBefore := c.echoesSentAfter(killed)
	gap := after[0].received - lastBefore
	t.Logf("nearest POP closed at %v; last echo before %v, first echo via the backup at %v: media gap %v; POP switches %v",
		killed.Round(time.Millisecond), lastBefore.Round(time.Millisecond), after[0].received.Round(time.Millisecond),
		gap.Round(time.Millisecond), switches()-switchesBefore)
	if n := switches() - switchesBefore; n < 1 {
		t.Errorf("the transceiver switched POPs %v times, want ≥ 1", n)
	}
	if n := w.Regions[1].GlobalRelay.Flows(); n < 1 {
		t.Errorf("backup POP holds %d flows after the switch", n)
	}
	// Bounded by the client: a Pion client with renomination finds the
	// dead pair after its ICE disconnect timeout, then checks the backup.
	if gap >= 10*time.Second {
		t.Errorf("media gap %v after the nearest POP died, want < 10 s", gap)
	}
}
