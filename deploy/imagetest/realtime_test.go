package imagetest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/probe"
)

// TestRealtimeCallThroughImage runs `rtcedge dev -backend ref` from the
// image (the whole world in one container, its pods behind the Realtime
// connector and the reference server) and places a call: the offer
// succeeds only if the pod opened the connector's session, codecs included
// (a binary without libopus fails it), the server's session.created reaches
// the caller, and a response.create gets a reply the pod encodes and paces
// out between output_audio_buffer.started and stopped.
func TestRealtimeCallThroughImage(t *testing.T) {
	w := newWorld(t)
	dev := w.run("dev", "dev", "-http", "127.0.0.1:0", "-sip", "127.0.0.1:0", "-metrics", "", "-pop-port", "0", "-backend", "ref")
	var url string
	waitFor(t, 90*time.Second, "the dev world in the container to print its URL", func() bool {
		for _, l := range dev.Lines() {
			if _, u, ok := strings.Cut(l, "signaling + demo page: "); ok {
				url = strings.TrimSpace(u)
			}
		}
		return url != ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	call, err := probe.Dial(ctx, probe.Config{
		SignalingURL: url, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		IPFilter: func(ip net.IP) bool { return ip.IsLoopback() },
	})
	if err != nil {
		t.Fatalf("call through the connector in the image: %v", err)
	}
	defer call.Close()
	var seen []string
	await := func(typ string) {
		t.Helper()
		for !slices.Contains(seen, typ) {
			select {
			case msg := <-call.Events():
				var ev struct {
					Type string `json:"type"`
				}
				_ = json.Unmarshal(msg, &ev)
				seen = append(seen, ev.Type)
			case <-ctx.Done():
				t.Fatalf("no %s from the reference server; events %v", typ, seen)
			}
		}
	}
	await("session.created")
	if err := call.SendEvent([]byte(`{"type":"response.create"}`)); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"output_audio_buffer.started", "response.done", "output_audio_buffer.stopped"} {
		await(typ)
	}
	t.Logf("events through the image's connector: %v", seen)
	if err := call.Hangup(ctx); err != nil {
		t.Fatalf("hang up: %v", err)
	}
	dev.term(t)
	dev.Wait(t, 30*time.Second)
}
