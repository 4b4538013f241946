package transceiver

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// hearBackend adds up the caller audio its handlers are given.
type hearBackend struct {
	mu    sync.Mutex
	heard time.Duration
}

func (b *hearBackend) Open(context.Context, backend.SessionInfo, backend.Sink) (backend.Handler, error) {
	return hearHandler{b}, nil
}

func (b *hearBackend) total() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.heard
}

type hearHandler struct{ b *hearBackend }

func (h hearHandler) Audio(_ []byte, d time.Duration) {
	h.b.mu.Lock()
	h.b.heard += d
	h.b.mu.Unlock()
}
func (hearHandler) Event([]byte) {}
func (hearHandler) Close() error { return nil }

// TestCallIntakeBound: a carrier (or whoever holds its address and token)
// that sends 3 s of audio at once has its backend hear no more than the
// caller's credit allows (intake.go: 1.5x real time over a second), the
// rest dropped and counted, for a transcoded call as for a WebRTC one.
func TestCallIntakeBound(t *testing.T) {
	hb := &hearBackend{}
	p := newPod(t, Config{Backend: hb})
	media := netip.MustParseAddrPort("198.51.100.7:40000")
	res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	c := newCarrier(t, p, media, p.call(t, res.ID).nonce, g711.PCMU)
	const frames = 150 // 3 s
	start := time.Now()
	for i := range frames {
		c.send(tone(700, i*160, 160))
	}
	eventually(t, "every packet to be taken or dropped", func() bool {
		n := p.counter(t, "rtcedge_transceiver_call_packets_total", "result", "audio") +
			p.counter(t, "rtcedge_transceiver_call_packets_total", "result", "late") +
			p.counter(t, "rtcedge_transceiver_dropped_total", "reason", "caller_audio")
		return n == frames
	})
	elapsed := time.Since(start)
	heard := hb.total()
	t.Logf("heard %v of 3 s sent in %v", heard, elapsed)
	if limit := maxAhead + elapsed + callFrame; heard > limit {
		t.Errorf("backend heard %v of a 3 s burst within %v, want ≤ %v", heard, elapsed, limit)
	}
	if p.counter(t, "rtcedge_transceiver_dropped_total", "reason", "caller_audio") == 0 {
		t.Error("no caller audio counted as dropped")
	}
}
