// Package transceiver terminates WebRTC for rtcedge. It is the only place
// with hard per-call state: ICE, DTLS, SRTP and the session lifecycle.
//
// All sessions of a pod share one UDP socket. Every datagram on it carries the
// relay encapsulation header (WIRE.md section 2); the pod strips it, so Pion
// sees the client's real address, and presents one virtual net.PacketConn per
// POP whose local address is that POP's VIP. Pion's ICE UDP mux reads those
// conns, so the only host candidates a session advertises are relay VIPs.
// The server runs ICE-lite with a server ufrag that is a freshly minted
// routing token: relays route the client's first STUN packet by it.
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
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/sdpcheck"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/internal/token"
)

// Config configures a Transceiver. Zero durations take the defaults noted.
type Config struct {
	Cluster uint16          // this pod's cluster ID (non-zero)
	Pod     uint16          // this pod's ID, unique among live pods of the cluster
	Keys    *token.Keyring  // mints server ufrags
	Backend backend.Backend // the inference side of every session

	MaxSessions    int           // capacity; default 500
	ConnectTimeout time.Duration // a session not connected by then is freed; default 30s
	IdleTimeout    time.Duration // a connected session with no media or events for this long ends; default 60s
	// ICE consent: after DisconnectedTimeout without a packet from the
	// client the session is "disconnected" (it still recovers), after
	// FailedTimeout it ends. Defaults 5s and 15s.
	DisconnectedTimeout time.Duration
	FailedTimeout       time.Duration
	// SCTPRTOMax caps SCTP's retransmission back-off so data channels
	// recover quickly after a path gap; default 1s.
	SCTPRTOMax time.Duration
	// RouteTTL is how long a client's return route is kept without
	// packets from it; default 2m.
	RouteTTL time.Duration
	// DTLSRole is the server's DTLS role: "client" answers a=setup:active
	// (the server sends the ClientHello the moment ICE connects), "server"
	// answers a=setup:passive and skips the HelloVerify cookie round trip
	// (ICE has already proven the path with MESSAGE-INTEGRITY, so the
	// cookie adds nothing). Default "client".
	DTLSRole string
	// WaitForNomination makes the server select a candidate pair only when
	// the client nominates it, as RFC 8445 describes for lite agents. By
	// default the preferred POP's pair is selected on the first
	// authenticated check (see session.onBindingRequest), which saves
	// browsers about one ping interval of setup time.
	WaitForNomination bool
	// Relays, when set, limits the datagrams the pod accepts to those from
	// the cluster's relays (FollowRelays keeps it in step with gossip).
	Relays *RelaySet
	// Readers is how many goroutines read the pod socket, each taking
	// batches of datagrams (recvmmsg) and running their receive path;
	// default one per core (udpio.Procs: GOMAXPROCS without the relays' event loops), at most 4.
	Readers int
	// PionMedia keeps every session's SRTP on Pion's own path (its SRTP
	// sessions, read streams and report interceptors) instead of the pod's
	// (media.go). Only for comparing the two: the pod's path costs the pod
	// a fraction of the CPU per datagram (docs/benchmarks.md).
	PionMedia bool
	// HopKeys are the cluster's inter-tier MAC keys (required): datagrams
	// whose tag does not verify are dropped before anything else, replies
	// are sealed. SetHopKeys replaces them without a restart.
	HopKeys *encap.Keyring
	// SessionAPISecret is the cluster's bearer secret: Handler refuses
	// session API requests without it (health probes excepted). Empty: no
	// credentials needed (dev worlds and tests).
	SessionAPISecret string
	// SessionAPISecretHash, instead of the secret, is its
	// sessionapi.SecretHash: the pod verifies the front's secret without
	// holding it, so a compromised pod cannot call its cluster's other
	// pods. It wins over SessionAPISecret.
	SessionAPISecretHash string

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil: metrics are not registered
	Now        func() time.Time      // default time.Now
}

func (c *Config) applyDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 500
	}
	def(&c.ConnectTimeout, 30*time.Second)
	def(&c.IdleTimeout, 60*time.Second)
	def(&c.DisconnectedTimeout, 5*time.Second)
	def(&c.FailedTimeout, 15*time.Second)
	def(&c.SCTPRTOMax, time.Second)
	def(&c.RouteTTL, 2*time.Minute)
	if c.Readers == 0 {
		c.Readers = defaultReaders()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports the first problem with the configuration.
func (c *Config) Validate() error {
	switch {
	case c.Cluster == 0:
		return errors.New("transceiver config: cluster ID must be non-zero")
	case c.Keys == nil:
		return errors.New("transceiver config: token keyring is required")
	case c.Backend == nil:
		return errors.New("transceiver config: backend is required")
	case c.HopKeys == nil:
		return errors.New("transceiver config: inter-tier hop keys are required")
	case c.MaxSessions < 0:
		return errors.New("transceiver config: max sessions must not be negative")
	case c.Readers < 0:
		return errors.New("transceiver config: readers must not be negative")
	case c.DTLSRole != "" && c.DTLSRole != "client" && c.DTLSRole != "server":
		return fmt.Errorf("transceiver config: dtls role %q: want client or server", c.DTLSRole)
	}
	return nil
}

// POPAddr names a POP whose VIP a session advertises; the same type as the
// session API's wire form.
type POPAddr = sessionapi.POP

// CreateRequest asks for a new session.
type CreateRequest struct {
	Offer string
	// POPs to advertise, preferred first; later ones get lower candidate
	// priority so clients use them only when the first fails.
	POPs []POPAddr
	// Config is passed to the backend as backend.SessionInfo.Config.
	Config []byte
}

// CreateResult is a created session.
type CreateResult struct {
	ID     string
	Answer string
}

// podReadBuffer is the receive buffer asked for the pod socket.
const podReadBuffer = 4 << 20

// maxPOPs bounds the candidates per answer; more adds nothing but checks.
const maxPOPs = 4

// Transceiver holds the sessions of one pod.
type Transceiver struct {
	// Static after New.
	cfg  Config
	log  *slog.Logger
	m    *metrics
	sock *podSocket
	me   *webrtc.MediaEngine
	ir   *interceptor.Registry
	// mediaPath: sessions move their SRTP onto the pod's own path once
	// connected (media.go); false with Config.PionMedia.
	mediaPath bool
	base      webrtc.SettingEngine
	// restarts translates the ICE credentials of restarted sessions (restart.go).
	restarts *restartTable
	// byNonce finds a session by its routing token's nonce (hint.go).
	byNonce nonceIndex

	mu       sync.Mutex
	muxes    map[uint16]*popMux  // per POP, guarded by mu
	sessions map[string]*session // guarded by mu
	reserved int                 // sessions being created, guarded by mu
	draining bool                // guarded by mu
	closed   bool                // guarded by mu
	drained  chan struct{}       // closed when draining and no sessions remain; guarded by mu

	wg           sync.WaitGroup // session teardown goroutines
	creates      sync.WaitGroup // CreateSession calls past reserve; Close waits for them
	closeOnce    sync.Once
	runDone      chan struct{} // closed by Close to stop Run
	stateChanged chan struct{} // wakes Publish (buffered 1)
}

// New builds a transceiver over the pod's UDP socket. It takes ownership of
// conn and closes it on Close. Nothing runs until Run.
func New(cfg Config, conn *net.UDPConn) (*Transceiver, error) {
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
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
		muxes:     map[uint16]*popMux{},
		sessions:  map[string]*session{},
		runDone:   make(chan struct{}),

		stateChanged: make(chan struct{}, 1),
	}
	// Every session of the pod arrives on this one socket: at 50 pps per
	// session, the kernel's default receive buffer (about 200 KiB, some 300
	// small datagrams at kernel accounting) fills within a 10–20 ms stall
	// of the reader at a few hundred sessions, and the kernel drops
	// silently. Best effort: the kernel caps it at net.core.rmem_max.
	_ = conn.SetReadBuffer(podReadBuffer)
	t.sock = newPodSocket(conn, cfg.Cluster, cfg.Pod, cfg.HopKeys, cfg.Relays, m, cfg.Now)
	t.restarts = newRestartTable()
	t.sock.restarts = t.restarts
	t.sock.stray = t.strayMedia

	se := webrtc.SettingEngine{LoggerFactory: pionLoggers{t.log}}
	se.SetLite(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4, webrtc.NetworkTypeUDP6})
	se.SetIncludeLoopbackCandidate(true)
	se.DisableActiveTCP(true) // never dial out to a client's passive TCP candidate (tcp.go)
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
	go func() { readDone <- t.readAll() }()
	reportsDone, reportsStop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reportsDone)
		t.reportLoop(reportsStop)
	}()
	defer func() {
		close(reportsStop)
		<-reportsDone
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

// readAll runs the socket's readers until the socket is closed, and
// returns the first reader's error.
func (t *Transceiver) readAll() error { return t.sock.readers(t.cfg.Readers) }

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
	t.mu.Unlock()
	for _, s := range idle {
		s.end(endIdle)
	}
	t.m.routes.Set(float64(t.sock.sweep(t.cfg.RouteTTL)))
	t.restarts.sweep(now)
}

// Sessions returns the number of sessions held, including ones being set up.
func (t *Transceiver) Sessions() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions) + t.reserved
}

// Capacity returns MaxSessions.
func (t *Transceiver) Capacity() int { return t.cfg.MaxSessions }

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
	if t.draining && len(t.sessions) == 0 && t.reserved == 0 {
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
	t.mu.Unlock()
	for _, s := range all {
		s.end(reason)
	}
	t.wg.Wait()
}

// EndAllForDrainDeadline ends the sessions still running when a drain
// deadline passes.
func (t *Transceiver) EndAllForDrainDeadline() { t.endAll(endDrainDeadline) }

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
		t.mu.Lock()
		for _, mux := range t.muxes {
			_ = mux.Close()
		}
		t.mu.Unlock()
		t.sock.closeAll()
		_ = t.sock.conn.Close()
	})
	return nil
}

// EndSession ends a session as the caller's DELETE asks.
func (t *Transceiver) EndSession(id string) error {
	t.mu.Lock()
	s := t.sessions[id]
	t.mu.Unlock()
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
	case len(t.sessions)+t.reserved >= t.cfg.MaxSessions:
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
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]ice.UDPMux, 0, len(pops))
	seen := map[uint16]bool{}
	for _, p := range pops {
		if p.ID == 0 || !p.VIP.IsValid() || p.VIP.Port() == 0 || p.VIP.Addr().IsUnspecified() || seen[p.ID] {
			return nil, fmt.Errorf("%w: invalid or repeated POP %d %v", ErrBadPOP, p.ID, p.VIP)
		}
		seen[p.ID] = true
		pc, created, err := t.sock.popConn(p.ID, p.VIP)
		if err != nil {
			return nil, fmt.Errorf("%w: POP %d: %v", ErrBadPOP, p.ID, err)
		}
		if created {
			t.muxes[p.ID] = pc.mux
		}
		out = append(out, pc.mux)
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
			t.m.sessions.Set(float64(len(t.sessions)))
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
		if errors.Is(err, ErrBadPOP) {
			t.m.rejected.WithLabelValues(rejectBadPOP).Inc()
		} else if errors.Is(err, ErrBackendEnded) {
			t.m.rejected.WithLabelValues(rejectBackend).Inc()
		} else if !errors.Is(err, ErrClosed) {
			t.m.rejected.WithLabelValues(rejectInternal).Inc()
		}
		return CreateResult{}, err
	}
	t.m.created.Inc()
	s.armConnectTimer(t.cfg.ConnectTimeout)
	return CreateResult{ID: s.id, Answer: answer}, nil
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
		t.m.sessions.Set(float64(len(t.sessions)))
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
