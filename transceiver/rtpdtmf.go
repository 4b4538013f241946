// A phone call's keypad digits (RFC 4733 telephone events, docs/sip.md
// "DTMF"): the carrier's events become digits for the backend, each once
// (transceiver/dtmf), and the digits a backend or an app's sideband asks
// for go to the carrier as events on the call's RTP stream, between the
// paced reply's packets: same SSRC, the next sequence numbers, the
// timestamp of the event's start, the paced audio muted while a digit
// sounds.

package transceiver

import (
	"errors"
	"sync"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/transceiver/dtmf"
)

// What became of the digits asked for, the "result" label of
// rtcedge_transceiver_call_dtmf_total{direction="out"}.
const (
	dtmfSent    = iota // sent: its events went to the carrier
	dtmfNoRoute        // the carrier had sent no RTP yet: no route to it
	dtmfRefused        // refused by SendDTMF (not digits, a full queue, no telephone-event)
	numDTMFOut
)

var dtmfOutLabels = [numDTMFOut]string{dtmfSent: "sent", dtmfNoRoute: "no_route", dtmfRefused: "refused"}

// A digit the pod sends: 100 ms of tone in events 20 ms apart (ptime),
// the end sent three times 20 ms apart, then 60 ms of pause before the
// next (RFC 4733 §2.5.1; ITU-T Q.24 asks 40 ms of each at least).
const (
	dtmfStep      = 20 * time.Millisecond
	dtmfStepTicks = 160
	dtmfToneTicks = 800
	dtmfGapSteps  = 3
	dtmfVolume    = 10 // -10 dBm0
)

// errCallEnded is SendDTMF's error once the call ended.
var errCallEnded = errors.New("transceiver: the call has ended")

// callDigits is a phone call's DTMF state.
type callDigits struct {
	// Owned by the socket readers, under the call's inMu.
	rx dtmf.Receiver

	// The digits waiting to be sent and their sender, guarded by mu.
	mu      sync.Mutex
	queue   []byte
	running bool          // a sender goroutine runs
	stopped bool          // the call ended: no sender starts again
	stop    chan struct{} // closed when the call ends; made with the first sender
	done    chan struct{} // closed when the last sender started returns

	// Guarded by the call's outMu: a digit is sounding, the paced audio is
	// muted meanwhile (its frames still advance the RTP clock).
	muted bool
}

// dtmfPacket takes one of the carrier's telephone-event packets, its
// header in c.inHdr, after the SSRC and sequence checks; inMu held. A new
// digit goes to the backend.
func (c *rtpCall) dtmfPacket(payload []byte, now time.Time) {
	c.t.m.callPackets[callDTMF].Inc()
	res, d := c.digits.rx.Packet(c.inHdr.Timestamp, payload, now)
	c.t.m.dtmfIn[res].Inc()
	if res != dtmf.ResultDigit {
		return
	}
	if h, ok := c.handler.(backend.DTMFHandler); ok {
		h.DTMF(d)
	}
}

// SendDTMF implements backend.DTMFSender.
func (c *rtpCall) SendDTMF(digits string) error {
	err := c.queueDigits(digits)
	if err != nil {
		c.t.m.dtmfOut[dtmfRefused].Inc()
	}
	return err
}

func (c *rtpCall) queueDigits(digits string) error {
	switch {
	case c.offer.dtmfPT < 0:
		return backend.ErrDTMFUnsupported
	case digits == "" || !dtmf.ValidDigits(digits):
		return backend.ErrDTMFDigits
	}
	c.digits.mu.Lock()
	defer c.digits.mu.Unlock()
	switch {
	case c.digits.stopped:
		return errCallEnded
	case len(c.digits.queue)+len(digits) > backend.MaxDTMFQueued:
		return backend.ErrDTMFQueueFull
	}
	c.digits.queue = append(c.digits.queue, digits...)
	if !c.digits.running {
		if c.digits.stop == nil {
			c.digits.stop = make(chan struct{})
		}
		c.digits.running, c.digits.done = true, make(chan struct{})
		go c.sendDigits(c.digits.stop, c.digits.done)
	}
	return nil
}

// sendDigits sends the queued digits one after the other until the queue
// is empty or the call ends.
func (c *rtpCall) sendDigits(stop, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(dtmfStep)
	defer tick.Stop()
	for {
		c.digits.mu.Lock()
		if c.digits.stopped || len(c.digits.queue) == 0 {
			c.digits.running = false
			c.digits.mu.Unlock()
			return
		}
		d := c.digits.queue[0]
		c.digits.queue = c.digits.queue[:copy(c.digits.queue, c.digits.queue[1:])]
		c.digits.mu.Unlock()
		if !c.sendDigit(d, stop, tick.C) {
			return
		}
	}
}

// sendDigit sends one digit's events, one per tick, then its pause; false
// when the call ended meanwhile.
func (c *rtpCall) sendDigit(d byte, stop <-chan struct{}, tick <-chan time.Time) bool {
	code, _ := dtmf.Code(d)
	events := dtmf.Tone(code, dtmfVolume, dtmfToneTicks, dtmfStepTicks)
	var ts uint32
	for i, e := range events {
		select {
		case <-stop:
			return false
		case <-tick:
		}
		c.outMu.Lock()
		if c.outClosed {
			c.outMu.Unlock()
			return false
		}
		pop := uint16(c.pop.Load())
		if i == 0 {
			if pop == 0 {
				c.outMu.Unlock()
				c.t.m.dtmfOut[dtmfNoRoute].Inc()
				return true
			}
			ts, c.digits.muted = c.outHdr.Timestamp, true
		}
		c.sendEventLocked(pop, ts, i == 0, e)
		if i == len(events)-1 {
			c.digits.muted = false
			if end := ts + uint32(e.Duration); int32(c.outHdr.Timestamp-end) < 0 {
				c.outHdr.Timestamp = end // the audio goes on after the tone
			}
			c.t.m.dtmfOut[dtmfSent].Inc()
		}
		c.outMu.Unlock()
	}
	for range dtmfGapSteps {
		select {
		case <-stop:
			return false
		case <-tick:
		}
	}
	return true
}

// sendEventLocked sends one telephone-event packet of the event starting
// at ts on the call's stream; outMu held.
func (c *rtpCall) sendEventLocked(pop uint16, ts uint32, first bool, e dtmf.Event) {
	c.outHdr.SequenceNumber++
	h := c.outHdr
	h.PayloadType, h.Timestamp, h.Marker = uint8(c.offer.dtmfPT), ts, first
	buf := c.outBuf[:h.MarshalSize()]
	if _, err := h.MarshalTo(buf); err != nil {
		return
	}
	buf = dtmf.Append(buf, e)
	if c.t.sock.SendRTP(pop, c.media, buf) == nil {
		c.t.m.callPackets[callSent].Inc()
	}
}

// stopDigits ends the call's digit sending and waits for its sender;
// called by teardown, without outMu.
func (c *rtpCall) stopDigits() {
	c.digits.mu.Lock()
	c.digits.stopped = true
	if c.digits.stop != nil {
		close(c.digits.stop)
	}
	done := c.digits.done
	c.digits.mu.Unlock()
	if done != nil {
		<-done
	}
}

var (
	_ backend.DTMFSender = (*rtpCall)(nil)
)
