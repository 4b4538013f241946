package netsim_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/netsim"
)

// startTCPEcho runs a TCP server that echoes each connection until the
// client half-closes, then half-closes back.
func startTCPEcho(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

func startTCPLink(t testing.TB, target string, up, down netsim.LinkConfig) *netsim.TCPLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := netsim.NewTCPLink(ln, target, up, down, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	runLink(t, l)
	return l
}

// TestTCPLink sends data through the link to an echo server and back:
// the round trip takes at least both delays, the bytes come back intact
// and in order even with jitter, and half-closes pass through.
func TestTCPLink(t *testing.T) {
	tests := []struct {
		name     string
		up, down netsim.LinkConfig
		size     int
	}{
		{"no delay", netsim.LinkConfig{}, netsim.LinkConfig{}, 1 << 20},
		{"10ms each way", netsim.LinkConfig{Delay: 10 * time.Millisecond}, netsim.LinkConfig{Delay: 10 * time.Millisecond}, 64},
		{"jitter keeps order", netsim.LinkConfig{Delay: 5 * time.Millisecond, Jitter: 5 * time.Millisecond, Seed: 3},
			netsim.LinkConfig{Delay: 5 * time.Millisecond, Jitter: 5 * time.Millisecond, Seed: 4}, 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := startTCPLink(t, startTCPEcho(t), tt.up, tt.down)
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))

			// A one-byte round trip first, for the delay.
			start := time.Now()
			if _, err := c.Write([]byte{'x'}); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
			rtt := time.Since(start)
			t.Logf("round trip through %v up, %v down: %v", tt.up.Delay, tt.down.Delay, rtt)
			if floor := tt.up.Delay + tt.down.Delay - tt.up.Jitter - tt.down.Jitter; rtt < floor {
				t.Errorf("round trip %v shorter than the configured %v", rtt, floor)
			}

			data := make([]byte, tt.size)
			_, _ = rand.Read(data)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Write(data); err != nil {
					t.Errorf("write: %v", err)
				}
				_ = c.(*net.TCPConn).CloseWrite()
			}()
			got, err := io.ReadAll(c)
			wg.Wait()
			if err != nil {
				t.Fatalf("read back: %v", err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("got %d bytes back, want the %d sent, in order", len(got), len(data))
			}
			st := l.Stats()
			if st.Accepted != 1 || st.UpBytes != uint64(tt.size+1) || st.DownBytes != uint64(tt.size+1) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestTCPLinkPartition holds bytes while partitioned and delivers them once
// healed.
func TestTCPLinkPartition(t *testing.T) {
	l := startTCPLink(t, startTCPEcho(t), netsim.LinkConfig{}, netsim.LinkConfig{})
	l.SetPartitioned(true)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the link to accept", func() bool { return l.Stats().Accepted == 1 })
	// Nothing may come back while cut; a short deadline shows it.
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); err == nil {
		t.Fatalf("read %d bytes through a partitioned link", n)
	}
	if st := l.Stats(); st.UpBytes != 0 {
		t.Fatalf("delivered while partitioned: %+v", st)
	}
	l.SetPartitioned(false)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("after healing read %q, %v", buf, err)
	}
}

// TestTCPLinkCloseWithOpenConns closes proxied connections on shutdown.
func TestTCPLinkCloseWithOpenConns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := netsim.NewTCPLink(ln, startTCPEcho(t), netsim.LinkConfig{Delay: time.Hour}, netsim.LinkConfig{}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(context.Background()) }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("held for an hour")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the upstream connection", func() bool { return l.Stats().Open == 2 })
	l.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("client connection still open after Close")
	}
}
