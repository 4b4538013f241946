package transceiver

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/backend/realtime"
	"github.com/rtcedge/rtcedge/backend/realtime/refserver"
	"github.com/rtcedge/rtcedge/backend/realtime/reftest"
	"github.com/rtcedge/rtcedge/internal/opus"
	"github.com/rtcedge/rtcedge/transceiver/g711"
	"github.com/rtcedge/rtcedge/transceiver/pace"
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

// refPod is a pod whose backend is the Realtime connector, taking G.711
// (g711 true) or not, to a reference server of its own.
func refPod(t *testing.T, g711on bool) (*pod, *refserver.Server) {
	t.Helper()
	srv := reftest.Start(t, refserver.Config{})
	b, err := realtime.New(realtime.Config{URL: srv.URL() + "?model=ref", G711: g711on, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return newPod(t, Config{Backend: b}), srv
}

// histCount is the number of observations of histogram name.
func (p *pod) histCount(t *testing.T, name string) uint64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// speak sends ms of a 700 Hz tone (or silence) at real time.
func (c *carrier) speak(from, ms int, loud bool) {
	c.sendPaced(ms/20, func(i int) []int16 {
		if !loud {
			return make([]int16, 160)
		}
		return tone(700, (from+i)*160, 160)
	})
}

// TestCallPassthrough: a phone call whose backend takes G.711 (the
// Realtime connector to the reference server) has no codec on the pod:
// the server is asked for the carrier's law both ways, hears the
// caller's tone, and its G.711 reply reaches the carrier paced, the tone
// intact; the reply delay is measured; the caller speaking over the
// reply (the server's VAD) clears it: a barge-in, counted, and the reply
// stops. Not taking G.711, the same call is transcoded.
func TestCallPassthrough(t *testing.T) {
	for _, law := range []g711.Law{g711.PCMU, g711.PCMA} {
		t.Run(law.Name(), func(t *testing.T) {
			p, srv := refPod(t, true)
			media := netip.MustParseAddrPort("198.51.100.7:40000")
			res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, fmt.Sprint(law.PayloadType())), POPs: []POPAddr{popA}})
			if err != nil {
				t.Fatal(err)
			}
			call := p.call(t, res.ID)
			if !call.pass || call.enc != nil || call.dec != nil {
				t.Fatalf("call pass=%v, encoder %v, decoder %v: want passthrough, no codec", call.pass, call.enc != nil, call.dec != nil)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sess, err := srv.NextSession(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := newCarrier(t, p, media, call.nonce, law)
			c.speak(0, 200, false)
			c.speak(10, 1000, true)
			c.speak(60, 800, false)
			var format any
			if err := sess.Wait(ctx, func(st *refserver.State) bool {
				format, _ = lookupPath(st.Config, "audio", "input", "format", "type")
				return len(st.Responses) == 1
			}); err != nil {
				t.Fatal(err)
			}
			if want := map[g711.Law]string{g711.PCMU: "audio/pcmu", g711.PCMA: "audio/pcma"}[law]; format != want {
				t.Errorf("server's input format %v, want %s", format, want)
			}
			got := c.receive(600 * time.Millisecond)
			mid := got[800:4000]
			if on, off := power(mid, 700), power(mid, 1500); on < 100*off || on < 1e5 {
				t.Errorf("reply at 700 Hz: power %.0f, at 1500 Hz %.0f", on, off)
			}
			eventually(t, "the reply delay measured", func() bool { return p.histCount(t, "rtcedge_turn_reply_delay_seconds") == 1 })
			// The caller speaks over the reply: the server's VAD hears it.
			c.speak(200, 300, true)
			eventually(t, "the barge-in", func() bool { return p.counter(t, "rtcedge_bargeins_total", "source", "backend") == 1 })
			if d := p.counter(t, "rtcedge_reply_audio_seconds_total", "state", "dropped"); d <= 0 {
				t.Errorf("the barge-in dropped %.2f s of the queued reply, want > 0", d)
			}
			if p.histCount(t, "rtcedge_turn_bargein_stop_seconds") != 1 {
				t.Error("the barge-in's stop time not measured")
			}
			if p.counter(t, "rtcedge_transceiver_calls_passthrough_total", "", "") != 1 {
				t.Error("passthrough call not counted")
			}
		})
	}
	t.Run("transcoded", func(t *testing.T) {
		p, _ := refPod(t, false)
		media := netip.MustParseAddrPort("198.51.100.7:40000")
		res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}})
		if err != nil {
			t.Fatal(err)
		}
		if call := p.call(t, res.ID); call.pass || call.enc == nil {
			t.Errorf("call pass=%v, encoder %v: want transcoded", call.pass, call.enc != nil)
		}
	})
}

// lookupPath walks nested objects of m.
func lookupPath(m map[string]any, path ...string) (any, bool) {
	var v any = m
	for _, k := range path {
		o, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		v = o[k]
	}
	return v, v != nil
}

// modelServer runs a model server whose connections serve handles, on
// loopback until the test ends; it returns the server's ws:// URL.
func modelServer(tb testing.TB, serve func(ctx context.Context, c *websocket.Conn)) string {
	tb.Helper()
	var wg sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		wg.Add(1)
		defer wg.Done()
		defer c.CloseNow()
		c.SetReadLimit(-1)
		serve(r.Context(), c)
	}))
	tb.Cleanup(func() { srv.Close(); wg.Wait() })
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/realtime"
}

// hostileDelta is a model server that answers a call's first event with
// one audio delta of n bytes of G.711 (base64'd), then reads until the
// connection ends.
func hostileDelta(t *testing.T, n int) string {
	return modelServer(t, func(ctx context.Context, c *websocket.Conn) {
		if _, _, err := c.Read(ctx); err != nil {
			return
		}
		audio := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5a}, n))
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"response.output_audio.delta","response_id":"resp_1","item_id":"item_1","delta":"`+audio+`"}`))
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	})
}

// TestCallPassthroughBounds: a hostile model server's huge G.711 delta
// is bounded as for a transcoded call: one under the connector's
// message bound (1 MiB) fills the call's reply queue to its bound (60 s
// of audio), the rest dropped and counted; one over it ends the call
// (backend_oversized).
func TestCallPassthroughBounds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes int // of G.711: 8,000 a second
		ends  bool
	}{
		{"86s", 86 * g711.ClockRate, false},
		{"2MiB", 2 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := realtime.New(realtime.Config{URL: hostileDelta(t, tc.bytes), G711: true, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			p := newPod(t, Config{Backend: b})
			media := netip.MustParseAddrPort("198.51.100.7:40000")
			created := time.Now()
			if _, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}}); err != nil {
				t.Fatal(err)
			}
			if tc.ends {
				eventually(t, "the call to end", func() bool {
					return p.counter(t, "rtcedge_transceiver_sessions_ended_total", "reason", "backend_closed") == 1
				})
				return
			}
			eventually(t, "the delta's audio queued or dropped", func() bool {
				return p.counter(t, "rtcedge_reply_audio_seconds_total", "state", "generated")+
					p.counter(t, "rtcedge_reply_audio_seconds_total", "state", "dropped") >= 85.9
			})
			// Queued: at most the bound, plus what the pacer played out
			// meanwhile (real time at most; under -race the delta takes a
			// while to arrive).
			played := time.Since(created).Seconds()
			if g := p.counter(t, "rtcedge_reply_audio_seconds_total", "state", "generated"); g > pace.DefaultMaxQueued.Seconds()+played+0.1 {
				t.Errorf("%.2f s of reply queued in %.2f s, want ≤ %v and what played meanwhile", g, played, pace.DefaultMaxQueued)
			}
			if d := p.counter(t, "rtcedge_reply_audio_seconds_total", "state", "dropped"); d < 25 {
				t.Errorf("%.1f s of reply dropped, want ≥ 25", d)
			}
		})
	}
}

// TestCallEncoderKeepsVAD: a transcoded call's encoder, at callComplexity,
// still marks silence inactive and speech active (opus.Inactive), which
// the edge's VAD and the Realtime connector's batching read.
func TestCallEncoderKeepsVAD(t *testing.T) {
	p := newPod(t, Config{})
	media := netip.MustParseAddrPort("198.51.100.7:40000")
	res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	c := p.call(t, res.ID)
	c.inMu.Lock()
	defer c.inMu.Unlock()
	encode := func(pcm []int16) []byte {
		n, err := c.enc.Encode(pcm, c.opusBuf)
		if err != nil {
			t.Fatal(err)
		}
		return c.opusBuf[:n]
	}
	for i := range 25 {
		if p := encode(tone(700, i*160, 160)); i == 24 && opus.Inactive(p) {
			t.Error("a tone coded inactive")
		}
	}
	for i := range 25 {
		if p := encode(make([]int16, 160)); i == 24 && !opus.Inactive(p) {
			t.Error("silence coded active")
		}
	}
}
