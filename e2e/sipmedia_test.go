package e2e

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"github.com/pion/rtp"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

var (
	sdpConn  = regexp.MustCompile(`c=IN IP[46] (\S+)`)
	sdpAudio = regexp.MustCompile(`m=audio (\d+) RTP/AVP`)
)

// TestSIPMediaThroughRelays: a phone call's RTP crosses the global relay
// and the cluster relay to the pod's echo and back (docs/wire.md §6). The
// carrier sends from the address its SDP names to the VIP the answer
// names; the pod's route entry opens the flow at the first datagram; the
// carrier hears its 700 Hz tone back as PCMU from the VIP. RTP another
// socket sends to the VIP is forwarded nowhere. BYE ends the call and
// leaves no session.
func TestSIPMediaThroughRelays(t *testing.T) {
	w := startWorld(t, devworld.Config{SIPAddr: "127.0.0.1:0", PodsPerCluster: 1, RelaysPerCluster: 1})
	to, cli := sipCarrier(t, w)
	media, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer media.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dua := &sipgo.DialogUA{Client: cli, ContactHDR: sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "carrier", Host: "127.0.0.1", Port: 5999}}}
	port := media.LocalAddr().(*net.UDPAddr).Port
	offer := fmt.Sprintf("v=0\r\no=carrier 1 1 IN IP4 127.0.0.1\r\ns=call\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio %d RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=ptime:20\r\n", port)
	call, err := dua.Invite(ctx, to, []byte(offer), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		t.Fatal(err)
	}
	defer call.Close()
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := call.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	body := string(call.InviteResponse.Body())
	cm, am := sdpConn.FindStringSubmatch(body), sdpAudio.FindStringSubmatch(body)
	if cm == nil || am == nil {
		t.Fatalf("answer without an address:\n%s", body)
	}
	vipPort, _ := strconv.Atoi(am[1])
	vip := netip.AddrPortFrom(netip.MustParseAddr(cm[1]), uint16(vipPort))

	// A stranger's RTP to the VIP opens nothing.
	stranger, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()

	heard := make(chan []int16, 1)
	go func() {
		var pcm []int16
		buf := make([]byte, 1500)
		_ = media.SetReadDeadline(time.Now().Add(20 * time.Second))
		for len(pcm) < g711.ClockRate { // one second back
			n, from, err := media.ReadFromUDPAddrPort(buf)
			if err != nil {
				break
			}
			var p rtp.Packet
			if from != vip || p.Unmarshal(buf[:n]) != nil || p.PayloadType != 0 {
				continue
			}
			pcm = g711.PCMU.Decode(pcm, p.Payload)
		}
		heard <- pcm
	}()
	hdr := rtp.Header{Version: 2, SequenceNumber: 1, Timestamp: 160, SSRC: 0xc0ffee}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var got []int16
	strangerSent := 0
	for i := 0; got == nil && i < 500; i++ { // at most 10 s of audio
		select {
		case got = <-heard:
			continue
		case <-tick.C:
		}
		hdr.SequenceNumber++
		hdr.Timestamp += 160
		b, _ := hdr.Marshal()
		pcm := make([]int16, 160)
		for j := range pcm {
			pcm[j] = int16(8000 * math.Sin(2*math.Pi*700*float64(i*160+j)/g711.ClockRate))
		}
		b = g711.PCMU.Encode(b, pcm)
		if _, err := media.WriteToUDPAddrPort(b, vip); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			if _, err := stranger.WriteToUDPAddrPort(b, vip); err == nil {
				strangerSent++
			}
		}
	}
	if got == nil {
		got = <-heard
	}
	if len(got) < g711.ClockRate {
		t.Fatalf("heard %d samples back, want a second", len(got))
	}
	mid := got[1600:]
	if on, off := goertzel(mid, 700), goertzel(mid, 1500); on < 100*off {
		t.Errorf("the echo is not the tone: %.0f at 700 Hz, %.0f at 1500 Hz", on, off)
	}
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_dropped_packets_total", map[string]string{"reason": "rtp_token"}); n != 0 {
		t.Errorf("%v datagrams at the call's address under another token", n)
	}
	// The stranger's datagrams were misses at the global relay, each
	// counted, and it was answered nothing.
	if n := metricSum(t, w.Registry, "rtcedge_globalrelay_dropped_packets_total", map[string]string{"reason": "unknown_flow"}); n < float64(strangerSent) {
		t.Errorf("unknown_flow drops %v, want at least the stranger's %d", n, strangerSent)
	}
	_ = stranger.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _, err := stranger.ReadFromUDPAddrPort(make([]byte, 1500)); err == nil {
		t.Errorf("the stranger was answered (%d bytes)", n)
	}
	if err := call.Bye(ctx); err != nil {
		t.Fatalf("BYE: %v", err)
	}
	eventually(t, 5*time.Second, "the call's session to end", func() bool { return w.Sessions() == 0 })
}

// goertzel is pcm's power at freq (8 kHz samples), normalised.
func goertzel(pcm []int16, freq float64) float64 {
	w := 2 * math.Cos(2*math.Pi*freq/g711.ClockRate)
	var s1, s2 float64
	for _, x := range pcm {
		s1, s2 = float64(x)+w*s1-s2, s1
	}
	return (s1*s1 + s2*s2 - w*s1*s2) / float64(len(pcm)*len(pcm))
}
