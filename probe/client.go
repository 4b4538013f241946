// Package probe is rtcedge's synthetic client: it places real calls the way
// a browser does (signaling over HTTP, WebRTC with Pion through the relays)
// against the echo backend, and measures every step: signaling time, ICE
// connected, DTLS connected, first echoed audio, audio RTT, jitter and loss.
// The end-to-end tests use it, and `rtcedge probe` runs it one-shot, as a
// continuous prober, or as a load generator.
package probe

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/internal/config"
)

// DefaultPath is the signaling endpoint probes post to.
const DefaultPath = "/v1/realtime/sdp"

// Config configures a probe call.
type Config struct {
	SignalingURL string       // base URL, e.g. http://127.0.0.1:8080
	Path         string       // default DefaultPath
	Token        string       // bearer credential; "" = none
	HTTPClient   *http.Client // default http.DefaultClient
	// FrameInterval is the audio packet interval; default 20ms (50 pps).
	FrameInterval time.Duration
	// PayloadSize is the size of each audio payload; default 80 bytes
	// (Opus voice at about 32 kbit/s). At least 16.
	PayloadSize int
	// Headers are extra request headers (e.g. CF-IPLatitude in tests).
	Headers http.Header
	// IPFilter, when set, limits the local addresses the client gathers
	// candidates on (tests keep everything on loopback with it); nil means
	// every address.
	IPFilter func(net.IP) bool
	// Transport is the candidates the client uses: TransportUDP (also
	// ""), TransportTCP (ICE-TCP to the POPs' passive TCP candidates only,
	// as from a network that drops UDP; docs/tcp.md) or TransportAny.
	Transport string
	// PacketConn, when set, is the client's one UDP socket: its ICE runs
	// over a UDP mux on it instead of sockets of its own (tests put the
	// client behind a netsim NAT this way). Close closes it.
	PacketConn net.PacketConn
	// Talk, when set, makes the call a synthetic talker (talker.go): it
	// sends Opus in turns and measures the replies instead of echo RTTs.
	Talk   *TalkConfig
	Logger *slog.Logger
}

// Transports of Config.Transport.
const (
	TransportUDP = "udp"
	TransportTCP = "tcp"
	TransportAny = "any"
)

// networkTypes returns the ICE network types of a transport.
func networkTypes(transport string) ([]webrtc.NetworkType, error) {
	udp := []webrtc.NetworkType{webrtc.NetworkTypeUDP4, webrtc.NetworkTypeUDP6}
	tcp := []webrtc.NetworkType{webrtc.NetworkTypeTCP4, webrtc.NetworkTypeTCP6}
	switch transport {
	case TransportAny:
		return append(udp, tcp...), nil
	case TransportUDP, "":
		return udp, nil
	case TransportTCP:
		return tcp, nil
	}
	return nil, fmt.Errorf("probe: transport %q: want udp, tcp or any", transport)
}

// Timings are measured from the moment the offer is posted.
type Timings struct {
	Signaling     time.Duration // POST → answer received
	ICEConnected  time.Duration
	DTLSConnected time.Duration // peer connection "connected"
	FirstEcho     time.Duration // first audio packet back from the echo
}

// Call is one live probe call.
type Call struct {
	cfg Config
	log *slog.Logger
	pc  *webrtc.PeerConnection
	mux *ice.UDPMuxDefault // over Config.PacketConn; nil without one
	out *webrtc.TrackLocalStaticRTP
	dc  *webrtc.DataChannel
	// talker is the call's voice when Config.Talk is set; nil otherwise.
	talker *talker

	// Location is the session resource signaling returned.
	Location string
	// Answer is the SDP answer.
	Answer string
	// Region, Cluster, POP are the placement signaling reported;
	// Steering why it chose the POP (X-Rtcedge-Steering).
	Region, Cluster, POP, Steering string

	start     time.Time
	mu        sync.Mutex
	timings   Timings // guarded by mu
	stats     rttStats
	events    chan []byte
	connected chan struct{}
	failed    chan struct{}
	echoed    chan struct{}
	seq       atomic.Uint32
	stop      chan struct{}
	stopOnce  sync.Once
	wg        sync.WaitGroup
}

// Dial posts an offer and waits until the call is connected (DTLS up and
// the events channel open) or ctx ends. The caller must Close the call.
func Dial(ctx context.Context, cfg Config) (*Call, error) {
	config.Default(&cfg.Path, DefaultPath)
	config.Default(&cfg.HTTPClient, http.DefaultClient)
	config.Default(&cfg.FrameInterval, 20*time.Millisecond)
	config.Default(&cfg.PayloadSize, 80)
	if cfg.PayloadSize < payloadHeader {
		return nil, fmt.Errorf("probe: payload size must be at least %d", payloadHeader)
	}
	config.Default(&cfg.Logger, slog.Default())
	c := &Call{
		cfg: cfg, log: cfg.Logger.With("component", "probe"),
		events: make(chan []byte, 64), connected: make(chan struct{}), failed: make(chan struct{}),
		echoed: make(chan struct{}), stop: make(chan struct{}),
	}
	if cfg.Talk != nil {
		t, err := newTalker(*cfg.Talk, cfg.FrameInterval)
		if err != nil {
			return nil, &CallError{Stage: StageSetup, Err: err}
		}
		c.talker = t
	}
	if err := c.setup(); err != nil {
		c.Close()
		return nil, &CallError{Stage: StageSetup, Err: err}
	}
	if err := c.negotiate(ctx); err != nil {
		c.Close()
		return nil, err
	}
	select {
	case <-c.connected:
	case <-c.failed:
		c.Close()
		return nil, &CallError{Stage: c.pendingStage(), Err: ErrConnectionFailed}
	case <-ctx.Done():
		c.Close()
		return nil, &CallError{Stage: c.pendingStage(), Err: fmt.Errorf("waiting for connection: %w", ctx.Err())}
	}
	c.wg.Add(1)
	go c.sendAudio()
	return c, nil
}

func (c *Call) setup() error {
	se := webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	types, err := networkTypes(c.cfg.Transport)
	if err != nil {
		return err
	}
	se.SetNetworkTypes(types)
	if c.cfg.IPFilter != nil {
		se.SetIPFilter(c.cfg.IPFilter)
	}
	if c.cfg.PacketConn != nil {
		c.mux = ice.NewUDPMuxDefault(ice.UDPMuxParams{UDPConn: c.cfg.PacketConn})
		se.SetICEUDPMux(c.mux)
	}
	me := &webrtc.MediaEngine{}
	if err := me.RegisterDefaultCodecs(); err != nil {
		return err
	}
	api := webrtc.NewAPI(webrtc.WithSettingEngine(se), webrtc.WithMediaEngine(me))
	pc, err := api.NewPeerConnection(webrtc.Configuration{BundlePolicy: webrtc.BundlePolicyMaxBundle})
	if err != nil {
		return err
	}
	c.pc = pc
	c.out, err = webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "probe")
	if err != nil {
		return err
	}
	if _, err := pc.AddTrack(c.out); err != nil {
		return err
	}
	c.dc, err = pc.CreateDataChannel("oai-events", nil)
	if err != nil {
		return err
	}
	dcOpen := make(chan struct{})
	c.dc.OnOpen(func() { close(dcOpen) })
	c.dc.OnMessage(func(m webrtc.DataChannelMessage) {
		select {
		case c.events <- m.Data:
		default:
		}
	})
	var pcUp atomic.Bool
	pc.OnICEConnectionStateChange(func(s webrtc.ICEConnectionState) {
		if s == webrtc.ICEConnectionStateConnected {
			c.mark(func(t *Timings) *time.Duration { return &t.ICEConnected })
		}
	})
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		switch s {
		case webrtc.PeerConnectionStateConnected:
			if pcUp.CompareAndSwap(false, true) {
				c.mark(func(t *Timings) *time.Duration { return &t.DTLSConnected })
				go func() {
					select {
					case <-dcOpen:
						close(c.connected)
					case <-c.stop:
					}
				}()
			}
		case webrtc.PeerConnectionStateFailed:
			select {
			case <-c.failed:
			default:
				close(c.failed)
			}
		}
	})
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		if c.talker != nil {
			c.readTalk(tr)
			return
		}
		c.readEcho(tr)
	})
	return nil
}

// pendingStage is the first connection stage not reached yet.
func (c *Call) pendingStage() string {
	t := c.Timings()
	switch {
	case t.ICEConnected == 0:
		return StageICE
	case t.DTLSConnected == 0:
		return StageDTLS
	default:
		return StageDataChannel
	}
}

func (c *Call) mark(field func(*Timings) *time.Duration) {
	c.mu.Lock()
	if p := field(&c.timings); *p == 0 {
		*p = time.Since(c.start)
	}
	c.mu.Unlock()
}

// negotiate posts the offer (complete, no trickle) and applies the answer.
// Its errors are CallErrors of the setup or signaling stage.
func (c *Call) negotiate(ctx context.Context) error {
	stage, err := c.offerAnswer(ctx)
	if err != nil {
		return &CallError{Stage: stage, Err: err}
	}
	return nil
}

func (c *Call) offerAnswer(ctx context.Context) (stage string, err error) {
	offer, err := c.pc.CreateOffer(nil)
	if err != nil {
		return StageSetup, fmt.Errorf("create offer: %w", err)
	}
	gathered := webrtc.GatheringCompletePromise(c.pc)
	if err := c.pc.SetLocalDescription(offer); err != nil {
		return StageSetup, fmt.Errorf("set local description: %w", err)
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return StageSetup, fmt.Errorf("gathering candidates: %w", ctx.Err())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.cfg.SignalingURL, "/")+c.cfg.Path,
		strings.NewReader(c.pc.LocalDescription().SDP))
	if err != nil {
		return StageSignaling, err
	}
	for k, v := range c.cfg.Headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/sdp")
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	c.start = time.Now()
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return StageSignaling, fmt.Errorf("post offer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<10))
	if err != nil {
		return StageSignaling, fmt.Errorf("read answer: %w", err)
	}
	c.mark(func(t *Timings) *time.Duration { return &t.Signaling })
	if resp.StatusCode != http.StatusCreated {
		return StageSignaling, &HTTPError{Status: resp.StatusCode, Body: string(bytes.TrimSpace(body))}
	}
	c.Location = resp.Header.Get("Location")
	c.Region, c.Cluster, c.POP = resp.Header.Get("X-Rtcedge-Region"), resp.Header.Get("X-Rtcedge-Cluster"), resp.Header.Get("X-Rtcedge-Pop")
	c.Steering = resp.Header.Get("X-Rtcedge-Steering")
	c.Answer = string(body)
	if err := c.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: c.Answer}); err != nil {
		return StageSignaling, fmt.Errorf("apply answer: %w", err)
	}
	return "", nil
}

// HTTPError is a non-201 answer from signaling.
type HTTPError struct {
	Status int
	Body   string
}

func (e *HTTPError) Error() string { return fmt.Sprintf("signaling answered %d: %s", e.Status, e.Body) }

// payloadHeader is the probe's own prefix in every audio payload: a magic,
// a sequence number and the send time, so that the echo gives RTT directly.
const payloadHeader = 16

var payloadMagic = [4]byte{'r', 't', 'c', 'e'}

func (c *Call) sendAudio() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.FrameInterval)
	defer tick.Stop()
	payload := make([]byte, c.cfg.PayloadSize)
	samples := uint32(c.cfg.FrameInterval * 48000 / time.Second)
	pkt := &rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111}}
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		seq := c.seq.Add(1)
		if c.talker != nil {
			if err := c.sendTalk(pkt, seq, samples); err != nil {
				c.log.Debug("talker frame", "err", err)
			}
			continue
		}
		copy(payload, payloadMagic[:])
		binary.BigEndian.PutUint32(payload[4:], seq)
		binary.BigEndian.PutUint64(payload[8:], uint64(time.Since(c.start)))
		pkt.SequenceNumber = uint16(seq)
		pkt.Timestamp = seq * samples
		pkt.Payload = payload
		if err := c.out.WriteRTP(pkt); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			c.log.Debug("write rtp", "err", err)
		}
		c.stats.sent(seq)
	}
}

func (c *Call) readEcho(tr *webrtc.TrackRemote) {
	buf := make([]byte, 1500)
	var pkt rtp.Packet
	first := true
	for {
		n, _, err := tr.Read(buf)
		if err != nil {
			return
		}
		if pkt.Unmarshal(buf[:n]) != nil || len(pkt.Payload) < payloadHeader || !bytes.Equal(pkt.Payload[:4], payloadMagic[:]) {
			continue
		}
		seq := binary.BigEndian.Uint32(pkt.Payload[4:])
		sent := time.Duration(binary.BigEndian.Uint64(pkt.Payload[8:]))
		now := time.Since(c.start)
		c.stats.received(seq, now, now-sent)
		if first {
			first = false
			c.mark(func(t *Timings) *time.Duration { return &t.FirstEcho })
			close(c.echoed)
		}
	}
}

// WaitEcho waits for the first echoed audio packet.
func (c *Call) WaitEcho(ctx context.Context) error {
	select {
	case <-c.echoed:
		return nil
	case <-ctx.Done():
		return &CallError{Stage: StageFirstEcho, Err: fmt.Errorf("no echoed audio: %w", ctx.Err())}
	}
}

// SendEvent sends a message on the oai-events channel.
func (c *Call) SendEvent(b []byte) error { return c.dc.Send(b) }

// Events returns received oai-events messages.
func (c *Call) Events() <-chan []byte { return c.events }

// Timings returns the setup timings measured so far.
func (c *Call) Timings() Timings {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timings
}

// Stats returns the audio statistics so far.
func (c *Call) Stats() AudioStats { return c.stats.snapshot() }

// SelectedPair returns the local and remote addresses of the selected ICE
// candidate pair, once ICE has selected one.
func (c *Call) SelectedPair() (local, remote netip.AddrPort, ok bool) {
	p, err := c.pc.SCTP().Transport().ICETransport().GetSelectedCandidatePair()
	if err != nil || p == nil {
		return netip.AddrPort{}, netip.AddrPort{}, false
	}
	la, err1 := netip.ParseAddr(p.Local.Address)
	ra, err2 := netip.ParseAddr(p.Remote.Address)
	if err1 != nil || err2 != nil {
		return netip.AddrPort{}, netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(la.Unmap(), p.Local.Port), netip.AddrPortFrom(ra.Unmap(), p.Remote.Port), true
}

// ConnectionState returns the peer connection state.
func (c *Call) ConnectionState() webrtc.PeerConnectionState { return c.pc.ConnectionState() }

// Hangup deletes the session at signaling (DELETE of Location).
func (c *Call) Hangup(ctx context.Context) error {
	if c.Location == "" {
		return errors.New("probe: no session to hang up")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, strings.TrimSuffix(c.cfg.SignalingURL, "/")+c.Location, nil)
	if err != nil {
		return err
	}
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return &HTTPError{Status: resp.StatusCode, Body: string(body)}
	}
	return nil
}

// Close stops sending and closes the peer connection. Idempotent.
func (c *Call) Close() error {
	c.stopOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
	if c.talker != nil {
		c.talker.enc.Close() // the sender has returned
	}
	var err error
	if c.pc != nil {
		err = c.pc.GracefulClose()
	}
	if c.mux != nil {
		_ = c.mux.Close() // and with it Config.PacketConn
	}
	return err
}
