// A phone call at the pod (docs/wire.md §6, docs/sip.md): a session of
// kind rtp, beside the WebRTC sessions. Its media is plain RTP with the
// carrier (PCMU or PCMA), through the same relays and the same pod
// socket; the backend hears and speaks it as Opus, the one audio format
// of backend.Handler, so every backend, the pacer, barge-in and the turn
// metrics work as for a WebRTC call. The codec runs at 8 kHz both ways:
// the caller's G.711 is decoded and coded as narrowband Opus, the reply's
// Opus decoded at 8 kHz and coded as G.711 (libopus resamples, as it
// does for a Realtime backend's rate).

package transceiver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/rtp"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/opus"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/transceiver/g711"
	"github.com/rtcedge/rtcedge/transceiver/pace"
	"github.com/rtcedge/rtcedge/transceiver/podnet"
	"github.com/rtcedge/rtcedge/transceiver/vad"
)

// CallRequest asks for a phone call (session API kind rtp).
type CallRequest struct {
	// Offer is the carrier's SDP offer, as the SIP front received it.
	Offer string
	// POPs: the first is the POP whose VIP the answer names.
	POPs []POPAddr
	// Config and Caller are the backend's, as for CreateRequest.
	Config []byte
	Caller *sessionapi.Caller
}

// ssrcSilence is how long a call's SSRC must have been silent before RTP
// of another SSRC is taken (a carrier's media server switching streams);
// before that, another SSRC is a stranger's and dropped (wire.md §6).
const ssrcSilence = 200 * time.Millisecond

// callFrame is the Opus frame the backend is given: 20 ms at 8 kHz.
const (
	callFrame        = 20 * time.Millisecond
	callFrameSamples = g711.ClockRate / 50
	g711Sample       = time.Second / g711.ClockRate // one byte of G.711
)

// rtpCall is one phone call.
type rtpCall struct {
	// Static after newCall.
	id          string
	t           *Transceiver
	media       netip.AddrPort // the carrier's negotiated RTP address
	token       string         // the routing token minted for the call (its ufrag form)
	nonce       [6]byte        // its nonce: the headers of the call's datagrams carry it
	offer       carrierOffer
	pass        bool // G.711 both ways, no codec (rtppass.go)
	created     time.Time
	handler     backend.Handler
	interrupter backend.Interrupter
	play        *pace.Queue

	lastRTP    atomic.Int64  // unix nanos of the last RTP taken; creation before
	lastStored atomic.Int64  // unix nanos the call's route entry was last written
	pop        atomic.Uint32 // POP of the carrier's last datagram; 0 before one

	// The caller's side, owned by the socket readers (one at a time under
	// inMu).
	inMu     sync.Mutex
	inClosed bool // the backend is closed: no Audio after it
	inHdr    rtp.Header
	ssrc     uint32
	haveSeq  bool
	lastSeq  uint16
	seen     uint64  // the window of sequence numbers taken: bit i is lastSeq-i
	intake   intake  // the caller's credit of audio (intake.go)
	pcm      []int16 // decoded samples not yet a whole frame
	enc      *opus.Encoder
	opusBuf  []byte
	vad      vad.Detector

	// The reply's side, owned by the pacer (outMu).
	outMu     sync.Mutex
	outClosed bool
	dec       *opus.Decoder
	outPCM    []int16
	outHdr    rtp.Header
	outBuf    []byte
	outTSFrac int64

	digits callDigits // keypad digits both ways (rtpdtmf.go)
	ended  callEnd    // the call's end, for the SIP front (rtpend.go)

	forgotten    bool // guarded by t.mu
	endOnce      sync.Once
	teardownOnce sync.Once
}

// CreateCall creates a phone call for a carrier's offer and returns the
// pod's answer. Its media flows once the carrier's first RTP datagram
// arrives; without RTP for Config.RTPTimeout it ends.
func (t *Transceiver) CreateCall(ctx context.Context, req CallRequest) (CreateResult, error) {
	o, err := parseCarrierOffer(req.Offer)
	if err != nil {
		t.m.rejected.WithLabelValues(rejectBadOffer).Inc()
		return CreateResult{}, err
	}
	if err := t.reserve(); err != nil {
		return CreateResult{}, err
	}
	defer t.creates.Done()
	c, answer, err := t.newCall(ctx, req, o)
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("create call: %w", ctx.Err())
	}
	t.mu.Lock()
	t.reserved--
	if err == nil {
		switch {
		case t.closed:
			err = ErrClosed
		case c.forgotten:
			err = ErrBackendEnded
		default:
			t.calls[c.id] = c
			t.setSessionsGaugeLocked()
		}
	}
	t.maybeDrainedLocked()
	t.mu.Unlock()
	if err != nil {
		if c != nil {
			c.endOnce.Do(func() {})
			c.teardown()
		}
		if errors.Is(err, ErrBadOffer) {
			t.m.rejected.WithLabelValues(rejectBadOffer).Inc()
		} else {
			t.countRejected(err)
		}
		return CreateResult{}, err
	}
	t.m.created.Inc()
	t.m.calls.Inc()
	if c.pass {
		t.m.passCalls.Inc()
	}
	c.storeRoute(t.cfg.Now())
	return CreateResult{ID: c.id, Answer: answer}, nil
}

// callRouteRefresh is how often a call's route entry is written again
// until its carrier's first datagram arrives (a slow ACK): the global
// relays' cache_refresh, so that an entry is never older than they take.
const callRouteRefresh = 20 * time.Second

// storeRoute writes the call's pod-sealed route entry (docs/wire.md §6):
// the carrier's address → this pod, under the call's token. From the
// carrier's first datagram on, the global relay that opened the flow
// keeps the entry fresh under its own key.
func (c *rtpCall) storeRoute(now time.Time) {
	rc := c.t.cfg.RouteCache
	if rc == nil {
		return
	}
	c.lastStored.Store(now.UnixNano())
	rt := routecache.Route{Cluster: c.t.cfg.Cluster, Pod: c.t.cfg.Pod, Token: c.nonce, Stored: uint32(now.Unix())}
	rt.KeyID, rt.Tag = c.t.sock.SealPodRoute(c.media, c.nonce, rt.Stored)
	rc.Store(c.media, rt)
}

// refreshRoute rewrites the call's entry every callRouteRefresh while its
// carrier has sent nothing (housekeep).
func (c *rtpCall) refreshRoute(now time.Time) {
	if c.pop.Load() == 0 && now.UnixNano()-c.lastStored.Load() >= int64(callRouteRefresh) {
		c.storeRoute(now)
	}
}

func (t *Transceiver) newCall(ctx context.Context, req CallRequest, o carrierOffer) (*rtpCall, string, error) {
	if _, err := t.muxesFor(req.POPs); err != nil { // binds every POP's ID to its VIP
		return nil, "", err
	}
	ufrag, err := t.cfg.Keys.Mint(t.cfg.Cluster, t.cfg.Pod)
	if err != nil {
		return nil, "", fmt.Errorf("mint token: %w", err)
	}
	tok, err := t.cfg.Keys.Verify([]byte(ufrag))
	if err != nil {
		return nil, "", fmt.Errorf("minted token: %w", err)
	}
	id, err := t.newID()
	if err != nil {
		return nil, "", err
	}
	c := &rtpCall{id: id, t: t, media: o.media, token: ufrag, nonce: tok.Nonce, offer: o, created: t.cfg.Now(),
		pcm: make([]int16, 0, 2*callFrameSamples+g711.ClockRate/10), opusBuf: make([]byte, opus.MaxPacket),
		outPCM: make([]int16, g711.ClockRate*120/1000), outBuf: make([]byte, 0, 12+g711.ClockRate*120/1000)}
	c.lastRTP.Store(c.created.UnixNano())
	c.outHdr = rtp.Header{Version: 2, Marker: true, PayloadType: o.pt, SequenceNumber: uint16(rand.Uint32()),
		Timestamp: rand.Uint32(), SSRC: rand.Uint32()}
	c.play = t.pacer.NewQueue(c)
	info := t.sessionInfo(id, CreateRequest{Config: req.Config, Caller: req.Caller})
	if info.G711, err = c.codecs(); err != nil { // rtppass.go: none for a backend that takes G.711
		return c, "", err
	}
	c.handler, err = t.cfg.Backend.Open(ctx, info, c)
	if err != nil {
		return c, "", fmt.Errorf("open backend: %w", err)
	}
	c.interrupter, _ = c.handler.(backend.Interrupter)
	// Registered last: the socket's readers see the call whole.
	if err := t.sock.AddRTP(o.media, tok.Nonce, c); err != nil {
		return c, "", fmt.Errorf("%w: %w", ErrBadOffer, err)
	}
	return c, callAnswer(id, req.POPs[0].VIP, o), nil
}

// RTP implements podnet.RTPCall: one datagram from the carrier's address.
func (c *rtpCall) RTP(pop uint16, b []byte) {
	now := c.t.cfg.Now()
	c.pop.Store(uint32(pop))
	if len(b) >= 2 && b[1] >= 192 && b[1] <= 223 {
		c.t.m.callPackets[callRTCP].Inc() // RTCP (rtcp-mux): the pod needs none of it
		return
	}
	c.inMu.Lock()
	defer c.inMu.Unlock()
	n, err := c.inHdr.Unmarshal(b)
	switch {
	case err != nil || n >= len(b) || c.inClosed:
		c.t.m.callPackets[callMalformed].Inc()
		return
	case c.inHdr.PayloadType != c.offer.pt && int(c.inHdr.PayloadType) != c.offer.dtmfPT:
		c.t.m.callPackets[callPayloadType].Inc()
		return
	}
	last := c.lastRTP.Load()
	if c.haveSeq && c.inHdr.SSRC != c.ssrc {
		if now.UnixNano()-last < int64(ssrcSilence) {
			c.t.m.callPackets[callSSRC].Inc()
			return
		}
		c.haveSeq = false // a new stream: its own sequence
	}
	if !c.seqWindow() {
		c.t.m.callPackets[callLate].Inc()
		return
	}
	c.ssrc = c.inHdr.SSRC
	c.lastRTP.Store(now.UnixNano())
	payload := b[n:]
	if c.inHdr.Padding && len(payload) > 0 {
		payload = payload[:max(0, len(payload)-int(payload[len(payload)-1]))]
	}
	if int(c.inHdr.PayloadType) == c.offer.dtmfPT {
		c.dtmfPacket(payload, now)
		return
	}
	if !c.intake.admit(now, time.Duration(len(payload))*g711Sample) {
		c.t.m.dropped[dropCallerAudio].Inc() // over 1.5x real time (intake.go)
		return
	}
	c.t.m.callPackets[callAudio].Inc()
	if c.pass {
		c.passIn(payload)
		return
	}
	if len(payload) > cap(c.pcm)-len(c.pcm) {
		payload = payload[:cap(c.pcm)-len(c.pcm)] // longer than 100 ms: the rest is not heard
	}
	c.pcm = c.offer.law.Decode(c.pcm, payload)
	for len(c.pcm) >= callFrameSamples {
		c.frameIn(c.pcm[:callFrameSamples])
		c.pcm = c.pcm[:copy(c.pcm, c.pcm[callFrameSamples:])]
	}
}

// seqWindow takes the header's sequence number into the window of the
// last 64: a repeat or one older than the window is refused (a replay, or
// too late to be heard). One that a later one overtook is taken, heard a
// frame late rather than lost (several socket readers may hand a call's
// datagrams on out of order). inMu held.
func (c *rtpCall) seqWindow() bool {
	seq := c.inHdr.SequenceNumber
	if !c.haveSeq {
		c.lastSeq, c.seen, c.haveSeq = seq, 1, true
		return true
	}
	switch d := int16(seq - c.lastSeq); {
	case d > 0:
		if d >= 64 {
			c.seen = 0
		} else {
			c.seen <<= uint(d)
		}
		c.seen |= 1
		c.lastSeq = seq
		return true
	case d > -64 && c.seen&(1<<uint(-d)) == 0:
		c.seen |= 1 << uint(-d)
		return true
	}
	return false
}

// frameIn codes one 20 ms frame of the caller as Opus for the backend;
// inMu held.
func (c *rtpCall) frameIn(pcm []int16) {
	n, err := c.enc.Encode(pcm, c.opusBuf)
	if err != nil {
		c.t.m.callPackets[callCodec].Inc()
		return
	}
	p := c.opusBuf[:n]
	if c.interrupter != nil {
		c.edgeVAD(p)
	}
	c.handler.Audio(p, callFrame)
}

// edgeVAD is the session's (play.go) for a phone call; inMu held.
func (c *rtpCall) edgeVAD(p []byte) {
	now := time.Now()
	switch c.vad.Frame(p, now) {
	case vad.SpeechStarted:
		if !c.play.Playing() {
			return
		}
		if cl := c.clearReply(backend.ClearEdge, c.vad.Onset()); cl.Active {
			c.interrupter.Interrupted(backend.ClearEdge, cl.ItemID, cl.Played)
		}
	case vad.SpeechStopped:
		c.play.SpeechStopped(c.vad.Onset())
		c.interrupter.SpeechStopped()
	}
}

// SendFrame implements pace.Output: one Opus frame of the reply, decoded
// at 8 kHz and sent to the carrier as one G.711 RTP packet (a passthrough
// call's frame is G.711 already: sent as it is). An empty frame only
// advances the RTP clock.
func (c *rtpCall) SendFrame(payload []byte, d time.Duration) {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	ticks := int64(d)*g711.ClockRate + c.outTSFrac
	c.outTSFrac = ticks % int64(time.Second)
	advance := uint32(ticks / int64(time.Second))
	defer func() { c.outHdr.Timestamp += advance }()
	if len(payload) == 0 || c.outClosed || c.digits.muted {
		return
	}
	n, err := c.decodeReply(payload)
	if err != nil {
		c.t.m.callPackets[callCodec].Inc()
		return
	}
	pop := uint16(c.pop.Load())
	if pop == 0 {
		c.t.m.callPackets[callNoRoute].Inc() // the carrier has sent nothing yet: no route to it
		return
	}
	c.outHdr.SequenceNumber++
	buf := c.outBuf[:c.outHdr.MarshalSize()]
	if _, err := c.outHdr.MarshalTo(buf); err != nil {
		return
	}
	if c.pass {
		buf = append(buf, payload...)
	} else {
		buf = c.offer.law.Encode(buf, c.outPCM[:n])
	}
	c.outHdr.Marker = false
	if c.t.sock.SendRTP(pop, c.media, buf) == nil {
		c.t.m.callPackets[callSent].Inc()
	}
}

// Started implements pace.Output: the turn's reply delay. A phone call
// has no events channel; its sidebands are not served yet.
func (c *rtpCall) Started(_ string, replyDelay time.Duration) {
	if replyDelay >= 0 {
		c.t.m.replyDelay.WithLabelValues(c.popLabel()).Observe(replyDelay.Seconds())
	}
}

// Stopped implements pace.Output.
func (c *rtpCall) Stopped(string) {}

func (c *rtpCall) popLabel() string { return fmt.Sprint(c.pop.Load()) }

// WriteAudio implements backend.Sink: paced as a WebRTC call's reply.
func (c *rtpCall) WriteAudio(payload []byte, d time.Duration) error { return c.play.Push(payload, d) }

// WriteRaw implements backend.RawWriter.
func (c *rtpCall) WriteRaw(frame []byte, d time.Duration, enc backend.FrameEncoder) error {
	return c.play.PushRaw(frame, d, enc)
}

// SendEvent implements backend.Sink: a phone call has no events channel
// toward its caller; the backend's events reach no one.
func (c *rtpCall) SendEvent([]byte) error { return errChannelNotOpen }

// BeginItem implements backend.Player.
func (c *rtpCall) BeginItem(responseID, itemID string) { c.play.BeginItem(responseID, itemID) }

// EndResponse implements backend.Player.
func (c *rtpCall) EndResponse(responseID string) { c.play.EndResponse(responseID) }

// AwaitStart implements backend.StartAwaiter.
func (c *rtpCall) AwaitStart(responseID string) { c.play.AwaitStart(responseID, 2*opus.FrameDuration) }

// SpeechStopped implements backend.Player.
func (c *rtpCall) SpeechStopped() { c.play.SpeechStopped(time.Now()) }

// Clear implements backend.Player.
func (c *rtpCall) Clear(source string) (string, time.Duration, bool) {
	cl := c.clearReply(source, time.Now())
	return cl.ItemID, cl.Played, cl.Active
}

func (c *rtpCall) clearReply(source string, onset time.Time) pace.Cleared {
	cl := c.play.Clear()
	if cl.Active {
		c.t.m.bargeins.WithLabelValues(source).Inc()
		c.t.m.bargeinStop.WithLabelValues(c.popLabel()).Observe(max(0, cl.LastReply.Sub(onset)).Seconds())
	}
	return cl
}

// End implements backend.Ender.
func (c *rtpCall) End(reason string) {
	c.t.log.Info("backend ended the call", "session", c.id, "reason", reason)
	c.end(endBackend)
}

// The call is the Sink its backend gets, with the pod's paced output.
var (
	_ backend.Player       = (*rtpCall)(nil)
	_ backend.RawWriter    = (*rtpCall)(nil)
	_ backend.StartAwaiter = (*rtpCall)(nil)
	_ backend.Ender        = (*rtpCall)(nil)
	_ podnet.RTPCall       = (*rtpCall)(nil)
)

// rtpSilent reports whether the carrier has sent no RTP for timeout.
func (c *rtpCall) rtpSilent(now time.Time, timeout time.Duration) bool {
	return now.UnixNano()-c.lastRTP.Load() > int64(timeout)
}

// end removes the call and frees it in the background.
func (c *rtpCall) end(reason string) {
	c.endOnce.Do(func() {
		c.ended.fire(reason)
		c.t.forgetCall(c)
		c.t.m.ended.WithLabelValues(reason).Inc()
		go func() {
			defer c.t.wg.Done()
			c.teardown()
		}()
	})
}

// teardown frees everything the call holds: its registration and routes
// in the packet layer, the backend, the pacer's queue and the codecs.
func (c *rtpCall) teardown() {
	c.teardownOnce.Do(func() {
		c.t.sock.RemoveRTP(c.media, c)
		c.stopDigits()
		if rc := c.t.cfg.RouteCache; rc != nil && c.lastStored.Load() != 0 {
			rc.Delete(c.media) // the relays' flow idles out by itself
		}
		c.inMu.Lock()
		c.inClosed = true
		c.inMu.Unlock()
		if c.handler != nil {
			_ = c.handler.Close()
		}
		c.play.Close()
		c.outMu.Lock()
		c.outClosed = true
		c.outMu.Unlock()
		c.inMu.Lock()
		if c.enc != nil {
			c.enc.Close()
		}
		c.inMu.Unlock()
		c.outMu.Lock()
		if c.dec != nil {
			c.dec.Close()
		}
		c.outMu.Unlock()
	})
}
