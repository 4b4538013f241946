package probe_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/netsim"
	"github.com/rtcedge/rtcedge/probe"
)

// TestSignalingThroughDelayLink puts a TCP delay link with 10 ms each way
// in front of signaling: the probe's signaling time then includes one
// delayed round trip (the link's connection set-up is local, so only the
// request and the answer are delayed). The media path is not delayed: the
// client reaches the POP VIP from the answer directly.
func TestSignalingThroughDelayLink(t *testing.T) {
	const oneWay = 10 * time.Millisecond
	w := startWorld(t, devworld.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	link, err := netsim.NewTCPLink(ln, strings.TrimPrefix(w.SignalingURL, "http://"),
		netsim.LinkConfig{Delay: oneWay}, netsim.LinkConfig{Delay: oneWay}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	linkCtx, stopLink := context.WithCancel(ctx)
	linkDone := make(chan error, 1)
	go func() { linkDone <- link.Run(linkCtx) }()
	defer func() {
		stopLink()
		if err := <-linkDone; err != nil {
			t.Errorf("link: %v", err)
		}
	}()

	direct, err := probe.Once(ctx, callConfig(t, w.SignalingURL), 200*time.Millisecond)
	if err != nil {
		t.Fatalf("direct call: %v", err)
	}
	delayed, err := probe.Once(ctx, callConfig(t, "http://"+link.Addr().String()), 200*time.Millisecond)
	if err != nil {
		t.Fatalf("call through the link: %v", err)
	}
	t.Logf("signaling direct %.1f ms, through 2 × %v link %.1f ms; first echo %.1f ms vs %.1f ms",
		direct.SignalingMs, oneWay, delayed.SignalingMs, direct.FirstEchoMs, delayed.FirstEchoMs)
	if rtt := float64(2 * oneWay / time.Millisecond); delayed.SignalingMs < rtt {
		t.Errorf("signaling took %.1f ms through the link, less than its round trip of %.0f ms", delayed.SignalingMs, rtt)
	}
	if st := link.Stats(); st.UpBytes == 0 || st.DownBytes == 0 {
		t.Errorf("link stats %+v: the probe did not go through it", st)
	}
}
