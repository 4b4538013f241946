package e2e

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/devworld"
)

// restartProbe is what the page measured around its ICE restart.
type restartProbe struct {
	Restarts      float64 `json:"restarts"`
	PatchMs       float64 `json:"patchMs"`       // the PATCH round trip
	SelectedMs    float64 `json:"selectedMs"`    // restart -> a new candidate pair selected
	FirstPacketMs float64 `json:"firstPacketMs"` // restart -> audio received on it
	MaxStallMs    float64 `json:"maxStallMs"`    // longest wait between received packets, 3 s from the restart
	OldUfrag      string  `json:"oldUfrag"`
	NewUfrag      string  `json:"newUfrag"`
}

// TestBrowserICERestartOverPATCH: Chromium in a call gets a (simulated)
// network change — the "online" event a browser fires when it rejoins a
// network — and the demo page restarts ICE: pc.restartIce(), the new
// offer's credentials by PATCH, the server's new credentials into the
// remote description. The call goes on over the new ICE generation without
// a new call; the backend session is the same one throughout.
func TestBrowserICERestartOverPATCH(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	b := startBrowser(t)
	b.do("open the demo page", chromedp.Navigate(w.SignalingURL+"/"), chromedp.WaitVisible(chromedp.ID("call")))
	b.do("click Call", chromedp.Click(chromedp.ID("call")))
	b.waitJS("the call to connect", `window.rtcedge.state === "connected" ? "ok" : (window.rtcedge.state === "failed" ? "failed" : "wait")`, 20*time.Second)
	b.waitAudio("window.rtcedge.pc", 50, 15*time.Second)

	p := mustEval[restartProbe](b, `(async () => {
  const pc = window.rtcedge.pc;
  const ufrag = () => (/^a=ice-ufrag:(\S+)/m.exec(pc.remoteDescription.sdp) || [])[1];
  const read = async () => {
    const r = await pc.getStats();
    let pair = "", n = 0;
    r.forEach((s) => {
      if (s.type === "transport") pair = s.selectedCandidatePairId || "";
      if (s.type === "inbound-rtp" && s.kind === "audio") n = s.packetsReceived;
    });
    return { pair, n };
  };
  const before = await read();
  const o = { oldUfrag: ufrag(), selectedMs: -1, firstPacketMs: -1, maxStallMs: 0 };
  const t0 = performance.now();
  window.dispatchEvent(new Event("online"));
  let last = before.n, lastAt = t0, selectedAt = -1;
  while (performance.now() - t0 < 3000) {
    await new Promise((r) => setTimeout(r, 5));
    const s = await read();
    const now = performance.now();
    if (selectedAt < 0 && s.pair && s.pair !== before.pair) { selectedAt = now; o.selectedMs = now - t0; }
    if (s.n > last) {
      o.maxStallMs = Math.max(o.maxStallMs, now - lastAt);
      if (selectedAt >= 0 && o.firstPacketMs < 0) o.firstPacketMs = now - t0;
      last = s.n; lastAt = now;
    }
  }
  o.newUfrag = ufrag();
  o.restarts = window.rtcedge.iceRestarts;
  o.patchMs = window.rtcedge.timings.restartPatchMs || -1;
  return o;
})()`)
	t.Logf("ICE restart in Chromium: PATCH %v ms; new pair selected %v ms and audio on it %v ms after the restart; "+
		"longest gap between received packets %v ms", p.PatchMs, p.SelectedMs, p.FirstPacketMs, p.MaxStallMs)
	if p.Restarts != 1 || p.NewUfrag == "" || p.NewUfrag == p.OldUfrag {
		t.Fatalf("restart %+v: want one restart and new server credentials in the remote description", p)
	}
	if p.SelectedMs < 0 || p.FirstPacketMs < 0 {
		t.Fatalf("restart %+v: Chromium selected no new pair, or no audio came on it", p)
	}
	b.waitAudio("window.rtcedge.pc", mustEval[audioStats](b, statsJS("window.rtcedge.pc")).PacketsReceived+50, 10*time.Second)
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_ice_restarts_total", map[string]string{"result": "ok"}); n != 1 {
		t.Errorf("%v ICE restarts on the pods, want 1", n)
	}
	// The pod saw checks on the new credentials (it records the gap at the
	// first one it translated).
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_path_change_gap_seconds", map[string]string{"cause": "ice_restart"}); n != 1 {
		t.Errorf("%v restart gaps observed, want 1: no check arrived on the new credentials", n)
	}
	t.Logf("the pod's view: first check on the new credentials %.1f ms after it answered the restart",
		1000*histogramSum(t, w.Registry, "rtcedge_transceiver_path_change_gap_seconds", "cause", "ice_restart"))
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_created_total", nil); n != 1 {
		t.Errorf("%v sessions created, want the one call's", n)
	}
	if n := w.Sessions(); n != 1 {
		t.Errorf("%d sessions held, want 1", n)
	}
	if got := mustEval[string](b, `window.rtcedge.state`); got != "connected" {
		t.Errorf("page state %q after the restart, want connected", got)
	}
}

// histogramSum adds up the observations of every histogram series with
// the given label (one per pod).
func histogramSum(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value && m.Histogram != nil {
					sum += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return sum
}
