package e2e

// Chromium through the fast path: the demo page on the client host of the
// fast path's site (fastpath_net_linux_test.go).

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserCallWithFastPath: Chromium on the client host, behind its
// NAT, calls through global relay → cluster relay → pod with fast_path tc
// on both relays: the demo page connects and its beep comes back, the
// relays' kernels forward the call's media both ways, and after the global
// relay is killed and restarted the audio goes on, forwarded by the new
// process's programs.
func TestBrowserCallWithFastPath(t *testing.T) {
	s := newSite(t, "tc")
	s.rebind(clientAddr)
	ip := requireTool(t, "ip", "iproute2")
	url := fmt.Sprintf("http://%s:8080", sigAddr)
	b := startBrowser(t,
		chromedp.ModifyCmdFunc(func(cmd *exec.Cmd) {
			cmd.Args = append([]string{ip, "netns", "exec", s.client.Name(), cmd.Path}, cmd.Args[1:]...)
			cmd.Path = ip
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		}),
		chromedp.Flag("host-resolver-rules", fmt.Sprintf("MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE %s, EXCLUDE %s", sigAddr, grAddr)),
		chromedp.Flag("unsafely-treat-insecure-origin-as-secure", url))
	b.do("open the demo page", chromedp.Navigate(url+"/"), chromedp.WaitVisible(chromedp.ID("call")))
	b.do("click Call", chromedp.Click(chromedp.ID("call")))
	b.waitJS("the call to connect", `window.rtcedge.state === "connected" ? "ok" : (window.rtcedge.state === "failed" ? "failed" : "wait")`, 30*time.Second)
	st := b.waitAudio("window.rtcedge.pc", 100, 20*time.Second)
	s.checkKernel("the browser's call", s.kernel())

	s.restartGR()
	st = b.waitAudio("window.rtcedge.pc", st.PacketsReceived+100, 20*time.Second)
	s.checkKernel("after the global relay restart", s.kernel())
	if st.ConnectionState != "connected" {
		t.Errorf("the page's connection is %q after the restart", st.ConnectionState)
	}
	if v := s.metric(podAddr, "rtcedge_transceiver_sessions_created_total"); v != 1 {
		t.Errorf("%v sessions created, want the call's one", v)
	}
}
