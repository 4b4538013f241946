// Package reftest is what the tests of the Realtime backend share: a
// reference server on a loopback port for the length of a test, and the
// decoding of the Opus frames a caller received.
package reftest

import (
	"context"
	"net"
	"testing"

	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// Start runs a reference server with cfg on 127.0.0.1:0 until the test
// ends; a Run error then fails the test. Its sessions record 10 minutes
// of input unless cfg.RecordMs says otherwise.
func Start(tb testing.TB, cfg refserver.Config) *refserver.Server {
	tb.Helper()
	if cfg.RecordMs == 0 {
		cfg.RecordMs = 600000 // what the tests compare
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := refserver.New(cfg, ln)
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(context.Background()) }()
	tb.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; err != nil {
			tb.Errorf("reference server: %v", err)
		}
	})
	return srv
}

// DecodeOpus decodes a stream of Opus frames to PCM16 at rate.
func DecodeOpus(tb testing.TB, frames [][]byte, rate int) []int16 {
	tb.Helper()
	dec, err := opus.NewDecoder(rate)
	if err != nil {
		tb.Fatal(err)
	}
	defer dec.Close()
	var out []int16
	buf := make([]int16, rate*120/1000)
	for _, p := range frames {
		n, err := dec.Decode(p, buf)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, buf[:n]...)
	}
	return out
}
