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
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/interceptor"
	"github.com/pion/logging"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/internal/udpio"
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
	// fillLow and fillHigh are the packets (20 ms each) the filler keeps
	// queued per client: it tops a queue under fillLow up to fillHigh.
	fillLow, fillHigh = 50, 100
	// fillEvery is how often the filler looks at the queues.
	fillEvery = 100 * time.Millisecond
	// rttRing is how many of its last send times a client keeps, to match
	// an echo's packet index with.
	rttRing = 256
	// maxCatchUp is how far behind (1 ms slots) the sender catches up:
	// a starved sender sends the frames it overslept late, in a burst,
	// rather than fewer of them; beyond a second it skips.
	maxCatchUp = 1000
	// sampleEvery: with the echo, every sampleEvery-th client's replies
	// are also decrypted (by Pion), which gives the RTT.
	sampleEvery = 8
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
	// Senders is how many goroutines send audio; default 1.
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
//
// Pion sets every call up (ICE, DTLS, SCTP: the pod sees a real client)
// and keeps its ICE agent running (the pod's consent checks are
// answered), but does no per-packet work in real time. Its audio track
// encrypts ahead: the filler goroutine has Pion make each client's next
// packets (SRTP, sealed for the pod) into the client's queue (Link's
// packetQueue) a second or two before they are due, Prepare makes a whole
// window's worth before it opens, and one sender goroutine replays the
// queues at 50 packets a second per client, a batch (one sendmmsg) per
// 1 ms slot. The SRTP indexes rise as Pion made them. Replies are counted
// from their ciphertext on the Link's reader (a Tap per client: the
// sequence numbers give the pod's sends and so the loss) and never
// decrypted, except for every sampleEvery-th client's echo, which Pion
// decrypts to read the send index the payload carries (the RTT). The pod
// needs no RTCP from the clients (transceiver/podnet: reports are
// optional), and Pion's RTP sender without interceptors sends none.
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

	// Underruns counts frames a client had none queued for when it was
	// due (the filler fell behind): sent late, not lost.
	Underruns atomic.Int64
	// failed counts the calls whose connection failed (ICE: the pod stopped
	// answering) rather than closed.
	failed atomic.Int64
	// decrypting counts the clients whose replies reached Pion (a track
	// came up): the sampled ones only.
	decrypting atomic.Int64
	// Skipped counts the 1 ms slots the sender skipped, having slept
	// through more than maxCatchUp of them.
	Skipped atomic.Int64

	stop    chan struct{}
	senders sync.WaitGroup
	readers sync.WaitGroup
}

// NewFleet prepares the shared Pion state and starts the senders. Audio
// is off until SetAudio(true).
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if cfg.Senders <= 0 {
		cfg.Senders = 1
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
	f.senders.Add(1)
	go f.fillLoop()
	return f, nil
}

// client is one call of the fleet.
type client struct {
	pc    *webrtc.PeerConnection
	mux   *ice.UDPMuxDefault
	conn  *clientConn
	queue *packetQueue
	track *webrtc.TrackLocalStaticRTP
	// fillMu serializes the making of the client's packets (the filler,
	// Prepare, SendFrames, the sender on an underrun), guarding pkt,
	// payload, next and made.
	fillMu  sync.Mutex
	pkt     rtp.Packet
	payload [payloadSize]byte
	next    int // the next of FleetConfig.Opus to make
	made    int64
	// Owned by the sender goroutine that serves this client: packets sent
	// so far, whose send times sentAt keeps (by index mod rttRing) for the
	// echo's RTT.
	sent   atomic.Int64
	sentAt [rttRing]atomic.Int64
	// Owned by the Link's reader (the tap): the window the last reply
	// counted in, and its highest extended sequence number there.
	tapWin  *Window
	tapLast int64
	// dead is set once the call failed or closed after it was up; the
	// sender skips it.
	dead atomic.Bool
}

// Lost returns how many calls failed or closed after they were up, and
// how many of them failed (the rest were closed).
func (f *Fleet) Lost() (lost, failed int) {
	for _, c := range f.snapshot() {
		if c.dead.Load() {
			lost++
		}
	}
	return lost, int(f.failed.Load())
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
	cc := conn.(*clientConn)
	c := &client{conn: cc, mux: mux, next: f.Size() * 7, queue: &packetQueue{}}
	sampled := f.cfg.Opus == nil && (cc.self.Port()-firstClientPort)%sampleEvery == 0
	cc.setTap(func(b []byte) bool { f.reply(c, b); return sampled })
	cc.queue.Store(c.queue)
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
			if !c.dead.Swap(true) && s == webrtc.PeerConnectionStateFailed {
				f.failed.Add(1)
			}
			failOnce.Do(func() { close(failed) })
		}
	})
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		f.decrypting.Add(1)
		f.readers.Add(1)
		defer f.readers.Done()
		f.readEcho(c, tr)
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

// snapshot returns the clients now.
func (f *Fleet) snapshot() []*client {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*client(nil), f.clients...)
}

// fillLoop keeps every client's queue between fillLow and fillHigh
// packets while the audio is on.
func (f *Fleet) fillLoop() {
	defer f.senders.Done()
	tick := time.NewTicker(fillEvery)
	defer tick.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
		if !f.audioOn.Load() {
			continue
		}
		for _, c := range f.snapshot() {
			if c.queue.len() < fillLow {
				f.fill(c, fillHigh)
			}
		}
	}
}

// fill has Pion make packets for c until its queue holds n; it returns
// how many it made.
func (f *Fleet) fill(c *client, n int) int {
	c.fillMu.Lock()
	defer c.fillMu.Unlock()
	made := 0
	for k := c.queue.len(); k < n; k++ {
		if !f.make(c) {
			break
		}
		made++
	}
	return made
}

// Prepare queues d of audio for every client (Pion encrypting it now), so
// that the filler has nothing to do for about d: call it before opening a
// window to keep the encryption out of it. It returns the packets it made
// and the CPU time that took (its thread's; 0 where not measured).
func (f *Fleet) Prepare(d time.Duration) (made int, cpu time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	n := int(d/frameInterval) + 1
	for _, c := range f.snapshot() {
		made += f.fill(c, n)
	}
	return made, threadCPU() - t0
}

// Queued returns the packets queued over all clients.
func (f *Fleet) Queued() int {
	total := 0
	for _, c := range f.snapshot() {
		total += c.queue.len()
	}
	return total
}

// sendLoop sends one frame per client every 20 ms for the clients i with
// i % Senders == shard, each in the 1 ms slot i/Senders % 20, all of a
// slot in one batch. It catches up on slots it overslept, so a busy
// machine delays packets rather than silently sending fewer.
func (f *Fleet) sendLoop(shard int) {
	defer f.senders.Done()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	next := int64(0) // next 1 ms slot to serve, counted from f.start
	var batch, sent []*client
	var ms []udpio.Msg
	pod := f.cfg.Link.cfg.Pod
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
		now := int64(time.Since(f.start) / time.Millisecond)
		if next == 0 || now-next > maxCatchUp {
			if next != 0 {
				f.Skipped.Add(now - next)
			}
			next = now // first tick, or so far behind that the frames are better skipped
		}
		if !f.audioOn.Load() {
			next = now + 1
			continue
		}
		batch, sent, ms = batch[:0], sent[:0], ms[:0]
		f.mu.Lock()
		for ; next <= now; next++ {
			slot := int(next % int64(slots))
			for i := shard; i < len(f.clients); i += f.cfg.Senders {
				if (i/f.cfg.Senders)%slots == slot {
					batch = append(batch, f.clients[i])
				}
			}
		}
		f.mu.Unlock()
		for _, c := range batch {
			if c.dead.Load() {
				continue
			}
			b := c.queue.pop()
			if b == nil {
				f.Underruns.Add(1)
				// Made now on this goroutine: late, but in order.
				f.fill(c, 1)
				if b = c.queue.pop(); b == nil {
					continue
				}
			}
			ms = append(ms, udpio.Msg{Buf: b, Addr: pod})
			sent = append(sent, c)
		}
		if len(ms) == 0 {
			continue
		}
		at := int64(time.Since(f.start))
		for _, c := range sent {
			k := c.sent.Load()
			c.sentAt[k%rttRing].Store(at)
			c.sent.Store(k + 1)
		}
		f.cfg.Link.sendBatch(ms)
		if w := f.win.Load(); w != nil && at >= w.from && at < w.to {
			w.sent.Add(int64(len(ms)))
		}
	}
}

// SendFrames has Pion make n audio frames on every client at once,
// unpaced; with Link.StartRecording it produces packets to replay.
func (f *Fleet) SendFrames(n int) {
	for _, c := range f.snapshot() {
		c.fillMu.Lock()
		for range n {
			f.make(c)
		}
		c.fillMu.Unlock()
	}
}

// make has Pion encrypt c's next audio frame, which the client's conn
// queues (or the Link records). With the echo the payload carries the
// packet's index, for the RTT; with FleetConfig.Opus it is the next frame
// of the turn. Called with c.fillMu held.
func (f *Fleet) make(c *client) bool {
	binary.BigEndian.PutUint64(c.payload[:8], uint64(c.made))
	c.pkt.SequenceNumber++
	c.pkt.Timestamp += frameSamples
	c.pkt.Payload = c.payload[:]
	if n := len(f.cfg.Opus); n > 0 {
		c.pkt.Payload = f.cfg.Opus[c.next%n]
		c.next++
	}
	if c.track.WriteRTP(&c.pkt) != nil {
		return false
	}
	c.made++
	return true
}

// reply counts one RTP datagram from the pod to c in the current window,
// by its arrival and by its sequence number (which the pod raises by one
// per packet it sends the client: a gap is a packet lost on the way). It
// runs on the Link's reader goroutine, which owns c.tapWin and c.tapLast.
func (f *Fleet) reply(c *client, b []byte) {
	w := f.win.Load()
	if w == nil {
		return
	}
	now := int64(time.Since(f.start))
	if now < w.from || now >= w.to {
		return
	}
	seq := int64(binary.BigEndian.Uint16(b[2:4]))
	w.recv.Add(1)
	if c.tapWin != w {
		c.tapWin, c.tapLast = w, seq
		w.expected.Add(1)
		return
	}
	// Extend to the nearest value of the 16-bit sequence number.
	d := int64(int16(uint16(seq) - uint16(c.tapLast)))
	if d > 0 {
		w.expected.Add(d)
		c.tapLast += d
	}
}

// readEcho reads the replies Pion decrypts (a sampled client's echo) and
// times them: the payload starts with the packet's index.
func (f *Fleet) readEcho(c *client, tr *webrtc.TrackRemote) {
	buf := make([]byte, 1500)
	var h rtp.Header
	for {
		n, _, err := tr.Read(buf)
		if err != nil {
			return
		}
		hl, err := h.Unmarshal(buf[:n])
		if err != nil || n-hl < 8 {
			continue
		}
		k := int64(binary.BigEndian.Uint64(buf[hl:]))
		now := int64(time.Since(f.start))
		if sent := c.sent.Load(); k < 0 || k >= sent || sent-k >= rttRing {
			continue // not sent yet by our count, or too old to match
		}
		sent := c.sentAt[k%rttRing].Load()
		if w := f.win.Load(); w != nil && sent >= w.from && sent < w.to {
			f.rtt.add(time.Duration(now - sent))
		}
	}
}

// Window counts the audio sent during one interval and the replies that
// arrived during it.
type Window struct {
	from, to   int64 // nanoseconds since the fleet started
	sent, recv atomic.Int64
	// expected is what the replies' sequence numbers say the pod sent:
	// per client, from its first reply in the window to its last.
	expected atomic.Int64
}

// OpenWindow starts counting packets sent from now for d, and the replies
// that arrive in the same interval (the edges cancel: as many replies are
// in flight at the start as at the end). Read the result once it is over.
func (f *Fleet) OpenWindow(d time.Duration) *Window {
	from := int64(time.Since(f.start))
	w := &Window{from: from, to: from + int64(d)}
	f.rtt.reset()
	f.win.Store(w)
	return w
}

// Loss returns packets sent in the window, replies received, and the
// loss ratio of the echo (1 - received/sent).
func (w *Window) Loss() (sent, recv int64, ratio float64) {
	sent, recv = w.sent.Load(), w.recv.Load()
	if sent == 0 {
		return 0, 0, 0
	}
	return sent, recv, math.Max(0, 1-float64(recv)/float64(sent))
}

// SeqLoss returns the replies the pod sent in the window by their
// sequence numbers, and the ratio that never arrived.
func (w *Window) SeqLoss() (expected int64, ratio float64) {
	expected = w.expected.Load()
	if expected == 0 {
		return 0, 0
	}
	return expected, math.Max(0, 1-float64(w.recv.Load())/float64(expected))
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
