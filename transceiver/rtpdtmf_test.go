package transceiver

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/rtp"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/transceiver/dtmf"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// dtmfBackend sends audio back as loopBackend does, records the digits it
// is given and, when echo is set, sends each back as the echo backend does.
type dtmfBackend struct {
	echo bool

	mu     sync.Mutex
	digits []byte
	sink   backend.Sink
}

func (b *dtmfBackend) Open(_ context.Context, _ backend.SessionInfo, out backend.Sink) (backend.Handler, error) {
	b.mu.Lock()
	b.sink = out
	b.mu.Unlock()
	return dtmfHandler{loopHandler{out}, b}, nil
}

func (b *dtmfBackend) got() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.digits)
}

type dtmfHandler struct {
	loopHandler
	b *dtmfBackend
}

func (h dtmfHandler) DTMF(d byte) {
	h.b.mu.Lock()
	h.b.digits = append(h.b.digits, d)
	h.b.mu.Unlock()
	if h.b.echo {
		_ = h.out.(backend.DTMFSender).SendDTMF(string(d))
	}
}

const allKeys = "0123456789*#ABCD"

// sendDigits sends keys as a carrier does: each digit's start three
// times, its updates, its end three times, all under the digit's
// timestamp, one packet every 20 ms (a burst would let the pod's socket
// readers reorder whole digits past its sequence window, which a
// carrier's real-time stream does not); the sequence numbers go on from
// the audio's.
func (c *carrier) sendDigits(keys string) {
	c.t.Helper()
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	for i := 0; i < len(keys); i++ {
		code, _ := dtmf.Code(keys[i])
		tone := dtmf.Tone(code, 10, 800, 160)
		tone = append([]dtmf.Event{tone[0], tone[0]}, tone...)
		c.pkt.Timestamp += 1600
		for j, e := range tone {
			<-pace.C
			h := c.pkt
			h.PayloadType, h.Marker = 101, j == 0
			c.pkt.SequenceNumber++
			h.SequenceNumber = c.pkt.SequenceNumber
			b, err := h.Marshal()
			if err != nil {
				c.t.Fatal(err)
			}
			if _, err := c.relay.WriteToUDPAddrPort(sealed(c.t, c.hdr, string(dtmf.Append(b, e))), c.pod); err != nil {
				c.t.Fatal(err)
			}
		}
	}
}

// receiveDigits reads the pod's RTP toward the carrier until want digits
// came as telephone events, checking the events' RTP: payload type 101,
// the call's SSRC, the marker on an event's first packet only, each
// event's end three times with its final duration, sequence numbers that
// go up by one across audio and events.
func (c *carrier) receiveDigits(want int) string {
	c.t.Helper()
	var (
		rx      dtmf.Receiver
		got     []byte
		ssrc    uint32
		lastSeq uint16
		first   = true
		ends    = map[uint32]int{}
	)
	buf := make([]byte, 2048)
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < want {
		_ = c.relay.SetReadDeadline(deadline)
		n, _, err := c.relay.ReadFromUDPAddrPort(buf)
		if err != nil {
			c.t.Fatalf("after digits %q: %v", got, err)
		}
		_, hl, err := encap.Decode(buf[:n])
		if err != nil {
			c.t.Fatal(err)
		}
		var p rtp.Packet
		if err := p.Unmarshal(buf[hl:n]); err != nil {
			c.t.Fatal(err)
		}
		if !first && (p.SSRC != ssrc || p.SequenceNumber != lastSeq+1) {
			c.t.Fatalf("SSRC %x seq %d after %x %d", p.SSRC, p.SequenceNumber, ssrc, lastSeq)
		}
		first, ssrc, lastSeq = false, p.SSRC, p.SequenceNumber
		if p.PayloadType != 101 {
			continue
		}
		e, err := dtmf.Parse(p.Payload)
		if err != nil {
			c.t.Fatal(err)
		}
		res, d := rx.Packet(p.Timestamp, p.Payload, time.Now())
		if (res == dtmf.ResultDigit) != p.Marker {
			c.t.Errorf("event at %d: marker %v on a packet that is %v", p.Timestamp, p.Marker, res)
		}
		if res == dtmf.ResultDigit {
			got = append(got, d)
		}
		if e.End {
			if e.Duration != 800 {
				c.t.Errorf("end of event at %d: duration %d", p.Timestamp, e.Duration)
			}
			ends[p.Timestamp]++
		}
	}
	// The last digit's two other ends.
	for ends[lastTS(ends)] < 3 {
		_ = c.relay.SetReadDeadline(deadline)
		n, _, err := c.relay.ReadFromUDPAddrPort(buf)
		if err != nil {
			c.t.Fatal(err)
		}
		_, hl, _ := encap.Decode(buf[:n])
		var p rtp.Packet
		if p.Unmarshal(buf[hl:n]) == nil && p.PayloadType == 101 {
			if e, err := dtmf.Parse(p.Payload); err == nil && e.End {
				ends[p.Timestamp]++
			}
		}
	}
	for ts, n := range ends {
		if n != 3 {
			c.t.Errorf("event at %d: %d end packets, want 3", ts, n)
		}
	}
	return string(got)
}

func lastTS(m map[uint32]int) uint32 {
	var last uint32
	first := true
	for ts := range m {
		if first || int32(ts-last) > 0 {
			last, first = ts, false
		}
	}
	return last
}

func dtmfCall(t *testing.T, b *dtmfBackend, law g711.Law) (*pod, *carrier, *rtpCall) {
	t.Helper()
	p := newPod(t, Config{Backend: b})
	media := netip.MustParseAddrPort("198.51.100.7:40000")
	res, err := p.t.CreateCall(context.Background(), CallRequest{Offer: carrierSDP(media, "0 8 101"), POPs: []POPAddr{popA}})
	if err != nil {
		t.Fatal(err)
	}
	call := p.call(t, res.ID)
	return p, newCarrier(t, p, media, call.nonce, law), call
}

// counterPair is the counter of name with direction and result.
func (p *pod) counterPair(t *testing.T, name, direction, result string) float64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["direction"] == direction && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestCallDTMFEcho: 16 digits from the carrier, with their repeated start
// and end packets, reach the backend exactly once each and in order; the
// backend's 16 digits go back to the carrier as RFC 4733 events on the
// call's stream, each detected exactly once.
func TestCallDTMFEcho(t *testing.T) {
	b := &dtmfBackend{echo: true}
	p, c, _ := dtmfCall(t, b, g711.PCMU)
	c.send(tone(700, 0, 160)) // the carrier's first datagram: the route back
	c.sendDigits(allKeys)
	if got := c.receiveDigits(len(allKeys)); got != allKeys {
		t.Errorf("the carrier heard %q, want %q", got, allKeys)
	}
	if got := b.got(); got != allKeys {
		t.Errorf("the backend got %q, want %q", got, allKeys)
	}
	for result, want := range map[string]float64{"digit": 16, "repeat": 16 * 8} {
		if n := p.counterPair(t, "rtcedge_transceiver_call_dtmf_total", "in", result); n != want {
			t.Errorf("in %s: %v, want %v", result, n, want)
		}
	}
	eventually(t, "16 digits counted sent", func() bool {
		return p.counterPair(t, "rtcedge_transceiver_call_dtmf_total", "out", "sent") == 16
	})
}

// TestCallDTMFBounds: digits asked for before the carrier's first
// datagram have no route; not digits, or past MaxDTMFQueued, are refused;
// a flood of events under new timestamps gives the backend no more than
// the per-call burst and rate, each packet counted; a call ending while
// it sends stops its sender (the leak check of TestMain).
func TestCallDTMFBounds(t *testing.T) {
	b := &dtmfBackend{}
	p, c, call := dtmfCall(t, b, g711.PCMA)
	if err := call.SendDTMF("1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a digit without a route to be counted", func() bool {
		return p.counterPair(t, "rtcedge_transceiver_call_dtmf_total", "out", "no_route") == 1
	})
	if err := call.SendDTMF("1x"); !errors.Is(err, backend.ErrDTMFDigits) {
		t.Errorf("not digits: %v", err)
	}
	if err := call.SendDTMF(strings.Repeat("5", backend.MaxDTMFQueued+1)); !errors.Is(err, backend.ErrDTMFQueueFull) {
		t.Errorf("too many digits: %v", err)
	}

	const flood = 1000
	start := time.Now()
	for i := range flood {
		c.pkt.SequenceNumber++
		c.pkt.Timestamp += 160
		h := c.pkt
		h.PayloadType = 101
		raw, _ := h.Marshal()
		if _, err := c.relay.WriteToUDPAddrPort(sealed(t, c.hdr, string(dtmf.Append(raw, dtmf.Event{Code: uint8(i % 16)}))), c.pod); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every event to be counted", func() bool {
		var n float64
		for _, r := range dtmf.Results {
			n += p.counterPair(t, "rtcedge_transceiver_call_dtmf_total", "in", r.String())
		}
		return n+p.counter(t, "rtcedge_transceiver_call_packets_total", "result", "late") == flood
	})
	bound := dtmf.Burst + int(time.Since(start).Seconds()*dtmf.Rate) + 1
	if got := len(b.got()); got < dtmf.Burst || got > bound {
		t.Errorf("a flood of %d events gave %d digits, want %d to %d", flood, got, dtmf.Burst, bound)
	}
	if n := p.counterPair(t, "rtcedge_transceiver_call_dtmf_total", "in", "rate"); n < flood-float64(bound)-p.counter(t, "rtcedge_transceiver_call_packets_total", "result", "late") {
		t.Errorf("rate drops counted %v", n)
	}

	if err := call.SendDTMF(strings.Repeat("9", backend.MaxDTMFQueued)); err != nil {
		t.Fatal(err)
	}
	if err := p.t.EndSession(call.id); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the call to be freed", func() bool { return p.t.Sessions() == 0 && p.t.sock.RTPCalls() == 0 })
	if err := call.SendDTMF("1"); !errors.Is(err, errCallEnded) {
		t.Errorf("after the end: %v", err)
	}
	if n := p.counterPair(t, "rtcedge_transceiver_call_dtmf_total", "out", "refused"); n != 3 {
		t.Errorf("refused %v, want 3", n)
	}
}
