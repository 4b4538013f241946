package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browserTimeout bounds everything one browser test does in Chromium.
const browserTimeout = 45 * time.Second

// chromiumPath finds Debian's chromium. Browser tests never skip: a missing
// browser is a broken test environment.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found in PATH: install chromium (apt-get install chromium, or make test-deps)")
	return ""
}

// browser is one headless Chromium with one tab, owned by one test.
type browser struct {
	t   *testing.T
	ctx context.Context // the tab; cancelled in the test's cleanup

	mu      sync.Mutex
	console []string // guarded by mu: the page's console, for failure reports
}

// startBrowser starts a headless Chromium that is quiet and offline: fake
// microphone, no permission prompts, loopback ICE candidates allowed, no
// name resolution except for loopback. extra options come last and can
// override these. The test's cleanup closes it, waits for its processes
// and removes its profile.
func startBrowser(t *testing.T, extra ...chromedp.ExecAllocatorOption) *browser {
	t.Helper()
	exe := chromiumPath(t)
	profile := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.UserDataDir(profile),
		chromedp.Headless,
		chromedp.NoSandbox, // the tests may run as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.WindowSize(1100, 1000),
		chromedp.Flag("use-fake-device-for-media-stream", true),
		chromedp.Flag("use-fake-ui-for-media-stream", true),
		// A host whose only interface is lo gathers no candidates without it.
		chromedp.Flag("allow-loopback-in-peer-connection", true),
		chromedp.Flag("autoplay-policy", "no-user-gesture-required"),
		chromedp.Flag("no-proxy-server", true),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-breakpad", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-features", "Translate,MediaRouter,OptimizationHints"),
		// A loaded machine must not throttle the page's timers.
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.Flag("use-mock-keychain", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(opts, extra...)...)
	tctx, cancelTab := chromedp.NewContext(actx)
	b := &browser{t: t, ctx: tctx}

	var wg sync.WaitGroup
	t.Cleanup(func() {
		// Close the browser gracefully, then make sure: the allocator's
		// cancel waits for the process; the console reader ends with it.
		cctx, cancel := context.WithTimeout(tctx, 10*time.Second)
		if err := chromedp.Cancel(cctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("closing chromium: %v", err)
		}
		cancel()
		cancelTab()
		cancelAlloc()
		wg.Wait()
		waitNoProcesses(t, profile)
	})
	t.Cleanup(func() {
		if t.Failed() {
			b.mu.Lock()
			defer b.mu.Unlock()
			t.Logf("browser console (%d lines):\n%s", len(b.console), strings.Join(b.console, "\n"))
		}
	})

	start := time.Now()
	if err := chromedp.Do(tctx); err != nil {
		t.Fatalf("start chromium (%s): %v", exe, err)
	}
	t.Logf("chromium started in %v", time.Since(start).Round(time.Millisecond))
	msgs := chromedp.Console(tctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for m, err := range msgs {
			if err != nil {
				return
			}
			b.mu.Lock()
			if len(b.console) < 200 {
				b.console = append(b.console, m.String())
			}
			b.mu.Unlock()
		}
	}()
	return b
}

// waitNoProcesses checks that no process still uses the profile directory:
// a Chromium child left behind would outlive the test and keep files in it.
func waitNoProcesses(t *testing.T, profile string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := processesWith(profile)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("chromium processes still running after close: %v", left)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processesWith lists the PIDs whose command line mentions s.
func processesWith(s string) []string {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []string
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, filepath.Base(filepath.Dir(d)))
		}
	}
	return pids
}

// do runs actions in the tab, failing the test on error.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression (awaiting a promise it returns)
// and decodes its JSON value into a T.
func eval[T any](b *browser, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
}

// mustEval is eval that fails the test on error.
func mustEval[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := eval[T](b, expr)
	if err != nil {
		b.t.Fatalf("evaluate %q: %v", expr, err)
	}
	return v
}

// waitJS polls a JavaScript expression every 100 ms until it returns "ok".
// "wait" keeps polling; any other string fails the test at once with that
// message (the page saw an error). It returns how long the wait took.
func (b *browser) waitJS(what, expr string, d time.Duration) time.Duration {
	b.t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	last := ""
	for {
		v, err := eval[string](b, expr)
		switch {
		case err != nil:
			last = err.Error()
		case v == "ok":
			return time.Since(start)
		case v != "wait":
			b.t.Fatalf("waiting for %s: %s", what, v)
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out after %v waiting for %s (last error: %s)", d, what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// audioStats is what a test reads of a peer connection's getStats().
type audioStats struct {
	ConnectionState  string  `json:"connectionState"`
	PacketsReceived  float64 `json:"packetsReceived"`
	PacketsSent      float64 `json:"packetsSent"`
	TotalAudioEnergy float64 `json:"totalAudioEnergy"`
	RTT              float64 `json:"rtt"`     // seconds, the latest; -1 when not known yet
	MeanRTT          float64 `json:"meanRtt"` // seconds, over all STUN responses; -1 when none
	Remote           string  `json:"remote"`
}

// statsJS returns an expression that reads audioStats from the
// RTCPeerConnection that pcExpr names.
func statsJS(pcExpr string) string {
	return fmt.Sprintf(`(async () => {
  const pc = %s;
  const o = {connectionState: pc.connectionState, packetsReceived: 0, packetsSent: 0, totalAudioEnergy: 0, rtt: -1, meanRtt: -1, remote: ""};
  const r = await pc.getStats();
  const byId = new Map();
  let selected = "";
  r.forEach((s) => { byId.set(s.id, s); if (s.type === "transport" && s.selectedCandidatePairId) selected = s.selectedCandidatePairId; });
  r.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      o.packetsReceived = s.packetsReceived || 0;
      o.totalAudioEnergy = s.totalAudioEnergy || 0;
    }
    if (s.type === "outbound-rtp" && s.kind === "audio") o.packetsSent = s.packetsSent || 0;
    // The transport's selected pair (the browser may receive on a pair
    // the server selected before its own nomination), else the nominated one.
    if (s.type === "candidate-pair" && (selected ? s.id === selected : s.nominated && s.state === "succeeded")) {
      if (s.currentRoundTripTime != null) o.rtt = s.currentRoundTripTime;
      if (s.responsesReceived > 0) o.meanRtt = s.totalRoundTripTime / s.responsesReceived;
      const rc = byId.get(s.remoteCandidateId);
      if (rc) o.remote = (rc.address || rc.ip) + ":" + rc.port;
    }
  });
  return o;
})()`, pcExpr)
}

// waitAudio polls getStats until packetsReceived exceeds n and the echoed
// audio has energy (the fake microphone's beep came back).
func (b *browser) waitAudio(pcExpr string, n float64, d time.Duration) audioStats {
	b.t.Helper()
	deadline := time.Now().Add(d)
	var st audioStats
	for {
		var err error
		st, err = eval[audioStats](b, statsJS(pcExpr))
		if err == nil && st.PacketsReceived > n && st.TotalAudioEnergy > 0 {
			return st
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out after %v waiting for echoed audio: last stats %+v (err %v)", d, st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitAudioStops polls getStats until packetsReceived has not grown for a
// whole second, and returns the final count.
func (b *browser) waitAudioStops(pcExpr string, d time.Duration) float64 {
	b.t.Helper()
	const quiet = time.Second
	deadline := time.Now().Add(d)
	last, since := -1.0, time.Now()
	for {
		st, err := eval[audioStats](b, statsJS(pcExpr))
		if err != nil {
			b.t.Fatalf("read stats: %v", err)
		}
		if st.PacketsReceived != last {
			last, since = st.PacketsReceived, time.Now()
		} else if time.Since(since) >= quiet {
			return last
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("packetsReceived still growing after %v (now %v)", d, st.PacketsReceived)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
