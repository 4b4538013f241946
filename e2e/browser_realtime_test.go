package e2e

import (
	"context"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/internal/audiotest"
)

// TestBrowserRealtimeCall drives the demo page in real Chromium against
// pods behind the Realtime connector and the reference server, through
// both relay tiers: the server hears the fake microphone (its beep's
// frequency), the page shows the server's events (session.created first)
// and which backend it talks to, and it hears the parrot reply of what it
// sent (manual commit and response.create from the page's event box, since
// the beep is too short for the server's VAD).
func TestBrowserRealtimeCall(t *testing.T) {
	w, srv := realtimeWorld(t, false)
	b := startBrowser(t)
	b.do("open the demo page", chromedp.Navigate(w.SignalingURL+"/"), chromedp.WaitVisible(chromedp.ID("call")))
	b.do("click Call", chromedp.Click(chromedp.ID("call")))
	b.waitJS("the call to connect", `(() => {
  const r = window.rtcedge;
  if (r.state === "connected") return "ok";
  if (r.state === "failed") return "the page reports: " + JSON.stringify(r.lastError);
  return "wait";
})()`, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := srv.NextSession(ctx)
	if err != nil {
		t.Fatalf("the reference server got no session: %v", err)
	}
	b.waitJS("session.created on the data channel", `window.rtcedge.events.some((e) => e.dir === "in" && e.type === "session.created") ? "ok" : "wait"`, 10*time.Second)
	b.waitJS("the page to name the backend", `document.getElementById("backend").textContent === "OpenAI Realtime · ref" ? "ok" : "wait"`, 5*time.Second)

	// The server hears the fake microphone: 3 s of it.
	const rate = 24000
	var heard []int16
	if err := sess.Wait(ctx, func(s *refserver.State) bool {
		heard = slices.Clone(s.Input)
		return s.InputSamples >= 3*rate
	}); err != nil {
		t.Fatalf("server heard %d samples of the microphone: %v", len(heard), err)
	}
	hz := audiotest.DominantFrequency(heard, rate)
	t.Logf("server heard %d ms of the fake microphone, voiced %d ms, dominant %.1f Hz, RMS %.4f",
		len(heard)*1000/rate, voicedMs(heard, rate), hz, audiotest.RMS(heard))
	if math.Abs(hz-beepHz) > 0.05*beepHz {
		t.Errorf("server heard dominant %.1f Hz, the fake microphone beeps at %d Hz", hz, beepHz)
	}

	// Commit what the server heard and ask for a reply: the parrot plays
	// it back, and the page receives audio with energy.
	before := mustEval[audioStats](b, statsJS("window.rtcedge.pc"))
	for _, ev := range []string{`{"type":"input_audio_buffer.commit"}`, `{"type":"response.create"}`} {
		b.do("send "+ev, chromedp.SetValue(chromedp.ID("event-text"), ev), chromedp.Click(chromedp.ID("send")))
	}
	b.waitJS("the reply's events", `(() => {
  const types = window.rtcedge.events.filter((e) => e.dir === "in").map((e) => e.type);
  if (types.includes("error")) return "the server sent an error: " + JSON.stringify(window.rtcedge.events.filter((e) => e.type === "error"));
  return ["input_audio_buffer.committed", "response.created", "output_audio_buffer.started", "response.done", "output_audio_buffer.stopped"].every((t) => types.includes(t)) ? "ok" : "wait";
})()`, 20*time.Second)
	st := b.waitAudio("window.rtcedge.pc", before.PacketsReceived+100, 10*time.Second)
	t.Logf("page: %v packets received (%v before the reply), totalAudioEnergy %.4f", st.PacketsReceived, before.PacketsReceived, st.TotalAudioEnergy)
	if st.TotalAudioEnergy <= before.TotalAudioEnergy {
		t.Errorf("the reply brought no audio energy: %.4f before, %.4f after", before.TotalAudioEnergy, st.TotalAudioEnergy)
	}
	var resp refserver.Response
	_ = sess.Wait(ctx, func(s *refserver.State) bool { resp = s.Responses[len(s.Responses)-1]; return true })
	if got := st.PacketsReceived - before.PacketsReceived; got < float64(resp.Samples/(rate/50))*95/100 {
		t.Errorf("page received %v packets of a %d ms reply", got, resp.Samples*1000/rate)
	}
	if path := os.Getenv(screenshotEnv); path != "" {
		shot(t, b, path)
	}
	b.do("click Hang up", chromedp.Click(chromedp.ID("hangup")))
	b.waitJS("the page to end the call", `window.rtcedge.state === "ended" ? "ok" : "wait"`, 10*time.Second)
	if err := sess.Wait(ctx, func(s *refserver.State) bool { return s.Closed }); err != nil {
		t.Errorf("the connector kept the WebSocket after hang-up: %v", err)
	}
}

// beepHz is the frequency of Chromium's fake microphone
// (--use-fake-device-for-media-stream): a square wave beeping 20 ms in
// every 500 ms (media/audio/simple_sources.cc).
const beepHz = 400

// shot writes a PNG of the whole page to path.
func shot(t *testing.T, b *browser, path string) {
	t.Helper()
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
