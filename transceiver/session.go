package transceiver

// A session: one caller's PeerConnection and its backend. Its state and
// who owns each part, how it is made from a create request, its media and
// events in both directions, and its teardown.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/datachannel"
	"github.com/pion/ice/v4"
	"github.com/pion/rtp"
	"github.com/pion/stun/v4"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/steer"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/transceiver/pace"
	"github.com/rtcedge/rtcedge/transceiver/podnet"
	"github.com/rtcedge/rtcedge/transceiver/vad"
)

// EventsLabel is the data channel label OpenAI-style clients use for events.
const EventsLabel = "oai-events"

// errChannelNotOpen is returned by SendEvent before the events channel
// opens once maxEarlyEvents bytes wait for it.
var errChannelNotOpen = errors.New("transceiver: events channel not open")

// maxEarlyEvents bounds the events a session holds until its events channel
// opens: a backend opened with the offer (a Realtime server's
// session.created) speaks before the caller's channel is up, and OpenAI's
// own endpoint delivers those first events.
const maxEarlyEvents = 64 << 10

// errEventsBacklog: the client has not read maxEventBacklog bytes of
// events already; the event is dropped (SendEvent).
var errEventsBacklog = errors.New("transceiver: events channel backlog full")

// maxEventBacklog bounds what one session's events channel holds toward a
// client that does not read: writes do not block, so a client that keeps
// sending (never idle) behind a zero receive window would otherwise grow
// the pod's queue without bound.
const maxEventBacklog = 1 << 20

// session is one call. The PeerConnection and its callbacks own the media;
// the session struct only tracks lifecycle.
type session struct {
	// Static after newSession returns.
	id      string
	t       *Transceiver
	pc      *webrtc.PeerConnection
	track   *webrtc.TrackLocalStaticRTP
	sender  *webrtc.RTPSender
	handler backend.Handler
	created time.Time
	ufrag   string // the server's ICE credentials (the agent's; an ICE restart adds aliases, restart.go)
	pwd     string
	client  podnet.Creds // the client's, from the offer (the agent's view of the remote side)
	// dtlsClient: our answer says a=setup:active (we are the DTLS client;
	// newMediaPath derives the SRTP keys by it).
	dtlsClient bool

	lastActivity atomic.Int64 // unix nanos of the last media packet or event from the client
	connected    atomic.Bool
	popByVIP     map[netip.AddrPort]uint16      // static: the POPs this session advertises
	preferredPOP uint16                         // static: the nearest POP, first in the request
	selectedPOP  atomic.Uint32                  // POP of the selected candidate pair; 0 before one is selected
	selectedPeer atomic.Pointer[netip.AddrPort] // the client address of the selected pair
	selectedTCP  atomic.Bool                    // the selected pair is ICE-TCP
	rtt          rttPaths                       // the POPs the client checked, for steering (rttreport.go)

	// media is the session's own SRTP path once connected (podnet.Media);
	// nil while media goes through Pion. Stored under outMu.
	media       atomic.Pointer[podnet.Media]
	mediaFailed atomic.Bool // startMedia failed, or teardown began: no media path (again) for this session

	// audioMu makes the backend's Audio one call at a time: Pion's track
	// reader (onTrack) still hands over the frames Pion opened when the
	// media path's readers start on the next ones. audioClosed: the
	// backend is closed (teardown), no Audio after it.
	audioMu     sync.Mutex
	audioClosed bool
	intake      intake // the caller's audio credit (intake.go), under audioMu

	// play paces the backend's audio to the caller (play.go); static
	// after newSession. interrupter is the handler's, if it wants the
	// edge's barge-in (static after the backend opened); vad is owned by
	// the audio path (under audioMu).
	play        *pace.Queue
	interrupter backend.Interrupter
	vad         vad.Detector

	// The outgoing audio stream: one RTP packet per Opus frame, header
	// state reused across frames.
	outMu     sync.Mutex
	outPkt    rtp.Packet // guarded by outMu
	outTSFrac int64      // sub-tick remainder of the RTP clock in ns·Hz, guarded by outMu

	mu           sync.Mutex
	events       datachannel.ReadWriteCloser // the open events channel (detached), nil before; guarded by mu
	early        [][]byte                    // events sent before the channel opened, to send first; guarded by mu
	earlyBytes   int                         // their size; guarded by mu
	opened       bool                        // the channel has opened (no more holding); guarded by mu
	closing      bool                        // teardown has begun: no new readers; guarded by mu
	connectTimer *time.Timer                 // guarded by mu
	readers      sync.WaitGroup              // the events reader; Add under mu while !closing

	follow podnet.Follower // a path change waiting for the old address to go silent

	// sendMu orders SendEvent: the caller's channel, the sidebands and
	// the replay see the events in one order (sideband.go). Taken before
	// mu.
	sendMu sync.Mutex
	sb     sidebands // guarded by sendMu

	nonces [][6]byte // routing-token nonces of its server ufrags, guarded by t.byNonce.mu

	// restartMu makes RestartICE's reading of the session's ICE state, its
	// If-Match check and its new state one step (restart.go).
	restartMu sync.Mutex

	forgotten    bool // forget ran: the session ended; guarded by t.mu
	endOnce      sync.Once
	teardownOnce sync.Once
}

// newSession makes the session of one create request: fresh ICE
// credentials and ID, a PeerConnection over the pod's shared POP muxes,
// the offer applied, the outgoing track, the backend opened (before the
// answer, so a refusing backend fails the request) and the answer
// gathered and shaped for the POPs. On an error after the session exists
// it is returned with the error, for the caller to tear down.
func (t *Transceiver) newSession(ctx context.Context, req CreateRequest) (*session, string, error) {
	muxes, err := t.muxesFor(req.POPs)
	if err != nil {
		return nil, "", err
	}
	ufrag, err := t.cfg.Keys.Mint(t.cfg.Cluster, t.cfg.Pod)
	if err != nil {
		return nil, "", fmt.Errorf("mint ufrag: %w", err)
	}
	pwd, err := token.NewPassword()
	if err != nil {
		return nil, "", fmt.Errorf("ice password: %w", err)
	}
	id, err := t.newID()
	if err != nil {
		return nil, "", err
	}
	s := t.sessionFor(req, id, ufrag, pwd)
	if err := s.newPeerConnection(muxes, req.POPs); err != nil {
		return nil, "", err
	}
	if err := s.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: req.Offer}); err != nil {
		return s, "", fmt.Errorf("%w: %w", ErrBadOffer, err)
	}
	if s.client, err = iceFragment(req.Offer); err != nil {
		return s, "", fmt.Errorf("%w: %w", ErrBadOffer, err)
	}
	if err := s.addTrack(); err != nil {
		return s, "", err
	}
	s.handler, err = t.cfg.Backend.Open(ctx, t.sessionInfo(id, req), s)
	if err != nil {
		return s, "", fmt.Errorf("open backend: %w", err)
	}
	s.interrupter, _ = s.handler.(backend.Interrupter)
	out, err := s.answer(ctx, req.POPs)
	return s, out, err
}

// sessionFor is the session's static state: its credentials, its POPs and
// the steering it measures for (a bad key or ticket measures nothing).
func (t *Transceiver) sessionFor(req CreateRequest, id, ufrag, pwd string) *session {
	s := &session{id: id, t: t, created: t.cfg.Now(), ufrag: ufrag, pwd: pwd, popByVIP: make(map[netip.AddrPort]uint16, len(req.POPs))}
	for _, p := range req.POPs {
		s.popByVIP[p.VIP] = p.ID
	}
	s.preferredPOP = req.POPs[0].ID
	s.play = t.pacer.NewQueue(s)
	s.rtt.key, _ = steer.ParseKey(req.Steer)
	s.rtt.ticket, _ = steer.ParseTicket(req.SteerTicket)
	if s.rtt.ticket == (steer.Ticket{}) && t.rttOut.key != nil {
		// The relays would refuse the whole report this call's samples
		// went in (a create that did not come through an authority's front).
		s.rtt.key = steer.Key{}
	}
	for _, p := range req.POPs[:min(len(req.POPs), steer.MaxTicketPOPs)] {
		s.rtt.pops = append(s.rtt.pops, p.ID)
	}
	return s
}

// newPeerConnection makes the session's PeerConnection. A SettingEngine
// copy per session carries its credentials and the subset of POP muxes it
// advertises; the muxes themselves are shared.
func (s *session) newPeerConnection(muxes []ice.UDPMux, pops []POPAddr) error {
	t := s.t
	se := t.base
	se.SetICECredentials(s.ufrag, s.pwd)
	se.SetICEUDPMux(ice.NewMultiUDPMuxDefault(muxes...))
	t.setupTCP(&se, s, pops) // passive TCP candidates
	se.SetICEBindingRequestHandler(s.onBindingRequest)
	api := webrtc.NewAPI(webrtc.WithSettingEngine(se), webrtc.WithMediaEngine(t.me), webrtc.WithInterceptorRegistry(t.ir))
	pc, err := api.NewPeerConnection(webrtc.Configuration{BundlePolicy: webrtc.BundlePolicyMaxBundle})
	if err != nil {
		return fmt.Errorf("new peer connection: %w", err)
	}
	s.pc = pc
	pc.SCTP().Transport().ICETransport().OnSelectedCandidatePairChange(s.onSelectedPair)
	pc.OnConnectionStateChange(s.onState)
	pc.OnTrack(s.onTrack)
	pc.OnDataChannel(s.onDataChannel)
	return nil
}

// onSelectedPair records the selected candidate pair's POP, client address
// and transport. Every move to another POP or another client address
// counts, whichever side made it: the transceiver after silence
// (onBindingRequest), or the client by nominating another pair (a browser
// on ICE-TCP does as soon as its connection to the failed POP is reset; a
// browser whose NAT rebound may nominate its new address before the pod
// has followed it).
func (s *session) onSelectedPair(p *webrtc.ICECandidatePair) {
	var oldPeer, newPeer *netip.AddrPort
	s.selectedTCP.Store(p.Local.Protocol == webrtc.ICEProtocolTCP)
	if ip, err := netip.ParseAddr(p.Remote.Address); err == nil {
		peer := netip.AddrPortFrom(ip.Unmap(), p.Remote.Port)
		oldPeer, newPeer = s.selectedPeer.Swap(&peer), &peer
	}
	pop := uint32(s.popOf(p.Local.Address, p.Local.Port))
	switch old := s.selectedPOP.Swap(pop); {
	case old != 0 && pop != 0 && old != pop:
		s.t.m.popSwitches.Inc()
	case old != 0 && old == pop && oldPeer != nil && newPeer != nil && *oldPeer != *newPeer:
		s.t.m.addressChanges.Inc()
	}
}

// addTrack adds the outgoing audio track. A static RTP track written frame
// by frame rather than Pion's sample track: its packetizer allocates a
// packet, a slice and a payload copy for every 20 ms frame, the largest
// share of the pod's per-packet garbage. The packets are the same: random
// initial sequence number and timestamp, marker set, one Opus frame each.
func (s *session) addTrack() error {
	s.outPkt.Header = rtp.Header{Version: 2, Marker: true, SequenceNumber: uint16(rand.Uint32()), Timestamp: rand.Uint32()}
	var err error
	s.track, err = webrtc.NewTrackLocalStaticRTP(opusCapability, "audio", "rtcedge")
	if err != nil {
		return fmt.Errorf("local track: %w", err)
	}
	sender, err := s.pc.AddTrack(s.track)
	if err != nil {
		return fmt.Errorf("add track: %w", err)
	}
	s.sender = sender
	if !s.t.mediaPath {
		// Pion's media path (Config.PionMedia): reading the sender's RTCP
		// passes the client's sender reports (which Pion delivers to
		// every SSRC they name, ours included) through the receiver-report
		// interceptor: it needs their timestamps for the LSR/DLSR fields
		// from which the browser computes its round-trip time. The RTCP of
		// the client's own stream is not read; its buffer is bounded
		// (rtcpReadBuffer).
		s.t.wg.Add(1)
		go func() {
			defer s.t.wg.Done()
			buf := make([]byte, 1500)
			for {
				if _, _, err := sender.Read(buf); err != nil {
					return
				}
			}
		}()
	}
	return nil
}

// answer creates the answer, waits for its candidates (until ctx ends) and
// shapes it for the POPs, the Opus rate capped at what the backend takes.
func (s *session) answer(ctx context.Context, pops []POPAddr) (string, error) {
	pc := s.pc
	answer, err := pc.CreateAnswer(nil)
	if err != nil {
		return "", fmt.Errorf("%w: create answer: %w", ErrBadOffer, err)
	}
	s.dtlsClient = strings.Contains(answer.SDP, "a=setup:active")
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(answer); err != nil {
		return "", fmt.Errorf("set local description: %w", err)
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return "", fmt.Errorf("gather candidates: %w", ctx.Err())
	}
	out, err := shapeAnswer(pc.LocalDescription().SDP, pops)
	if err != nil {
		return "", err
	}
	if r, ok := s.t.cfg.Backend.(backend.InputRater); ok {
		out = limitOpusRate(out, r.InputRate())
	}
	return out, nil
}

// popSwitchSilence is how long the selected address must have carried
// nothing from the client before an authenticated check from another
// address or through another POP moves the session there. A lite server
// otherwise waits for the client to re-nominate, which browsers do only
// after several seconds and Pion clients never do without renomination; a
// rebinding NAT gives the client no reason to nominate at all.
const popSwitchSilence = time.Second

// addressSwitchSilence is the same for a new client address behind the
// same POP (a NAT rebinding, a network change), shorter because nothing
// but a POP's own failure detection is waited for: it is above the packet
// interval of a caller in Opus DTX silence (400 ms), so a live caller is
// never moved, and short enough that echo resumes well within a second of
// a rebound client's next check.
const addressSwitchSilence = 600 * time.Millisecond

func (s *session) popOf(addr string, port uint16) uint16 {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return 0
	}
	return s.popByVIP[netip.AddrPortFrom(ip, port)]
}

// candidateAddr is a candidate's address in the pod's canonical form.
func candidateAddr(c ice.Candidate) (netip.AddrPort, bool) {
	ip, err := netip.ParseAddr(c.Address())
	if err != nil || c.Port() <= 0 || c.Port() > 0xffff {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(c.Port())), true
}

// onBindingRequest runs for every ICE check that Pion has authenticated
// (USERNAME and MESSAGE-INTEGRITY of this session): a check that reaches it
// was sent by someone holding the session's ICE password, not necessarily
// by the owner of its source address. It confirms the client's return
// route, and on the first check from an address it sends the address a
// probe of its own (podnet.Socket.Probe): media toward an address waits for
// the probe's answer or a second check of this session, and until then
// DTLS goes only within the anti-amplification budget (3 times the bytes
// the address sent), so a check from a spoofed source (with the spoofer's
// own credentials) never makes the pod a reflector toward it.
//
// It moves the selected pair to the check's pair when the client is
// reaching us only that way: the check came from another client address (a
// NAT rebinding, a network change) or through another POP, and the selected
// pair's own address has delivered nothing for addressSwitchSilence
// (popSwitchSilence for another POP). While the selected address is live
// nothing moves, whatever the check; a check that comes too early is
// looked at again once the silence is reached (follow.go).
//
// It also selects the preferred POP's pair early, before the client
// nominates: a lite server can do no checks of its own, and browsers send
// their nominating check a ping interval (about 50 ms) after the first one
// succeeds. Selecting at once lets the DTLS handshake start with the answer
// to the first check, within the anti-amplification budget. Only the
// preferred POP is selected this way, so an early choice never pins a call
// to the backup; a later nomination of the same pair changes nothing.
//
// It runs on the ICE agent's task loop, so it must not call the
// PeerConnection: Pion holds the PeerConnection's lock while it waits for
// that loop (LocalDescription gathers the agent's candidates under it), and
// a check handled meanwhile would wait for the lock: both stuck, the
// session and the pod's Close with them (seen in CI).
// TestBindingRequestHandlerLeavesThePeerConnection guards it.
func (s *session) onBindingRequest(msg *stun.Message, local, remote ice.Candidate, _ *ice.CandidatePair) bool {
	cur := uint16(s.selectedPOP.Load())
	pop := s.popOf(local.Address(), uint16(local.Port()))
	checks := 0
	if client, ok := candidateAddr(remote); ok && pop != 0 {
		checks = s.t.sock.Confirm(pop, client, s.ufrag, msg.TransactionID)
		s.rtt.noteCheck(pop, client, msg)
		// Before a pair is selected, probe only through the preferred
		// POP (or a check that nominates): a full agent that gets a check
		// on a succeeded pair may nominate that pair at once, and that
		// must not be whichever POP answered first.
		if checks == 1 && (cur != 0 || pop == s.preferredPOP || msg.Contains(stun.AttrUseCandidate)) {
			// A check on restarted credentials reaches Pion translated
			// to the agent's own: the probe must carry those the client
			// really uses, or a restarted client cannot answer it.
			var user stun.Username
			if u, pwd, ok := s.t.sock.Translated(msg.TransactionID); ok {
				s.t.sock.Probe(pop, client, s.ufrag, u, pwd)
			} else if user.GetFrom(msg) == nil {
				s.t.sock.Probe(pop, client, s.ufrag, user.String(), s.client.Pwd)
			}
		}
	}
	if cur == 0 && pop != 0 && pop == s.preferredPOP && !s.t.cfg.WaitForNomination && checks >= podnet.EarlySelectChecks {
		s.t.m.earlySelects.Inc()
		return true
	}
	if cur == 0 || pop == 0 {
		return false
	}
	// Silence is judged on the selected pair's own client address: behind
	// a NAT that maps each destination to its own port, the address this
	// check came from never appears on the other POP.
	peer := s.selectedPeer.Load()
	from, ok := candidateAddr(remote)
	if peer == nil || !ok || (pop == cur && from == *peer) {
		return false
	}
	now := s.t.cfg.Now()
	silence := popSwitchSilence
	if pop == cur {
		silence = addressSwitchSilence
	}
	last, seen := s.t.sock.LastSeen(cur, *peer)
	if quiet := now.Sub(last); seen && quiet < silence {
		// Maybe the old path has only just died: look again once it has
		// been silent long enough.
		s.follow.Defer(s.t.sock, podnet.Deferred{Check: msg, POP: pop, From: from, Ufrag: s.ufrag,
			OldPOP: cur, Old: *peer, Silence: silence})
		return false
	}
	s.follow.Disarm()
	cause := podnet.CausePOP // counted when the selection changes (newSession)
	if pop == cur {
		cause = podnet.CauseAddress
	}
	if seen {
		s.t.m.net.ObserveGap(cause, now.Sub(last))
	}
	s.t.log.Info("following the client to a new path", "session", s.id, "cause", cause,
		"from_pop", cur, "to_pop", pop, "from", peer.String(), "to", from.String())
	return true
}

func (s *session) armConnectTimer(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connectTimer = time.AfterFunc(d, func() {
		if !s.connected.Load() {
			s.end(endConnectTimeout)
		}
	})
}

func (s *session) onState(st webrtc.PeerConnectionState) {
	switch st {
	case webrtc.PeerConnectionStateConnected:
		if s.connected.CompareAndSwap(false, true) {
			now := s.t.cfg.Now()
			s.lastActivity.Store(now.UnixNano())
			s.t.m.setupSeconds.Observe(now.Sub(s.created).Seconds())
			s.startMedia()
			s.measureRTT()
			s.mu.Lock()
			if s.connectTimer != nil {
				s.connectTimer.Stop()
			}
			s.mu.Unlock()
		}
	case webrtc.PeerConnectionStateFailed:
		s.end(endICEFailed)
	case webrtc.PeerConnectionStateClosed:
		s.end(endRemoteClosed)
	}
}

func (s *session) onTrack(track *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
	if track.Kind() != webrtc.RTPCodecTypeAudio {
		return
	}
	buf := make([]byte, 1500)
	var pkt rtp.Packet
	var lastTS uint32
	for {
		n, _, err := track.Read(buf)
		if err != nil {
			return
		}
		if pkt.Unmarshal(buf[:n]) != nil {
			continue
		}
		s.Audio(pkt.Payload, podnet.FrameDuration(lastTS, pkt.Timestamp))
		lastTS = pkt.Timestamp
	}
}

// audio hands one frame to the backend, unless it is closed: from Pion's
// track reader and from the media path, never both at once (audioMu).
func (s *session) audio(p []byte, d time.Duration) {
	s.audioMu.Lock()
	defer s.audioMu.Unlock()
	s.audioLocked(p, d)
}

// audioLocked is audio with audioMu held.
func (s *session) audioLocked(p []byte, d time.Duration) {
	if !s.audioClosed {
		if s.interrupter != nil {
			s.edgeVAD(p)
		}
		s.handler.Audio(p, d)
	}
}

// closeAudio ends the backend's Audio calls: once it returns none is in
// progress and none will begin.
func (s *session) closeAudio() {
	s.audioMu.Lock()
	s.audioClosed = true
	s.audioMu.Unlock()
}

// Audio implements podnet.Session: one frame of the client's audio, from
// the media path or Pion's track reader, counted as activity.
// A frame beyond the caller's credit of audio (intake.go) is dropped and
// counted.
func (s *session) Audio(p []byte, d time.Duration) {
	now := s.t.cfg.Now()
	s.lastActivity.Store(now.UnixNano())
	s.audioMu.Lock()
	defer s.audioMu.Unlock()
	if !s.intake.admit(now, frameAudio(p, d)) {
		s.t.m.dropped[dropCallerAudio].Inc()
		return
	}
	s.audioLocked(p, d)
}

// Path implements podnet.Session: the selected pair.
func (s *session) Path() (uint16, netip.AddrPort, bool) {
	peer := s.selectedPeer.Load()
	if peer == nil {
		return 0, netip.AddrPort{}, false
	}
	return uint16(s.selectedPOP.Load()), *peer, s.selectedTCP.Load()
}

// Creds implements podnet.Session: the credentials of the session's agent.
func (s *session) Creds() (server, client podnet.Creds) {
	return podnet.Creds{Ufrag: s.ufrag, Pwd: s.pwd}, s.client
}

func (s *session) onDataChannel(dc *webrtc.DataChannel) {
	if dc.Label() != EventsLabel {
		// Only the events channel is served; others are closed so the
		// client learns it at once.
		_ = dc.Close()
		return
	}
	// Detached (sizeForVoice): the session reads the channel itself.
	dc.OnOpen(func() {
		raw, err := dc.Detach()
		if err != nil {
			s.t.log.Warn("detach events channel", "session", s.id, "err", err)
			return
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			_ = raw.Close()
			return
		}
		s.events = raw
		// Under mu, so that no later event overtakes them.
		for _, ev := range s.early {
			_, _ = raw.WriteDataChannel(ev, true)
		}
		s.early, s.earlyBytes, s.opened = nil, 0, true
		s.readers.Add(1)
		s.mu.Unlock()
		go s.readEvents(raw)
	})
}

// Event buffer: small JSON events fit the first size; a larger message
// grows the buffer (the message waits in SCTP meanwhile) up to the
// largest message the pod accepts.
const (
	eventReadBuffer = 4 << 10
	maxEventSize    = 256 << 10
)

// sessionInfo is what the backend is told of a session: its config and
// the policy for its caller's events (backend/oaievents).
func (t *Transceiver) sessionInfo(id string, req CreateRequest) backend.SessionInfo {
	info := backend.SessionInfo{ID: id, Cluster: t.cfg.Cluster, Pod: t.cfg.Pod, Config: req.Config}
	if req.Caller != nil {
		info.ClientSessionFields, info.SealedWins = req.Caller.SessionFields, req.Caller.SealedWins
		if info.ClientSessionFields == nil {
			info.ClientSessionFields = []string{} // signaling's policy allows none: not the default
		}
	}
	return info
}

// readEvents hands the events channel's messages to the backend until the
// channel or the call ends.
func (s *session) readEvents(raw datachannel.ReadWriteCloser) {
	defer s.readers.Done()
	defer func() {
		s.mu.Lock()
		if s.events == raw {
			s.events = nil
		}
		s.mu.Unlock()
	}()
	buf := make([]byte, eventReadBuffer)
	for {
		n, _, err := raw.ReadDataChannel(buf)
		if errors.Is(err, io.ErrShortBuffer) && len(buf) < maxEventSize {
			buf = make([]byte, min(2*len(buf), maxEventSize))
			continue
		}
		if err != nil {
			_ = raw.Close()
			return
		}
		s.lastActivity.Store(s.t.cfg.Now().UnixNano())
		s.handler.Event(buf[:n])
	}
}

// End implements backend.Ender: the backend side is gone, so the call ends.
func (s *session) End(reason string) {
	s.t.log.Info("backend ended the session", "session", s.id, "reason", reason)
	s.end(endBackend)
}

// WriteAudio implements backend.Sink: the frame is queued and sent at real
// time (play.go).
func (s *session) WriteAudio(payload []byte, d time.Duration) error {
	return s.play.Push(payload, d)
}

// The session is the Sink every backend gets, with the pod's paced output,
// and the Ender a backend that fails calls; it is the pacer's Output.
var (
	_ backend.Sink         = (*session)(nil)
	_ backend.Ender        = (*session)(nil)
	_ pace.Output          = (*session)(nil)
	_ backend.Player       = (*session)(nil)
	_ backend.RawWriter    = (*session)(nil)
	_ backend.StartAwaiter = (*session)(nil)
)

// WriteRaw implements backend.RawWriter: the frame is queued and encoded
// by enc when it is sent (play.go).
func (s *session) WriteRaw(frame []byte, d time.Duration, enc backend.FrameEncoder) error {
	return s.play.PushRaw(frame, d, enc)
}

// SendFrame implements pace.Output. One frame is one RTP packet; the
// timestamp advances by the frame's duration on the 48 kHz clock, and an
// empty frame only advances it. Send failures are the session ending.
func (s *session) SendFrame(payload []byte, d time.Duration) {
	_ = s.writeRTP(payload, d)
}

func (s *session) writeRTP(payload []byte, d time.Duration) error {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	ticks := int64(d)*int64(opusCapability.ClockRate) + s.outTSFrac
	s.outTSFrac = ticks % int64(time.Second)
	if len(payload) == 0 {
		s.outPkt.Timestamp += uint32(ticks / int64(time.Second))
		return nil
	}
	var err error
	switch mp := s.media.Load(); {
	case mp != nil:
		s.outPkt.SequenceNumber++
		err = mp.SendRTP(&s.outPkt.Header, payload)
	case s.t.mediaPath && !s.mediaFailed.Load():
		// Not connected yet: no one hears it, and what Pion would encrypt
		// now the media path could encrypt again under the same SRTP index.
	default:
		s.outPkt.SequenceNumber++
		s.outPkt.Payload = payload
		// WriteRTP copies the header and the payload is consumed before
		// it returns, so the packet can be reused.
		err = s.track.WriteRTP(&s.outPkt)
		s.outPkt.Payload = nil
	}
	s.outPkt.Timestamp += uint32(ticks / int64(time.Second))
	return err
}

// SendEvent implements backend.Sink: the event goes to the caller's
// events channel and to every sideband (sideband.go), in one order.
func (s *session) SendEvent(data []byte) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.fanOut(data)
	return s.toCaller(data)
}

// toCaller sends an event on the caller's events channel (held until it
// opens); sendMu held.
func (s *session) toCaller(data []byte) error {
	s.mu.Lock()
	ev := s.events
	if ev == nil {
		defer s.mu.Unlock()
		if s.closing || s.opened || s.earlyBytes+len(data) > maxEarlyEvents {
			return errChannelNotOpen
		}
		s.early = append(s.early, bytes.Clone(data))
		s.earlyBytes += len(data)
		return nil
	}
	s.mu.Unlock()
	if b, ok := ev.(interface{ BufferedAmount() uint64 }); ok && b.BufferedAmount()+uint64(len(data)) > maxEventBacklog {
		s.t.m.net.EventDropped()
		return errEventsBacklog
	}
	// Text, as OpenAI sends events: clients JSON.parse(e.data).
	_, err := ev.WriteDataChannel(data, true)
	return err
}

func (s *session) isIdle(now time.Time, timeout time.Duration) bool {
	return s.connected.Load() && now.Sub(time.Unix(0, s.lastActivity.Load())) > timeout
}

// end removes the session and frees it in the background; Pion callbacks
// call it, and a PeerConnection must not be closed from its own callback.
func (s *session) end(reason string) {
	s.endOnce.Do(func() {
		s.t.forget(s) // counts the teardown in s.t.wg
		s.t.m.ended.WithLabelValues(reason).Inc()
		s.t.log.Debug("session ended", "session", s.id, "reason", reason)
		go func() {
			defer s.t.wg.Done()
			s.teardown()
		}()
	})
}

// teardown frees everything the session holds. Safe to call more than once.
func (s *session) teardown() {
	s.teardownOnce.Do(func() {
		s.follow.Stop()
		s.t.sock.Forget(s)
		s.mu.Lock()
		s.closing = true
		if s.connectTimer != nil {
			s.connectTimer.Stop()
		}
		s.mu.Unlock()
		s.outMu.Lock() // startMedia stores under outMu: no media path appears after this
		mp := s.media.Load()
		s.mediaFailed.Store(true)
		s.outMu.Unlock()
		if mp != nil {
			mp.Stop()
		}
		s.closeAudio()
		s.closeSidebands(sbCloseEnded) // before the backend closes: no sideband event after it
		if s.handler != nil {
			_ = s.handler.Close()
		}
		s.play.Close()
		_ = s.pc.GracefulClose()
		// Closing the PeerConnection ends the SCTP association, which ends
		// the events reader's read: no goroutine of the session outlives
		// teardown.
		s.readers.Wait()
	})
}

// setupTCP makes a session's setting engine gather a passive TCP candidate
// per POP that has a TCP port (podnet.Socket.TCP, docs/tcp.md), and
// records those candidates' addresses as the session's POP addresses (so
// selection and POP switching treat a TCP pair as being at its POP).
// Without such POPs it changes nothing.
func (t *Transceiver) setupTCP(se *webrtc.SettingEngine, s *session, pops []POPAddr) {
	mux, vipNet, v4, v6 := t.sock.TCP(pops)
	if mux == nil {
		return
	}
	for _, p := range pops {
		if p.TCPPort != 0 {
			s.popByVIP[netip.AddrPortFrom(p.VIP.Addr().Unmap(), p.TCPPort)] = p.ID
		}
	}
	types := []webrtc.NetworkType{webrtc.NetworkTypeUDP4, webrtc.NetworkTypeUDP6}
	if v4 {
		types = append(types, webrtc.NetworkTypeTCP4)
	}
	if v6 {
		types = append(types, webrtc.NetworkTypeTCP6)
	}
	se.SetNetworkTypes(types)
	se.SetNet(vipNet)
	se.SetICETCPMux(mux)
}
