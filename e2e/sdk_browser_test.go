package e2e

// OpenAI's Agents SDK (@openai/agents-realtime) in real Chromium, on a page
// served from an origin other than signaling's, pointed at rtcedge by the
// transport's baseUrl alone.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/audiotest"
)

// sealedForAgents is what the app server seals into the browser's client
// secret: instructions and a tool of the same name as the agent's.
const sealedForAgents = `{"type":"realtime","instructions":"SEALED-INSTRUCTIONS",` +
	`"tools":[{"type":"function","name":"lookup","description":"SEALED-TOOL","parameters":{"type":"object","properties":{}}}]}`

// TestAgentsSDKCrossOrigin: an app built with the Agents SDK, bundled with
// esbuild and served on another origin, connects through rtcedge with a
// client secret its server minted: connect() succeeds (the CORS preflight
// lets the SDK's headers through), the model hears the fake microphone,
// the SDK's voice and turn detection take effect at the model while the
// sealed instructions and tool stay, and, with the sealed fields set to
// win, no error event fires although the SDK sends the agent's whole
// configuration. Then the app answers the model's call of its sealed tool
// over the sideband and the page hears the reply.
func TestAgentsSDKCrossOrigin(t *testing.T) {
	tools := sdk(t)
	dir := tools.workdir(t, "agent.js", "index.html")
	bundle := tools.bundle(t, dir, "agent.js")
	index, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	srv := startRefServer(t, refserver.Config{})
	w := startWorld(t, devworld.Config{APIKeys: []string{e2eAPIKey}, BackendURL: srv.URL() + "?model=ref",
		Signaling: sealedFieldsWin})
	page := servePage(t, index, bundle)
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	ek := mintSecretWith(t, &http.Client{Transport: tr}, w.SignalingURL, sealedForAgents)

	b := startBrowser(t)
	b.do("open the app on its own origin", chromedp.Navigate(page), chromedp.WaitReady("body"))
	b.waitJS("the bundle to load", `typeof window.startAgent === "function" ? "ok" : "wait"`, 10*time.Second)
	mustEval[string](b, fmt.Sprintf(`(window.startAgent({baseUrl: %q, secret: %q}), "started")`, w.SignalingURL+"/v1/realtime/calls", ek.Value))
	b.waitJS("connect()", `(() => {
  const s = window.agentTest;
  if (s.status === "connected") return "ok";
  if (s.status === "failed") return "connect() failed: " + s.error;
  return "wait";
})()`, 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := srv.NextSession(ctx)
	if err != nil {
		t.Fatalf("the reference server got no session: %v", err)
	}
	// The model hears the fake microphone.
	const rate = 24000
	var heard []int16
	if err := sess.Wait(ctx, func(s *refserver.State) bool {
		heard = append(heard[:0], s.Input...)
		return s.InputSamples >= rate
	}); err != nil {
		t.Fatalf("the model heard %d samples of the microphone: %v", len(heard), err)
	}
	if rms := audiotest.RMS(heard); rms == 0 {
		t.Errorf("the model heard silence from the fake microphone")
	}

	// The session at the model: the SDK's voice and turn detection, the
	// app's sealed instructions and tool.
	var cfg map[string]any
	cfgCtx, cancelCfg := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancelCfg()
	waitCfg := sess.Wait(cfgCtx, func(s *refserver.State) bool {
		cfg = s.Config
		voice, _ := lookupJSON(cfg, "audio", "output", "voice")
		td, _ := lookupJSON(cfg, "audio", "input", "turn_detection", "type")
		return voice == "verse" && td == "semantic_vad"
	})
	sealedCfg(t, cfg)
	if waitCfg != nil {
		v, _ := lookupJSON(cfg, "audio", "output", "voice")
		td, _ := lookupJSON(cfg, "audio", "input", "turn_detection", "type")
		t.Errorf("the SDK's voice and turn detection did not take effect: the model has voice %v, turn detection %v (%v)", v, td, waitCfg)
	}

	// No error event: the SDK's session.update (the agent's whole
	// configuration) and its tracing update are answered without one once
	// the page has its session.updated acknowledgements.
	b.waitJS("the SDK's session updates to be answered", `(() => {
  const s = window.agentTest;
  return s.errors.length > 0 || s.events.filter((e) => e.type === "session.updated").length >= 2 ? "ok" : "wait";
})()`, 15*time.Second)
	if errs := mustEval[[]string](b, `window.agentTest.errors`); len(errs) > 0 {
		t.Errorf("the session fired %d error events although sealed fields win: %v", len(errs), errs)
	}

	// The reply: the app answers its sealed tool over the sideband, as
	// tools the app sealed are answered (the Agents SDK in the page sees
	// the model's call too and, not owning the tool, reports it: its own
	// behaviour, as against OpenAI), and the page hears the model.
	callID := mustEval[string](b, `window.agentTest.transport.connectionState.callId || ""`)
	sb, status, body := attachSideband(ctx, t, w.SignalingURL, callID, e2eAPIKey)
	if sb == nil {
		t.Fatalf("the app's sideband to call %q: %d %s", callID, status, body)
	}
	pc := "window.agentTest.transport.connectionState.peerConnection"
	before := mustEval[audioStats](b, statsJS(pc))
	sb.send(t, map[string]any{"type": "response.create"})
	var call map[string]any
	sb.await(t, 20*time.Second, "the model's call of the sealed tool", func(evs [][]byte, _ error) bool {
		call = findEvent(evs, "response.function_call_arguments.done")
		return call != nil
	})
	sb.send(t, map[string]any{"type": "conversation.item.create", "item": map[string]any{
		"type": "function_call_output", "call_id": call["call_id"], "output": `{"seats":4}`}})
	sb.send(t, map[string]any{"type": "response.create"})
	st := b.waitAudio(pc, before.PacketsReceived+25, 20*time.Second) // a reply of a second or more
	t.Logf("page: %v packets received (%v before the reply), totalAudioEnergy %.4f", st.PacketsReceived, before.PacketsReceived, st.TotalAudioEnergy)
	if st.TotalAudioEnergy <= before.TotalAudioEnergy {
		t.Errorf("the reply brought no audio energy: %.4f before, %.4f after", before.TotalAudioEnergy, st.TotalAudioEnergy)
	}
	mustEval[string](b, `(window.agentTest.session.close(), "closed")`)
}

// sealedCfg checks that the model kept the sealed instructions and tool.
func sealedCfg(t *testing.T, cfg map[string]any) {
	t.Helper()
	if cfg["instructions"] != "SEALED-INSTRUCTIONS" {
		t.Errorf("the model's instructions are %q, want the sealed ones", cfg["instructions"])
	}
	tools, _ := cfg["tools"].([]any)
	if len(tools) != 1 {
		t.Errorf("the model has tools %v, want the sealed one", cfg["tools"])
		return
	}
	if tool, _ := tools[0].(map[string]any); tool["description"] != "SEALED-TOOL" {
		t.Errorf("the model's tool is %v, want the sealed one", tools[0])
	}
}

// lookupJSON walks a decoded JSON object along path.
func lookupJSON(m map[string]any, path ...string) (any, bool) {
	var v any = m
	for _, k := range path {
		o, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = o[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// servePage serves the app (index.html and its bundle) on a loopback
// port of its own: an origin other than signaling's.
func servePage(t *testing.T, index, bundle []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(index)
	})
	mux.HandleFunc("GET /bundle.js", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		_, _ = w.Write(bundle)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("page server: %v", err)
		}
	})
	return "http://" + ln.Addr().String() + "/"
}
