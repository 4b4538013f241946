package probe_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/backend/realtime/reftest"
	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
	"github.com/rtcedge/rtcedge/probe"
)

// talk places one talker call (one plain turn of speech, then the
// barge-in turn) as a continuous prober does, and checks the report's
// shape and that the turn histograms got its turns.
func talk(t *testing.T, url string, speech time.Duration) probe.Report {
	t.Helper()
	cfg := callConfig(t, url)
	cfg.Talk = &probe.TalkConfig{Turns: 1, Speech: speech}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reg := prometheus.NewRegistry()
	m, err := probe.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var rep probe.Report
	var callErr error
	if err := probe.Continuous(ctx, probe.ContinuousConfig{Call: cfg, Iterations: 1, Metrics: m,
		OnResult: func(r probe.Report, err error) { rep, callErr = r, err }}); err != nil {
		t.Fatal(err)
	}
	if callErr != nil {
		t.Fatalf("talker call: %v", callErr)
	}
	t.Logf("talker report:\n%s", rep)
	if len(rep.Turns) != 2 || rep.Turns[0].BargeIn || !rep.Turns[1].BargeIn {
		t.Fatalf("turns %+v: want a plain turn, then the barge-in turn", rep.Turns)
	}
	for i, turn := range rep.Turns {
		if !turn.Replied {
			t.Fatalf("turn %d heard no reply: %+v", i+1, turn)
		}
	}
	if s := rep.String(); !strings.Contains(s, "turn 1:") || !strings.Contains(s, "barge-in:") {
		t.Errorf("report text lacks its turns:\n%s", s)
	}
	snap := testmetrics.Take(t, reg)
	placement := fmt.Sprintf(",cluster=%s,pop=%s,region=%s", rep.Cluster, rep.POP, rep.Region)
	if n := snap["rtcedge_probe_turn_reply_delay_seconds"+placement]; n != 2 {
		t.Errorf("reply delay histogram has %v samples, want 2 (both turns)", n)
	}
	if n := snap["rtcedge_probe_bargein_stop_seconds"+placement]; n != 1 {
		t.Errorf("barge-in histogram has %v samples, want 1", n)
	}
	return rep
}

// within fails the test unless lo ≤ v ≤ hi.
func within(t *testing.T, what string, v, lo, hi float64) {
	t.Helper()
	if v < lo || v > hi {
		t.Errorf("%s = %.1f ms, want within [%.0f, %.0f]", what, v, lo, hi)
	}
}

// TestTalkerEcho: against the echo backend the reply is the talker's own
// speech coming back, so it begins a round trip after the speech began
// (the delay from the end of the speech is about minus its length), lasts
// as long as the speech, and stops a round trip after the talker switches
// to its barge-in tone.
func TestTalkerEcho(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	const speech = 600.0
	rep := talk(t, w.SignalingURL, speech*time.Millisecond)
	plain, barge := rep.Turns[0], rep.Turns[1]
	// A loaded machine delays the sender's ticks: the speech lasts at
	// least its frames.
	within(t, "speech", plain.SpeechMs, speech-30, 3*speech)
	within(t, "reply delay", plain.ReplyDelayMs, -plain.SpeechMs, 0)
	within(t, "reply", plain.ReplyMs, 0.5*speech, 1.3*plain.SpeechMs)
	within(t, "barge-in stop", barge.BargeInStopMs, 0, 500)
	within(t, "barge-in reply", barge.ReplyMs, 200, 2*barge.SpeechMs)
}

// TestTalkerRealtime: against the reference server (energy VAD, replies
// that parrot the turn) through the Realtime backend, a reply begins
// after the server's silence window (500 ms) and repeats the turn's
// speech; the barge-in turn's reply stops soon after the talker speaks
// over it (the server's VAD, then the edge drops what it queued), where
// without barge-in at the edge the rest of the 1.5 s reply would play.
func TestTalkerRealtime(t *testing.T) {
	srv := reftest.Start(t, refserver.Config{Logger: testLogger()})
	w := startWorld(t, devworld.Config{BackendURL: srv.URL() + "?model=ref", BackendProtocol: "ga"})
	const speech = 1500.0
	rep := talk(t, w.SignalingURL, speech*time.Millisecond)
	plain, barge := rep.Turns[0], rep.Turns[1]
	within(t, "reply delay", plain.ReplyDelayMs, 400, 8000)
	within(t, "reply", plain.ReplyMs, 0.7*speech, 2*plain.SpeechMs)
	within(t, "barge-in reply delay", barge.ReplyDelayMs, 400, 8000)
	// 45 ms on a quiet machine; loose for a loaded one, yet under the
	// 1.2 s of reply that would play without barge-in at the edge.
	within(t, "barge-in stop", barge.BargeInStopMs, 0, 600)
	within(t, "barge-in reply", barge.ReplyMs, 200, 2*barge.SpeechMs)
}
