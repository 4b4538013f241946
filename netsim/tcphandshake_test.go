package netsim_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/netsim"
)

// TestTCPLinkWithHandshake: through a handshake link with d each way, a
// client that writes right after its connect returns gets its first byte
// echoed no sooner than two round trips after the connect (handshake, then
// data), and the target accepts no sooner than one round trip after it; a
// plain link charges one round trip. Lower bounds only: delays never
// shrink, however loaded the machine.
func TestTCPLinkWithHandshake(t *testing.T) {
	const d = 40 * time.Millisecond
	rtt := 2 * d
	for _, tc := range []struct {
		name               string
		handshake          bool
		minAccept, minEcho time.Duration
	}{
		{"plain", false, 0, rtt},
		{"handshake", true, rtt, 2 * rtt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, accepted := startAcceptRecorder(t)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			newLink := netsim.NewTCPLink
			if tc.handshake {
				newLink = netsim.NewTCPLinkWithHandshake
			}
			cfg := netsim.LinkConfig{Delay: d}
			l, err := newLink(ln, target, cfg, cfg, testLogger())
			if err != nil {
				t.Fatal(err)
			}
			runLink(t, l)

			start := time.Now()
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte{42}); err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != 42 {
				t.Fatalf("echo: %v %v", b, err)
			}
			echo := time.Since(start)
			at := <-accepted
			t.Logf("target accepted after %v, first byte echoed after %v", at.Sub(start).Round(time.Millisecond), echo.Round(time.Millisecond))
			if got := at.Sub(start); got < tc.minAccept {
				t.Errorf("target accepted %v after the connect, want ≥ %v", got, tc.minAccept)
			}
			if echo < tc.minEcho {
				t.Errorf("first byte echoed %v after the connect, want ≥ %v", echo, tc.minEcho)
			}
		})
	}
}

// TestTCPLinkWithHandshakeClosesWhileHolding: a link closed while a
// connection's handshake is still being held returns from Run at once and
// leaves nothing behind (goleak); the target never sees the connection.
func TestTCPLinkWithHandshakeClosesWhileHolding(t *testing.T) {
	target, accepted := startAcceptRecorder(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := netsim.LinkConfig{Delay: time.Hour}
	l, err := netsim.NewTCPLinkWithHandshake(ln, target, cfg, cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for l.Stats().Accepted == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel while a handshake was held")
	}
	select {
	case <-accepted:
		t.Fatal("the target saw a connection whose handshake never completed")
	default:
	}
}

// startAcceptRecorder runs an echo server that reports when it accepted
// each connection.
func startAcceptRecorder(t *testing.T) (string, <-chan time.Time) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	at := make(chan time.Time, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			at <- time.Now()
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), at
}

// runLink runs l until the test ends; it must then return nil.
func runLink(t testing.TB, l interface{ Run(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("link run: %v", err)
		}
	})
}
