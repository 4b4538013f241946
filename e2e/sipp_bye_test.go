package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
)

// TestSIPpByeFromPod: SIPp (Debian's sip-tester) calls the dev world,
// acknowledges the answer and sends no RTP; the pod ends the call on its
// RTP timeout and the front sends SIPp the BYE it waits for
// (testdata/bye-from-pod.xml: SIPp fails the call on no BYE within 20 s).
// Nothing is left: no session, no dialog, no RTP registration or route at
// the pod, no goroutine (TestMain's leak check).
func TestSIPpByeFromPod(t *testing.T) {
	sipp, err := exec.LookPath("sipp")
	if err != nil {
		t.Fatal("sipp is missing: install Debian's sip-tester (scripts/test-deps.sh does)")
	}
	scenario, err := filepath.Abs(filepath.Join("testdata", "bye-from-pod.xml"))
	if err != nil {
		t.Fatal(err)
	}
	w := startWorld(t, devworld.Config{SIPAddr: "127.0.0.1:0", PodsPerCluster: 1, RelaysPerCluster: 1, RTPTimeout: time.Second})
	target := strings.TrimPrefix(w.SIPURI, "sip:agent@")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	// One call: SIPp's calls all offer the same media address, which a pod
	// takes for one call at a time.
	cmd := exec.CommandContext(ctx, sipp, "-sf", scenario, "-t", "u1", "-i", "127.0.0.1", "-p", "0",
		"-m", "1", "-timeout", "40s", "-timeout_error", "-nostdin", target)
	cmd.Dir = t.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sipp: %v\n%s", err, tailOf(out))
	}
	t.Logf("SIPp got the BYE %v after its INVITE (RTP timeout 1 s)", time.Since(began).Round(time.Millisecond))
	if n := metricSum(t, w.Registry, "rtcedge_sipfront_pod_hangups_total", map[string]string{"reason": "rtp_timeout"}); n != 1 {
		t.Errorf("pod hangups (rtp_timeout) counted %v, want 1", n)
	}
	eventually(t, 10*time.Second, "nothing left of the call", func() bool {
		for _, rg := range w.Regions {
			for _, p := range rg.Pods {
				if routes, registered := p.Transceiver.PacketState(); routes != 0 || registered != 0 {
					return false
				}
			}
		}
		return w.Sessions() == 0 && w.SIP.Front().Dialogs() == 0
	})
}

// tailOf is the end of a command's output, for a failure message.
func tailOf(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
