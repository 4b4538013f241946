// Package capacity measures how many concurrent voice sessions one
// transceiver pod holds, and what each costs it in CPU and memory.
//
// The load generator is built to be cheap, so that it does not starve the
// pod it measures on a small machine: its Pion clients run no interceptors,
// share one MediaEngine, and reach the pod through a Link, which plays both
// relay tiers at once. Every client gets a virtual net.PacketConn with its
// own made-up address; all of them share one real UDP socket that sends
// encapsulated datagrams (docs/wire.md section 2) straight to the pod socket and
// demultiplexes the replies by the client address in their header. There is
// no relay hop. Pion sets the calls up and keeps their ICE running, but the
// audio is made ahead and replayed, a sendmmsg per 1 ms slot, and the
// replies are read a recvmmsg at a time and counted from their ciphertext
// (Fleet).
//
// The stepped measurement (Run) drives a transceiver running in a process of
// its own, and the reference Realtime server in another, so that the CPU
// time and memory of each can be read apart from the load generator's;
// cmd/capacity is the command `make bench-capacity` runs.
package capacity

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// maxDatagram bounds one client datagram, as the pod does.
const maxDatagram = 1500

// clientQueueLen bounds the datagrams waiting for one client's ICE mux; a
// full queue drops (counted) rather than stalling the shared reader.
const clientQueueLen = 256

// linkBatch is how many datagrams one recvmmsg or sendmmsg of the link
// moves.
const linkBatch = 64

// firstClientPort is the port of the first virtual client address. The
// addresses are never bound: they exist only in encapsulation headers.
const firstClientPort = 20000

// MaxClients is how many virtual clients one Link can carry.
const MaxClients = 65535 - firstClientPort

// LinkConfig names the pod a Link talks to.
type LinkConfig struct {
	Pod     netip.AddrPort // the pod's data socket
	Cluster uint16
	PodID   uint16
	POP     uint16 // the POP ID sessions are created with
	// HopKeys is the cluster's inter-tier key, shared with the pod: the
	// link seals what it sends as the cluster relay would have.
	HopKeys *encap.Keyring
}

// Link is one UDP socket standing in for the global and cluster relays
// between many virtual clients and one transceiver pod.
type Link struct {
	// Static after NewLink.
	cfg  LinkConfig
	conn *net.UDPConn
	addr netip.AddrPort // conn's local address: the ingress, and the POP VIP clients send to
	vip  *net.UDPAddr

	batch *udpio.BatchConn // the reader's recvmmsg and sendBatch's sendmmsg

	mu      sync.Mutex
	clients []*clientConn // index = port - firstClientPort; guarded by mu
	closed  bool          // guarded by mu
	// snap is clients as of the last NewConn, for the reader, which looks
	// a client up per datagram without taking mu.
	snap atomic.Pointer[[]*clientConn]

	sendMu sync.Mutex // serializes sendBatch (one sendmmsg at a time)

	// Counters, for reports.
	Dropped atomic.Int64 // replies for unknown clients or to full queues
	// SendErrors counts replayed datagrams the kernel refused.
	SendErrors atomic.Int64
	done       chan struct{}

	recOn     atomic.Bool // fast-path copy of recording
	recMu     sync.Mutex
	recording bool     // guarded by recMu
	recorded  [][]byte // guarded by recMu
}

// StartRecording makes the clients' RTP datagrams be kept, encapsulated,
// instead of sent, and everything else they send (ICE, DTLS, SCTP, RTCP)
// be dropped, until StopRecording. Benchmarks replay the recording into the
// pod to time the pod alone.
func (l *Link) StartRecording() {
	l.recMu.Lock()
	l.recording, l.recorded = true, nil
	l.recOn.Store(true)
	l.recMu.Unlock()
}

// StopRecording returns the recorded datagrams, each ready to send to the
// pod as is, from any socket.
func (l *Link) StopRecording() [][]byte {
	l.recMu.Lock()
	defer l.recMu.Unlock()
	l.recording = false
	l.recOn.Store(false)
	out := l.recorded
	l.recorded = nil
	return out
}

// record keeps or drops a datagram while recording; it reports whether it
// took the datagram.
func (l *Link) record(pkt []byte, payloadOff int) bool {
	if !l.recOn.Load() {
		return false
	}
	l.recMu.Lock()
	defer l.recMu.Unlock()
	if !l.recording {
		return false
	}
	if isRTP(pkt[payloadOff:]) {
		l.recorded = append(l.recorded, append([]byte(nil), pkt...))
	}
	return true
}

var bufPool = sync.Pool{New: func() any { return new([maxDatagram + encap.MaxLen]byte) }}

// NewLink opens a loopback socket on port 0 and starts reading it. Close
// stops the reader and every client conn.
func NewLink(cfg LinkConfig) (*Link, error) {
	if cfg.HopKeys == nil {
		return nil, errors.New("capacity: link needs the pod's hop keys")
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	// Hundreds of clients send in bursts every 20 ms; the default socket
	// buffers are the first thing to overflow. Best effort.
	_ = conn.SetReadBuffer(4 << 20)
	_ = conn.SetWriteBuffer(4 << 20)
	addr := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	l := &Link{cfg: cfg, conn: conn, addr: addr, vip: net.UDPAddrFromAddrPort(addr), done: make(chan struct{}),
		batch: udpio.NewBatchConn(conn, linkBatch)}
	go l.readLoop()
	return l, nil
}

// VIP is the address clients send to, advertised as the POP's VIP.
func (l *Link) VIP() netip.AddrPort { return l.addr }

// Close closes the socket and all client conns and waits for the reader.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.done
		return nil
	}
	l.closed = true
	cs := l.clients
	l.mu.Unlock()
	err := l.conn.Close()
	<-l.done
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
	return err
}

// NewConn returns a virtual conn for one more client.
func (l *Link) NewConn() (net.PacketConn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, net.ErrClosed
	}
	if len(l.clients) >= MaxClients {
		return nil, errors.New("capacity: out of virtual client addresses")
	}
	self := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(firstClientPort+len(l.clients)))
	c := &clientConn{link: l, self: self, local: net.UDPAddrFromAddrPort(self), in: make(chan datagram, clientQueueLen), closed: make(chan struct{})}
	h := encap.Header{Cluster: l.cfg.Cluster, Pod: l.cfg.PodID, POP: l.cfg.POP, Client: self, Ingress: l.addr}
	n, err := h.Put(c.hdr[:])
	if err != nil {
		return nil, err
	}
	c.hdrLen = n
	l.clients = append(l.clients, c)
	snap := l.clients
	l.snap.Store(&snap)
	return c, nil
}

// readLoop hands every reply from the pod to its client conn, a batch
// per recvmmsg; the RTP of a client with a tap goes to the tap instead
// (and on to the conn only when the tap says so).
func (l *Link) readLoop() {
	defer close(l.done)
	ms := make([]udpio.Msg, linkBatch)
	for i := range ms {
		ms[i].Buf = make([]byte, maxDatagram+encap.MaxLen+1)
	}
	_ = l.batch.ReadLoop(ms, func(n int) bool {
		snap := l.snap.Load()
		for i := range n {
			l.deliver(ms[i].Buf[:ms[i].N], snap)
		}
		return true
	})
}

// deliver takes one datagram from the pod: to the client's tap (RTP), or
// copied to the client's queue for its ICE mux.
func (l *Link) deliver(b []byte, snap *[]*clientConn) {
	if len(b) > maxDatagram+encap.MaxLen {
		l.Dropped.Add(1)
		return
	}
	h, hl, err := encap.Decode(b)
	if err != nil || !h.ToClient || snap == nil {
		l.Dropped.Add(1)
		return
	}
	i := int(h.Client.Port()) - firstClientPort
	cs := *snap
	if i < 0 || i >= len(cs) || cs[i].self != h.Client {
		l.Dropped.Add(1)
		return
	}
	c := cs[i]
	if tap := c.tap.Load(); tap != nil {
		if p := b[hl:]; isRTP(p) {
			if !(*tap)(p) {
				return
			}
		} else if isRTCP(p) {
			return // the pod's reports: nothing here reads them
		}
	}
	buf := bufPool.Get().(*[maxDatagram + encap.MaxLen]byte)
	n := copy(buf[:], b)
	select {
	case c.in <- datagram{buf: buf, off: hl, n: n}:
	default:
		bufPool.Put(buf)
		l.Dropped.Add(1)
	}
}

// isRTP and isRTCP tell media from the rest (RFC 7983: first byte
// 128..191; RFC 5761: RTCP packet types 192..223 in the second byte,
// payload types 64..95 are never RTP).
func isRTP(b []byte) bool {
	return len(b) >= 12 && b[0] >= 128 && b[0] <= 191 && (b[1]&0x7f < 64 || b[1]&0x7f > 95)
}

func isRTCP(b []byte) bool {
	return len(b) >= 8 && b[0] >= 128 && b[0] <= 191 && b[1] >= 192 && b[1] <= 223
}

// sendBatch sends ms (datagrams the clients' queues hold, each already
// sealed for the pod) with as few sendmmsg calls as it takes; a datagram
// the kernel refuses is counted in SendErrors and skipped.
func (l *Link) sendBatch(ms []udpio.Msg) {
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	for len(ms) > 0 {
		n, err := l.batch.WriteBatch(ms)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.SendErrors.Add(1)
			n++
		}
		ms = ms[min(n, len(ms)):]
	}
}

type datagram struct {
	buf    *[maxDatagram + encap.MaxLen]byte
	off, n int
}

// clientConn is one client's view of the network: it looks like a UDP
// socket at a made-up address whose only peer is the POP VIP.
type clientConn struct {
	// Static after NewConn.
	link   *Link
	self   netip.AddrPort
	local  *net.UDPAddr
	hdr    [encap.MaxLen]byte // the to-pod header of every datagram this client sends
	hdrLen int

	in        chan datagram
	closed    chan struct{}
	closeOnce sync.Once
	deadline  atomic.Pointer[time.Time]

	// queue, when set, takes the client's RTP (sealed, ready for the pod)
	// instead of the socket: a Fleet replays it at real time. tap, when
	// set, takes the RTP the pod sends the client (see Tap).
	queue atomic.Pointer[packetQueue]
	tap   atomic.Pointer[Tap]
}

// Tap is given each RTP datagram (still SRTP, ciphertext) the pod sends a
// client, on the Link's reader goroutine, which must not be held up; it
// must not keep b. It returns true to pass the datagram on to the
// client's Pion stack too (to decrypt it), false to drop it there.
type Tap func(b []byte) (pass bool)

// setTap makes t see the client's RTP from the pod; see Tap.
func (c *clientConn) setTap(t Tap) { c.tap.Store(&t) }

// packetQueue holds a client's RTP datagrams, sealed and ready to send,
// in the order Pion made them (their SRTP indexes rise): made ahead of
// time by the Fleet's filler, sent at real time by its sender.
type packetQueue struct {
	mu   sync.Mutex
	pkts [][]byte // guarded by mu; pkts[head:] wait
	head int      // guarded by mu
}

func (q *packetQueue) push(b []byte) {
	q.mu.Lock()
	if q.head > 0 && q.head == len(q.pkts) {
		clear(q.pkts)
		q.pkts, q.head = q.pkts[:0], 0
	}
	q.pkts = append(q.pkts, b)
	q.mu.Unlock()
}

// pop returns the oldest datagram, or nil when none waits.
func (q *packetQueue) pop() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.pkts) {
		return nil
	}
	b := q.pkts[q.head]
	q.pkts[q.head] = nil
	q.head++
	return b
}

func (q *packetQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pkts) - q.head
}

// ReadFromAddrPort implements ice's allocation-free reader interface.
func (c *clientConn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	var timeout <-chan time.Time
	if d := c.deadline.Load(); d != nil && !d.IsZero() {
		wait := time.Until(*d)
		if wait <= 0 {
			return 0, netip.AddrPort{}, os.ErrDeadlineExceeded
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case d := <-c.in:
		n := copy(b, d.buf[d.off:d.n])
		bufPool.Put(d.buf)
		return n, c.link.addr, nil
	case <-c.closed:
		return 0, netip.AddrPort{}, io.EOF
	case <-timeout:
		return 0, netip.AddrPort{}, os.ErrDeadlineExceeded
	}
}

// ReadFrom implements net.PacketConn.
func (c *clientConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, _, err := c.ReadFromAddrPort(b)
	if err != nil {
		return 0, nil, err
	}
	return n, c.link.vip, nil
}

// WriteToAddrPort sends b to the pod with this client's header. The only
// peer is the VIP, so the destination is not looked at.
func (c *clientConn) WriteToAddrPort(b []byte, _ netip.AddrPort) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	if len(b) > maxDatagram {
		return 0, errors.New("capacity: datagram too large")
	}
	buf := bufPool.Get().(*[maxDatagram + encap.MaxLen]byte)
	defer bufPool.Put(buf)
	copy(buf[:], c.hdr[:c.hdrLen])
	copy(buf[c.hdrLen:], b)
	c.link.cfg.HopKeys.Seal(buf[:c.hdrLen+len(b)], c.hdrLen)
	if c.link.record(buf[:c.hdrLen+len(b)], c.hdrLen) {
		return len(b), nil
	}
	if q := c.queue.Load(); q != nil && isRTP(b) {
		q.push(append([]byte(nil), buf[:c.hdrLen+len(b)]...))
		return len(b), nil
	}
	if _, err := c.link.conn.WriteToUDPAddrPort(buf[:c.hdrLen+len(b)], c.link.cfg.Pod); err != nil {
		return 0, err
	}
	return len(b), nil
}

// WriteTo implements net.PacketConn.
func (c *clientConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	return c.WriteToAddrPort(b, netip.AddrPort{})
}

// Close ends reads with io.EOF, which stops the client's ICE mux.
func (c *clientConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

func (c *clientConn) LocalAddr() net.Addr                { return c.local }
func (c *clientConn) SetDeadline(t time.Time) error      { return c.SetReadDeadline(t) }
func (c *clientConn) SetReadDeadline(t time.Time) error  { c.deadline.Store(&t); return nil }
func (c *clientConn) SetWriteDeadline(_ time.Time) error { return nil }
