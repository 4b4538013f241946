// The simulation's carrier: a SIP UAC (sipgo, as the sipfront and e2e
// tests' carriers) that places one call on its site's trunk, sends a tone
// as PCMU from the address its SDP names, and times what it hears back.

package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"github.com/pion/rtp"

	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// PhoneResult is what one phone call measured at the carrier.
type PhoneResult struct {
	// InviteToOK is from sending the INVITE to its 200 OK (through the
	// site's SIP link: one signaling round trip plus placement).
	InviteToOK time.Duration
	// AckToAudio is from sending the ACK to the first datagram of audio
	// back from the VIP (the carrier's first RTP leaves with the ACK).
	AckToAudio time.Duration
	// VIP is where the answer sent the media (c= and m= of its SDP);
	// Media the carrier's own media address (its offer's).
	VIP, Media netip.AddrPort
	// Heard is the audio heard back, in samples at 8 kHz; Tone its
	// power at the tone's frequency over that at another, in the part
	// after the first 200 ms.
	Heard int
	Tone  float64
}

var (
	sdpConn  = regexp.MustCompile(`c=IN IP[46] (\S+)`)
	sdpAudio = regexp.MustCompile(`m=audio (\d+) RTP/AVP`)
)

// toneHz is the carrier's tone; offHz where the echo should be quiet.
const (
	toneHz = 700
	offHz  = 1500
)

// PhoneCall places one call from site's carrier through its trunk, sends
// the tone from the first datagram, with the ACK, until it has heard hold
// of audio back (or ctx ends), calls during (when not nil) with the call
// still up, and hangs up with BYE.
func PhoneCall(ctx context.Context, site *Site, hold time.Duration, during func(PhoneResult)) (PhoneResult, error) {
	var res PhoneResult
	c := site.SIP
	var to sip.Uri
	if err := sip.ParseUri(c.URI, &to); err != nil {
		return res, fmt.Errorf("carrier URI %s: %w", c.URI, err)
	}
	ua, err := sipgo.NewUA(sipgo.WithUserAgent(c.Trunk))
	if err != nil {
		return res, err
	}
	defer ua.Close()
	cli, err := sipgo.NewClient(ua, sipgo.WithClientHostname(c.Carrier.String()))
	if err != nil {
		return res, err
	}
	defer cli.Close()
	udp, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.Carrier, 0)))
	if err != nil {
		return res, err
	}
	media := newDelayConn(udp, site.SIP.POP.Delay)
	defer media.Close()
	res.Media = media.LocalAddr()
	offer := fmt.Sprintf("v=0\r\no=carrier 1 1 IN IP4 %[1]s\r\ns=call\r\nc=IN IP4 %[1]s\r\nt=0 0\r\nm=audio %[2]d RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=ptime:20\r\n",
		c.Carrier, media.LocalAddr().Port())
	dua := &sipgo.DialogUA{Client: cli, ContactHDR: sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "carrier", Host: c.Carrier.String(), Port: 5060}}}
	start := time.Now()
	call, err := dua.Invite(ctx, to, []byte(offer), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		return res, fmt.Errorf("INVITE: %w", err)
	}
	defer call.Close()
	if err := call.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		return res, fmt.Errorf("INVITE: %w", err)
	}
	res.InviteToOK = time.Since(start)
	body := string(call.InviteResponse.Body())
	cm, am := sdpConn.FindStringSubmatch(body), sdpAudio.FindStringSubmatch(body)
	if cm == nil || am == nil {
		return res, fmt.Errorf("answer without a media address:\n%s", body)
	}
	port, _ := strconv.Atoi(am[1])
	ip, err := netip.ParseAddr(cm[1])
	if err != nil {
		return res, fmt.Errorf("answer's c=: %w", err)
	}
	res.VIP = netip.AddrPortFrom(ip, uint16(port))
	heard := media.listen(res.VIP, int(hold.Seconds()*g711.ClockRate))
	ackAt := time.Now()
	if err := call.Ack(ctx); err != nil {
		return res, fmt.Errorf("ACK: %w", err)
	}
	pcm, first, err := sendTone(ctx, media, res.VIP, heard)
	if err == nil {
		res.AckToAudio = first.Sub(ackAt)
		res.Heard = len(pcm)
		if len(pcm) > 1600 {
			res.Tone = goertzel(pcm[1600:], toneHz) / math.Max(goertzel(pcm[1600:], offHz), 1e-9)
		}
		if during != nil {
			during(res)
		}
	}
	// Hang up even when ctx is spent, within a bound of its own.
	byeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if berr := call.Bye(byeCtx); berr != nil && err == nil {
		err = fmt.Errorf("BYE: %w", berr)
	}
	return res, err
}

// heardAudio is what the carrier's receiver reports once it has heard
// enough, or gave up.
type heardAudio struct {
	pcm   []int16
	first time.Time
}

// sendTone sends 20 ms PCMU frames of the tone to vip until heard reports.
// The SSRC is random, as RFC 3550 has it: the global relays take a silent
// flow's SSRC from a new address as that caller's NAT rebinding
// (globalrelay/ssrc.go), so a carrier reusing one SSRC on every call would
// move a new call's audio to the previous call's ended flow.
func sendTone(ctx context.Context, media *delayConn, vip netip.AddrPort, heard <-chan heardAudio) ([]int16, time.Time, error) {
	hdr := rtp.Header{Version: 2, SequenceNumber: uint16(rand.Uint32()), Timestamp: rand.Uint32(), SSRC: rand.Uint32()}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	pcm := make([]int16, 160)
	for i := 0; ; i++ {
		for j := range pcm {
			pcm[j] = int16(8000 * math.Sin(2*math.Pi*toneHz*float64(i*160+j)/g711.ClockRate))
		}
		b, _ := hdr.Marshal()
		media.send(g711.PCMU.Encode(b, pcm), vip)
		hdr.SequenceNumber++
		hdr.Timestamp += 160
		select {
		case h := <-heard:
			if len(h.pcm) == 0 {
				return nil, time.Time{}, errors.New("no audio came back from the VIP")
			}
			return h.pcm, h.first, nil
		case <-ctx.Done():
			return nil, time.Time{}, fmt.Errorf("audio: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// goertzel is pcm's power at freq (8 kHz samples), normalised.
func goertzel(pcm []int16, freq float64) float64 {
	w := 2 * math.Pi * freq / g711.ClockRate
	coeff := 2 * math.Cos(w)
	var s1, s2 float64
	for _, v := range pcm {
		s0 := float64(v) + coeff*s1 - s2
		s2, s1 = s1, s0
	}
	return (s1*s1 + s2*s2 - coeff*s1*s2) / float64(len(pcm)*len(pcm))
}

// delayConn is the carrier's media socket with the site's one-way delay
// charged in each direction, in order, as the sites' links do: datagrams
// leave delay after send, and are delivered delay after they arrive.
type delayConn struct {
	conn  *net.UDPConn
	delay time.Duration
	out   chan datagram // to send, each at its due time; owned by the sender
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

type datagram struct {
	b    []byte
	addr netip.AddrPort
	due  time.Time
}

func newDelayConn(conn *net.UDPConn, delay time.Duration) *delayConn {
	d := &delayConn{conn: conn, delay: delay, out: make(chan datagram, 1024), done: make(chan struct{})}
	d.wg.Add(1)
	go d.sender()
	return d
}

// LocalAddr is the address the carrier's SDP names.
func (d *delayConn) LocalAddr() netip.AddrPort { return d.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// send queues b for addr; a full queue drops it, as a link would.
func (d *delayConn) send(b []byte, addr netip.AddrPort) {
	select {
	case d.out <- datagram{b: b, addr: addr, due: time.Now().Add(d.delay)}:
	default:
	}
}

func (d *delayConn) sender() {
	defer d.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-d.done:
			return
		case g := <-d.out:
			timer.Reset(time.Until(g.due))
			select {
			case <-d.done:
				return
			case <-timer.C:
			}
			_, _ = d.conn.WriteToUDPAddrPort(g.b, g.addr)
		}
	}
}

// listen delivers, each delay after it arrived, the PCMU audio from vip
// (other sources and payloads are ignored) until want samples were heard
// or the socket closes, then reports once on the returned channel: the
// samples and when the first datagram was delivered.
func (d *delayConn) listen(vip netip.AddrPort, want int) <-chan heardAudio {
	in := make(chan datagram, 1024)
	res := make(chan heardAudio, 1)
	d.wg.Add(2)
	go func() { // the socket's reader
		defer d.wg.Done()
		defer close(in)
		buf := make([]byte, 1500)
		for {
			n, from, err := d.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			select {
			case in <- datagram{b: append([]byte(nil), buf[:n]...), addr: from, due: time.Now().Add(d.delay)}:
			default:
			}
		}
	}()
	go func() { // delivery
		defer d.wg.Done()
		var h heardAudio
		defer func() { res <- h }()
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for g := range in {
			timer.Reset(time.Until(g.due))
			select {
			case <-d.done:
				return
			case <-timer.C:
			}
			var p rtp.Packet
			if g.addr != vip || p.Unmarshal(g.b) != nil || p.PayloadType != 0 {
				continue
			}
			if h.first.IsZero() {
				h.first = time.Now()
			}
			if h.pcm = g711.PCMU.Decode(h.pcm, p.Payload); len(h.pcm) >= want {
				return
			}
		}
	}()
	return res
}

// Close stops the delays and closes the socket. Idempotent.
func (d *delayConn) Close() error {
	var err error
	d.once.Do(func() {
		close(d.done)
		err = d.conn.Close()
		d.wg.Wait()
	})
	return err
}
