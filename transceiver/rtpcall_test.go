package transceiver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pion/rtp"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// carrierSDP is a carrier's offer as the SIP front forwards it.
func carrierSDP(media netip.AddrPort, pts string) string {
	return fmt.Sprintf("v=0\r\no=carrier 1 1 IN IP4 %s\r\ns=-\r\nc=IN IP4 %s\r\nt=0 0\r\nm=audio %d RTP/AVP %s\r\n"+
		"a=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\na=rtpmap:101 telephone-event/8000\r\na=ptime:20\r\na=sendrecv\r\n",
		media.Addr(), media.Addr(), media.Port(), pts)
}

// carrier is a test carrier behind a stand-in cluster relay: it sends a
// call's RTP to the pod under the call's header and reads what the pod
// sends back.
type carrier struct {
	t     *testing.T
	relay *net.UDPConn
	pod   netip.AddrPort
	hdr   encap.Header
	law   g711.Law
	pkt   rtp.Header
}

func newCarrier(t *testing.T, p *pod, media netip.AddrPort, nonce [6]byte, law g711.Law) *carrier {
	relay := udp4(t)
	t.Cleanup(func() { relay.Close() })
	h := clientHeader(media)
	h.Token = nonce
	return &carrier{t: t, relay: relay, pod: p.addr, hdr: h, law: law,
		pkt: rtp.Header{Version: 2, PayloadType: law.PayloadType(), SequenceNumber: 100, Timestamp: 1000, SSRC: 0x1234}}
}

// send sends one 20 ms RTP packet of pcm (160 samples).
func (c *carrier) send(pcm []int16) {
	c.t.Helper()
	c.pkt.SequenceNumber++
	c.pkt.Timestamp += 160
	b, err := c.pkt.Marshal()
	if err != nil {
		c.t.Fatal(err)
	}
	b = c.law.Encode(b, pcm)
	if _, err := c.relay.WriteToUDPAddrPort(sealed(c.t, c.hdr, string(b)), c.pod); err != nil {
		c.t.Fatal(err)
	}
}

// sendPaced sends n packets at real time, as a carrier does (a burst
// beyond the caller's credit is dropped: intake.go), frame(i) the i-th.
func (c *carrier) sendPaced(n int, frame func(i int) []int16) {
	c.t.Helper()
	tick := time.NewTicker(callFrame)
	defer tick.Stop()
	for i := range n {
		if i > 0 {
			<-tick.C
		}
		c.send(frame(i))
	}
}

// receive reads the pod's RTP toward the carrier until d of audio came or
// the deadline passes, checking every header.
func (c *carrier) receive(d time.Duration) []int16 {
	c.t.Helper()
	var pcm []int16
	buf := make([]byte, 2048)
	deadline := time.Now().Add(5 * time.Second)
	for len(pcm) < int(d.Seconds()*g711.ClockRate) {
		_ = c.relay.SetReadDeadline(deadline)
		n, _, err := c.relay.ReadFromUDPAddrPort(buf)
		if err != nil {
			c.t.Fatalf("after %d samples: %v", len(pcm), err)
		}
		h, hl, err := encap.Decode(buf[:n])
		if err != nil || testHop.Verify(buf[:n], hl) != nil {
			c.t.Fatalf("reply header: %v", err)
		}
		if !h.ToClient || h.Client != c.hdr.Client {
			c.t.Fatalf("reply goes to %v (to client %v), want %v", h.Client, h.ToClient, c.hdr.Client)
		}
		var p rtp.Packet
		if err := p.Unmarshal(buf[hl:n]); err != nil {
			c.t.Fatal(err)
		}
		if p.PayloadType != c.law.PayloadType() {
			c.t.Fatalf("payload type %d, want %d", p.PayloadType, c.law.PayloadType())
		}
		pcm = c.law.Decode(pcm, p.Payload)
	}
	return pcm
}

func tone(freq float64, from, n int) []int16 {
	pcm := make([]int16, n)
	for i := range pcm {
		pcm[i] = int16(8000 * math.Sin(2*math.Pi*freq*float64(from+i)/g711.ClockRate))
	}
	return pcm
}

// power is the Goertzel power of pcm at freq, normalised by its length.
func power(pcm []int16, freq float64) float64 {
	w := 2 * math.Cos(2*math.Pi*freq/g711.ClockRate)
	var s1, s2 float64
	for _, x := range pcm {
		s1, s2 = float64(x)+w*s1-s2, s1
	}
	return (s1*s1 + s2*s2 - w*s1*s2) / float64(len(pcm)*len(pcm))
}

func (p *pod) call(t *testing.T, id string) *rtpCall {
	p.t.mu.Lock()
	defer p.t.mu.Unlock()
	c := p.t.calls[id]
	if c == nil {
		t.Fatalf("no call %s", id)
	}
	return c
}

// TestCallEcho: a phone call's G.711 reaches the backend and its reply
// comes back to the carrier's negotiated address as G.711 of the same
// codec, the tone intact; the answer names the POP's VIP.
func TestCallEcho(t *testing.T) {
	for _, law := range []g711.Law{g711.PCMU, g711.PCMA} {
		t.Run(law.Name(), func(t *testing.T) {
			p := newPod(t, Config{})
			media := netip.MustParseAddrPort("198.51.100.7:40000")
			res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, fmt.Sprintf("%d 101", law.PayloadType())), POPs: []POPAddr{popA}})
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"c=IN IP4 127.0.0.2", "m=audio 3478 RTP/AVP " + fmt.Sprint(law.PayloadType()) + " 101", law.Name() + "/8000", "telephone-event/8000"} {
				if !strings.Contains(res.Answer, want) {
					t.Errorf("answer lacks %q:\n%s", want, res.Answer)
				}
			}
			c := newCarrier(t, p, media, p.call(t, res.ID).nonce, law)
			const frames = 50
			c.sendPaced(frames, func(i int) []int16 { return tone(700, i*160, 160) })
			got := c.receive(800 * time.Millisecond)
			// The codecs' delay and the first frames' onset: judge the middle.
			mid := got[1600:6000]
			if on, off := power(mid, 700), power(mid, 1500); on < 100*off || on < 1e5 {
				t.Errorf("700 Hz tone: power %.0f at 700 Hz, %.0f at 1500 Hz", on, off)
			}
			eventually(t, "every audio packet counted", func() bool {
				return p.counter(t, "rtcedge_transceiver_call_packets_total", "result", "audio") == frames
			})
		})
	}
}

// TestCallForeignMedia: at the call's address, a datagram under another
// token is dropped and counted; from another address it is no call's; a
// second SSRC while the first is live is dropped and counted.
func TestCallForeignMedia(t *testing.T) {
	p := newPod(t, Config{})
	media := netip.MustParseAddrPort("198.51.100.7:40000")
	res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	nonce := p.call(t, res.ID).nonce
	forged := nonce
	forged[5] ^= 1
	stranger := newCarrier(t, p, media, forged, g711.PCMU)
	stranger.send(tone(700, 0, 160))
	eventually(t, "the foreign token to be counted", func() bool {
		return p.counter(t, "rtcedge_transceiver_dropped_packets_total", "reason", "rtp_token") == 1
	})
	c := newCarrier(t, p, media, nonce, g711.PCMU)
	c.send(tone(700, 0, 160))
	other := newCarrier(t, p, media, nonce, g711.PCMU)
	other.pkt.SSRC = 0x9999
	other.send(tone(700, 0, 160))
	eventually(t, "the second SSRC to be counted", func() bool {
		return p.counter(t, "rtcedge_transceiver_call_packets_total", "result", "ssrc") == 1
	})
	if n := p.counter(t, "rtcedge_transceiver_call_packets_total", "result", "audio"); n != 1 {
		t.Errorf("audio packets %v, want 1", n)
	}
	// The same address cannot be a second call's.
	_, err = p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0"), POPs: []POPAddr{popA}})
	if !errors.Is(err, ErrBadOffer) {
		t.Errorf("second call at the same address: %v, want ErrBadOffer", err)
	}
}

// TestCallRTPTimeout: a call whose carrier stops sending ends after
// RTPTimeout and leaves nothing: no call, no registration, no route.
func TestCallRTPTimeout(t *testing.T) {
	p := newPod(t, Config{RTPTimeout: 300 * time.Millisecond})
	media := netip.MustParseAddrPort("198.51.100.7:40000")
	res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "8"), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	c := newCarrier(t, p, media, p.call(t, res.ID).nonce, g711.PCMA)
	for i := range 10 {
		c.send(tone(700, i*160, 160))
	}
	c.receive(100 * time.Millisecond) // the call is up: audio came back
	if p.t.sock.Routes() != 1 || p.t.sock.RTPCalls() != 1 {
		t.Fatalf("live call: %d routes, %d calls registered", p.t.sock.Routes(), p.t.sock.RTPCalls())
	}
	eventually(t, "the call to end by its RTP timeout", func() bool {
		return p.counter(t, "rtcedge_transceiver_sessions_ended_total", "reason", "rtp_timeout") == 1
	})
	eventually(t, "the call's state to be freed", func() bool {
		return p.t.Sessions() == 0 && p.t.sock.RTPCalls() == 0 && p.t.sock.Routes() == 0
	})
	if err := p.t.EndSession(res.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("ended call still found: %v", err)
	}
}
