package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rtcedge/rtcedge/devworld"
)

// iceJS lists a peer connection's candidate pairs with their candidates,
// as chrome://webrtc-internals shows them: the evidence of which paths
// the browser has when a test about ICE fails.
func iceJS(pcExpr string) string {
	return fmt.Sprintf(`(async () => {
  const r = await (%s).getStats();
  const c = new Map(), out = [];
  r.forEach((s) => { if (s.type === "local-candidate" || s.type === "remote-candidate") c.set(s.id, s); });
  const name = (id) => { const x = c.get(id); return x ? x.protocol + " " + (x.address || x.ip) + ":" + x.port + " " + x.candidateType + (x.tcpType ? "/" + x.tcpType : "") : id; };
  r.forEach((s) => {
    if (s.type === "candidate-pair") out.push(name(s.localCandidateId) + " -> " + name(s.remoteCandidateId) + ": " + s.state + (s.nominated ? " nominated" : "") + " requests " + s.requestsSent + " responses " + s.responsesReceived);
    if (s.type === "transport") out.push("transport: ICE " + s.iceState + ", selected " + s.selectedCandidatePairId);
  });
  return out.join("\n");
})()`, pcExpr)
}

// gapSamplerJS starts sampling the page's received audio packets every
// 20 ms (getStats is cached for about 50 ms, so that is the resolution)
// and keeps the longest time without a new packet in window.rtcedgeGap.
const gapSamplerJS = `(() => {
  const pc = window.rtcedge.pc;
  const g = window.rtcedgeGap = {maxMs: 0, n: 0, at: performance.now()};
  g.timer = setInterval(async () => {
    const r = await pc.getStats();
    let n = 0;
    r.forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "audio") n = s.packetsReceived; });
    const now = performance.now();
    if (n > g.n) { g.maxMs = Math.max(g.maxMs, now - g.at); g.n = n; g.at = now; }
  }, 20);
  return "ok";
})()`

// TestBrowserNearestPOPDiesMidCallOverTCP: Chromium in a network whose
// firewall drops all UDP calls over ICE-TCP through the nearest POP; then
// that POP fails, in two ways:
//
//   - its global relays die: their TCP connections are reset, Chromium
//     learns at once that the pair is gone and nominates the backup POP's
//     TCP pair by itself (no ICE restart);
//   - the path to it goes silent (a blackhole: no reset, no ICMP): the
//     transceiver follows the checks arriving through the backup POP once
//     the nearest has been silent for a second, and Chromium moves when its
//     pair stops answering.
//
// Chromium has connected to the backup POP's passive TCP candidate from the
// start, and has usually checked it too (the pod answers those checks
// before any switch; whether the check came before Chromium settled on the
// nearest POP's pair is logged). Either way the transceiver's POP switch
// is counted, no ICE restart is needed, and the echo and the data channel
// carry on. The media gap is logged and bound loosely.
func TestBrowserNearestPOPDiesMidCallOverTCP(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(n *udpBlockedNet, w *devworld.World, near int)
	}{
		{"replicas killed", func(_ *udpBlockedNet, w *devworld.World, near int) { w.KillPOP(near) }},
		{"path silent", func(n *udpBlockedNet, w *devworld.World, near int) { n.blackholeTCP(w.Regions[near].TCPAddr) }},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "-"), func(t *testing.T) { nearestPOPFailsOverTCP(t, tc.fail) })
	}
}

func nearestPOPFailsOverTCP(t *testing.T, fail func(n *udpBlockedNet, w *devworld.World, near int)) {
	n := newUDPBlockedNet(t)
	w := n.startWorld(t)
	near := expectedPlacement(t, w)
	nearIdx, backupIdx := 0, 1
	if w.Regions[1].Spec.POP == near.POP {
		nearIdx, backupIdx = 1, 0
	}
	nearTCP, backupTCP := w.Regions[nearIdx].TCPAddr.String(), w.Regions[backupIdx].TCPAddr.String()
	b := n.startBrowser(t, w)
	n.blockUDP()

	b.do("open the demo page", chromedp.Navigate(w.SignalingURL+"/"), chromedp.WaitVisible(chromedp.ID("call")))
	b.do("click Call", chromedp.Click(chromedp.ID("call")))
	b.waitJS("the call to connect", `(() => {
  const r = window.rtcedge;
  if (r.state === "connected") return "ok";
  if (r.state === "failed") return "the page reports: " + JSON.stringify(r.lastError);
  return "wait";
})()`, 30*time.Second)
	st := b.waitAudio("window.rtcedge.pc", 50, 20*time.Second)
	if st.Remote != nearTCP {
		t.Fatalf("the call runs via %s, want the nearest POP's TCP address %s\n%s", st.Remote, nearTCP, mustEval[string](b, iceJS("window.rtcedge.pc")))
	}
	// Whether the backup's TCP pair was checked before the failure (the
	// pod answers such checks whatever the selected pair) depends on
	// Chromium's timing; it is logged, and the failover must work either way.
	backupChecked := fmt.Sprintf(`(async () => {
  const r = await window.rtcedge.pc.getStats();
  const rc = new Map();
  r.forEach((s) => { if (s.type === "remote-candidate") rc.set(s.id, (s.address || s.ip) + ":" + s.port); });
  let ok = false;
  r.forEach((s) => { if (s.type === "candidate-pair" && s.state === "succeeded" && rc.get(s.remoteCandidateId) === %q) ok = true; });
  return ok;
})()`, backupTCP)
	for end := time.Now().Add(3 * time.Second); !mustEval[bool](b, backupChecked) && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("backup POP's TCP pair checked before the failure: %v", mustEval[bool](b, backupChecked))
	t.Logf("candidate pairs before the failure:\n%s", mustEval[string](b, iceJS("window.rtcedge.pc")))

	switchesBefore := metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil)
	backupFrames := map[string]string{"direction": "to_client", "pop": w.Regions[backupIdx].Spec.POPName}
	backupBefore := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_frames_total", backupFrames)
	before := mustEval[audioStats](b, statsJS("window.rtcedge.pc")).PacketsReceived
	b.waitJS("the gap sampler", gapSamplerJS, 5*time.Second)
	fail(n, w, nearIdx)
	killed := time.Now()

	b.waitJS("the echo to resume through the backup POP's TCP candidate", fmt.Sprintf(`(async () => {
  if (window.rtcedge.state === "failed") return "the page reports: " + JSON.stringify(window.rtcedge.lastError);
  const r = await window.rtcedge.pc.getStats();
  const byId = new Map();
  r.forEach((s) => byId.set(s.id, s));
  let n = 0, remote = "";
  r.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") n = s.packetsReceived;
    if (s.type === "transport") {
      const p = byId.get(s.selectedCandidatePairId), rc = p && byId.get(p.remoteCandidateId);
      if (rc) remote = (rc.address || rc.ip) + ":" + rc.port;
    }
  });
  return n > %.0f && remote === %q ? "ok" : "wait";
})()`, before+50, backupTCP), 30*time.Second)
	resumed := time.Since(killed)
	gapMs := mustEval[float64](b, `(() => { clearInterval(window.rtcedgeGap.timer); return window.rtcedgeGap.maxMs; })()`)
	switches := metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil) - switchesBefore
	t.Logf("nearest POP failed mid-call (UDP blocked): longest time without an echoed packet %.0f ms; 50 more packets via %s after %v; transceiver POP switches %v",
		gapMs, backupTCP, resumed.Round(time.Millisecond), switches)
	t.Logf("candidate pairs after the failure:\n%s", mustEval[string](b, iceJS("window.rtcedge.pc")))

	// The selection callback that counts the switch runs asynchronously.
	eventually(t, 5*time.Second, "the transceiver's POP switch to be counted", func() bool {
		return metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil) > switchesBefore
	})
	if v := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_frames_total", backupFrames) - backupBefore; v < 25 {
		t.Errorf("the backup POP carried %v TCP frames to the client after the kill, want ≥ 25", v)
	}
	if r := mustEval[float64](b, `window.rtcedge.iceRestarts`); r != 0 {
		t.Errorf("the page restarted ICE %v times: the browser must move to the backup pair by itself", r)
	}
	if s := mustEval[string](b, `window.rtcedge.state`); s != "connected" {
		t.Errorf("page state %q after the failover, want connected", s)
	}
	if gapMs >= 15000 {
		t.Errorf("media gap %.0f ms, want < 15 s", gapMs)
	}
	// The data channel (SCTP over the same DTLS) survived the move too.
	b.do("send a test event", chromedp.Click(chromedp.ID("send")))
	b.waitJS("the echo event after the failover", `window.rtcedge.events.filter((e) => e.dir === "in" && JSON.parse(e.data).type === "rtcedge.echo").length > 0 ? "ok" : "wait"`, 10*time.Second)
}
