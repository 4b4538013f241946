// Package transceiver terminates WebRTC for rtcedge: it is the session
// layer of a pod, the only place with hard per-call state (Pion's ICE,
// DTLS and SCTP, the session lifecycle, the session API, ICE restarts).
//
// All sessions of a pod share one UDP socket, owned by the packet layer
// (package podnet): it strips the relay encapsulation header (docs/wire.md
// section 2), so Pion sees the client's real address, and presents one ICE
// mux per POP whose local address is that POP's VIP, so the only host
// candidates a session advertises are relay VIPs. The server runs ICE-lite
// with a server ufrag that is a freshly minted routing token: relays route
// the client's first STUN packet by it.
//
// Audio and data-channel events are bridged to a backend.Backend; the echo
// subpackage is the reference one.
package transceiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/interceptor"
	"github.com/pion/webrtc/v4"

	"github.com/rtcedge/rtcedge/internal/sdpcheck"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/internal/steer"
	"github.com/rtcedge/rtcedge/transceiver/pace"
	"github.com/rtcedge/rtcedge/transceiver/podnet"
)

// POPAddr names a POP whose VIP a session advertises; the same type as the
// session API's wire form.
type POPAddr = podnet.POP

// CreateRequest asks for a new session.
type CreateRequest struct {
	Offer string
	// POPs to advertise, preferred first; later ones get lower candidate
	// priority so clients use them only when the first fails.
	POPs []POPAddr
	// Config is passed to the backend as backend.SessionInfo.Config.
	Config []byte
	// Caller is the call's policy for its caller's events (signaling's,
	// passed to the backend in backend.SessionInfo); nil: the defaults.
	Caller *sessionapi.Caller
	// Steer is the caller's steering key (steer.Key's text) under which
	// the pod reports the round trips it measures; empty: none.
	Steer string
	// SteerTicket is the front's ticket for this call on this pod
	// (sessionapi.HeaderSteerTicket), sent with the call's round trips;
	// without one (no deployment authority) they are sent untagged.
	SteerTicket string
}

// CreateResult is a created session.
type CreateResult struct {
	ID     string
	Answer string
}

// maxPOPs bounds the candidates per answer; more adds nothing but checks.
// A ticket names every POP of its call, so the bound is the ticket's.
const maxPOPs = steer.MaxTicketPOPs

// Transceiver holds the sessions of one pod.
type Transceiver struct {
	// Static after New.
	cfg  Config
	log  *slog.Logger
	m    *metrics
	sock *podnet.Socket // the packet layer: sockets, muxes, routes, the media path
	me   *webrtc.MediaEngine
	ir   *interceptor.Registry
	// mediaPath: sessions move their SRTP onto the pod's own path once
	// connected (podnet.Media); false with Config.PionMedia.
	mediaPath bool
	base      webrtc.SettingEngine
	// byNonce finds a session by its routing token's nonce (podnet asks).
	byNonce nonceIndex
	// pacer sends every session's outgoing audio at real time (Run
	// drives it).
	pacer *pace.Scheduler

	mu       sync.Mutex
	sessions map[string]*session // guarded by mu
	calls    map[string]*rtpCall // phone calls (rtpcall.go), guarded by mu
	reserved int                 // sessions being created, guarded by mu
	draining bool                // guarded by mu
	closed   bool                // guarded by mu
	drained  chan struct{}       // closed when draining and no sessions remain; guarded by mu

	wg           sync.WaitGroup // session teardown goroutines
	creates      sync.WaitGroup // CreateSession calls past reserve; Close waits for them
	closeOnce    sync.Once
	runDone      chan struct{} // closed by Close to stop Run
	stateChanged chan struct{} // wakes Publish (buffered 1)
	rttOut       *rttReporter  // measured round trips waiting for ReportRTT
}

// New builds a transceiver over the pod's UDP socket. It takes ownership of
// conn and closes it on Close. Nothing runs until Run.
func New(cfg Config, conn *net.UDPConn) (*Transceiver, error) {
	cfg.Defaults()
	err := cfg.check()
	if err == nil && (cfg.Keys == nil || cfg.Hop == nil || cfg.Backend == nil) {
		err = errors.New("the token keyring, the inter-tier hop keys and the backend are required")
	}
	if err != nil {
		return nil, fmt.Errorf("transceiver config: %w", err)
	}
	m, err := newMetrics(cfg.Registerer, cfg.TurnRegisterer)
	if err != nil {
		return nil, err
	}
	rttOut, err := newRTTReporter(cfg.PodKeys, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	me := &webrtc.MediaEngine{}
	if err := me.RegisterCodec(webrtc.RTPCodecParameters{
		RTPCodecCapability: opusCapability,
		PayloadType:        111,
	}, webrtc.RTPCodecTypeAudio); err != nil {
		return nil, fmt.Errorf("register opus: %w", err)
	}
	// The pod's media path sends its own reports: Pion's interceptors
	// would send a second set under the same SRTCP keys.
	mediaPath := !cfg.PionMedia && mediaPathSupported()
	ir := &interceptor.Registry{}
	if !mediaPath {
		if ir, err = voiceInterceptors(); err != nil {
			return nil, err
		}
	}

	t := &Transceiver{
		cfg: cfg,
		log: cfg.Logger.With("component", "transceiver", "cluster", cfg.Cluster, "pod", cfg.Pod),
		m:   m,
		me:  me,
		ir:  ir,

		mediaPath: mediaPath,
		sessions:  map[string]*session{},
		calls:     map[string]*rtpCall{},
		runDone:   make(chan struct{}),

		stateChanged: make(chan struct{}, 1),
		rttOut:       rttOut,
	}
	t.sock = podnet.NewSocket(conn, podnet.Config{Cluster: cfg.Cluster, Pod: cfg.Pod, HopKeys: cfg.Hop, Relays: cfg.Relays,
		Sessions: &t.byNonce, Metrics: m.net, Now: cfg.Now})
	t.pacer = pace.New(pace.Config{Counters: pace.Counters{
		Generated: m.replyAudio.WithLabelValues(replyGenerated),
		Sent:      m.replyAudio.WithLabelValues(replySent),
		Dropped:   m.replyAudio.WithLabelValues(replyDropped),
		Evicted:   m.dropped[dropReplyItem],
	}, Batch: t.sock})

	se := webrtc.SettingEngine{LoggerFactory: pionLoggers{t.log}}
	se.SetLite(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4, webrtc.NetworkTypeUDP6})
	se.SetIncludeLoopbackCandidate(true)
	se.DisableActiveTCP(true) // never dial out to a client's passive TCP candidate (docs/tcp.md)
	role := webrtc.DTLSRoleClient
	if cfg.DTLSRole == "server" {
		role = webrtc.DTLSRoleServer
		se.SetDTLSInsecureSkipHelloVerify(true)
	}
	if err := se.SetAnsweringDTLSRole(role); err != nil {
		return nil, err
	}
	se.SetICETimeouts(cfg.DisconnectedTimeout, cfg.FailedTimeout, 2*time.Second)
	se.SetSCTPRTOMax(cfg.SCTPRTOMax)
	sizeForVoice(&se)
	t.base = se
	return t, nil
}

var opusCapability = webrtc.RTPCodecCapability{
	MimeType:    webrtc.MimeTypeOpus,
	ClockRate:   48000,
	Channels:    2,
	SDPFmtpLine: "minptime=10;useinbandfec=1",
}

// Run reads the pod socket and runs housekeeping until ctx ends or Close is
// called; then it closes the transceiver. It returns nil on a normal stop.
func (t *Transceiver) Run(ctx context.Context) error {
	readDone := make(chan error, 1)
	go func() { readDone <- t.sock.Read(t.cfg.Readers) }()
	reportsDone, reportsStop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reportsDone)
		t.sock.Report(reportsStop)
	}()
	pacerDone, pacerStop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pacerDone)
		t.pacer.Run(pacerStop)
	}()
	defer func() {
		close(reportsStop)
		close(pacerStop)
		<-reportsDone
		<-pacerDone
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var err error
	for err == nil {
		select {
		case <-ctx.Done():
			t.Close()
			return <-readDone
		case <-t.runDone:
			return <-readDone
		case err = <-readDone:
			if err == nil {
				// The readers end when the socket closes. Closed by Close or
				// by the node's shutdown (ctx ended too; select picks at
				// random among ready cases): the normal end.
				select {
				case <-t.runDone:
					return nil
				case <-ctx.Done():
					t.Close()
					return nil
				default:
				}
				err = errors.New("pod socket closed")
			}
		case <-tick.C:
			t.housekeep()
		}
	}
	t.Close()
	return fmt.Errorf("read pod socket: %w", err)
}

// housekeep expires idle sessions and stale routes.
func (t *Transceiver) housekeep() {
	now := t.cfg.Now()
	t.mu.Lock()
	var idle []*session
	for _, s := range t.sessions {
		if s.isIdle(now, t.cfg.IdleTimeout) {
			idle = append(idle, s)
		}
	}
	var silent []*rtpCall
	for _, c := range t.calls {
		if c.rtpSilent(now, t.cfg.RTPTimeout) {
			silent = append(silent, c)
		} else {
			c.refreshRoute(now)
		}
	}
	t.mu.Unlock()
	for _, s := range idle {
		s.end(endIdle)
	}
	for _, c := range silent {
		c.end(endRTPTimeout)
	}
	t.sock.Sweep(t.cfg.RouteTTL)
}

// Sessions returns the number of sessions held, including ones being set up.
func (t *Transceiver) Sessions() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions) + len(t.calls) + t.reserved
}

// Draining reports whether Drain has been called.
func (t *Transceiver) Draining() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.draining
}

// Drain stops taking new sessions. It returns a channel closed once every
// existing session has ended; sessions are not cut short (see EndAll).
func (t *Transceiver) Drain() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.draining {
		t.draining = true
		t.drained = make(chan struct{})
		t.maybeDrainedLocked()
		t.notifyState()
	}
	return t.drained
}

func (t *Transceiver) maybeDrainedLocked() {
	if t.draining && len(t.sessions) == 0 && len(t.calls) == 0 && t.reserved == 0 {
		select {
		case <-t.drained:
		default:
			close(t.drained)
		}
	}
}

// EndAll ends every session with the given reason label and waits for them.
func (t *Transceiver) endAll(reason string) {
	t.mu.Lock()
	all := make([]*session, 0, len(t.sessions))
	for _, s := range t.sessions {
		all = append(all, s)
	}
	calls := make([]*rtpCall, 0, len(t.calls))
	for _, c := range t.calls {
		calls = append(calls, c)
	}
	t.mu.Unlock()
	for _, s := range all {
		s.end(reason)
	}
	for _, c := range calls {
		c.end(reason)
	}
	t.wg.Wait()
}

// Close ends all sessions, stops the muxes and closes the socket. It is
// idempotent and waits until nothing of the transceiver is left running.
func (t *Transceiver) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		close(t.runDone)
		t.creates.Wait() // a create in flight must not open a mux after they close
		t.endAll(endShutdown)
		_ = t.sock.Close()
	})
	return nil
}

// EndSession ends a session as the caller's DELETE asks.
func (t *Transceiver) EndSession(id string) error {
	t.mu.Lock()
	s, c := t.sessions[id], t.calls[id]
	t.mu.Unlock()
	if c != nil {
		c.end(endDeleted)
		return nil
	}
	if s == nil {
		return ErrNotFound
	}
	s.end(endDeleted)
	return nil
}

// reserve takes a session slot or says why not.
func (t *Transceiver) reserve() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return ErrClosed
	case t.draining:
		t.m.rejected.WithLabelValues(rejectDraining).Inc()
		return ErrDraining
	case len(t.sessions)+len(t.calls)+t.reserved >= t.cfg.MaxSessions:
		t.m.rejected.WithLabelValues(rejectFull).Inc()
		return ErrFull
	}
	t.reserved++
	t.creates.Add(1) // under mu, and only while not closed: Close's Wait cannot race it
	return nil
}

// muxesFor returns the ICE muxes of the requested POPs, creating the virtual
// conns and muxes of POPs seen for the first time.
func (t *Transceiver) muxesFor(pops []POPAddr) ([]ice.UDPMux, error) {
	if len(pops) == 0 || len(pops) > maxPOPs {
		return nil, fmt.Errorf("%w: need 1 to %d POPs, got %d", ErrBadPOP, maxPOPs, len(pops))
	}
	out := make([]ice.UDPMux, 0, len(pops))
	seen := map[uint16]bool{}
	for _, p := range pops {
		if p.ID == 0 || !p.VIP.IsValid() || p.VIP.Port() == 0 || p.VIP.Addr().IsUnspecified() || seen[p.ID] {
			return nil, fmt.Errorf("%w: invalid or repeated POP %d %v", ErrBadPOP, p.ID, p.VIP)
		}
		seen[p.ID] = true
		mux, err := t.sock.UDPMux(p.ID, p.VIP)
		if err != nil {
			return nil, fmt.Errorf("%w: POP %d: %v", ErrBadPOP, p.ID, err)
		}
		out = append(out, mux)
	}
	return out, nil
}

// beforeRegister, when set (tests), runs between a session's creation and
// its registration.
var beforeRegister func(*session)

// CreateSession creates a session for an offer and returns its answer. The
// answer is complete (no trickle): its candidates are the requested VIPs.
func (t *Transceiver) CreateSession(ctx context.Context, req CreateRequest) (CreateResult, error) {
	if err := sdpcheck.Offer(req.Offer); err != nil {
		t.m.rejected.WithLabelValues(rejectBadOffer).Inc()
		return CreateResult{}, fmt.Errorf("%w: %w", ErrBadOffer, err)
	}
	if err := t.reserve(); err != nil {
		return CreateResult{}, err
	}
	defer t.creates.Done()
	s, answer, err := t.newSession(ctx, req)
	if err == nil && beforeRegister != nil {
		beforeRegister(s)
	}
	if err == nil && ctx.Err() != nil {
		// The caller gave up (its timeout passed): nobody will get this
		// answer, so the session must not hold a slot until its connect
		// timeout.
		err = fmt.Errorf("create session: %w", ctx.Err())
	}
	t.mu.Lock()
	t.reserved--
	if err == nil {
		if t.closed {
			err = ErrClosed
		} else if s.forgotten {
			// The backend ended it meanwhile (netbackend: its server hung
			// up after the hello): registered, nothing could end it again.
			err = ErrBackendEnded
		} else {
			t.sessions[s.id] = s
			t.setSessionsGaugeLocked()
			t.indexUfrag(s.ufrag, s)
		}
	}
	t.maybeDrainedLocked()
	t.mu.Unlock()
	if err != nil {
		if s != nil {
			// Ended here: a later end (the PeerConnection's "closed"
			// callback) must not count it or add to t.wg after Close.
			s.endOnce.Do(func() {})
			s.teardown()
		}
		t.countRejected(err)
		return CreateResult{}, err
	}
	t.m.created.Inc()
	s.armConnectTimer(t.cfg.ConnectTimeout)
	return CreateResult{ID: s.id, Answer: answer}, nil
}

// countRejected counts a create that failed past reserve.
func (t *Transceiver) countRejected(err error) {
	switch {
	case errors.Is(err, ErrBadPOP):
		t.m.rejected.WithLabelValues(rejectBadPOP).Inc()
	case errors.Is(err, ErrBackendEnded):
		t.m.rejected.WithLabelValues(rejectBackend).Inc()
	case !errors.Is(err, ErrClosed):
		t.m.rejected.WithLabelValues(rejectInternal).Inc()
	}
}

// setSessionsGaugeLocked sets the sessions gauge: WebRTC sessions and
// phone calls. t.mu held.
func (t *Transceiver) setSessionsGaugeLocked() {
	t.m.sessions.Set(float64(len(t.sessions) + len(t.calls)))
}

// forgetCall removes an ended phone call, counting its teardown in t.wg
// (as forget does for a session).
func (t *Transceiver) forgetCall(c *rtpCall) {
	t.mu.Lock()
	t.wg.Add(1)
	c.forgotten = true
	if t.calls[c.id] == c {
		delete(t.calls, c.id)
		t.setSessionsGaugeLocked()
	}
	t.maybeDrainedLocked()
	t.mu.Unlock()
}

// forget removes an ended session.
func (t *Transceiver) forget(s *session) {
	t.mu.Lock()
	// The teardown is counted in the same critical section that removes the
	// session: endAll snapshots the sessions under t.mu, so a session it
	// does not see has already been added to t.wg, and its Wait cannot
	// return before that teardown (or race with the Add).
	t.wg.Add(1)
	s.forgotten = true
	if t.sessions[s.id] == s {
		delete(t.sessions, s.id)
		t.setSessionsGaugeLocked()
	}
	t.byNonce.remove(s)
	t.maybeDrainedLocked()
	t.mu.Unlock()
}

// newID mints a session ID routable to this pod.
func (t *Transceiver) newID() (string, error) {
	id, err := sessionid.New(t.cfg.Cluster, t.cfg.Pod)
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// nonceIndex finds the session of a datagram's routing token (the nonce in
// its encapsulation header): a session's first server ufrag, and one per
// ICE restart. It is the podnet.Sessions the packet layer asks.
type nonceIndex struct {
	mu sync.Mutex
	m  map[[6]byte]*session // guarded by mu
}

// maxNoncesPerSession bounds the tokens a session is found by: its first
// server ufrag's and its two latest ICE restarts' (the ones the packet
// layer still translates, podnet's maxAliases), so that a client
// restarting over and over does not grow the index.
const maxNoncesPerSession = 3

func (x *nonceIndex) add(nonce [6]byte, s *session) {
	x.mu.Lock()
	if x.m == nil {
		x.m = map[[6]byte]*session{}
	}
	x.m[nonce] = s
	s.nonces = append(s.nonces, nonce)
	if len(s.nonces) > maxNoncesPerSession {
		// Keep the first; forget the oldest restart's.
		if old := s.nonces[1]; x.m[old] == s {
			delete(x.m, old)
		}
		s.nonces = append(s.nonces[:1], s.nonces[2:]...)
	}
	x.mu.Unlock()
}

func (x *nonceIndex) get(nonce [6]byte) *session {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.m[nonce]
}

// ByToken implements podnet.Sessions.
func (x *nonceIndex) ByToken(nonce [6]byte) podnet.Session {
	if s := x.get(nonce); s != nil {
		return s
	}
	return nil
}

func (x *nonceIndex) remove(s *session) {
	x.mu.Lock()
	for _, n := range s.nonces {
		if x.m[n] == s {
			delete(x.m, n)
		}
	}
	s.nonces = nil
	x.mu.Unlock()
}

// indexUfrag adds a server ufrag the pod minted for s to the index.
func (t *Transceiver) indexUfrag(ufrag string, s *session) {
	if tok, err := t.cfg.Keys.Verify([]byte(ufrag)); err == nil {
		t.byNonce.add(tok.Nonce, s)
	}
}
