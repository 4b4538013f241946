package probe_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/probe"
)

// TestLoad runs a small load against the dev world: every session must
// connect, echo and hang up cleanly, the percentiles must be ordered, and
// the HTML report must parse and carry both histograms.
func TestLoad(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const sessions = 10
	var progress []probe.LoadProgress
	rep, err := probe.Load(ctx, probe.LoadConfig{
		Call: callConfig(t, w.SignalingURL), Sessions: sessions, Ramp: time.Second, Duration: 3 * time.Second,
		SetupTimeout: 15 * time.Second, ProgressInterval: 500 * time.Millisecond,
		Progress: func(p probe.LoadProgress) { progress = append(progress, p) },
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Logf("report:\n%s", rep)

	if rep.Started != sessions || rep.Connected != sessions || rep.Echoed != sessions || rep.Completed != sessions || rep.Failed != 0 {
		t.Fatalf("sessions: %d started, %d connected, %d echoed, %d completed, %d failed (%v); want all %d fine",
			rep.Started, rep.Connected, rep.Echoed, rep.Completed, rep.Failed, rep.Failures, sessions)
	}
	placed := 0
	for _, n := range rep.Placements {
		placed += n
	}
	if placed != sessions {
		t.Errorf("placements %v add up to %d, want %d", rep.Placements, placed, sessions)
	}

	// Each distribution is ordered, and every session reaches the stages
	// in order, so the stages' percentiles are ordered too.
	sane := func(name string, d probe.Dist, count int) {
		t.Helper()
		if d.Count < count || d.P50 <= 0 || d.P50 > d.P90 || d.P90 > d.P99 || d.P99 > d.Max || d.Mean <= 0 || d.Mean > d.Max {
			t.Errorf("%s: implausible distribution %+v (want at least %d samples)", name, d, count)
		}
	}
	var prev probe.Dist
	for i, s := range probe.SetupStages {
		d := rep.Setup[s]
		sane("setup "+s, d, sessions)
		if i > 0 && (d.P50 < prev.P50 || d.Max < prev.Max) {
			t.Errorf("stage %s (%+v) ends before the one before it (%+v)", s, d, prev)
		}
		prev = d
	}
	// 50 packets a second for three seconds per session would be 150; the
	// generator is paced by the clock, and on a machine busy with other
	// tests (CI runs packages in parallel) it sent a third of that. The
	// bound checks that media flowed, not how fast.
	const minPackets = sessions * 10
	sane("RTT", rep.RTT, minPackets)
	if rep.Jitter.Count != sessions {
		t.Errorf("jitter over %d sessions, want %d", rep.Jitter.Count, sessions)
	}
	if rep.PacketsSent < minPackets || rep.LossRatio < 0 || rep.LossRatio > 0.5 {
		t.Errorf("implausible loss: %d sent, %d lost, ratio %v", rep.PacketsSent, rep.PacketsLost, rep.LossRatio)
	}
	if len(progress) == 0 || progress[len(progress)-1].Done != sessions {
		t.Errorf("progress %+v: want updates ending with all %d done", progress, sessions)
	}
	if rep.ElapsedSecs < 4 {
		t.Errorf("run took %.1f s, less than ramp + duration", rep.ElapsedSecs)
	}

	var buf bytes.Buffer
	if err := rep.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	checkHTMLReport(t, buf.String(), true)
}

// checkHTMLReport parses the report and checks it is self-contained and has
// the summary table and both histogram sections, with charts when there
// were samples to draw.
func checkHTMLReport(t *testing.T, page string, charts bool) {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatalf("parse HTML report: %v", err)
	}
	var svgs, bars int
	var summary bool
	var headings []string
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			for _, a := range n.Attr {
				if a.Key == "src" || a.Key == "href" {
					t.Errorf("report references an external asset: <%s %s=%q>", n.Data, a.Key, a.Val)
				}
				if a.Key == "id" && a.Val == "summary" && n.Data == "table" {
					summary = true
				}
				if a.Key == "class" && a.Val == "bar" {
					bars++
				}
			}
			switch n.Data {
			case "svg":
				svgs++
			case "h2":
				if n.FirstChild != nil {
					headings = append(headings, n.FirstChild.Data)
				}
			case "script", "link", "img":
				t.Errorf("report has a <%s> element", n.Data)
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	if !summary {
		t.Error("no summary table")
	}
	switch {
	case charts && (svgs != 2 || bars == 0):
		t.Errorf("%d SVG charts with %d bars, want the two histograms", svgs, bars)
	case !charts && svgs != 0:
		t.Errorf("%d SVG charts without samples", svgs)
	}
	all := strings.Join(headings, "|")
	for _, want := range []string{"Setup time to first echo", "Echo RTT"} {
		if !strings.Contains(all, want) {
			t.Errorf("no %q histogram among headings %q", want, headings)
		}
	}
}

// TestLoadFailures counts sessions that cannot be placed by reason rather
// than failing the run: here signaling does not answer at all.
func TestLoadFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := probe.Load(ctx, probe.LoadConfig{Call: callConfig(t, url), Sessions: 3, Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed != 3 || rep.Failures["signaling_error"] != 3 || rep.Connected != 0 || rep.Echoed != 0 {
		t.Errorf("against a closed port: %d failed, failures %v, %d connected; want 3 × signaling_error", rep.Failed, rep.Failures, rep.Connected)
	}
	var buf bytes.Buffer
	if err := rep.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "signaling_error") {
		t.Error("HTML report does not list the failure reason")
	}
	checkHTMLReport(t, buf.String(), false)
}

func TestLoadConfigErrors(t *testing.T) {
	tests := []probe.LoadConfig{
		{Sessions: 0},
		{Sessions: 1, Duration: -time.Second},
		{Sessions: 1, Ramp: -time.Second},
	}
	for _, cfg := range tests {
		if _, err := probe.Load(context.Background(), cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}
