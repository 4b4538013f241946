package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/probe"
)

// TestBackupPOPWhenNearestDown closes the nearest POP's global relay
// before dialing: the client, given both POPs in the answer, connects
// through the backup with no extra delay (the setup times of a normal call
// and of the backup call are logged side by side).
func TestBackupPOPWhenNearestDown(t *testing.T) {
	w := startWorld(t, devworld.Config{FlowIdle: time.Second, RouteTTL: time.Second})
	// A loopback client is placed in the default region, the first one.
	nearest, backup := w.Regions[0], w.Regions[1]
	nearestVIP, backupVIP := nearest.GlobalRelay.PublicAddr(), backup.GlobalRelay.PublicAddr()

	dial := func(name string) (*probe.Call, probe.Timings) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		call, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Logger: testLogger()})
		if err != nil {
			t.Fatalf("%s: dial: %v", name, err)
		}
		t.Cleanup(func() { call.Close() })
		if err := call.WaitEcho(ctx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return call, call.Timings()
	}
	hangup := func(call *probe.Call) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := call.Hangup(ctx); err != nil {
			t.Errorf("hangup: %v", err)
		}
		call.Close()
	}

	// A normal call: both POPs advertised, the backup at a lower priority,
	// and the nearest one carries the call.
	call, normal := dial("normal call")
	prios := testsdp.CandidatePriorities(t, call.Answer)
	if prios[nearestVIP] == 0 || prios[backupVIP] == 0 {
		t.Fatalf("answer candidates %v, want the nearest POP %v and the backup %v", prios, nearestVIP, backupVIP)
	}
	if prios[backupVIP] >= prios[nearestVIP] {
		t.Errorf("backup POP candidate priority %d is not below the nearest POP's %d", prios[backupVIP], prios[nearestVIP])
	}
	if n := nearest.GlobalRelay.Flows(); n < 1 {
		t.Errorf("nearest POP holds %d flows during a normal call, want ≥ 1", n)
	}
	hangup(call)

	// The nearest POP is gone before the next call starts.
	if err := nearest.GlobalRelay.Close(); err != nil {
		t.Fatalf("close nearest POP: %v", err)
	}
	call, viaBackup := dial("call via backup")
	// Whether the dead POP is still advertised depends on how soon gossip
	// reports it down; the call must connect either way.
	t.Logf("answer with the nearest POP down advertises %v", testsdp.CandidatePriorities(t, call.Answer))
	if n := backup.GlobalRelay.Flows(); n < 1 {
		t.Errorf("backup POP holds %d flows, want the call's flow", n)
	}
	eventually(t, 10*time.Second, "25 echoed packets through the backup POP", func() bool { return call.Stats().Received >= 25 })
	t.Logf("setup, normal call:      signaling %v, ICE %v, DTLS %v, first echo %v",
		normal.Signaling, normal.ICEConnected, normal.DTLSConnected, normal.FirstEcho)
	t.Logf("setup, nearest POP down: signaling %v, ICE %v, DTLS %v, first echo %v",
		viaBackup.Signaling, viaBackup.ICEConnected, viaBackup.DTLSConnected, viaBackup.FirstEcho)
	hangup(call)
}

// renominatingCall is a minimal Pion client with ICE renomination enabled,
// which the probe does not offer: it sends timestamped audio every 20 ms and
// records when each echo comes back.
type renominatingCall struct {
	pc    *webrtc.PeerConnection
	out   *webrtc.TrackLocalStaticRTP
	start time.Time

	mu       sync.Mutex
	arrivals []echoArrival // guarded by mu

	stop chan struct{}
	wg   sync.WaitGroup
}

type echoArrival struct {
	sent, received time.Duration // since start
}

func dialRenominating(ctx context.Context, t *testing.T, signalingURL string) *renominatingCall {
	t.Helper()
	se := webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	if err := se.SetICERenomination(webrtc.WithRenominationInterval(250 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// Find a dead pair quickly, as a browser's consent checks would.
	se.SetICETimeouts(time.Second, 5*time.Second, 200*time.Millisecond)
	me := &webrtc.MediaEngine{}
	if err := me.RegisterDefaultCodecs(); err != nil {
		t.Fatal(err)
	}
	pc, err := webrtc.NewAPI(webrtc.WithSettingEngine(se), webrtc.WithMediaEngine(me)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	c := &renominatingCall{pc: pc, start: time.Now(), stop: make(chan struct{})}
	t.Cleanup(c.close)
	if c.out, err = webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "renominating"); err != nil {
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
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(answer)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-connected:
	case <-ctx.Done():
		t.Fatal("renominating client did not connect")
	}
	c.wg.Add(1)
	go c.send()
	return c
}

func (c *renominatingCall) send() {
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
		binary.BigEndian.PutUint64(payload, uint64(time.Since(c.start)))
		pkt.SequenceNumber, pkt.Timestamp = seq, uint32(seq)*960
		if err := c.out.WriteRTP(pkt); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			return
		}
	}
}

// echoesSentAfter returns the echoes of packets sent after d, and the last
// arrival of any echo sent before it.
func (c *renominatingCall) echoesSentAfter(d time.Duration) (after []echoArrival, lastBefore time.Duration) {
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

func (c *renominatingCall) close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.wg.Wait()
	_ = c.pc.Close()
}

// TestNearestPOPDiesMidCall closes the nearest POP's relay during a call
// whose client (Pion with ICE renomination) also has the backup POP, at
// production gossip timings, and measures the media gap until echoes come
// back through the backup.
//
// The recovery depends on the transceiver switching POPs when checks
// arrive through another POP while the selected one has gone silent
// (ARCHITECTURE.md, "Two POPs in one answer"): the test asserts that the
// switch happened (its counter) and that the call goes on.
func TestNearestPOPDiesMidCall(t *testing.T) {
	w := startWorld(t, devworld.Config{FlowIdle: time.Second, RouteTTL: time.Second, ProductionGossip: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dialRenominating(ctx, t, w.SignalingURL)
	eventually(t, 10*time.Second, "echoes through the nearest POP", func() bool {
		after, _ := c.echoesSentAfter(0)
		return len(after) >= 25
	})
	switches := func() float64 { return metricSum(t, w.Registry, "rtcedge_transceiver_pop_switches_total", nil) }
	switchesBefore := switches()

	if err := w.Regions[0].GlobalRelay.Close(); err != nil {
		t.Fatal(err)
	}
	killed := time.Since(c.start)
	eventually(t, 15*time.Second, "audio sent after the nearest POP died to come back through the backup "+
		"(needs the transceiver's POP switch on silence)", func() bool {
		after, _ := c.echoesSentAfter(killed)
		return len(after) >= 50
	})
	after, lastBefore := c.echoesSentAfter(killed)
	gap := after[0].received - lastBefore
	t.Logf("nearest POP closed at %v; last echo before %v, first echo via the backup at %v: media gap %v; POP switches %v",
		killed.Round(time.Millisecond), lastBefore.Round(time.Millisecond), after[0].received.Round(time.Millisecond),
		gap.Round(time.Millisecond), switches()-switchesBefore)
	if n := switches() - switchesBefore; n < 1 {
		t.Errorf("the transceiver switched POPs %v times, want ≥ 1", n)
	}
	if n := w.Regions[1].GlobalRelay.Flows(); n < 1 {
		t.Errorf("backup POP holds %d flows after the switch", n)
	}
	// Bounded by the client: a Pion client with renomination finds the
	// dead pair after its ICE disconnect timeout, then checks the backup.
	if gap >= 10*time.Second {
		t.Errorf("media gap %v after the nearest POP died, want < 10 s", gap)
	}
}
