package transceiver

import (
	"context"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pion/rtp"

	"github.com/rtcedge/rtcedge/backend/realtime"
	"github.com/rtcedge/rtcedge/internal/opus"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// nullModel is a model server that reads and discards every event: the
// benchmark's allocations and CPU are then the pod's, connector included.
func nullModel(b *testing.B) string {
	return modelServer(b, func(_ context.Context, c *websocket.Conn) {
		buf := make([]byte, 64<<10)
		for {
			_, rd, err := c.Reader(context.Background()) // no deadline: the read allocates nothing
			if err != nil {
				return
			}
			for err == nil {
				_, err = rd.Read(buf)
			}
		}
	})
}

// BenchmarkCallPacket is a phone call's per-packet path on the pod, one
// 20 ms PCMU packet each way per op: the carrier's RTP taken (header,
// sequence window, credit) and handed to the Realtime connector, which
// batches it into input_audio_buffer.append; and one reply frame sent
// from the pacer's output as RTP to the carrier (through the pod socket
// to a loopback address). passthrough hands the G.711 on as it is;
// transcode (the baseline) decodes G.711, codes Opus for the connector
// (transcode-c9: at complexity 9, a browser's, as the call's encoder did
// before callComplexity),
// which decodes it to PCM16 at 24 kHz, and decodes an Opus reply frame to
// code G.711. The model server discards what it gets; the pod's clock
// advances 20 ms a packet, so the caller's credit (intake.go) admits
// every one. cpu-ns/op counts the whole process (the connector's writer
// and the null server included).
func BenchmarkCallPacket(b *testing.B) {
	for _, mode := range []string{"transcode-c9", "transcode", "passthrough"} {
		b.Run(mode, func(b *testing.B) {
			var clock atomic.Int64
			clock.Store(time.Now().UnixNano())
			bk, err := realtime.New(realtime.Config{URL: nullModel(b), G711: mode == "passthrough", Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			p := newPod(b, Config{Backend: bk, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
			media := netip.MustParseAddrPort("198.51.100.7:40000")
			res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}})
			if err != nil {
				b.Fatal(err)
			}
			p.t.mu.Lock()
			c := p.t.calls[res.ID]
			p.t.mu.Unlock()
			if mode == "transcode-c9" { // the encoder as it was: a browser's complexity
				if err := c.enc.SetComplexity(9); err != nil {
					b.Fatal(err)
				}
			}
			// One datagram through the socket: the pod learns the route back.
			relay := udp4(b)
			defer relay.Close()
			_ = relay.SetReadBuffer(64 << 10) // replies overflow and are dropped by the kernel
			h := clientHeader(media)
			h.Token = c.nonce
			hdr := rtp.Header{Version: 2, PayloadType: 0, SequenceNumber: 1, Timestamp: 160, SSRC: 0x1234}
			tone := g711.PCMU.Encode(nil, toneAt(700, 0, 160))
			first, _ := hdr.Marshal()
			if _, err := relay.WriteToUDPAddrPort(sealed(b, h, string(append(first, tone...))), p.addr); err != nil {
				b.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for c.pop.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if c.pop.Load() == 0 {
				b.Fatal("the carrier's first datagram did not arrive")
			}
			reply := replyFrame(b, mode == "passthrough", tone)
			pkt := make([]byte, 12+160)
			b.ReportAllocs()
			cpu0 := procCPU()
			b.ResetTimer()
			for range b.N {
				clock.Add(int64(callFrame))
				hdr.SequenceNumber++
				hdr.Timestamp += 160
				n, _ := hdr.MarshalTo(pkt)
				copy(pkt[n:], tone)
				c.RTP(1, pkt[:n+160])
				c.SendFrame(reply, callFrame)
			}
			b.StopTimer()
			b.ReportMetric(float64(procCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			if got := p.counter(b, "rtcedge_transceiver_call_packets_total", "result", "audio"); got < float64(b.N) {
				b.Errorf("%v packets heard of %d", got, b.N+1)
			}
		})
	}
}

// procCPU is the process's user and system CPU time.
func procCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// toneAt is n samples of a tone at hz from sample from, at 8 kHz.
func toneAt(hz float64, from, n int) []int16 { return tone(hz, from, n) }

// replyFrame is one 20 ms reply frame as the connector writes it: the
// G.711 itself for passthrough, else an 8 kHz Opus frame of it.
func replyFrame(b *testing.B, pass bool, code []byte) []byte {
	if pass {
		return code
	}
	enc, err := opus.NewVoIPEncoder(g711.ClockRate)
	if err != nil {
		b.Fatal(err)
	}
	defer enc.Close()
	out := make([]byte, opus.MaxPacket)
	n, err := enc.Encode(g711.PCMU.Decode(nil, code), out)
	if err != nil {
		b.Fatal(err)
	}
	return out[:n]
}
