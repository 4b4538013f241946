package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
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
// firewall drops all UDP calls over ICE-TCP through the nearest POP; that
// POP's global relays die, and with them the browser's TCP connection.
// Chromium has already connected to and checked the backup POP's passive
// TCP candidate (the pod answers those checks before any switch), so it
// moves the call there by itself — no ICE restart — the transceiver
// follows, and the echo and the data channel carry on. The media gap is
// logged and bound loosely.
func TestBrowserNearestPOPDiesMidCallOverTCP(t *testing.T) {
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
	// Before the failure the backup's TCP pair must already be checked
	// through the backup POP: that is what the browser moves to.
	b.waitJS("a succeeded pair to the backup POP's TCP candidate", fmt.Sprintf(`(async () => {
  const r = await window.rtcedge.pc.getStats();
  const rc = new Map();
  r.forEach((s) => { if (s.type === "remote-candidate") rc.set(s.id, (s.address || s.ip) + ":" + s.port); });
  let ok = false;
  r.forEach((s) => { if (s.type === "candidate-pair" && s.state === "succeeded" && rc.get(s.remoteCandidateId) === %q) ok = true; });
  return ok ? "ok" : "wait";
})()`, backupTCP), 10*time.Second)
	t.Logf("candidate pairs before the failure:\n%s", mustEval[string](b, iceJS("window.rtcedge.pc")))

	switchesBefore := metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil)
	backupFrames := map[string]string{"direction": "to_client", "pop": w.Regions[backupIdx].Spec.POPName}
	backupBefore := metricSum(t, w.Registry, "rtcedge_globalrelay_tcp_frames_total", backupFrames)
	before := mustEval[audioStats](b, statsJS("window.rtcedge.pc")).PacketsReceived
	b.waitJS("the gap sampler", gapSamplerJS, 5*time.Second)
	w.KillPOP(nearIdx) // its replicas' TCP connections die with them
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
	t.Logf("nearest POP killed mid-call (UDP blocked): longest time without an echoed packet %.0f ms; 50 more packets via %s after %v; transceiver POP switches %v",
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
