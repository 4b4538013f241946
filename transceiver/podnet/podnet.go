// Package podnet is the transceiver pod's packet layer. A Socket owns the
// pod's one UDP socket and its readers, the virtual per-POP conns and ICE
// muxes Pion reads and writes (route.go, popmux.go, tcp.go), every client's
// return route and the probes that prove a client's address, the follower
// of a caller whose address changed (follow.go), the translation of
// ICE-restarted checks (restart.go) and the SRTP fast path of connected
// sessions (media.go). Each datagram is handled by handle (handle.go):
// parse, decide, write.
//
// The session layer (package transceiver) owns Pion, the sessions and
// their lifecycle. It asks the Socket for the muxes a session's agent uses
// and registers what the packet path needs of a session (its SRTP keys, its
// restarted credentials); the Socket asks it, through Sessions and Session,
// which session a routing token names, where a session's selected path
// goes, and hands it decrypted audio. podnet never imports Pion's webrtc.
package podnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// POP names a POP whose VIP a session advertises (the session API's form).
type POP = sessionapi.POP

// Creds are one side's ICE credentials.
type Creds struct{ Ufrag, Pwd string }

// Sessions is the session layer as the packet layer asks it.
type Sessions interface {
	// ByToken returns the session whose server ufrag carries the routing
	// token nonce, nil if none.
	ByToken(nonce [6]byte) Session
}

// Session is one session as the packet layer sees it. Its methods run on
// socket readers and on the ICE agent's loop: they must not block, nor
// call the session's PeerConnection.
type Session interface {
	// Audio takes one decrypted frame of the client's audio (media.go);
	// it counts as the session's activity.
	Audio(payload []byte, d time.Duration)
	// Path is the selected candidate pair: its POP (0 before one is
	// selected), the client's address and whether it is ICE-TCP.
	Path() (pop uint16, peer netip.AddrPort, tcp bool)
	// Creds are the ICE credentials the session's agent was set up with:
	// the server's and the client's (from the offer).
	Creds() (server, client Creds)
}

// Config configures a Socket.
type Config struct {
	Cluster, Pod uint16
	HopKeys      *encap.Keyring // inter-tier MAC keys (required); SetHopKeys replaces them
	Relays       *RelaySet      // the senders accepted; nil: every sender (the MAC still applies)
	Sessions     Sessions       // nil: no session is found by its token
	Metrics      *Metrics       // required
	Now          func() time.Time
}

// podReadBuffer is the receive buffer asked for the pod socket.
const podReadBuffer = 4 << 20

// Socket owns the pod's single UDP socket and splits its traffic into one
// popConn per POP and the ICE-TCP side. A client given candidates at two
// POPs reaches the pod from one address through two VIPs; Pion must see
// two local candidates, so each POP is its own conn, picked by the
// header's POP ID (docs/wire.md section 2).
type Socket struct {
	// Static after NewSocket.
	conn     *net.UDPConn
	cluster  uint16
	pod      uint16
	relays   *RelaySet
	sessions Sessions
	m        *Metrics
	now      func() time.Time
	keys     atomic.Pointer[encap.Keyring]
	restarts restartTable // checks of ICE-restarted sessions
	rtp      rtpTable     // phone calls by their negotiated media address (rtp.go)
	out      *outQueue    // batched sends
	tcp      tcpSide      // ICE-TCP clients

	mu   sync.RWMutex
	pops map[uint16]*popConn // guarded by mu

	mediaMu sync.Mutex
	media   map[*Media]struct{} // sessions on the media path, for Report; guarded by mediaMu
}

// NewSocket builds the packet layer over the pod's UDP socket; it owns
// conn from then on and closes it on Close. Nothing is read until Read.
func NewSocket(conn *net.UDPConn, cfg Config) *Socket {
	// Every session of the pod arrives on this one socket: at 50 pps per
	// session, the kernel's default receive buffer (about 200 KiB, some 300
	// small datagrams at kernel accounting) fills within a 10–20 ms stall
	// of the reader at a few hundred sessions, and the kernel drops
	// silently. Best effort: the kernel caps it at net.core.rmem_max.
	_ = conn.SetReadBuffer(podReadBuffer)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Socket{conn: conn, cluster: cfg.Cluster, pod: cfg.Pod, relays: cfg.Relays, sessions: cfg.Sessions, m: cfg.Metrics, now: cfg.Now,
		pops: map[uint16]*popConn{}, media: map[*Media]struct{}{}, out: newOutQueue(conn, cfg.Metrics)}
	s.keys.Store(cfg.HopKeys)
	s.restarts.init(cfg.Metrics)
	s.tcp.init(s)
	return s
}

// SetHopKeys replaces the pod's inter-tier keys (key rotation): replies are
// sealed with the new current key and datagrams verified against every key
// it holds, from the next datagram on. nil is ignored.
func (s *Socket) SetHopKeys(k *encap.Keyring) {
	if k != nil {
		s.keys.Store(k)
	}
}

// UDPMux returns the ICE UDP mux of a POP, creating its conn on first use.
// It fails when the POP ID is already bound to another VIP.
func (s *Socket) UDPMux(id uint16, vip netip.AddrPort) (ice.UDPMux, error) {
	pc, _, err := s.popConn(id, vip)
	if err != nil {
		return nil, err
	}
	return pc.mux, nil
}

// popConn returns the virtual conn for a POP, creating it on first use.
func (s *Socket) popConn(id uint16, vip netip.AddrPort) (*popConn, bool, error) {
	s.mu.RLock()
	pc := s.pops[id]
	s.mu.RUnlock()
	if pc == nil {
		s.mu.Lock()
		if pc = s.pops[id]; pc == nil {
			pc = &popConn{sock: s, id: id, vip: vip, local: net.UDPAddrFromAddrPort(vip),
				closed: make(chan struct{}), routes: map[netip.AddrPort]*route{}}
			pc.mux = newPOPMux(pc)
			s.pops[id] = pc
			s.mu.Unlock()
			return pc, true, nil
		}
		s.mu.Unlock()
	}
	if pc.vip != vip {
		return nil, false, errPOPRebound
	}
	return pc, false, nil
}

func (s *Socket) lookup(id uint16) *popConn {
	s.mu.RLock()
	pc := s.pops[id]
	s.mu.RUnlock()
	return pc
}

// Sweep forgets routes idle for longer than ttl, provisional ones older
// than provisionalTTL, held datagrams past heldTTL and restarted checks
// never answered; it sets the routes gauge to how many remain, and
// returns that.
func (s *Socket) Sweep(ttl time.Duration) int {
	now := s.now()
	cutoff, provCutoff := now.Add(-ttl).UnixNano(), now.Add(-provisionalTTL).UnixNano()
	s.mu.RLock()
	pops := make([]*popConn, 0, len(s.pops))
	for _, pc := range s.pops {
		pops = append(pops, pc)
	}
	s.mu.RUnlock()
	left := 0
	for _, pc := range pops {
		pc.mu.Lock()
		for addr, r := range pc.routes {
			if r.lastSeen.Load() < cutoff || (!r.confirmed.Load() && r.created < provCutoff) {
				pc.remove(addr, r)
			}
			for range r.expireHeld(now.UnixNano()) {
				s.m.drop(dropHeldExpired)
			}
		}
		left += len(pc.routes)
		pc.mu.Unlock()
	}
	left += s.tcp.sweep(cutoff)
	s.m.routes.Set(float64(left))
	s.restarts.sweep(now)
	return left
}

// LastSeen returns when the client last sent a datagram through a POP.
func (s *Socket) LastSeen(pop uint16, client netip.AddrPort) (time.Time, bool) {
	if p := s.tcp.peer(pop, client); p != nil {
		return time.Unix(0, p.lastSeen.Load()), true
	}
	pc := s.lookup(pop)
	if pc == nil {
		return time.Time{}, false
	}
	r := pc.route(client)
	if r == nil {
		return time.Time{}, false
	}
	return time.Unix(0, r.lastSeen.Load()), true
}

// Cork holds the datagrams the socket is asked to send until the matching
// Uncork, which sends them together (a sendmmsg per up to 32): the pod's
// pacer corks it for each 5 ms slot, so the frames of every call due in
// the slot cost one system call instead of one each (transceiver/pace).
// A full batch is sent at once; nothing waits for more traffic.
func (s *Socket) Cork() { s.out.cork() }

// Uncork releases a Cork and, if it was the last, sends what was held.
func (s *Socket) Uncork() { s.out.uncork() }

// Close closes every POP's mux and conn and the TCP side (writes fail from
// then on, reads end) and the socket, which ends Read.
func (s *Socket) Close() error {
	s.mu.Lock()
	for _, pc := range s.pops {
		_ = pc.mux.Close()
	}
	s.mu.Unlock()
	s.closeAll()
	return s.conn.Close()
}

// closeAll closes the TCP side and every POP conn.
func (s *Socket) closeAll() {
	s.tcp.closeAll()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pc := range s.pops {
		pc.Close()
	}
}

// DefaultReaders is how many goroutines should read the pod socket: one
// per core the process may use (udpio.Procs), at most 4. Every reader runs
// the whole receive path of its datagrams, so one core is not the ceiling
// of a pod.
//
// Why several readers on one port rather than the kernel's reuseport
// hash: that spreads by the sender, and a pod's senders are the few
// cluster relay replicas of its cluster; readerConns steers by client.
func DefaultReaders() int { return min(udpio.Procs(), 4) }

// Read runs n readers (handle.go) on the pod socket's port until the socket
// is closed and returns the first reader's error. Every reader has a socket
// or descriptor of its own (readerConns): the runtime lets one goroutine
// at a time read a descriptor, and a reader holds it for as long as it
// runs (udpio.BatchConn.ReadLoop handles its batches inside the raw read),
// so readers of one descriptor would take turns, never run at once
// (TestReadersRunInParallel). When one reader ends (the socket was closed,
// or it failed), the others are stopped.
func (s *Socket) Read(n int) error {
	conns, err := readerConns(s.conn, n)
	if errors.Is(err, net.ErrClosed) {
		return nil // closed before the readers started: the normal end
	}
	if err != nil {
		return err
	}
	errs := make(chan error, len(conns))
	for _, c := range conns {
		go func() { errs <- s.readLoop(c) }()
	}
	var first error
	for i := range conns {
		err := <-errs
		if i == 0 {
			closeConns(conns)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// readerConns returns n conns that together read the pod socket's port, the
// socket itself first; the caller closes the others.
//
// A socket bound with SO_REUSEPORT (the pod's own, transceiver.OpenSockets)
// gets n-1 siblings on its address and a classic BPF program that hands
// each datagram to socket (client port mod n), the port read from the
// encapsulation header: every datagram wakes one reader, a client's
// datagrams stay on one reader and in order, and the spread does not hang
// on the few cluster relay addresses a pod hears from (the kernel's own
// SO_REUSEPORT hash would). Any other socket (one a test or an
// embedding program passed in, or any socket off Linux) gets duplicates of
// its descriptor instead, which share its queue but wake every reader for
// each datagram; datagrams of one client may then be handed on out of
// order, which SRTP, SCTP and DTLS all tolerate.
func readerConns(c *net.UDPConn, n int) ([]*net.UDPConn, error) {
	conns := []*net.UDPConn{c}
	if n <= 1 {
		return conns, nil
	}
	shared := udpio.ReusePort(c)
	for range n - 1 {
		var sib *net.UDPConn
		var err error
		if shared {
			var cs []*net.UDPConn
			if cs, err = udpio.ListenReusePort(c.LocalAddr().(*net.UDPAddr).AddrPort(), 1); err == nil {
				sib = cs[0]
			}
		} else {
			sib, err = dupUDP(c)
		}
		if err != nil {
			closeConns(conns[1:])
			return nil, fmt.Errorf("pod socket reader: %w", err)
		}
		_ = sib.SetReadBuffer(podReadBuffer)
		conns = append(conns, sib)
	}
	if shared {
		// By the header's client port (internal/fastpath, with the
		// project's other kernel programs).
		err := fastpath.AttachReuseport(c, fastpath.ClientPortSteering(n))
		if err != nil {
			closeConns(conns[1:])
			return nil, fmt.Errorf("pod socket steering: %w", err)
		}
	}
	return conns, nil
}

// dupUDP returns a second conn on c's socket, with a descriptor of its own.
func dupUDP(c *net.UDPConn) (*net.UDPConn, error) {
	f, err := c.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pc, err := net.FilePacketConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		_ = pc.Close()
		return nil, errNotUDPConn
	}
	return uc, nil
}

func closeConns(cs []*net.UDPConn) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// RelaySet is the set of cluster relays whose datagrams the pod accepts
// (their data addresses, from the cluster pool). A datagram's header sets
// the return route of its client, so only the cluster's own relays may
// send them. Lookups are lock-free; Set replaces the whole set.
type RelaySet struct {
	// Replaced whole by Set (the gossip watcher), read lock-free by the
	// socket's readers; the map is immutable.
	addrs  atomic.Pointer[map[netip.AddrPort]struct{}]
	joined atomic.Bool // has held at least one relay
}

// Set replaces the trusted relays. Addresses are unmapped, as datagram
// sources are.
func (r *RelaySet) Set(addrs []netip.AddrPort) {
	m := make(map[netip.AddrPort]struct{}, len(addrs))
	for _, a := range addrs {
		m[netip.AddrPortFrom(a.Addr().Unmap(), a.Port())] = struct{}{}
	}
	r.addrs.Store(&m)
	if len(m) > 0 {
		r.joined.Store(true)
	}
}

// Trusted reports whether a datagram from addr is accepted. A nil set, or
// one that has never held a relay, trusts everyone (the bootstrap: a pod
// must not drop its first calls while the cluster pool is still joining;
// the MAC still applies). A set that has held relays and is now empty
// trusts no one: a partition or a rollout that leaves no live relay must
// not open the pod.
func (r *RelaySet) Trusted(addr netip.AddrPort) bool {
	if r == nil || !r.joined.Load() {
		return true
	}
	_, ok := (*r.addrs.Load())[addr]
	return ok
}

// Len is the number of relays in the set.
func (r *RelaySet) Len() int {
	if m := r.addrs.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// Addrs returns the trusted relays, sorted (nil before the first Set).
func (r *RelaySet) Addrs() []netip.AddrPort {
	m := r.addrs.Load()
	if m == nil {
		return nil
	}
	out := make([]netip.AddrPort, 0, len(*m))
	for a := range *m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}
