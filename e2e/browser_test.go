package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"github.com/rtcedge/rtcedge/devworld"
)

// screenshotEnv names a file to write a screenshot of the demo page during
// a call to (PNG), for docs/demo.png. Unset in normal test runs.
const screenshotEnv = "RTCEDGE_DEMO_SCREENSHOT"

// expectedPlacement is where signaling puts a loopback client: the default
// region (the embedded GeoIP database does not know 127.0.0.1), its cluster
// and its POP.
func expectedPlacement(t *testing.T, w *devworld.World) devworld.RegionSpec {
	t.Helper()
	for _, rg := range w.Regions {
		if rg.Spec.Name == w.Catalogue.DefaultRegion {
			return rg.Spec
		}
	}
	t.Fatalf("default region %q is not in the world", w.Catalogue.DefaultRegion)
	return devworld.RegionSpec{}
}

// TestBrowserDemoCall drives the demo page in real Chromium: Call, connect
// through the relays, hear the fake microphone's beep come back, see where
// the call was placed, exchange an event, hang up, and check that the
// server ended the session and media stopped.
func TestBrowserDemoCall(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	want := expectedPlacement(t, w)
	b := startBrowser(t)

	b.do("open the demo page", chromedp.Navigate(w.SignalingURL+"/"), chromedp.WaitVisible(chromedp.ID("call")))
	if st := mustEval[string](b, `document.body.dataset.state`); st != "idle" {
		t.Fatalf("page starts in state %q, want idle", st)
	}

	clicked := time.Now()
	b.do("click Call", chromedp.Click(chromedp.ID("call")))
	b.waitJS("the call to connect", `(() => {
  const r = window.rtcedge;
  if (r.state === "connected") return "ok";
  if (r.state === "failed") return "the page reports: " + JSON.stringify(r.lastError);
  return "wait";
})()`, 20*time.Second)
	goConnected := time.Since(clicked)
	pageConnected := mustEval[float64](b, `window.rtcedge.timings.clickToConnectedMs`)
	signalingMs := mustEval[float64](b, `window.rtcedge.timings.signalingMs`)
	t.Logf("click → connected: %.0f ms in the page (signaling %.0f ms), %v seen by the test",
		pageConnected, signalingMs, goConnected.Round(time.Millisecond))

	// The fake microphone's beep comes back through both relay tiers.
	st := b.waitAudio("window.rtcedge.pc", 50, 15*time.Second)
	t.Logf("echo: %v packets received, totalAudioEnergy %.4f, via %s",
		st.PacketsReceived, st.TotalAudioEnergy, st.Remote)

	// The page shows where the call was placed, as the headers said.
	for _, c := range []struct{ id, want string }{
		{"region", want.Name},
		{"cluster", strconv.Itoa(int(want.Cluster))},
		{"pop", want.POPName},
	} {
		b.waitJS("#"+c.id+" to show "+c.want, `document.getElementById(`+strconv.Quote(c.id)+`).textContent === `+strconv.Quote(c.want)+` ? "ok" : "wait"`, 5*time.Second)
	}
	if bp := mustEval[string](b, `document.getElementById("backup-pop").textContent`); bp == "—" || bp == want.POPName {
		t.Errorf("backup POP shows %q, want another POP's name", bp)
	}
	// The live stats reached the page (the relay VIP of the chosen POP).
	b.waitJS("the page to show the relay address", `(window.rtcedge.remoteAddress || "").startsWith(`+strconv.Quote(want.POPIP.String()+":")+`) ? "ok" : "wait"`, 5*time.Second)

	// The events channel: the button sends, the echo backend answers.
	b.waitJS("the Send button", `document.getElementById("send").disabled ? "wait" : "ok"`, 10*time.Second)
	b.do("send a test event", chromedp.Click(chromedp.ID("send")))
	b.waitJS("the echo event", `window.rtcedge.events.some((e) => e.dir === "in" && JSON.parse(e.data).type === "rtcedge.echo") ? "ok" : "wait"`, 10*time.Second)

	if path := os.Getenv(screenshotEnv); path != "" {
		screenshot(t, b, path)
	}

	st = mustEval[audioStats](b, statsJS("window.rtcedge.pc"))
	t.Logf("Chromium's ICE RTT through the relays: current %.1f ms, mean %.2f ms (after %v packets)",
		st.RTT*1000, st.MeanRTT*1000, st.PacketsReceived)
	checkVoiceRTCP(t, b, "window.rtcedge.pc")
	checkPodMediaPath(t, w)

	// Hang up: DELETE, then the session ends on the server, the relays
	// stop carrying its media, and the page lets go of the microphone.
	b.do("click Hang up", chromedp.Click(chromedp.ID("hangup")))
	b.waitJS("the page to end the call", `(() => {
  const r = window.rtcedge;
  if (r.state === "ended") return r.lastError ? "hang-up error: " + JSON.stringify(r.lastError) : "ok";
  return "wait";
})()`, 10*time.Second)
	eventually(t, 5*time.Second, "the session to end by DELETE", func() bool {
		return metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", map[string]string{"reason": "deleted"}) == 1
	})
	toClient := map[string]string{"direction": "to_client"}
	final := waitMetricSettles(t, w, "rtcedge_globalrelay_packets_total", toClient, 5*time.Second)
	t.Logf("after hang-up the global relays stop sending at %v packets to clients", final)
	b.waitJS("the page to close the connection and stop the microphone", `(() => {
  const pc = window.rtcedge.pc;
  if (pc.connectionState !== "closed") return "wait";
  const live = pc.getSenders().filter((s) => s.track && s.track.readyState !== "ended");
  return live.length === 0 ? "ok" : "wait";
})()`, 5*time.Second)
}

// checkVoiceRTCP checks what the pod's slimmed-down media stack still gives
// the browser: its quality figures from the pod's RTCP (remote-inbound-rtp
// fractionLost and jitter from receiver reports, remote-outbound-rtp from
// sender reports), and an answer without the feedback the pod no longer
// serves (transport-cc, nack). It logs what Chromium offered for audio, the
// evidence for what the pod registers (transceiver/voice.go), and whether
// Chromium got a round-trip time out of the receiver reports (it does not
// yet, with or without the slimming: docs/benchmarks.md).
func checkVoiceRTCP(t *testing.T, b *browser, pcExpr string) {
	t.Helper()
	// Reports go out once a second each way: a few seconds.
	deadline := time.Now().Add(15 * time.Second)
	for {
		v, err := eval[string](b, fmt.Sprintf(`(async () => {
  const r = await %s.getStats();
  let ri = null, ro = null;
  r.forEach((s) => {
    if (s.type === "remote-inbound-rtp" && s.kind === "audio") ri = s;
    if (s.type === "remote-outbound-rtp" && s.kind === "audio") ro = s;
  });
  if (ri && ri.fractionLost !== undefined && ri.jitter !== undefined && ro && ro.packetsSent > 0 && ro.reportsSent > 1) {
    return "ok";
  }
  return "remote-inbound-rtp " + JSON.stringify(ri) + ", remote-outbound-rtp " + JSON.stringify(ro);
})()`, pcExpr))
		if err == nil && v == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no RTCP-derived quality figures in Chromium's getStats after 15 s: %s (%v)", v, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	q := mustEval[struct {
		RTTs, FractionLost, Jitter float64
		Offer, Answer              []string
	}](b, fmt.Sprintf(`(async () => {
  const pc = %s;
  const r = await pc.getStats();
  const o = {};
  r.forEach((s) => {
    if (s.type === "remote-inbound-rtp" && s.kind === "audio") {
      o.RTTs = s.roundTripTimeMeasurements; o.FractionLost = s.fractionLost; o.Jitter = s.jitter;
    }
  });
  const audio = (sdp) => {
    const m = sdp.split("m=").find((x) => x.startsWith("audio"));
    return m.split("\r\n").filter((l) => l.startsWith("a=rtcp-fb") || l.startsWith("a=extmap"));
  };
  o.Offer = audio(pc.localDescription.sdp);
  o.Answer = audio(pc.remoteDescription.sdp);
  return o;
})()`, pcExpr))
	t.Logf("pod RTCP seen by Chromium: remote-inbound-rtp fractionLost %v, jitter %.4f s, %v round-trip measurements",
		q.FractionLost, q.Jitter, q.RTTs)
	t.Logf("Chromium's audio offer: %q; the pod's answer: %q", q.Offer, q.Answer)
	for _, l := range q.Answer {
		if strings.Contains(l, "transport-cc") || strings.Contains(l, "transport-wide-cc") || strings.Contains(l, "nack") {
			t.Errorf("the answer negotiates %q, which the pod does not serve", l)
		}
	}
}

// checkPodMediaPath checks the call's media went through the pod's own
// media path (transceiver/media.go), not Pion's, and that Chromium's RTCP
// on the pod's audio gave the pod round-trip times: Chromium accepted the
// pod's sender reports (its receiver reports carry their LSR) and the pod
// read Chromium's reports.
func checkPodMediaPath(t *testing.T, w *devworld.World) {
	t.Helper()
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_media_paths_total", map[string]string{"path": "pod"}); n < 1 {
		t.Errorf("no session on the pod's media path (media_paths_total{path=\"pod\"} = %v)", n)
	}
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_media_paths_total", map[string]string{"path": "pion"}); n != 0 {
		t.Errorf("%v sessions fell back to Pion's media path", n)
	}
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_rtcp_reports_total", nil); n < 2 {
		t.Errorf("the pod sent %v RTCP reports, want at least 2", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for metricSum(t, w.Registry, "rtcedge_transceiver_client_rtt_seconds", nil) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no round-trip time from Chromium's receiver reports on the pod's audio after 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitMetricSettles polls a counter until it has not changed for a whole
// second and returns its value.
func waitMetricSettles(t *testing.T, w *devworld.World, name string, labels map[string]string, d time.Duration) float64 {
	t.Helper()
	const quiet = time.Second
	deadline := time.Now().Add(d)
	last, since := -1.0, time.Now()
	for {
		v := metricSum(t, w.Registry, name, labels)
		if v != last {
			last, since = v, time.Now()
		} else if time.Since(since) >= quiet {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v still changing after %v (now %v)", name, labels, d, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBrowserDemoErrors checks that the demo page shows failures plainly:
// an API error with its message and code, and a refused microphone.
func TestBrowserDemoErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      devworld.Config
		deny     bool   // refuse the microphone to the page's origin
		code     string // lastError.code
		status   int    // lastError.status
		contains string // in the shown message
	}{
		{
			name: "API error", cfg: devworld.Config{APIKeys: []string{"rtcedge-test-key-0123456789"}},
			code: "missing_credentials", status: http.StatusUnauthorized, contains: "Authorization",
		},
		{
			name: "microphone refused", deny: true,
			code: "mic_denied", contains: "Microphone access was refused",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startWorld(t, tc.cfg)
			var opts []chromedp.ExecAllocatorOption
			if tc.deny {
				// The fake UI accepts every prompt; without it the
				// permission override below decides.
				opts = append(opts, chromedp.Flag("use-fake-ui-for-media-stream", false))
			}
			b := startBrowser(t, opts...)
			if tc.deny {
				ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
				_, err := chromedp.CallBrowser(ctx, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
					Permission: &cdpbrowser.PermissionDescriptor{Name: "microphone"},
					Setting:    cdpbrowser.PermissionSettingDenied,
					Origin:     w.SignalingURL,
				})
				cancel()
				if err != nil {
					t.Fatalf("deny the microphone: %v", err)
				}
			}
			b.do("open the demo page", chromedp.Navigate(w.SignalingURL+"/"), chromedp.WaitVisible(chromedp.ID("call")))
			b.do("click Call", chromedp.Click(chromedp.ID("call")))
			b.waitJS("the call to fail", `(() => {
  const r = window.rtcedge;
  if (r.state === "failed") return "ok";
  if (r.state === "connected") return "the call connected";
  return "wait";
})()`, 15*time.Second)
			got := mustEval[struct {
				Code    string `json:"code"`
				Status  int    `json:"status"`
				Message string `json:"message"`
			}](b, `window.rtcedge.lastError`)
			if got.Code != tc.code || got.Status != tc.status || !strings.Contains(got.Message, tc.contains) {
				t.Errorf("lastError = %+v, want code %q, status %d, message with %q", got, tc.code, tc.status, tc.contains)
			}
			shown := mustEval[string](b, `document.getElementById("error").hidden ? "" : document.getElementById("error").innerText`)
			if !strings.Contains(shown, got.Message) || !strings.Contains(shown, tc.code) {
				t.Errorf("error box shows %q, want the message and the code %q", shown, tc.code)
			}
			if disabled := mustEval[bool](b, `document.getElementById("call").disabled`); disabled {
				t.Errorf("Call stays disabled after a failure")
			}
		})
	}
}

// TestBrowserOpenAISnippet runs OpenAI's documented browser snippet for the
// Realtime API over WebRTC against the dev world, changing only the base
// URL. The page comes from another origin (an app server that mints the
// ephemeral key, as the docs describe), so the API is reached through CORS.
// The snippet does not wait for ICE gathering: its offer has no candidates,
// and the ICE-lite server learns the client's address from its checks.
func TestBrowserOpenAISnippet(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	app := httptest.NewServer(snippetApp(t, w.SignalingURL))
	t.Cleanup(app.Close)
	b := startBrowser(t)

	b.do("open the snippet page", chromedp.Navigate(app.URL+"/"))
	b.waitJS("the snippet to finish", `window.snippetResult === undefined ? "wait" : window.snippetResult`, 20*time.Second)

	info := mustEval[snippetInfo](b, `window.snippet.info`)
	if info.Status != http.StatusCreated || !strings.HasPrefix(info.Location, "/v1/realtime/calls/") { // OpenAI's call URL
		t.Fatalf("POST /v1/realtime/calls answered %d with Location %q (CORS must expose Location)", info.Status, info.Location)
	}
	if info.Candidates {
		t.Errorf("the snippet's offer carries candidates; this test is meant to cover an offer without any")
	}
	if want := expectedPlacement(t, w).Name; info.Region != want {
		t.Errorf("X-Rtcedge-Region through CORS = %q, want %q", info.Region, want)
	}

	b.waitJS("the snippet's call to connect", `(() => {
  const s = window.snippet.pc.connectionState;
  if (s === "connected") return "ok";
  if (s === "failed" || s === "closed") return "connection " + s;
  return "wait";
})()`, 20*time.Second)
	st := b.waitAudio("window.snippet.pc", 50, 15*time.Second)
	t.Logf("snippet call: %v packets echoed, totalAudioEnergy %.4f, Chromium's ICE RTT current %.1f ms, mean %.2f ms, via %s",
		st.PacketsReceived, st.TotalAudioEnergy, st.RTT*1000, st.MeanRTT*1000, st.Remote)

	// End the session the way a page would: DELETE the Location (through
	// CORS), with the peer connection left open so that we see the server
	// stop sending.
	status := mustEval[int](b, `fetch(window.snippet.baseUrl + window.snippet.info.location,
  {method: "DELETE", headers: {Authorization: "Bearer " + window.snippet.key}}).then((r) => r.status)`)
	if status != http.StatusNoContent {
		t.Fatalf("DELETE %s answered %d, want 204", info.Location, status)
	}
	eventually(t, 5*time.Second, "the session to end by DELETE", func() bool {
		return metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", map[string]string{"reason": "deleted"}) == 1
	})
	final := b.waitAudioStops("window.snippet.pc", 5*time.Second)
	t.Logf("after DELETE packetsReceived stays at %v with the peer connection still open", final)
	mustEval[chromedp.Void](b, `window.snippet.pc.close()`)
}

// snippetInfo is what the snippet page saw of the API's answer.
type snippetInfo struct {
	Status     int    `json:"status"`
	Location   string `json:"location"`
	Region     string `json:"region"`
	Candidates bool   `json:"offerHasCandidates"`
}

// snippetPage is OpenAI's documented browser code for the Realtime API over
// WebRTC, verbatim except for baseUrl, followed by hooks for the test.
var snippetPage = template.Must(template.New("snippet").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>OpenAI WebRTC snippet</title><link rel="icon" href="data:,"></head>
<body>
<script>
const baseUrl = {{.}};

async function init() {
  // Get a session token for OpenAI Realtime API
  const tokenResponse = await fetch("/token");
  const data = await tokenResponse.json();
  const EPHEMERAL_KEY = data.value;

  // Create a peer connection
  const pc = new RTCPeerConnection();

  // Set up to play remote audio from the model
  const audioEl = document.createElement("audio");
  audioEl.autoplay = true;
  pc.ontrack = e => audioEl.srcObject = e.streams[0];

  // Add local audio track for microphone input in the browser
  const ms = await navigator.mediaDevices.getUserMedia({
    audio: true
  });
  pc.addTrack(ms.getTracks()[0]);

  // Set up data channel for sending and receiving events
  const dc = pc.createDataChannel("oai-events");

  // Start the session using the Session Description Protocol (SDP)
  const offer = await pc.createOffer();
  await pc.setLocalDescription(offer);

  const sdpResponse = await fetch(` + "`${baseUrl}/v1/realtime/calls`" + `, {
    method: "POST",
    body: offer.sdp,
    headers: {
      Authorization: ` + "`Bearer ${EPHEMERAL_KEY}`" + `,
      "Content-Type": "application/sdp",
    },
  });

  const answer = {
    type: "answer",
    sdp: await sdpResponse.text(),
  };
  await pc.setRemoteDescription(answer);

  // Test hooks, not part of the snippet.
  window.snippet = {pc, dc, key: EPHEMERAL_KEY, baseUrl, info: {
    status: sdpResponse.status,
    location: sdpResponse.headers.get("Location"),
    region: sdpResponse.headers.get("X-Rtcedge-Region"),
    offerHasCandidates: offer.sdp.includes("a=candidate"),
  }};
}

init().then(() => { window.snippetResult = "ok"; }, (e) => { window.snippetResult = "snippet failed: " + e; });
</script>
</body></html>
`))

// snippetApp is the app server of OpenAI's browser example: it serves the
// page and mints an ephemeral key server-side at GET /token.
func snippetApp(t *testing.T, signalingURL string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := snippetPage.Execute(w, signalingURL); err != nil {
			t.Errorf("render snippet page: %v", err)
		}
	})
	mux.HandleFunc("GET /token", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, signalingURL+"/v1/realtime/client_secrets",
			strings.NewReader(`{"expires_after":{"anchor":"created_at","seconds":600}}`))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req.Header.Set("Content-Type", "application/json")
		// No proxy and no idle connection left behind after the test.
		client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, "mint client secret: "+err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil || resp.StatusCode != http.StatusOK || !json.Valid(body) {
			http.Error(w, "mint client secret: status "+resp.Status, http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	return mux
}

// screenshot waits until the live charts have some history, then writes a
// PNG of the whole page to path.
func screenshot(t *testing.T, b *browser, path string) {
	t.Helper()
	b.waitJS("30 s of stats", `(window.rtcedge.stats && window.rtcedge.stats.packetsReceived > 1500) ? "ok" : "wait"`, 45*time.Second)
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("write screenshot: %v", err)
	}
	t.Logf("wrote %s (%d bytes)", path, len(png))
}
