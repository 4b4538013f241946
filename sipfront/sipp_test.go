package sipfront_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/testmetrics"
	"github.com/rtcedge/rtcedge/sipfront"
)

// TestSIPp runs Debian's SIPp (sip-tester) against the front over UDP and
// TCP: out-of-dialog requests, a method it does not take, offers it
// cannot take and OPTIONS pings, each answered with its status
// (testdata/out-of-dialog.xml; SIPp fails a call on any other answer),
// counted by result, and no dialog or session left.
func TestSIPp(t *testing.T) {
	sipp, err := exec.LookPath("sipp")
	if err != nil {
		t.Fatal("sipp is missing: install Debian's sip-tester (scripts/test-deps.sh does)")
	}
	scenario, err := filepath.Abs(filepath.Join("testdata", "out-of-dialog.xml"))
	if err != nil {
		t.Fatal(err)
	}
	const calls = 500
	for _, tc := range []struct{ transport, flag string }{{"udp", "u1"}, {"tcp", "t1"}} {
		t.Run(tc.transport, func(t *testing.T) {
			w := newWorld(t, sipfront.Config{SourceRate: 100000, SourceBurst: 100000})
			target := w.udp
			if tc.transport == "tcp" {
				target = w.tcp
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, sipp, "-sf", scenario, "-t", tc.flag, "-i", "127.0.0.1", "-p", "0",
				"-m", strconv.Itoa(calls), "-r", "200", "-l", "50", "-timeout", "90s", "-timeout_error",
				"-recv_timeout", "10s", "-nostdin", target.String())
			cmd.Dir = t.TempDir()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("sipp: %v\n%s", err, tail(out))
			}
			for _, c := range []struct {
				method, result string
				want           float64
			}{
				{"BYE", "no_dialog", calls}, {"INVITE", "no_dialog", calls}, {"other", "not_allowed", calls},
				{"INVITE", "offer_codec", calls}, {"INVITE", "no_offer", calls}, {"OPTIONS", "ok", calls},
			} {
				if got := count(t, w, c.method, c.result); got != c.want {
					t.Errorf("%s %s counted %v, want %v", c.method, c.result, got, c.want)
				}
			}
			if t.Failed() {
				for k, v := range testmetrics.Take(t, w.reg) {
					if v != 0 && strings.HasPrefix(k, "rtcedge_sipfront_") {
						t.Logf("%s %v", k, v)
					}
				}
			}
			if n := w.front.Dialogs(); n != 0 {
				t.Fatalf("%d dialogs left", n)
			}
			if creates, _ := w.cluster.record(); len(creates) != 0 {
				t.Fatalf("%d creates reached the cluster", len(creates))
			}
		})
	}
}

// tail is the end of a command's output, for a failure message.
func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
