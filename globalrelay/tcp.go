package globalrelay

import (
	"bufio"
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

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/token"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// The TCP ingress (docs/tcp.md): clients whose networks drop UDP reach the
// same VIP over TCP, as ICE-TCP does (RFC 6544; the POP is the passive
// side), with RFC 4571 framing: every frame is a 2-byte big-endian length
// and one datagram. The first frame of a connection must be a STUN Binding
// Request whose server ufrag is a valid routing token; after it, every
// frame is forwarded as one datagram, encapsulated exactly as a UDP
// client's (flag TCP set), to the token's cluster relay and pod, and the
// pod's replies (flag TCP set) are framed back into the connection. The
// connection is the only TCP state: the cluster relay and the pod see
// datagrams, and a lost connection is recovered by ICE (the client's
// backup candidate), not by any tier behind this one.

// Defaults of TCPConfig.
const (
	DefaultTCPMaxConns         = 1 << 16
	DefaultTCPMaxConnsPerIP    = 32
	DefaultTCPMaxPending       = 4096
	DefaultTCPHandshakeTimeout = 3 * time.Second
	DefaultTCPIdleTimeout      = 30 * time.Second
	DefaultTCPWriteQueue       = 64
	DefaultTCPWriteTimeout     = 5 * time.Second
	// maxConnsPerToken bounds the connections one routing token may
	// hold open, as maxFlowsPerToken does for UDP flows.
	maxConnsPerToken = 8
)

// TCPConfig configures a TCP ingress (the tcp keys of the role's config).
// Zero values take the defaults.
type TCPConfig struct {
	// MaxConns caps the connections of the replica, handshaking or not.
	MaxConns int `yaml:"max_conns"`
	// MaxConnsPerIP caps the connections from one client IPv4 address or
	// IPv6 /64 (addrKey).
	MaxConnsPerIP int `yaml:"max_conns_per_ip"`
	// MaxPending caps the connections that have not yet sent a valid
	// first frame (slowloris from many addresses fills this, not MaxConns).
	MaxPending int `yaml:"max_pending"`
	// HandshakeTimeout is how long a new connection has to deliver its
	// first frame, a Binding Request with a valid token.
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// IdleTimeout closes a connection that has sent no frame for this
	// long (consent checks every few seconds keep live calls).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxFrame is the longest frame accepted; a longer length prefix
	// closes the connection (a stream cannot resynchronise). At most
	// encap.MaxPayload, the default.
	MaxFrame int `yaml:"-"`
	// WriteQueue is how many frames toward one client may wait for its
	// connection; a full queue drops the oldest (fresh media is worth
	// more than stale), so a slow reader costs a bounded amount of memory
	// and never delays other connections.
	WriteQueue int `yaml:"write_queue"`
	// WriteTimeout closes a connection whose writes make no progress
	// for this long.
	WriteTimeout time.Duration `yaml:"write_timeout"`

	Logger     *slog.Logger          `yaml:"-"` // default: the relay's
	Registerer prometheus.Registerer `yaml:"-"` // nil: metrics are not registered
}

func (c *TCPConfig) defaults(r *Relay) error {
	config.Default(&c.MaxConns, DefaultTCPMaxConns)
	config.Default(&c.MaxConnsPerIP, DefaultTCPMaxConnsPerIP)
	config.Default(&c.MaxPending, DefaultTCPMaxPending)
	config.Default(&c.MaxFrame, encap.MaxPayload)
	config.Default(&c.WriteQueue, DefaultTCPWriteQueue)
	config.Default(&c.HandshakeTimeout, DefaultTCPHandshakeTimeout)
	config.Default(&c.IdleTimeout, DefaultTCPIdleTimeout)
	config.Default(&c.WriteTimeout, DefaultTCPWriteTimeout)
	config.Default(&c.Logger, r.log)
	switch {
	case c.MaxConns < 0, c.MaxConnsPerIP < 0, c.MaxPending < 0, c.WriteQueue < 0:
		return errors.New("globalrelay tcp config: limits must not be negative")
	case c.MaxFrame < 0 || c.MaxFrame > encap.MaxPayload:
		return fmt.Errorf("globalrelay tcp config: max frame must be 1..%d", encap.MaxPayload)
	case c.HandshakeTimeout < 0, c.IdleTimeout < 0, c.WriteTimeout < 0:
		return errors.New("globalrelay tcp config: timeouts must not be negative")
	}
	return nil
}

// tcpCloseReason is why a TCP connection was refused or closed;
// tcpCloseLabels holds the "reason" labels of
// rtcedge_globalrelay_tcp_closed_total.
type tcpCloseReason uint8

const (
	tcpCloseOther            tcpCloseReason = iota
	tcpCloseConnLimit                       // MaxConns reached
	tcpCloseIPLimit                         // MaxConnsPerIP reached
	tcpClosePendingLimit                    // MaxPending reached, and the client's prefix holds the most pending (pendingSet)
	tcpClosePendingEvicted                  // a pending connection gave its slot to a client of a prefix holding fewer
	tcpCloseDraining                        // the replica drains: no new connections
	tcpCloseHandshakeTimeout                // no complete first frame in time (slowloris)
	tcpCloseNotBinding                      // first frame is not a STUN Binding Request
	tcpCloseBadToken                        // first frame's ufrag is not a valid token (detail in dropped_packets_total)
	tcpCloseTokenExpired                    // the token may open no new flow
	tcpCloseTokenReuse                      // the token holds its share of connections
	tcpCloseBadSource                       // a client address no client can have
	tcpCloseOversize                        // a length prefix over MaxFrame
	tcpCloseIdle                            // no frame for IdleTimeout
	tcpCloseEOF                             // the client closed (or reset) the connection
	tcpCloseWriteStall                      // writes made no progress for WriteTimeout, or failed
	tcpCloseShutdown                        // the relay stopped
	numTCPCloseReasons
)

var tcpCloseLabels = [numTCPCloseReasons]string{"other", "conn_limit", "ip_limit", "pending_limit",
	"pending_evicted", "draining", "handshake_timeout", "not_binding", "bad_token", "token_expired",
	"token_reuse", "bad_source", "oversize", "idle", "eof", "write_stall", "shutdown"}

// tcpDropReason is why a frame was dropped on the TCP path; tcpDropLabels
// holds the "reason" labels of rtcedge_globalrelay_tcp_dropped_frames_total.
type tcpDropReason uint8

const (
	tcpDropOther          tcpDropReason = iota
	tcpDropQueueFull                    // the oldest queued frame toward a slow client
	tcpDropEmpty                        // a zero-length frame
	tcpDropNoConn                       // a reply for a client with no connection here
	tcpDropFlowMismatch                 // a reply from a pod that does not own the connection
	tcpDropNoClusterRelay               // the connection's cluster has no usable relay
	tcpDropNoHopKey                     // no inter-tier key for the connection's cluster
	tcpDropOtherToken                   // a later check naming another cluster or pod
	numTCPDropReasons
)

var tcpDropLabels = [numTCPDropReasons]string{"other", "queue_full", "empty", "no_conn", "flow_mismatch",
	"no_cluster_relay", "no_hop_key", "other_token"}

// TCP is the TCP ingress of one relay replica. It shares the relay's
// workers (their internal sockets carry its datagrams both ways), token
// keyring, hop keys, cluster directory and source filter.
type TCP struct {
	// Static after NewTCP.
	r   *Relay
	ln  net.Listener
	cfg TCPConfig
	log *slog.Logger
	m   *tcpMetrics

	draining  atomic.Bool
	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup // one per connection goroutine and the accept loop

	mu     sync.Mutex
	conns  map[netip.AddrPort]*tcpConn // established, by client address; guarded by mu
	all    map[*tcpConn]struct{}       // every open connection; guarded by mu
	perIP  map[netip.Prefix]int        // open connections per client address (addrKey); guarded by mu
	tokens map[tokenKey]int            // established connections per token; guarded by mu
	pend   pendingSet                  // connections before their first valid frame; guarded by mu
}

// NewTCP attaches a TCP ingress on ln to the relay, taking ownership of
// ln. ln should be bound to the same VIP as the relay's public UDP socket
// (default port 443). Run accepts connections.
func NewTCP(r *Relay, ln net.Listener, cfg TCPConfig) (*TCP, error) {
	if err := cfg.defaults(r); err != nil {
		return nil, err
	}
	m, err := newTCPMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &TCP{
		r: r, ln: ln, cfg: cfg, m: m,
		log:   cfg.Logger.With("transport", "tcp"),
		done:  make(chan struct{}),
		conns: map[netip.AddrPort]*tcpConn{}, all: map[*tcpConn]struct{}{},
		perIP: map[netip.Prefix]int{}, tokens: map[tokenKey]int{}, pend: newPendingSet(),
	}
	if !r.tcp.CompareAndSwap(nil, s) {
		return nil, errors.New("globalrelay: the relay already has a TCP ingress")
	}
	return s, nil
}

// ListenTCP opens a TCP ingress listener on addr with SO_REUSEPORT, so
// that several replicas on one host (the dev world) share the port as
// their UDP sockets do.
func ListenTCP(addr netip.AddrPort) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", addr.String())
	if err != nil {
		return nil, fmt.Errorf("listen tcp %v: %w", addr, err)
	}
	return ln, nil
}

// Addr returns the listening address.
func (s *TCP) Addr() netip.AddrPort {
	if a, ok := s.ln.Addr().(*net.TCPAddr); ok {
		return a.AddrPort()
	}
	return netip.AddrPort{}
}

// Conns returns the number of open connections (handshaking included).
func (s *TCP) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.all)
}

// Drain stops accepting: the listener closes, so new clients are refused
// at once and their ICE tries the next candidate (the backup POP), while
// open connections carry on until they end or Close.
func (s *TCP) Drain() {
	if !s.draining.Swap(true) {
		_ = s.ln.Close()
	}
}

// Run accepts connections until ctx ends or Close is called, then closes
// every connection and returns when all their goroutines have ended.
func (s *TCP) Run(ctx context.Context) error {
	s.wg.Add(1)
	var acceptErr error
	go func() {
		defer s.wg.Done()
		acceptErr = s.acceptLoop()
	}()
	select {
	case <-ctx.Done():
	case <-s.done:
	}
	s.Close()
	s.wg.Wait()
	return acceptErr
}

// Close stops the ingress and closes every connection. Idempotent; Run
// returns once everything has stopped.
func (s *TCP) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		s.draining.Store(true)
		_ = s.ln.Close()
		s.mu.Lock()
		all := make([]*tcpConn, 0, len(s.all))
		for c := range s.all {
			all = append(all, c)
		}
		s.mu.Unlock()
		for _, c := range all {
			c.close(tcpCloseShutdown)
		}
	})
	return nil
}

func (s *TCP) acceptLoop() error {
	backoff := 5 * time.Millisecond
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: wait, as net/http does.
			s.log.Warn("accept failed", "err", err)
			select {
			case <-time.After(backoff):
			case <-s.done:
				return nil
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		s.admit(nc)
	}
}

// admit checks the limits for a new connection and starts its reader.
func (s *TCP) admit(nc net.Conn) {
	s.m.accepted.Inc()
	client := netip.AddrPort{}
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		client = a.AddrPort()
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	}
	refuse := func(r tcpCloseReason) {
		s.m.closed.Inc(r)
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST: no FIN_WAIT state for a refused peer
		}
		_ = nc.Close()
	}
	if !s.r.sourceOK(client) {
		refuse(tcpCloseBadSource)
		return
	}
	c := &tcpConn{s: s, nc: nc, client: client, accepted: s.r.cfg.Now(), wake: make(chan struct{}, 1), closed: make(chan struct{})}
	c.initRaw()
	s.mu.Lock()
	switch {
	case s.draining.Load() || s.r.draining.Load():
		// Checked under s.mu: Close takes its snapshot of the connections
		// under it after setting draining, so a connection registered
		// after that would be left for Run to wait on.
		s.mu.Unlock()
		refuse(tcpCloseDraining)
		return
	case len(s.all) >= s.cfg.MaxConns:
		s.mu.Unlock()
		refuse(tcpCloseConnLimit)
		return
	case s.perIP[addrKey(client.Addr())] >= s.cfg.MaxConnsPerIP:
		s.mu.Unlock()
		refuse(tcpCloseIPLimit)
		return
	}
	var evicted *tcpConn
	if s.pend.n >= s.cfg.MaxPending {
		if evicted = s.pend.evictFor(client.Addr()); evicted == nil {
			s.mu.Unlock()
			refuse(tcpClosePendingLimit)
			return
		}
		evicted.evicted = true
	}
	s.all[c] = struct{}{}
	s.perIP[addrKey(client.Addr())]++
	s.pend.add(c, client.Addr())
	c.pending = true
	s.m.conns.Set(float64(len(s.all)))
	s.wg.Add(1)
	s.mu.Unlock()
	if evicted != nil {
		evicted.close(tcpClosePendingEvicted)
	}
	go func() {
		defer s.wg.Done()
		c.readLoop()
	}()
}

// addrKey is what MaxConnsPerIP counts by: an IPv4 address, or the /64 of
// an IPv6 one — a single host is routinely given a whole /64, so counting
// by /128 would give one host as many addresses as it likes.
func addrKey(a netip.Addr) netip.Prefix {
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// establish registers a connection whose first frame carried tok. It
// returns the reason to close it instead, or 0.
func (s *TCP) establish(c *tcpConn, tok token.Token) tcpCloseReason {
	r := s.r
	now := r.now.Load()
	switch {
	case tok.Expired(time.Unix(0, now), r.cfg.TokenLifetime):
		return tcpCloseTokenExpired
	case r.draining.Load() || s.draining.Load():
		return tcpCloseDraining
	}
	c.f = flow{cluster: tok.Cluster, pod: tok.Pod, tok: tokenKey{tok.Cluster, tok.Pod, tok.Nonce}, created: now}
	ws := r.workers
	c.w = &ws[int(c.client.Port())%len(ws)]
	s.mu.Lock()
	if c.evicted {
		s.mu.Unlock()
		return tcpClosePendingEvicted
	}
	if s.tokens[c.f.tok] >= maxConnsPerToken {
		s.mu.Unlock()
		return tcpCloseTokenReuse
	}
	// The same address and port again (a wildcard listener reached at
	// two addresses, or a port reused before the old connection's reset
	// came in): replies go to the new connection, and the old one is
	// closed — after the lock, since closing forgets it under the lock.
	old := s.conns[c.client]
	s.tokens[c.f.tok]++
	s.conns[c.client] = c
	c.pending = false
	s.pend.remove(c)
	s.mu.Unlock()
	if old != nil {
		old.close(tcpCloseEOF)
	}
	s.m.established.Inc()
	s.m.firstFrame.Observe(r.cfg.Now().Sub(c.accepted).Seconds())
	return 0
}

// forget removes a closing connection from every table.
func (s *TCP) forget(c *tcpConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.all[c]; !ok {
		return
	}
	delete(s.all, c)
	if k := addrKey(c.client.Addr()); s.perIP[k] <= 1 {
		delete(s.perIP, k)
	} else {
		s.perIP[k]--
	}
	if c.pending {
		s.pend.remove(c) // gone already if it was evicted
	} else {
		if s.conns[c.client] == c {
			delete(s.conns, c.client)
		}
		if s.tokens[c.f.tok]--; s.tokens[c.f.tok] <= 0 {
			delete(s.tokens, c.f.tok)
		}
	}
	s.m.conns.Set(float64(len(s.all)))
}

// tcpToClient takes a verified to-client datagram whose header has the
// TCP flag (the relay's internal socket read it) and queues its payload
// on the client's connection. It never blocks.
func (r *Relay) tcpToClient(h *encap.Header, payload []byte, from netip.AddrPort) {
	s := r.tcp.Load()
	if s == nil {
		r.m.drops.Inc(dropUnknownFlow)
		return
	}
	s.mu.Lock()
	c := s.conns[h.Client]
	s.mu.Unlock()
	switch {
	case c == nil:
		s.m.drops.Inc(tcpDropNoConn)
	case c.f.cluster != h.Cluster || c.f.pod != h.Pod || c.f.tok.nonce != h.Token:
		// Another pod's, or another connection's from the same address
		// (its token is the one its first frame carried).
		s.m.drops.Inc(tcpDropFlowMismatch)
	default:
		r.watchReply(&c.f, from, r.now.Load())
		c.enqueue(payload)
	}
}

// frameBuf is one framed datagram waiting to be written: length prefix
// and payload.
type frameBuf struct {
	off, n int // b[off:n] is still to be written (off > 0 after a partial write)
	b      [2 + encap.MaxPayload]byte
}

var framePool = sync.Pool{New: func() any { return new(frameBuf) }}

// tcpConn is one client connection. The reader goroutine owns the read
// side; the writer goroutine (started with the first queued frame) owns
// the write side; the queue between them is guarded by mu.
type tcpConn struct {
	// Static after admit (f and w after establish, before any reply can
	// find the connection).
	s      *TCP
	nc     net.Conn
	client netip.AddrPort
	f      flow
	w      *worker

	pending  bool      // before establish; guarded by s.mu
	evicted  bool      // its pending slot went to another (pendingSet); guarded by s.mu
	accepted time.Time // static: when admit saw it (Config.Now)

	// raw writes a frame inline, without the writer goroutine, when
	// nothing is queued: one non-blocking write(2) attempt (writeFn,
	// cached so no closure is made per frame); wb/wn/werr are its
	// argument and results, guarded by mu. nil: always queue.
	raw     syscall.RawConn
	writeFn func(fd uintptr) bool
	wb      []byte
	wn      int
	werr    error

	mu        sync.Mutex
	queue     []*frameBuf // oldest first; guarded by mu
	writing   bool        // the writer goroutine runs; guarded by mu
	isClosed  bool        // guarded by mu
	wake      chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

// close ends the connection once, counting why.
func (c *tcpConn) close(reason tcpCloseReason) {
	c.closeOnce.Do(func() {
		c.s.m.closed.Inc(reason)
		c.mu.Lock()
		c.isClosed = true
		for _, f := range c.queue {
			framePool.Put(f)
		}
		c.queue = nil
		c.mu.Unlock()
		close(c.closed)
		_ = c.nc.Close()
		c.s.forget(c)
	})
}

// readLoop reads frames until the connection ends. The first must be a
// valid Binding Request; every frame is forwarded as one datagram.
func (c *tcpConn) readLoop() {
	s, r := c.s, c.s.r
	br := bufio.NewReaderSize(c.nc, 4096)
	var buf [encap.MaxLen + encap.MaxPayload]byte
	_ = c.nc.SetReadDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	first := true
	var deadlineSet int64
	for {
		// The length prefix lands in the header room, which the header
		// overwrites later: no per-frame allocation.
		n, reason := c.readFrame(br, buf[encap.MaxLen-2:encap.MaxLen], buf[encap.MaxLen:encap.MaxLen+s.cfg.MaxFrame])
		if reason != 0 {
			if first && reason == tcpCloseIdle {
				reason = tcpCloseHandshakeTimeout
			}
			c.close(reason)
			return
		}
		if n == 0 {
			s.m.drops.Inc(tcpDropEmpty)
			continue
		}
		pkt := buf[encap.MaxLen : encap.MaxLen+n]
		now := r.now.Load()
		if first {
			tok, why := c.firstFrame(pkt)
			if why == 0 {
				why = s.establish(c, tok)
			}
			if why != 0 {
				c.close(why)
				return
			}
			first = false
		} else if stunmsg.DemuxClass(pkt) == stunmsg.ClassSTUN {
			// A later check must name the same session: a connection
			// belongs to one candidate pair (RFC 6544).
			if user, err := stunmsg.Username(pkt); err == nil {
				if u, err := stunmsg.ServerUfrag(user); err == nil {
					if tok, err := r.tokKeys.Load().Verify(u); err != nil || tok.Cluster != c.f.cluster || tok.Pod != c.f.pod {
						s.m.drops.Inc(tcpDropOtherToken)
						continue
					}
				}
			}
		}
		// The idle deadline moves at most every eighth of the timeout:
		// one timer update per few hundred frames, not one per frame.
		if now-deadlineSet >= int64(s.cfg.IdleTimeout/8) {
			deadlineSet = now
			_ = c.nc.SetReadDeadline(time.Unix(0, now).Add(s.cfg.IdleTimeout))
		}
		if c.forward(buf[:], n, now) && stunmsg.IsBindingRequest(pkt) {
			watchCheck(&c.f, now) // the pod must answer it (failover.go)
		}
	}
}

// readFrame reads one RFC 4571 frame: its length into hdr (2 bytes), the
// datagram into b (at most len(b) bytes). It returns the frame length, or
// why the connection must close.
func (c *tcpConn) readFrame(br *bufio.Reader, hdr, b []byte) (int, tcpCloseReason) {
	if _, err := io.ReadFull(br, hdr); err != nil {
		return 0, readReason(err)
	}
	n := int(binary.BigEndian.Uint16(hdr))
	if n > len(b) {
		return 0, tcpCloseOversize
	}
	if _, err := io.ReadFull(br, b[:n]); err != nil {
		return 0, readReason(err)
	}
	return n, 0
}

func readReason(err error) tcpCloseReason {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return tcpCloseIdle
	case errors.Is(err, net.ErrClosed):
		return tcpCloseShutdown
	default:
		return tcpCloseEOF
	}
}

// firstFrame checks the connection's first frame: a Binding Request whose
// server ufrag is a valid token.
func (c *tcpConn) firstFrame(pkt []byte) (token.Token, tcpCloseReason) {
	if stunmsg.DemuxClass(pkt) != stunmsg.ClassSTUN {
		return token.Token{}, tcpCloseNotBinding
	}
	user, err := stunmsg.Username(pkt)
	if err == stunmsg.ErrNotSTUN || err == stunmsg.ErrNotBindingRequest {
		return token.Token{}, tcpCloseNotBinding
	}
	tok, ok := c.s.r.verify(user, err)
	if !ok {
		return token.Token{}, tcpCloseBadToken
	}
	return tok, 0
}

// forward encapsulates the frame at buf[encap.MaxLen:][:n] and sends it
// to the connection's cluster relay from its worker's internal socket. It
// reports whether the datagram left.
func (c *tcpConn) forward(buf []byte, n int, now int64) bool {
	s, r := c.s, c.s.r
	keys := r.hopKeys.Load().For(c.f.cluster)
	if keys == nil {
		s.m.drops.Inc(tcpDropNoHopKey)
		return false
	}
	relay, ok := r.relayFor(&c.f, c.client, now) // with the UDP path's data-plane failure detection (failover.go)
	if !ok {
		s.m.drops.Inc(tcpDropNoClusterRelay)
		return false
	}
	c.f.lastSeen.Store(now)
	h := encap.Header{TCP: true, Cluster: c.f.cluster, Pod: c.f.pod, POP: r.cfg.POP, Token: c.f.tok.nonce, Client: c.client, Ingress: c.w.ingress}
	hl := h.Len()
	if _, err := h.Put(buf[encap.MaxLen-hl : encap.MaxLen]); err != nil {
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return false
	}
	out := buf[encap.MaxLen-hl : encap.MaxLen+n]
	keys.Seal(out, hl)
	if _, err := c.w.internal.WriteToUDPAddrPort(out, relay); err != nil {
		r.m.writeErrors.Inc()
		return false
	}
	s.m.toCluster.Inc()
	s.m.toClusterBytes.Add(float64(n))
	return true
}

// initRaw prepares inline writes when the connection is a kernel socket.
func (c *tcpConn) initRaw() {
	if sc, ok := c.nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.raw, c.writeFn = rc, c.rawWrite
		}
	}
}

// rawWrite is one non-blocking write of c.wb; returning true tells the
// runtime not to wait for the socket to become writable.
func (c *tcpConn) rawWrite(fd uintptr) bool {
	c.wn, c.werr = unix.Write(int(fd), c.wb)
	return true
}

// enqueue sends a reply into the connection: inline when nothing is
// queued and the socket takes it at once (the common case: no goroutine
// hand-off), else through the write queue, dropping the oldest queued
// frame when it is full, and waking (or starting) the writer. It never
// blocks.
func (c *tcpConn) enqueue(payload []byte) {
	if len(payload) > encap.MaxPayload {
		c.s.r.m.drops.Inc(dropOversize)
		return
	}
	f := framePool.Get().(*frameBuf)
	binary.BigEndian.PutUint16(f.b[:2], uint16(len(payload)))
	f.off, f.n = 0, 2+copy(f.b[2:], payload)
	c.mu.Lock()
	if c.isClosed {
		c.mu.Unlock()
		framePool.Put(f)
		c.s.m.drops.Inc(tcpDropNoConn)
		return
	}
	if !c.writing && len(c.queue) == 0 && c.raw != nil {
		c.wb, c.wn, c.werr = f.b[:f.n], 0, nil
		err := c.raw.Write(c.writeFn)
		c.wb = nil
		if err == nil && c.werr == nil && c.wn == f.n {
			c.mu.Unlock()
			framePool.Put(f)
			c.s.m.toClient.Inc()
			c.s.m.toClientBytes.Add(float64(len(payload)))
			return
		}
		if c.wn > 0 {
			f.off = c.wn // partly written: the writer sends the rest first
		}
		// EAGAIN (socket buffer full) or an error: the writer takes over
		// and meets the error itself.
	}
	if len(c.queue) >= c.s.cfg.WriteQueue {
		i := 0
		if c.queue[0].off > 0 {
			i = 1 // a partly written frame must finish, or the stream breaks
		}
		if i < len(c.queue) {
			framePool.Put(c.queue[i])
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			c.s.m.drops.Inc(tcpDropQueueFull)
		}
	}
	c.queue = append(c.queue, f)
	start := !c.writing
	if start {
		// Under mu and while not closed: the reader has not returned
		// yet, so the group's counter is above zero and Run's Wait
		// cannot have passed.
		c.writing = true
		c.s.wg.Add(1)
	}
	c.mu.Unlock()
	if start {
		go func() {
			defer c.s.wg.Done()
			c.writeLoop()
		}()
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writeLoop writes queued frames, as many per system call as are waiting,
// until the queue stays empty for a while or the connection closes. A
// write that makes no progress for WriteTimeout closes the connection.
func (c *tcpConn) writeLoop() {
	var batch []*frameBuf
	iov := make(net.Buffers, 0, c.s.cfg.WriteQueue+1)
	var bufs net.Buffers // WriteTo consumes it; iov keeps the backing array
	idle := time.NewTimer(c.s.cfg.IdleTimeout)
	defer idle.Stop()
	for {
		c.mu.Lock()
		batch, c.queue = c.queue, batch[:0]
		if len(batch) == 0 {
			c.mu.Unlock()
			select {
			case <-c.wake:
				continue
			case <-c.closed:
			case <-idle.C:
			}
			c.mu.Lock()
			if len(c.queue) == 0 || c.isClosed {
				c.writing = false
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		bufs = iov[:0]
		total := 0
		for _, f := range batch {
			bufs = append(bufs, f.b[f.off:f.n])
			total += f.n - f.off
		}
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
		_, err := bufs.WriteTo(c.nc)
		for i, f := range batch {
			framePool.Put(f)
			batch[i] = nil
		}
		if err != nil {
			c.close(tcpCloseWriteStall)
			c.mu.Lock()
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.s.m.toClient.Add(float64(len(batch)))
		c.s.m.toClientBytes.Add(float64(total - 2*len(batch)))
		if !idle.Stop() {
			select {
			case <-idle.C:
			default:
			}
		}
		idle.Reset(c.s.cfg.IdleTimeout)
	}
}

type tcpMetrics struct {
	conns                         prometheus.Gauge
	accepted, established         prometheus.Counter
	firstFrame                    prometheus.Histogram
	toCluster, toClient           prometheus.Counter
	toClusterBytes, toClientBytes prometheus.Counter
	closed                        *udpio.Drops[tcpCloseReason]
	drops                         *udpio.Drops[tcpDropReason]
}

func newTCPMetrics(reg prometheus.Registerer) (*tcpMetrics, error) {
	conns := metric.Gauge("rtcedge_globalrelay_tcp_connections", "Open TCP client connections (handshaking included).")
	accepted := metric.Counter("rtcedge_globalrelay_tcp_accepted_total", "TCP connections accepted by the kernel and seen by the relay.")
	established := metric.Counter("rtcedge_globalrelay_tcp_established_total", "TCP connections whose first frame carried a valid routing token.")
	// The client's wait between its connection and its first check on it:
	// pacing of the client's ICE checks, not relay work (docs/tcp.md).
	firstFrame := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rtcedge_globalrelay_tcp_first_frame_seconds",
		Help:    "Time from accepting a TCP connection to its first frame with a valid routing token (the client's first ICE check on it).",
		Buckets: []float64{.005, .01, .025, .05, .075, .1, .15, .2, .3, .5, 1, 2},
	})
	closed := metric.CounterVec("rtcedge_globalrelay_tcp_closed_total", "TCP connections refused or closed, by reason.", "reason")
	frames := metric.CounterVec("rtcedge_globalrelay_tcp_frames_total", "Frames forwarded on the TCP path, by direction (to_cluster, to_client).", "direction")
	bytes := metric.CounterVec("rtcedge_globalrelay_tcp_bytes_total", "Client payload bytes on the TCP path (without framing or header), by direction.", "direction")
	drops := metric.CounterVec("rtcedge_globalrelay_tcp_dropped_frames_total", "Frames dropped on the TCP path, by reason.", "reason")
	m := &tcpMetrics{
		conns: conns, accepted: accepted, established: established, firstFrame: firstFrame,
		toCluster: frames.WithLabelValues("to_cluster"), toClient: frames.WithLabelValues("to_client"),
		toClusterBytes: bytes.WithLabelValues("to_cluster"), toClientBytes: bytes.WithLabelValues("to_client"),
		closed: udpio.NewDrops[tcpCloseReason](closed, "", tcpCloseLabels[:]...),
		drops:  udpio.NewDrops[tcpDropReason](drops, "", tcpDropLabels[:]...),
	}
	if err := metric.Register(reg, "globalrelay tcp", conns, accepted, established, firstFrame, closed, frames, bytes, drops); err != nil {
		return nil, err
	}
	return m, nil
}
