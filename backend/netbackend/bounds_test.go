package netbackend

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/heaptest"
)

// markSink counts the events a call gets and closes done on the marker.
type markSink struct {
	n    atomic.Int64
	done chan struct{}
}

func (s *markSink) WriteAudio([]byte, time.Duration) error { return nil }
func (s *markSink) SendEvent(b []byte) error {
	s.n.Add(1)
	if strings.Contains(string(b), "marker") {
		close(s.done)
	}
	return nil
}

// TestBigFramesReleased: a backend that sends frames of the largest size
// leaves its calls holding no more than quiet ones once they are handled.
func TestBigFramesReleased(t *testing.T) {
	const calls = 6
	big := []byte(`{"type":"x","pad":"` + strings.Repeat("x", MaxPayload-100) + `"}`)
	script := func(frames int) func(context.Context, *Conn) {
		return func(ctx context.Context, c *Conn) {
			for range frames {
				if c.WriteEvent(big) != nil {
					return
				}
			}
			_ = c.WriteEvent([]byte(`{"type":"marker"}`))
			<-ctx.Done()
		}
	}
	open := func(addr string) func() {
		b := &Backend{Addr: addr}
		var hs []backend.Handler
		for i := range calls {
			out := &markSink{done: make(chan struct{})}
			h, err := b.Open(context.Background(), backend.SessionInfo{ID: fmt.Sprint("rtc_", i)}, out)
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
			select {
			case <-out.done:
			case <-time.After(30 * time.Second):
				t.Fatal("no marker within 30s")
			}
		}
		return func() {
			for _, h := range hs {
				_ = h.Close()
			}
		}
	}
	quietAddr, floodAddr := startServer(t, script(0)), startServer(t, script(3))
	closeQuiet := open(quietAddr)
	base := heaptest.Live()
	closeQuiet()
	closeFlood := open(floodAddr)
	defer closeFlood()
	per := (heaptest.Live() - base) / calls
	t.Logf("a call that read 1 MiB frames holds %d KiB more than a quiet one", per>>10)
	if per > 256<<10 {
		t.Errorf("a call that read 1 MiB frames holds %d KiB more than a quiet one, want ≤ 256 KiB", per>>10)
	}
}
