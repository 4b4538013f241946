package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rtcedge/rtcedge/devworld"
)

// TestBrowserNearestPOPDiesMidCall: Chromium's call runs through the
// nearest POP; that POP's global relay dies; Chromium's checks then reach
// the transceiver only through the backup POP (the answer's second
// candidate), the transceiver moves the session there, and the echo
// resumes. The media gap is logged.
func TestBrowserNearestPOPDiesMidCall(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	near := expectedPlacement(t, w)
	var backup devworld.RegionSpec
	for _, rg := range w.Regions {
		if rg.Spec.POP != near.POP {
			backup = rg.Spec
		}
	}
	b := startBrowser(t)
	b.do("open the demo page", chromedp.Navigate(w.SignalingURL+"/"), chromedp.WaitVisible(chromedp.ID("call")))
	b.do("click Call", chromedp.Click(chromedp.ID("call")))
	b.waitJS("the call to connect", `window.rtcedge.state === "connected" ? "ok" : (window.rtcedge.state === "failed" ? "failed" : "wait")`, 20*time.Second)
	st := b.waitAudio("window.rtcedge.pc", 50, 15*time.Second)
	if !strings.HasPrefix(st.Remote, near.POPIP.String()+":") {
		t.Fatalf("call runs via %s, want the nearest POP %s", st.Remote, near.POPIP)
	}

	for _, rg := range w.Regions {
		if rg.Spec.POP == near.POP {
			rg.GlobalRelay.Close()
		}
	}
	killed := time.Now()
	before := mustEval[audioStats](b, statsJS("window.rtcedge.pc")).PacketsReceived
	b.waitJS("the echo to resume through the backup POP", `(async () => {
  const pc = window.rtcedge.pc;
  const r = await pc.getStats();
  let n = 0;
  r.forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "audio") n = s.packetsReceived; });
  return n > `+formatFloat(before+50)+` ? "ok" : "wait";
})()`, 30*time.Second)
	resumed := time.Since(killed)
	st = mustEval[audioStats](b, statsJS("window.rtcedge.pc"))
	switches := metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil)
	t.Logf("nearest POP killed mid-call: 50 more echoed packets %v later (≈ %v of silence), now via %s; transceiver POP switches: %v",
		resumed.Round(time.Millisecond), (resumed - time.Second).Round(100*time.Millisecond), st.Remote, switches)
	if st.Remote != "" && !strings.HasPrefix(st.Remote, backup.POPIP.String()+":") {
		t.Logf("Chromium's nominated pair still names %s (the transceiver follows the checks, not only nominations)", st.Remote)
	}
	if switches < 1 {
		t.Errorf("the transceiver did not switch POPs")
	}
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'f', 0, 64) }
