package capacity

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/interceptor"
	"github.com/pion/logging"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/transceiver"
)

// Audio shape of every session: Opus voice at 50 packets a second.
const (
	frameInterval = 20 * time.Millisecond
	payloadSize   = 80
	frameSamples  = 960 // 20 ms at 48 kHz
	// slots spreads the sends of a frame over 1 ms slots, so the pod sees
	// a steady stream rather than one burst every 20 ms.
	slots = int(frameInterval / time.Millisecond)
)

// FleetConfig configures a Fleet.
type FleetConfig struct {
	Link *Link
	// API is the pod's session API base URL (http://host:port).
	API string
	// POP is the POP ID sessions are created with; the Link must use it too.
	POP uint16
	// DataChannel opens the oai-events data channel in every session, as
	// real clients do (an SCTP association per session on both sides).
	DataChannel bool
	// Senders is how many goroutines send audio; default 2.
	Senders int
	// HTTPClient for the session API; default a client with keep-alives.
	HTTPClient *http.Client
	// Opus, when set, is real audio for a transcoding backend: every
	// client sends these frames in a loop, each from its own offset, and a
	// window counts every frame received while it is open (the backend's
	// reply carries no send time: no RTT).
	Opus [][]byte
}

// Fleet is a set of cheap Pion clients sending voice to a pod through one
// Link and counting the echo. Clients are added with Add and all closed by
// Close.
type Fleet struct {
	// Static after NewFleet.
	cfg   FleetConfig
	me    *webrtc.MediaEngine
	ir    *interceptor.Registry
	base  webrtc.SettingEngine
	start time.Time

	mu      sync.Mutex
	clients []*client // guarded by mu
	closed  bool      // guarded by mu

	audioOn atomic.Bool
	win     atomic.Pointer[Window]
	rtt     histogram

	stop    chan struct{}
	senders sync.WaitGroup
	readers sync.WaitGroup
}

// NewFleet prepares the shared Pion state and starts the senders. Audio
// is off until SetAudio(true).
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if cfg.Senders <= 0 {
		cfg.Senders = 2
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	me := &webrtc.MediaEngine{}
	if err := me.RegisterCodec(webrtc.RTPCodecParameters{
		RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2},
		PayloadType:        111,
	}, webrtc.RTPCodecTypeAudio); err != nil {
		return nil, err
	}
	quiet := logging.NewDefaultLoggerFactory()
	quiet.DefaultLogLevel = logging.LogLevelDisabled
	se := webrtc.SettingEngine{LoggerFactory: quiet}
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	f := &Fleet{
		cfg: cfg, me: me,
		// An empty registry, not nil: NewAPI would install the default
		// interceptors (NACK, reports, TWCC) that the load generator does
		// not need.
		ir:    &interceptor.Registry{},
		base:  se,
		start: time.Now(),
		stop:  make(chan struct{}),
	}
	for i := range cfg.Senders {
		f.senders.Add(1)
		go f.sendLoop(i)
	}
	return f, nil
}

// client is one call of the fleet.
type client struct {
	pc    *webrtc.PeerConnection
	mux   *ice.UDPMuxDefault
	conn  interface{ Close() error }
	track *webrtc.TrackLocalStaticRTP
	// Owned by the sender goroutine that serves this client.
	pkt     rtp.Packet
	payload [payloadSize]byte
	next    int // the next of FleetConfig.Opus to send
}

// Size returns the number of clients added so far.
func (f *Fleet) Size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.clients)
}

// Add places one call: offer to the pod's session API, ICE, DTLS (and the
// data channel when configured); it returns once the call is connected.
func (f *Fleet) Add(ctx context.Context) error {
	conn, err := f.cfg.Link.NewConn()
	if err != nil {
		return err
	}
	mux := ice.NewUDPMuxDefault(ice.UDPMuxParams{UDPConn: conn, Logger: f.base.LoggerFactory.NewLogger("mux")})
	c := &client{conn: conn, mux: mux, next: f.Size() * 7}
	c.pkt.Header = rtp.Header{Version: 2, PayloadType: 111}
	fail := func(err error) error {
		if c.pc != nil {
			_ = c.pc.Close()
		}
		_ = mux.Close()
		_ = conn.Close()
		return err
	}
	se := f.base
	se.SetICEUDPMux(mux)
	api := webrtc.NewAPI(webrtc.WithSettingEngine(se), webrtc.WithMediaEngine(f.me), webrtc.WithInterceptorRegistry(f.ir))
	pc, err := api.NewPeerConnection(webrtc.Configuration{BundlePolicy: webrtc.BundlePolicyMaxBundle})
	if err != nil {
		return fail(err)
	}
	c.pc = pc
	c.track, err = webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "capacity")
	if err != nil {
		return fail(err)
	}
	if _, err := pc.AddTrack(c.track); err != nil {
		return fail(err)
	}
	ready := make(chan struct{})
	var readyOnce sync.Once
	markReady := func() { readyOnce.Do(func() { close(ready) }) }
	failed := make(chan struct{})
	var failOnce sync.Once
	if f.cfg.DataChannel {
		dc, err := pc.CreateDataChannel(transceiver.EventsLabel, nil)
		if err != nil {
			return fail(err)
		}
		dc.OnOpen(markReady)
	}
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		switch s {
		case webrtc.PeerConnectionStateConnected:
			if !f.cfg.DataChannel {
				markReady()
			}
		case webrtc.PeerConnectionStateFailed, webrtc.PeerConnectionStateClosed:
			failOnce.Do(func() { close(failed) })
		}
	})
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		f.readers.Add(1)
		defer f.readers.Done()
		f.readEcho(tr)
	})

	offer, err := pc.CreateOffer(nil)
	if err != nil {
		return fail(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		return fail(err)
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	answer, err := f.createSession(ctx, pc.LocalDescription().SDP)
	if err != nil {
		return fail(err)
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
		return fail(fmt.Errorf("apply answer: %w", err))
	}
	select {
	case <-ready:
	case <-failed:
		return fail(errors.New("capacity: peer connection failed"))
	case <-ctx.Done():
		return fail(fmt.Errorf("connect: %w", ctx.Err()))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fail(errFleetClosed)
	}
	f.clients = append(f.clients, c)
	return nil
}

// errFleetClosed refuses clients added during or after Close.
var errFleetClosed = errors.New("capacity: fleet closed")

func (f *Fleet) createSession(ctx context.Context, offer string) (string, error) {
	body, err := json.Marshal(transceiver.APICreateRequest{
		Offer: offer,
		POPs:  []transceiver.POPAddr{{ID: f.cfg.POP, VIP: f.cfg.Link.VIP()}},
	})
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(f.cfg.API, "/")+transceiver.SessionsPath, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.cfg.HTTPClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("create session: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<10))
	if err != nil {
		return "", fmt.Errorf("create session: %w", err)
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("create session: %d %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var out transceiver.APICreateResponse
	if err := json.Unmarshal(b, &out); err != nil {
		return "", fmt.Errorf("create session: %w", err)
	}
	return out.Answer, nil
}

// SetAudio starts or stops the audio of every client.
func (f *Fleet) SetAudio(on bool) { f.audioOn.Store(on) }

// sendLoop sends one frame per client every 20 ms for the clients i with
// i % Senders == shard, each in the 1 ms slot i/Senders % 20. It catches up
// on slots it overslept, so a busy machine delays packets rather than
// silently sending fewer.
func (f *Fleet) sendLoop(shard int) {
	defer f.senders.Done()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	next := int64(0) // next 1 ms slot to serve, counted from f.start
	var batch []*client
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
		now := int64(time.Since(f.start) / time.Millisecond)
		if next == 0 || now-next > int64(slots) {
			next = now // first tick, or so far behind that a whole frame is lost anyway
		}
		for ; next <= now; next++ {
			if !f.audioOn.Load() {
				continue
			}
			slot := int(next % int64(slots))
			batch = batch[:0]
			f.mu.Lock()
			for i := shard; i < len(f.clients); i += f.cfg.Senders {
				if (i/f.cfg.Senders)%slots == slot {
					batch = append(batch, f.clients[i])
				}
			}
			f.mu.Unlock()
			for _, c := range batch {
				f.send(c)
			}
		}
	}
}

// SendFrames sends n audio frames on every client at once, unpaced; with
// Link.StartRecording it produces packets to replay.
func (f *Fleet) SendFrames(n int) {
	f.mu.Lock()
	cs := append([]*client(nil), f.clients...)
	f.mu.Unlock()
	for _, c := range cs {
		for range n {
			f.send(c)
		}
	}
}

// send writes one audio frame; the payload carries its send time, so that
// the echo gives the RTT and a window can count it by when it was sent.
func (f *Fleet) send(c *client) {
	sent := int64(time.Since(f.start))
	binary.BigEndian.PutUint64(c.payload[:8], uint64(sent))
	c.pkt.SequenceNumber++
	c.pkt.Timestamp += frameSamples
	c.pkt.Payload = c.payload[:]
	if n := len(f.cfg.Opus); n > 0 {
		c.pkt.Payload = f.cfg.Opus[c.next%n]
		c.next++
	}
	if c.track.WriteRTP(&c.pkt) != nil {
		return
	}
	if w := f.win.Load(); w != nil && sent >= w.from && sent < w.to {
		w.sent.Add(1)
	}
}

func (f *Fleet) readEcho(tr *webrtc.TrackRemote) {
	buf := make([]byte, 1500)
	var h rtp.Header
	for {
		n, _, err := tr.Read(buf)
		if err != nil {
			return
		}
		hl, err := h.Unmarshal(buf[:n])
		now := int64(time.Since(f.start))
		if w := f.win.Load(); err == nil && w != nil && f.cfg.Opus != nil {
			if now >= w.from && now < w.to {
				w.recv.Add(1)
			}
			continue
		}
		if err != nil || n-hl < 8 {
			continue
		}
		sent := int64(binary.BigEndian.Uint64(buf[hl:]))
		if w := f.win.Load(); w != nil && sent >= w.from && sent < w.to {
			w.recv.Add(1)
			f.rtt.add(time.Duration(now - sent))
		}
	}
}

// Window counts the audio sent during one interval and the echo of it.
type Window struct {
	from, to   int64 // nanoseconds since the fleet started
	sent, recv atomic.Int64
}

// OpenWindow starts counting packets sent from now for d. The echo of a
// packet counts whenever it arrives, until the next OpenWindow; read the
// result a second after the window ends (the probe's loss rule).
func (f *Fleet) OpenWindow(d time.Duration) *Window {
	from := int64(time.Since(f.start))
	w := &Window{from: from, to: from + int64(d)}
	f.rtt.reset()
	f.win.Store(w)
	return w
}

// Loss returns packets sent in the window, echoed, and the loss ratio.
func (w *Window) Loss() (sent, recv int64, ratio float64) {
	sent, recv = w.sent.Load(), w.recv.Load()
	if sent == 0 {
		return 0, 0, 0
	}
	return sent, recv, math.Max(0, 1-float64(recv)/float64(sent))
}

// RTT returns the p50 and p99 echo RTT of the current window.
func (f *Fleet) RTT() (p50, p99 time.Duration) { return f.rtt.quantile(0.5), f.rtt.quantile(0.99) }

// Close stops the senders and closes every client, eight at a time.
func (f *Fleet) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	cs := f.clients
	f.mu.Unlock()
	close(f.stop)
	f.senders.Wait()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, c := range cs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			_ = c.pc.GracefulClose()
			_ = c.mux.Close()
			_ = c.conn.Close()
		}()
	}
	wg.Wait()
	f.readers.Wait()
}

// histogram is a lock-free log-spaced histogram of durations from 10 µs to
// about 10 s, 8 buckets per octave (≤ 9 % error), good enough for p50/p99.
type histogram struct {
	b [8 * 21]atomic.Int64
}

func bucketOf(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond) / 10
	if us <= 1 {
		return 0
	}
	i := int(math.Log2(us) * 8)
	return min(i, len(histogram{}.b)-1)
}

func (h *histogram) add(d time.Duration) { h.b[bucketOf(d)].Add(1) }

func (h *histogram) reset() {
	for i := range h.b {
		h.b[i].Store(0)
	}
}

func (h *histogram) quantile(q float64) time.Duration {
	var total int64
	for i := range h.b {
		total += h.b[i].Load()
	}
	if total == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(total)))
	var acc int64
	for i := range h.b {
		acc += h.b[i].Load()
		if acc >= rank {
			// Upper edge of the bucket.
			return time.Duration(10 * math.Exp2(float64(i+1)/8) * float64(time.Microsecond))
		}
	}
	return 0
}
