package realtime

import (
	"encoding/base64"
	"math"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/opus"
)

type discard struct{}

func (discard) WriteAudio([]byte, time.Duration) error { return nil }
func (discard) SendEvent([]byte) error                 { return nil }

// BenchmarkFrame is the connector's cost per 20 ms of audio each way, with
// no network: in, the caller's Opus frame decoded to PCM16 at 24 kHz,
// batched, and base64'd into an append message (the writer's recycling
// done inline); in-silence, the same for a frame the caller's encoder
// marked inactive (sent as silence without decoding); out, a 20 ms audio
// delta scanned, base64-decoded to PCM, and encoded to an Opus frame
// written to the pod (whose pacing transceiver/pace's BenchmarkPacing
// measures).
func BenchmarkFrame(b *testing.B) {
	for _, dir := range []string{"in", "in-silence", "out", "both"} {
		b.Run(dir, func(b *testing.B) {
			bk, err := New(Config{URL: "ws://127.0.0.1:1/v1/realtime"})
			if err != nil {
				b.Fatal(err)
			}
			dec, err := opus.NewDecoder(bk.cfg.Rate)
			if err != nil {
				b.Fatal(err)
			}
			enc, err := opus.NewEncoder(bk.cfg.Rate)
			if err != nil {
				b.Fatal(err)
			}
			c := newCall(bk, backend.SessionInfo{ID: "bench"}, discard{}, nil, audioFormat{rate: bk.cfg.Rate}, dec, enc)
			defer func() { dec.Close(); enc.Close() }()

			// One 20 ms caller frame (48 kHz tone) and one 20 ms delta.
			e48, _ := opus.NewVoIPEncoder(48000)
			defer e48.Close()
			pcm48 := make([]int16, 960)
			for i := range pcm48 {
				pcm48[i] = int16(8000 * math.Sin(2*math.Pi*440*float64(i)/48000))
			}
			pkt := make([]byte, opus.MaxPacket)
			n, err := e48.Encode(pcm48, pkt)
			if err != nil {
				b.Fatal(err)
			}
			pkt = pkt[:n]
			if dir == "in-silence" {
				for range 10 { // past the encoder's VAD hangover
					if n, err = e48.Encode(make([]int16, 960), pkt[:cap(pkt)]); err != nil {
						b.Fatal(err)
					}
				}
				pkt = pkt[:n]
				if !opus.Inactive(pkt) {
					b.Fatal("silence not inactive")
				}
			}
			pcm24 := make([]int16, 480)
			for i := range pcm24 {
				pcm24[i] = int16(8000 * math.Sin(2*math.Pi*440*float64(i)/24000))
			}
			delta := []byte(`{"type":"response.output_audio.delta","event_id":"event_1","response_id":"resp_1","item_id":"item_1","output_index":0,"content_index":0,"delta":"` +
				base64.StdEncoding.EncodeToString(opus.AppendPCM16LE(nil, pcm24)) + `"}`)

			frame := func() {
				if dir != "out" {
					c.Audio(pkt, 20*time.Millisecond)
					select {
					case m := <-c.queue: // what writeLoop does after the write
						c.queued.Add(-int64(len(m.b)))
						c.free <- m.b
					default:
					}
				}
				if dir == "out" || dir == "both" {
					c.handle(delta)
				}
			}
			for range 10 { // warm the buffers up
				frame()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				frame()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/frame")
		})
	}
}
