// Package capacity measures how many concurrent voice sessions one
// transceiver pod holds, and what each costs it in CPU and memory.
//
// The load generator is built to be cheap, so that it does not starve the
// pod it measures on a small machine: its Pion clients run no interceptors,
// share one MediaEngine, and reach the pod through a Link, which plays both
// relay tiers at once. Every client gets a virtual net.PacketConn with its
// own made-up address; all of them share one real UDP socket that sends
// encapsulated datagrams (WIRE.md section 2) straight to the pod socket and
// demultiplexes the replies by the client address in their header. There is
// no relay hop and one system call per datagram each way.
//
// The stepped measurement (Run) drives a transceiver running in a process of
// its own, so that its CPU time and memory can be read apart from the load
// generator's; cmd/capacity is the command `make bench-capacity` runs.
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
)

// maxDatagram bounds one client datagram, as the pod does.
const maxDatagram = 1500

// clientQueueLen bounds the datagrams waiting for one client's ICE mux; a
// full queue drops (counted) rather than stalling the shared reader.
const clientQueueLen = 256

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

	mu      sync.Mutex
	clients []*clientConn // index = port - firstClientPort; guarded by mu
	closed  bool          // guarded by mu

	// Counters, for reports.
	Dropped atomic.Int64 // replies for unknown clients or to full queues
	done    chan struct{}

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
	// RTP per RFC 7983 and RFC 5761: first byte 128..191, and a payload
	// type outside the RTCP range 64..95.
	if b := pkt[payloadOff:]; len(b) > 1 && b[0] >= 128 && b[0] <= 191 && (b[1]&0x7f < 64 || b[1]&0x7f > 95) {
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
	l := &Link{cfg: cfg, conn: conn, addr: addr, vip: net.UDPAddrFromAddrPort(addr), done: make(chan struct{})}
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
	return c, nil
}

// readLoop hands every reply from the pod to its client conn.
func (l *Link) readLoop() {
	defer close(l.done)
	for {
		buf := bufPool.Get().(*[maxDatagram + encap.MaxLen]byte)
		n, _, err := l.conn.ReadFromUDPAddrPort(buf[:])
		if err != nil {
			bufPool.Put(buf)
			return
		}
		h, hl, err := encap.Decode(buf[:n])
		if err != nil || !h.ToClient {
			bufPool.Put(buf)
			l.Dropped.Add(1)
			continue
		}
		i := int(h.Client.Port()) - firstClientPort
		l.mu.Lock()
		var c *clientConn
		if i >= 0 && i < len(l.clients) && l.clients[i].self == h.Client {
			c = l.clients[i]
		}
		l.mu.Unlock()
		if c == nil {
			bufPool.Put(buf)
			l.Dropped.Add(1)
			continue
		}
		select {
		case c.in <- datagram{buf: buf, off: hl, n: n}:
		default:
			bufPool.Put(buf)
			l.Dropped.Add(1)
		}
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
