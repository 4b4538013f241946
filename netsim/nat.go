package netsim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// NAT is a user-space network address translator for tests: each inside
// host gets one mapping — an outside UDP socket on one of the NAT's public
// (loopback) addresses — and everything the host sends leaves from it, to
// whatever destination the host names. Replies come back only from
// destinations the host has sent to through that mapping (address- and
// port-dependent filtering, as most home routers and carrier NATs do).
//
// Rebind moves a host to a new mapping on command — a new outside port, as a
// NAT does when it expires an idle mapping, or a new outside IP, as a phone
// does when it moves from Wi-Fi to cellular. The host is not told: its next
// datagram simply leaves from the new address, and datagrams sent to the old
// one are dropped and counted (NATDropStale).
//
// An inside host is a net.PacketConn (NATHost) living in this process, so a
// standard WebRTC stack uses it through its ICE UDP mux: Pion takes it as
// ice.UDPMuxParams.UDPConn. Its LocalAddr is a virtual inside address that
// no socket binds.
type NAT struct {
	// Static after construction.
	outside []netip.Addr
	inside  netip.Addr
	linger  time.Duration
	log     *slog.Logger
	done    chan struct{}

	closeOnce sync.Once
	wg        sync.WaitGroup // mapping readers and Run

	mu        sync.Mutex
	hosts     []*NATHost    // guarded by mu
	abandoned []*natMapping // rebound away from, still counting; guarded by mu
	nextPort  uint16        // next inside port; guarded by mu
	closed    bool          // guarded by mu

	dropped [numNATDrops]atomic.Uint64
}

// NATConfig configures a NAT.
type NATConfig struct {
	// OutsideIPs are the NAT's public addresses, all loopback (127.0.0.0/8
	// or ::1): mappings bind the first; a Rebind of kind RebindIP moves a
	// host to the next one. At least one.
	OutsideIPs []netip.Addr
	// InsideIP is the virtual address inside hosts see as their own (no
	// socket binds it); default 127.0.100.1, so candidates a client
	// advertises stay on loopback.
	InsideIP netip.Addr
	// Linger is how long a mapping abandoned by a rebind keeps its socket,
	// counting what is still sent to it, before it closes; default 30 s.
	Linger time.Duration
	Logger *slog.Logger
}

// NATDropReason says why the NAT dropped a datagram; its String is suitable
// as a metric label.
type NATDropReason int

// NAT drop reasons.
const (
	NATDropFiltered   NATDropReason = iota // inbound from a destination the host never sent to
	NATDropStale                           // inbound to a mapping abandoned by a rebind
	NATDropQueueFull                       // the host's inbox was full
	NATDropOversize                        // longer than MaxDatagram
	NATDropWriteError                      // the outside socket refused the write
	numNATDrops
)

var natDropNames = [numNATDrops]string{"filtered", "stale_mapping", "queue_full", "oversize", "write_error"}

func (r NATDropReason) String() string {
	if r >= 0 && r < numNATDrops {
		return natDropNames[r]
	}
	return "unknown"
}

// RebindKind says what a rebind changes.
type RebindKind int

// Rebind kinds.
const (
	RebindPort RebindKind = iota // same outside IP, a new port
	RebindIP                     // the next outside IP, any port
)

// natInboxLen bounds the datagrams waiting for a host's reader.
const natInboxLen = 1024

// DefaultNATLinger is the default NATConfig.Linger.
const DefaultNATLinger = 30 * time.Second

// ErrNATClosed is returned by NewHost and Rebind after Close.
var ErrNATClosed = errors.New("netsim: NAT closed")

// NewNAT returns a NAT; it opens sockets only as hosts are added.
func NewNAT(cfg NATConfig) (*NAT, error) {
	if len(cfg.OutsideIPs) == 0 {
		return nil, errors.New("netsim: NAT needs at least one outside IP")
	}
	for _, ip := range cfg.OutsideIPs {
		if !ip.Unmap().IsLoopback() {
			return nil, fmt.Errorf("netsim: NAT outside IP %v is not loopback", ip)
		}
	}
	if !cfg.InsideIP.IsValid() {
		cfg.InsideIP = netip.AddrFrom4([4]byte{127, 0, 100, 1})
	}
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultNATLinger
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	out := make([]netip.Addr, len(cfg.OutsideIPs))
	for i, ip := range cfg.OutsideIPs {
		out[i] = ip.Unmap()
	}
	return &NAT{
		outside: out, inside: cfg.InsideIP.Unmap(), linger: cfg.Linger, nextPort: 1024,
		log: cfg.Logger.With("component", "netsim", "element", "nat"), done: make(chan struct{}),
	}, nil
}

// NATStats is a snapshot of the NAT's drop counters.
type NATStats struct {
	Dropped [numNATDrops]uint64
}

// Drops returns the count for one reason.
func (s NATStats) Drops(r NATDropReason) uint64 { return s.Dropped[r] }

// Stats returns the NAT's counters.
func (n *NAT) Stats() NATStats {
	var s NATStats
	for i := range s.Dropped {
		s.Dropped[i] = n.dropped[i].Load()
	}
	return s
}

func (n *NAT) drop(r NATDropReason) { n.dropped[r].Add(1) }

// Run closes abandoned mappings once they have lingered, until ctx ends or
// Close is called; then it closes the NAT and returns nil.
func (n *NAT) Run(ctx context.Context) error {
	tick := time.NewTicker(max(n.linger/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return n.Close()
		case <-n.done:
			return nil
		case <-tick.C:
		}
		cutoff := time.Now().Add(-n.linger)
		n.mu.Lock()
		kept := n.abandoned[:0]
		for _, m := range n.abandoned {
			if m.abandonedAt.Before(cutoff) {
				m.close()
			} else {
				kept = append(kept, m)
			}
		}
		clear(n.abandoned[len(kept):])
		n.abandoned = kept
		n.mu.Unlock()
	}
}

// Close closes every host and mapping and waits for their readers.
// Idempotent.
func (n *NAT) Close() error {
	n.closeOnce.Do(func() {
		close(n.done)
		n.mu.Lock()
		n.closed = true
		hosts := n.hosts
		for _, m := range n.abandoned {
			m.close()
		}
		n.abandoned = nil
		n.mu.Unlock()
		for _, h := range hosts {
			_ = h.Close()
		}
	})
	n.wg.Wait()
	return nil
}

// NewHost adds an inside host with a fresh mapping on the first outside IP.
func (n *NAT) NewHost() (*NATHost, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrNATClosed
	}
	port := n.nextPort
	n.nextPort++
	h := &NATHost{
		nat:    n,
		local:  net.UDPAddrFromAddrPort(netip.AddrPortFrom(n.inside, port)),
		inbox:  make(chan natDatagram, natInboxLen),
		closed: make(chan struct{}),
	}
	m, err := n.openMapping(h, n.outside[0], 0)
	if err != nil {
		return nil, err
	}
	h.cur.Store(m)
	n.hosts = append(n.hosts, h)
	return h, nil
}

// openMapping binds a new outside socket for h on ip and starts its reader.
func (n *NAT) openMapping(h *NATHost, ip netip.Addr, gen int) (*natMapping, error) {
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)))
	if err != nil {
		return nil, fmt.Errorf("netsim: NAT mapping on %v: %w", ip, err)
	}
	m := &natMapping{
		host: h, conn: conn, outside: conn.LocalAddr().(*net.UDPAddr).AddrPort(), gen: gen, since: time.Now(),
		peers: map[netip.AddrPort]struct{}{}, outSeen: make(chan struct{}), stunSeen: make(chan struct{}),
	}
	n.wg.Add(1)
	go n.readOutside(m)
	return m, nil
}

// readOutside is the one reader of a mapping's outside socket.
func (n *NAT) readOutside(m *natMapping) {
	defer n.wg.Done()
	for {
		buf := getBuf()
		k, _, flags, from, err := m.conn.ReadMsgUDPAddrPort(*buf, nil)
		if err != nil {
			putBuf(buf)
			if m.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		switch {
		case flags&syscall.MSG_TRUNC != 0:
			n.drop(NATDropOversize)
		case m.abandoned.Load():
			m.host.staleDrops.Add(1)
			n.drop(NATDropStale)
		case !m.knows(from):
			n.drop(NATDropFiltered)
		default:
			select {
			case m.host.inbox <- natDatagram{buf: buf, n: k, from: from}:
				m.received.Add(1)
				continue // the host's reader owns buf now
			default:
				n.drop(NATDropQueueFull)
			}
		}
		putBuf(buf)
	}
}

// natMapping is one outside socket of a host.
type natMapping struct {
	// Static after construction.
	host    *NATHost
	conn    *net.UDPConn
	outside netip.AddrPort
	gen     int
	since   time.Time

	abandoned   atomic.Bool
	abandonedAt time.Time // set before abandoned; read by Run under NAT.mu
	closed      atomic.Bool

	mu        sync.RWMutex
	peers     map[netip.AddrPort]struct{} // destinations sent to; guarded by mu
	firstOut  time.Time                   // guarded by mu
	firstSTUN time.Time                   // guarded by mu
	outSeen   chan struct{}               // closed on the first datagram out
	stunSeen  chan struct{}               // closed on the first STUN message out

	sent, received atomic.Uint64
}

func (m *natMapping) knows(peer netip.AddrPort) bool {
	m.mu.RLock()
	_, ok := m.peers[peer]
	m.mu.RUnlock()
	return ok
}

// noteSent records a datagram leaving through the mapping.
func (m *natMapping) noteSent(b []byte, to netip.AddrPort) {
	m.sent.Add(1)
	stun := isSTUN(b)
	m.mu.RLock()
	_, known := m.peers[to]
	seen := !m.firstOut.IsZero() && (!stun || !m.firstSTUN.IsZero())
	m.mu.RUnlock()
	if known && seen {
		return
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peers[to] = struct{}{}
	if m.firstOut.IsZero() {
		m.firstOut = now
		close(m.outSeen)
	}
	if stun && m.firstSTUN.IsZero() {
		m.firstSTUN = now
		close(m.stunSeen)
	}
}

func (m *natMapping) close() {
	if m.closed.CompareAndSwap(false, true) {
		_ = m.conn.Close()
	}
}

// isSTUN reports whether b looks like a STUN message (RFC 5389: two zero
// bits, then the magic cookie at offset 4).
func isSTUN(b []byte) bool {
	return len(b) >= 20 && b[0]&0xC0 == 0 && binary.BigEndian.Uint32(b[4:8]) == 0x2112A442
}

// Mapping describes one of a host's mappings.
type Mapping struct {
	Outside netip.AddrPort // the address the world sees the host at
	Gen     int            // 0 for the first mapping, one more per rebind
	Since   time.Time      // when the mapping was made
	// FirstOut and FirstSTUN are when the host's first datagram and first
	// STUN message left through this mapping (zero until then).
	FirstOut, FirstSTUN time.Time
	// OutSeen and STUNSeen are closed at those moments, for tests to await.
	OutSeen, STUNSeen <-chan struct{}
	Sent, Received    uint64 // datagrams through the mapping
}

func (m *natMapping) info() Mapping {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return Mapping{
		Outside: m.outside, Gen: m.gen, Since: m.since, FirstOut: m.firstOut, FirstSTUN: m.firstSTUN,
		OutSeen: m.outSeen, STUNSeen: m.stunSeen, Sent: m.sent.Load(), Received: m.received.Load(),
	}
}

type natDatagram struct {
	buf  *[]byte
	n    int
	from netip.AddrPort
}

// NATHost is one host behind the NAT: a net.PacketConn whose datagrams leave
// from its current mapping. Safe for concurrent use; one reader at a time.
type NATHost struct {
	// Static after construction.
	nat   *NAT
	local *net.UDPAddr

	cur          atomic.Pointer[natMapping]
	rebindMu     sync.Mutex // serialises Rebind
	inbox        chan natDatagram
	closed       chan struct{}
	closeOnce    sync.Once
	readDeadline atomic.Pointer[time.Time]
	staleDrops   atomic.Uint64

	stunMu   sync.Mutex
	nextSTUN chan struct{} // closed when the host next sends a STUN message; guarded by stunMu
}

// NextSTUN returns a channel closed when the host next sends a STUN message
// (an ICE check), through whichever mapping: tests use it to rebind at a
// chosen moment of the client's consent schedule.
func (h *NATHost) NextSTUN() <-chan struct{} {
	h.stunMu.Lock()
	defer h.stunMu.Unlock()
	if h.nextSTUN == nil {
		h.nextSTUN = make(chan struct{})
	}
	return h.nextSTUN
}

// Mapping describes the host's current mapping.
func (h *NATHost) Mapping() Mapping { return h.cur.Load().info() }

// StaleDrops counts datagrams sent to this host's abandoned mappings: what
// a peer that did not follow the rebind kept sending into the void.
func (h *NATHost) StaleDrops() uint64 { return h.staleDrops.Load() }

// Rebind moves the host to a new mapping — a new port on the same outside
// IP, or the next outside IP — and abandons the old one: from now on the
// host's datagrams leave from the new address, and what arrives at the old
// one is dropped (NATDropStale). It returns the new mapping.
func (h *NATHost) Rebind(kind RebindKind) (Mapping, error) {
	h.rebindMu.Lock()
	defer h.rebindMu.Unlock()
	n := h.nat
	old := h.cur.Load()
	ip := old.outside.Addr()
	if kind == RebindIP {
		if len(n.outside) < 2 {
			return Mapping{}, errors.New("netsim: NAT has one outside IP; cannot rebind to a new one")
		}
		for i, a := range n.outside {
			if a == ip {
				ip = n.outside[(i+1)%len(n.outside)]
				break
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return Mapping{}, ErrNATClosed
	}
	select {
	case <-h.closed:
		return Mapping{}, net.ErrClosed
	default:
	}
	m, err := n.openMapping(h, ip, old.gen+1)
	if err != nil {
		return Mapping{}, err
	}
	old.abandonedAt = time.Now()
	old.abandoned.Store(true)
	n.abandoned = append(n.abandoned, old)
	h.cur.Store(m)
	n.log.Debug("rebound host", "inside", h.local.String(), "from", old.outside.String(), "to", m.outside.String())
	return m.info(), nil
}

// ReadFrom implements net.PacketConn; the address is a *net.UDPAddr.
func (h *NATHost) ReadFrom(b []byte) (int, net.Addr, error) {
	var timeout <-chan time.Time
	if d := h.readDeadline.Load(); d != nil && !d.IsZero() {
		wait := time.Until(*d)
		if wait <= 0 {
			return 0, nil, os.ErrDeadlineExceeded
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case d := <-h.inbox:
		k := copy(b, (*d.buf)[:d.n])
		putBuf(d.buf)
		return k, net.UDPAddrFromAddrPort(d.from), nil
	case <-h.closed:
		return 0, nil, io.EOF
	case <-timeout:
		return 0, nil, os.ErrDeadlineExceeded
	}
}

// WriteTo implements net.PacketConn: b leaves from the current mapping.
func (h *NATHost) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, errors.New("netsim: NAT host writes need a *net.UDPAddr")
	}
	select {
	case <-h.closed:
		return 0, net.ErrClosed
	default:
	}
	to := ua.AddrPort()
	to = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
	m := h.cur.Load()
	m.noteSent(b, to)
	if isSTUN(b) {
		h.stunMu.Lock()
		if h.nextSTUN != nil {
			close(h.nextSTUN)
			h.nextSTUN = nil
		}
		h.stunMu.Unlock()
	}
	k, err := m.conn.WriteToUDPAddrPort(b, to)
	if err != nil {
		h.nat.drop(NATDropWriteError)
	}
	return k, err
}

// Close closes the host and its current mapping. Idempotent.
func (h *NATHost) Close() error {
	h.closeOnce.Do(func() {
		close(h.closed)
		h.rebindMu.Lock()
		h.cur.Load().close()
		h.rebindMu.Unlock()
	})
	return nil
}

// LocalAddr is the host's virtual inside address.
func (h *NATHost) LocalAddr() net.Addr { return h.local }

// SetDeadline sets the read deadline; writes never block.
func (h *NATHost) SetDeadline(t time.Time) error { return h.SetReadDeadline(t) }

// SetReadDeadline bounds ReadFrom calls started after it.
func (h *NATHost) SetReadDeadline(t time.Time) error {
	h.readDeadline.Store(&t)
	return nil
}

// SetWriteDeadline is a no-op: a write is one non-blocking UDP send.
func (h *NATHost) SetWriteDeadline(time.Time) error { return nil }
