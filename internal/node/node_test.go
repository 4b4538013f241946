package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/internal/udpio"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWildcardAdvertiseRefused(t *testing.T) {
	if _, _, err := DataSocket(nil, "0.0.0.0:0", "", slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a data socket on 0.0.0.0 without data_advertise was accepted")
	}
	c, ap, err := DataSocket(nil, "0.0.0.0:0", "127.0.0.1:7000", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if ap.String() != "127.0.0.1:7000" {
		t.Errorf("advertised %v", ap)
	}
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := AdvertisedURL(ln, ""); err == nil {
		t.Error("an API on 0.0.0.0 without api_advertise was accepted")
	}
	if u, err := AdvertisedURL(ln, "api.example.internal:8081"); err != nil || u != "http://api.example.internal:8081" {
		t.Errorf("advertise by name: %q, %v", u, err)
	}
}

// TestLifeOrder: Run starts every goroutine, drains on ctx, then stops the
// loops before the closers run, newest closer first; a second Run fails.
func TestLifeOrder(t *testing.T) {
	var l Life
	var order []string
	started := make(chan struct{}, 2)
	for _, name := range []string{"a", "b"} {
		l.Go(name, func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done()
			return nil
		})
	}
	l.OnClose(func() error { order = append(order, "close 1"); return nil })
	l.OnClose(func() error { order = append(order, "close 2"); return nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- l.Run(ctx, discard(), func(context.Context) { order = append(order, "drain") })
	}()
	<-started
	<-started
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ","); got != "drain,close 2,close 1" {
		t.Errorf("order %s", got)
	}
	if err := l.Run(context.Background(), discard(), nil); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Error(err)
	}
}

// TestLifeFailureStops: a failing goroutine skips the drain, stops the
// others, and its error is Run's.
func TestLifeFailureStops(t *testing.T) {
	var l Life
	boom := errors.New("boom")
	l.Go("other", func(ctx context.Context) error { <-ctx.Done(); return nil })
	l.Go("failing", func(context.Context) error { return boom })
	drained := false
	err := l.Run(context.Background(), discard(), func(context.Context) { drained = true })
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "failing") {
		t.Fatalf("Run = %v", err)
	}
	if drained {
		t.Error("drained after a failure")
	}
}

// TestLifeCloseStopsRun: Close during Run makes Run return without a drain,
// and the health server answers until then.
func TestLifeCloseStopsRun(t *testing.T) {
	var l Life
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	l.ServeHealth(ln, Env{Logger: discard()}, func() error {
		if !ready.Load() {
			return errors.New("still joining")
		}
		return nil
	})
	done := make(chan error, 1)
	drained := false
	go func() { done <- l.Run(context.Background(), discard(), func(context.Context) { drained = true }) }()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	get := func() (int, string) {
		resp, err := client.Get("http://" + ln.Addr().String() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "still joining") {
		t.Errorf("not ready: %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := get(); code != http.StatusOK {
		t.Errorf("ready: %d", code)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if drained || !l.Closed() {
		t.Errorf("drained %v, closed %v", drained, l.Closed())
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestWarnSmallBuffer: a socket whose receive buffer the kernel capped
// below udpio.SocketBuffer (net.core.rmem_max too small on the node) is
// found; one on loopback (the dev world, tests) is not reported.
func TestWarnSmallBuffer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the granted buffer is read on Linux only")
	}
	c, err := udpio.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A small buffer, as a node with the default rmem_max (about 200 KiB)
	// grants.
	if err := c.SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if got, capped := bufferCapped(c); !capped || got != 64<<10 {
		t.Errorf("a 64 KiB receive buffer: granted %d, capped %v", got, capped)
	}
	var logged strings.Builder
	if WarnSmallBuffer(slog.New(slog.NewTextHandler(&logged, nil)), c) || logged.Len() != 0 {
		t.Errorf("a loopback socket was reported: %q", logged.String())
	}
	if err := c.SetReadBuffer(udpio.SocketBuffer); err != nil {
		t.Fatal(err)
	}
	if got, capped := bufferCapped(c); capped && got == 64<<10 {
		t.Error("the buffer did not grow at all")
	}
}
