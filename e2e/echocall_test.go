package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"
)

// echoCall is a minimal standard Pion client for tests that shape its ICE
// settings (renomination, a socket behind a NAT), which the probe does not
// offer: it sends timestamped audio every 20 ms and records when each echo
// comes back.
type echoCall struct {
	pc       *webrtc.PeerConnection
	out      *webrtc.TrackLocalStaticRTP
	start    time.Time
	location string // the session resource signaling returned
	offer    string // the client's offer as posted
	answer   string // signaling's answer

	mu       sync.Mutex
	arrivals []echoArrival   // guarded by mu
	sent     []time.Duration // send times, guarded by mu

	remoteSSRC atomic.Uint32 // the SSRC of the server's audio to this client

	stop chan struct{}
	wg   sync.WaitGroup
}

type echoArrival struct {
	sent, received time.Duration // since start
}

// renominatingSettings enables ICE renomination and finds a dead pair
// quickly, as a browser's consent checks would.
func renominatingSettings(t *testing.T) func(*webrtc.SettingEngine) {
	return func(se *webrtc.SettingEngine) {
		if err := se.SetICERenomination(webrtc.WithRenominationInterval(250 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		se.SetICETimeouts(time.Second, 5*time.Second, 200*time.Millisecond)
	}
}

func dialRenominating(ctx context.Context, t *testing.T, signalingURL string) *echoCall {
	return dialEchoCall(ctx, t, signalingURL, renominatingSettings(t))
}

// dialEchoCall posts an offer to signaling and returns once the call is
// connected and sending. configure, when set, adjusts the client's
// SettingEngine (loopback UDP4 host candidates, no mDNS by default).
func dialEchoCall(ctx context.Context, t *testing.T, signalingURL string, configure func(*webrtc.SettingEngine)) *echoCall {
	t.Helper()
	se := webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	if configure != nil {
		configure(&se)
	}
	me := &webrtc.MediaEngine{}
	if err := me.RegisterDefaultCodecs(); err != nil {
		t.Fatal(err)
	}
	pc, err := webrtc.NewAPI(webrtc.WithSettingEngine(se), webrtc.WithMediaEngine(me)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	c := &echoCall{pc: pc, start: time.Now(), stop: make(chan struct{})}
	t.Cleanup(c.close)
	if c.out, err = webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "echocall"); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.AddTrack(c.out); err != nil {
		t.Fatal(err)
	}
	connected := make(chan struct{})
	var once sync.Once
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		if s == webrtc.PeerConnectionStateConnected {
			once.Do(func() { close(connected) })
		}
	})
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		c.remoteSSRC.Store(uint32(tr.SSRC()))
		var pkt rtp.Packet
		buf := make([]byte, 1500)
		for {
			n, _, err := tr.Read(buf)
			if err != nil {
				return
			}
			if pkt.Unmarshal(buf[:n]) != nil || len(pkt.Payload) < 8 {
				continue
			}
			sent := time.Duration(binary.BigEndian.Uint64(pkt.Payload))
			c.mu.Lock()
			c.arrivals = append(c.arrivals, echoArrival{sent: sent, received: time.Since(c.start)})
			c.mu.Unlock()
		}
	})

	res, answer := negotiate(ctx, t, pc, signalingURL)
	c.location, c.offer, c.answer = res.Header.Get("Location"), pc.LocalDescription().SDP, answer
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-connected:
	case <-ctx.Done():
		t.Fatal("client did not connect")
	}
	c.wg.Add(1)
	go c.send()
	return c
}

func (c *echoCall) send() {
	defer c.wg.Done()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	payload := make([]byte, 80)
	pkt := &rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111}, Payload: payload}
	for seq := uint16(1); ; seq++ {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		now := time.Since(c.start)
		binary.BigEndian.PutUint64(payload, uint64(now))
		pkt.SequenceNumber, pkt.Timestamp = seq, uint32(seq)*960
		c.mu.Lock()
		c.sent = append(c.sent, now)
		c.mu.Unlock()
		if err := c.out.WriteRTP(pkt); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			return
		}
	}
}

// since is the client's clock: time since the call started.
func (c *echoCall) since(t time.Time) time.Duration { return t.Sub(c.start) }

// echoesSentAfter returns the echoes of packets sent after d, and the last
// arrival of any echo sent before it.
func (c *echoCall) echoesSentAfter(d time.Duration) (after []echoArrival, lastBefore time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.arrivals {
		if a.sent > d {
			after = append(after, a)
		} else if a.received > lastBefore {
			lastBefore = a.received
		}
	}
	return after, lastBefore
}

// echoDelayBefore is the median time the echoes of the last ten packets
// sent before d took to come back: the call's own round trip through the
// (maybe loaded) world at that moment.
func (c *echoCall) echoDelayBefore(d time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var delays []time.Duration
	for i := len(c.arrivals) - 1; i >= 0 && len(delays) < 10; i-- {
		if a := c.arrivals[i]; a.sent <= d {
			delays = append(delays, a.received-a.sent)
		}
	}
	if len(delays) == 0 {
		return 0
	}
	slices.Sort(delays)
	return delays[len(delays)/2]
}

// lossBetween returns how many packets were sent in (from, to] and how many
// of them came back.
func (c *echoCall) lossBetween(from, to time.Duration) (sent, echoed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.sent {
		if s > from && s <= to {
			sent++
		}
	}
	seen := map[time.Duration]bool{}
	for _, a := range c.arrivals {
		if a.sent > from && a.sent <= to && !seen[a.sent] {
			seen[a.sent] = true
			echoed++
		}
	}
	return sent, echoed
}

func (c *echoCall) close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.wg.Wait()
	_ = c.pc.Close()
}

// negotiate posts pc's offer, once its candidates are gathered, to
// signaling's POST /v1/realtime/sdp and returns the 201 response and its
// answer; any other status fails the test.
func negotiate(ctx context.Context, t *testing.T, pc *webrtc.PeerConnection, signalingURL string) (*http.Response, string) {
	t.Helper()
	return negotiateAs(ctx, t, pc, signalingURL, "")
}

// negotiateAs is negotiate with a bearer credential (none when "").
func negotiateAs(ctx context.Context, t *testing.T, pc *webrtc.PeerConnection, signalingURL, bearer string) (*http.Response, string) {
	t.Helper()
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		t.Fatal("gathering did not complete")
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, signalingURL+"/v1/realtime/sdp", strings.NewReader(pc.LocalDescription().SDP))
	req.Header.Set("Content-Type", "application/sdp")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("offer: %d %s", res.StatusCode, answer)
	}
	return res, string(answer)
}
