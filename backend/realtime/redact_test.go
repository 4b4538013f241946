package realtime

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend"
)

func TestRedactURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"wss://api.example.com/v1/realtime?model=gpt-realtime", "wss://api.example.com/v1/realtime?model=gpt-realtime"},
		{"wss://x.example.com/openai/realtime?api-version=2025&deployment=d&api-key=SECRET1", "wss://x.example.com/openai/realtime?api-key=REDACTED&api-version=REDACTED&deployment=REDACTED"},
		{"ws://user:SECRET2@host:9/v1?model=m&token=SECRET3#frag", "ws://REDACTED@host:9/v1?model=m&token=REDACTED"},
		{"ws://host/%zz?api-key=SECRET4", "<unparseable URL>"},
	} {
		if got := RedactURL(c.in); got != c.want {
			t.Errorf("RedactURL(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}

// TestBackendURLRedacted: a key in the backend URL's query reaches no
// error and no log line: not the dial error (net/http quotes the URL it
// failed on), not the config's.
func TestBackendURLRedacted(t *testing.T) {
	const secret = "sk-SECRET-in-the-query"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the dial fails
	var logs bytes.Buffer
	b, err := New(Config{URL: "ws://" + addr + "/v1/realtime?model=m&api-key=" + secret, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Open(context.Background(), backend.SessionInfo{ID: "rtc_r"}, nopSink{})
	if err == nil {
		t.Fatal("the dial to a closed port succeeded")
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(logs.String(), secret) {
		t.Errorf("the key leaked: error %q, logs %q", err, logs.String())
	}
	if !strings.Contains(err.Error(), addr) {
		t.Errorf("the error %q no longer says where it dialled", err)
	}
	cfg := Config{URL: "ws://host/%zz?api-key=" + secret}
	if err := cfg.Validate(); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("config error %v", err)
	}
}

type nopSink struct{}

func (nopSink) WriteAudio([]byte, time.Duration) error { return nil }
func (nopSink) SendEvent([]byte) error                 { return nil }
