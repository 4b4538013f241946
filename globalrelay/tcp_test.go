package globalrelay

// Tests of the TCP ingress: forwarding both ways, abuse closed and
// counted, limits.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// tcpRig is a relay rig with a TCP ingress on loopback.
type tcpRig struct {
	*rig
	tcp  *TCP
	addr netip.AddrPort
}

func newTCPRig(t *testing.T, cfg Config, tcfg TCPConfig) *tcpRig {
	t.Helper()
	return newTCPRigOn(t, cfg, tcfg, net.IPv4(127, 0, 0, 1))
}

// newTCPRigOn is newTCPRig with the TCP listener on ip (IPv4).
func newTCPRigOn(t *testing.T, cfg Config, tcfg TCPConfig, ip net.IP) *tcpRig {
	t.Helper()
	r := newRig(t, cfg)
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: ip})
	if err != nil {
		t.Fatal(err)
	}
	tcfg.Registerer, tcfg.Logger = r.reg, quiet
	s, err := NewTCP(r.relay, ln, tcfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("TCP Run: %v", err)
		}
	})
	return &tcpRig{rig: r, tcp: s, addr: s.Addr()}
}

func (r *tcpRig) dial(t *testing.T) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(r.addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// frame is b with its RFC 4571 length prefix.
func frame(b []byte) []byte {
	out := binary.BigEndian.AppendUint16(nil, uint16(len(b)))
	return append(out, b...)
}

func readFrame(t *testing.T, c net.Conn) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatalf("read frame length: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint16(hdr[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read frame: %v", err)
	}
	return b
}

// awaitClosed reads until the relay closes the connection and fails if
// anything at all came back first: nothing is ever answered.
func awaitClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [64]byte
	n, err := c.Read(b[:])
	if n > 0 {
		t.Fatalf("relay answered %d bytes on a refused connection", n)
	}
	if ne := net.Error(nil); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("connection not closed by the relay: %v", err)
	}
}

func tcpAddrOf(c *net.TCPConn) netip.AddrPort {
	a := c.LocalAddr().(*net.TCPAddr).AddrPort()
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// TestTCPForwardingBothWays: the first frame (a valid check) and later
// frames reach the cluster relay as datagrams with the TCP flag and the
// connection's address; replies with the TCP flag come back framed.
func TestTCPForwardingBothWays(t *testing.T) {
	t.Run("poller", func(t *testing.T) { testTCPForwardingBothWays(t, Config{}) })
	// The TCP ingress sends on the internal socket the event loop owns.
	t.Run("event-loop", func(t *testing.T) {
		testTCPForwardingBothWays(t, Config{Tuning: udpio.Tuning{Batch: 32, EventLoop: new(true)}})
	})
}

func testTCPForwardingBothWays(t *testing.T, cfg Config) {
	r := newTCPRig(t, cfg, TCPConfig{})
	c := r.dial(t)
	check := r.validCheck(t, 0x42)
	media := []byte{0x80, 111, 0, 1, 2, 3}
	if _, err := c.Write(append(frame(check), frame(media)...)); err != nil {
		t.Fatal(err)
	}
	var tok [6]byte // the connection's: its first frame's token
	for i, want := range [][]byte{check, media} {
		got, _ := read(t, r.cluster)
		h, n, err := encap.Decode(got)
		tok = h.Token
		if err != nil {
			t.Fatal(err)
		}
		if err := testHop.For(0x12).Verify(got, n); err != nil {
			t.Fatalf("datagram %d does not verify: %v", i, err)
		}
		wantH := encap.Header{TCP: true, KeyID: 1, Cluster: 0x12, Pod: 0x42, POP: 9, Token: h.Token, Client: tcpAddrOf(c), Ingress: r.ingress}
		if h != wantH || h.Token == ([6]byte{}) || !bytes.Equal(got[n:], want) {
			t.Fatalf("datagram %d: %+v + %x, want %+v + %x", i, h, got[n:], wantH, want)
		}
	}
	for _, p := range [][]byte{[]byte("response"), bytes.Repeat([]byte{0x17}, encap.MaxPayload)} {
		h := encap.Header{TCP: true, ToClient: true, Cluster: 0x12, Pod: 0x42, POP: 9, Token: tok, Client: tcpAddrOf(c), Ingress: r.ingress}
		r.cluster.WriteToUDPAddrPort(seal(t, h, p), r.ingress)
		if got := readFrame(t, c); !bytes.Equal(got, p) {
			t.Fatalf("client read %d bytes, want %d", len(got), len(p))
		}
	}
	// A TCP reply from another pod, or for another connection this
	// address had (another token), is dropped.
	for _, h := range []encap.Header{
		{TCP: true, ToClient: true, Cluster: 0x12, Pod: 0x43, POP: 9, Token: tok, Client: tcpAddrOf(c), Ingress: r.ingress},
		{TCP: true, ToClient: true, Cluster: 0x12, Pod: 0x42, POP: 9, Token: [6]byte{tok[0] ^ 1}, Client: tcpAddrOf(c), Ingress: r.ingress},
	} {
		r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("not yours")), r.ingress)
	}
	h := encap.Header{TCP: true, ToClient: true, Cluster: 0x12, Pod: 0x42, POP: 9, Token: tok, Client: tcpAddrOf(c), Ingress: r.ingress}
	r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("mine")), r.ingress)
	if got := readFrame(t, c); string(got) != "mine" {
		t.Fatalf("client read %q, want only its own connection's reply", got)
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_tcp_dropped_frames_total", "reason", tcpDropLabels[tcpDropFlowMismatch]); v != 2 {
		t.Errorf("flow_mismatch drops = %v, want 2", v)
	}
}

// TestTCPAbuseClosedAndCounted: garbage, slowloris, oversized frames and
// forged tokens close the connection with their reason; nothing is
// forwarded (the next datagram the cluster relay sees is a good
// connection's check) and nothing is answered.
func TestTCPAbuseClosedAndCounted(t *testing.T) {
	r := newTCPRig(t, Config{}, TCPConfig{HandshakeTimeout: 300 * time.Millisecond, IdleTimeout: 400 * time.Millisecond})
	ufrag, err := r.keys.Mint(0x12, 1)
	if err != nil {
		t.Fatal(err)
	}
	last := byte('A')
	if ufrag[len(ufrag)-1] == 'A' {
		last = 'B'
	}
	badMAC := bindingRequest(t, ufrag[:len(ufrag)-1]+string(last)) // a MAC bit changed
	tests := []struct {
		name   string
		send   func(t *testing.T) []byte
		reason string
	}{
		{"garbage", func(*testing.T) []byte { return frame([]byte("GET / HTTP/1.1\r\n\r\n")) }, tcpCloseLabels[tcpCloseNotBinding]},
		{"HTTP request", func(*testing.T) []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }, tcpCloseLabels[tcpCloseOversize]},
		{"DTLS first", func(*testing.T) []byte { return frame([]byte{22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) }, tcpCloseLabels[tcpCloseNotBinding]},
		{"STUN without USERNAME", func(t *testing.T) []byte { return frame(mustBuild(t, stun.BindingRequest)) }, tcpCloseLabels[tcpCloseBadToken]},
		{"forged MAC", func(t *testing.T) []byte { return frame(badMAC) }, tcpCloseLabels[tcpCloseBadToken]},
		{"forged key", func(t *testing.T) []byte { return frame(bindingRequest(t, "ExI0AEKhssPU5fbG74W9")) }, tcpCloseLabels[tcpCloseBadToken]},
		{"oversized frame", func(*testing.T) []byte { return []byte{0xff, 0xff, 1, 2, 3} }, tcpCloseLabels[tcpCloseOversize]},
		{"just over max", func(*testing.T) []byte { return binary.BigEndian.AppendUint16(nil, encap.MaxPayload+1) }, tcpCloseLabels[tcpCloseOversize]},
		{"slowloris: half a length", func(*testing.T) []byte { return []byte{0} }, tcpCloseLabels[tcpCloseHandshakeTimeout]},
		{"slowloris: half a frame", func(t *testing.T) []byte { return frame(r.validCheck(t, 1))[:20] }, tcpCloseLabels[tcpCloseHandshakeTimeout]},
		{"silent", func(*testing.T) []byte { return nil }, tcpCloseLabels[tcpCloseHandshakeTimeout]},
		{"valid check then oversize", func(t *testing.T) []byte {
			return append(frame(r.validCheck(t, 3)), 0xff, 0xff)
		}, tcpCloseLabels[tcpCloseOversize]},
		{"valid check then silence", func(t *testing.T) []byte { return frame(r.validCheck(t, 4)) }, tcpCloseLabels[tcpCloseIdle]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := counter(t, r.reg, "rtcedge_globalrelay_tcp_closed_total", "reason", tt.reason)
			c := r.dial(t)
			if b := tt.send(t); len(b) > 0 {
				if _, err := c.Write(b); err != nil {
					t.Fatal(err)
				}
			}
			awaitClosed(t, c)
			if after := counter(t, r.reg, "rtcedge_globalrelay_tcp_closed_total", "reason", tt.reason); after != before+1 {
				t.Errorf("closed{reason=%q} went %v → %v, want +1", tt.reason, before, after)
			}
			// Nothing forwarded: except for the cases whose valid check
			// legitimately went through first, the cluster relay's next
			// datagram is a good connection's check.
			if tt.reason == tcpCloseLabels[tcpCloseIdle] || tt.name == "valid check then oversize" {
				read(t, r.cluster)
			}
			good := r.dial(t)
			check := r.validCheck(t, 7)
			good.Write(frame(check))
			got, _ := read(t, r.cluster)
			if _, n, err := encap.Decode(got); err != nil || !bytes.Equal(got[n:], check) {
				t.Fatalf("cluster relay saw something other than the good check")
			}
			good.Close()
		})
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "token_mac"); v != 1 {
		t.Errorf("token_mac drops = %v, want 1 (the forged MAC's detail)", v)
	}
}

// TestTCPLimits: the per-address cap refuses the next connection, and a
// freed slot is given back.
func TestTCPLimits(t *testing.T) {
	r := newTCPRig(t, Config{}, TCPConfig{MaxConnsPerIP: 2})
	a, b := r.dial(t), r.dial(t)
	a.Write(frame(r.validCheck(t, 1)))
	read(t, r.cluster)
	_ = b
	// Refused: the relay resets it (the reset may even beat the dial).
	if third, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(r.addr)); err == nil {
		awaitClosed(t, third)
		third.Close()
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_tcp_closed_total", "reason", tcpCloseLabels[tcpCloseIPLimit]); v != 1 {
		t.Errorf("ip_limit closes = %v, want 1", v)
	}
	a.Close()
	// Once the relay has seen a's end, a new connection is admitted.
	deadline := time.Now().Add(10 * time.Second)
	for r.tcp.Conns() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("connections = %d, want 1 after a closed", r.tcp.Conns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	c := r.dial(t)
	check := r.validCheck(t, 2)
	c.Write(frame(check))
	if got, _ := read(t, r.cluster); !bytes.HasSuffix(got, check) {
		t.Fatal("freed slot not given back")
	}
}

// TestTCPDrain: draining refuses new connections and keeps open ones.
func TestTCPDrain(t *testing.T) {
	r := newTCPRig(t, Config{}, TCPConfig{})
	c := r.dial(t)
	c.Write(frame(r.validCheck(t, 1)))
	read(t, r.cluster)
	r.tcp.Drain()
	if _, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(r.addr)); err == nil {
		t.Fatal("a draining ingress accepted a connection")
	}
	media := []byte{0x80, 111, 0, 2}
	c.Write(frame(media))
	if got, _ := read(t, r.cluster); !bytes.HasSuffix(got, media) {
		t.Fatal("open connection not forwarded while draining")
	}
}

// TestTCPBackpressureDropsOldest: a client that does not read costs at most
// WriteQueue frames; the oldest are dropped, the newest delivered, and a
// stalled connection does not delay another.
func TestTCPBackpressureDropsOldest(t *testing.T) {
	r := newTCPRig(t, Config{}, TCPConfig{WriteQueue: 8})
	s := r.tcp
	mk := func() (*tcpConn, net.Conn) {
		srv, cli := net.Pipe() // synchronous: a write blocks until read
		c := &tcpConn{s: s, nc: srv, wake: make(chan struct{}, 1), closed: make(chan struct{})}
		s.mu.Lock()
		s.all[c] = struct{}{}
		s.perIP[addrKey(c.client.Addr())]++
		s.mu.Unlock()
		s.wg.Add(1) // stands for the reader goroutine a real connection has
		t.Cleanup(func() { c.close(tcpCloseEOF); s.wg.Done(); cli.Close() })
		return c, cli
	}
	stalled, stalledCli := mk()
	other, otherCli := mk()
	for i := range 100 {
		stalled.enqueue([]byte{byte(i)})
	}
	// The writer holds one frame in its blocked write; the queue holds
	// the newest 8 of the rest.
	other.enqueue([]byte("prompt"))
	if got := readFrame(t, otherCli); string(got) != "prompt" {
		t.Fatalf("other connection read %q", got)
	}
	stalled.mu.Lock()
	queued := len(stalled.queue)
	stalled.mu.Unlock()
	if queued > 8 {
		t.Fatalf("stalled queue holds %d frames, want at most 8", queued)
	}
	// The writer took a first batch (1 to 8 frames, however many were
	// queued when it started) into its blocked write; after it, only the
	// newest 8 are left.
	var got []byte
	for len(got) == 0 || got[len(got)-1] != 99 {
		got = append(got, readFrame(t, stalledCli)...)
	}
	k := len(got)
	if k > 16 || !bytes.Equal(got[k-8:], []byte{92, 93, 94, 95, 96, 97, 98, 99}) {
		t.Fatalf("stalled client read %v, want a first batch then the newest 8", got)
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_tcp_dropped_frames_total", "reason", tcpDropLabels[tcpDropQueueFull]); v != float64(100-k) {
		t.Errorf("queue_full drops = %v, want %d", v, 100-k)
	}
}

// TestTCPAddrConfig: tcp_addr takes IP:port or just the IP (port 443);
// empty means no TCP ingress; anything else is a config error.
func TestTCPAddrConfig(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
		err  bool
	}{
		{"", "", false, false},
		{"203.0.113.10", "203.0.113.10:443", true, false},
		{"203.0.113.10:8443", "203.0.113.10:8443", true, false},
		{"[2001:db8::1]:443", "[2001:db8::1]:443", true, false},
		{"2001:db8::1", "[2001:db8::1]:443", true, false},
		{"vip:443", "", false, true},
	} {
		c := Config{TCPAddr: tc.in}
		ap, ok, err := c.tcpAddr()
		if (err != nil) != tc.err || ok != tc.ok || (ok && ap.String() != tc.want) {
			t.Errorf("tcp_addr %q: %v, %v, %v; want %s, %v, error %v", tc.in, ap, ok, err, tc.want, tc.ok, tc.err)
		}
	}
}

// TestTCPFirstFrameTime: the time from accepting a connection to its first
// valid frame (the client's first check on it) is observed once per
// established connection, on the relay's clock; a connection that never
// sends a valid frame is not.
func TestTCPFirstFrameTime(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	r := newTCPRig(t, Config{Now: now}, TCPConfig{})
	bad := r.dial(t)
	if _, err := bad.Write(frame([]byte("not a check at all"))); err != nil {
		t.Fatal(err)
	}
	c := r.dial(t)
	// Wait until the relay has accepted both, then let 120 ms pass on
	// its clock before the check.
	deadline := time.Now().Add(5 * time.Second)
	for counter(t, r.reg, "rtcedge_globalrelay_tcp_accepted_total", "", "") < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the relay did not accept both connections")
		}
		time.Sleep(time.Millisecond)
	}
	clock.Add(int64(120 * time.Millisecond))
	if _, err := c.Write(frame(r.validCheck(t, 0x42))); err != nil {
		t.Fatal(err)
	}
	_, _ = read(t, r.cluster) // forwarded: established
	h := histogram(t, r.reg, "rtcedge_globalrelay_tcp_first_frame_seconds")
	if h.GetSampleCount() != 1 || h.GetSampleSum() != 0.12 {
		t.Errorf("first-frame histogram: %d samples, sum %v s; want 1 sample of 0.12 s", h.GetSampleCount(), h.GetSampleSum())
	}
}

func histogram(t *testing.T, reg *prometheus.Registry, name string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	t.Fatalf("no histogram %s", name)
	return nil
}

// TestTCPSameClientAddressTwice: a second connection from a client
// address and port that already has one (a wildcard listener reached at
// two addresses, or a port reused before the old connection's reset came
// in) replaces the old one. It once deadlocked the ingress: the old
// connection was closed, and so forgotten, under the lock that forgetting
// takes, and every accept and every TCP reply of the worker then waited on
// it.
func TestTCPSameClientAddressTwice(t *testing.T) {
	r := newTCPRigOn(t, Config{}, TCPConfig{}, net.IPv4zero)
	port := r.addr.Port()
	reuse := func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
		return errors.Join(err, serr)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, Control: reuse}
	a, err := d.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Write(frame(r.validCheck(t, 1))); err != nil {
		t.Fatal(err)
	}
	read(t, r.cluster)
	// The same source address and port, toward the relay's other address.
	d.LocalAddr = a.LocalAddr()
	b, err := d.Dial("tcp4", net.JoinHostPort("127.0.0.2", strconv.Itoa(int(port))))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	check := r.validCheck(t, 1)
	if _, err := b.Write(frame(check)); err != nil {
		t.Fatal(err)
	}
	got, _ := read(t, r.cluster)
	if !bytes.HasSuffix(got, check) {
		t.Fatal("the second connection's check was not forwarded")
	}
	fwd, _, err := encap.Decode(got)
	if err != nil {
		t.Fatal(err)
	}
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := a.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the replaced connection was not closed: %v", err)
	}
	if n := r.tcp.Conns(); n != 1 {
		t.Errorf("%d connections, want the new one", n)
	}
	// Replies go to the new connection.
	h := encap.Header{TCP: true, ToClient: true, Cluster: 0x12, Pod: 1, POP: 9, Token: fwd.Token, Client: tcpAddrOf(b.(*net.TCPConn)), Ingress: r.ingress}
	r.cluster.WriteToUDPAddrPort(seal(t, h, []byte("reply")), r.ingress)
	if got := readFrame(t, b); string(got) != "reply" {
		t.Fatalf("new connection read %q", got)
	}
}

// TestTCPAddrKey: the per-address limit counts an IPv6 client by its /64,
// which one host can fill with addresses; IPv4 addresses one by one.
func TestTCPAddrKey(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"2001:db8::1", "2001:db8::ffff:2", true},
		{"2001:db8::1", "2001:db8:0:1::1", false},
		{"10.0.0.1", "10.0.0.2", false},
		{"10.0.0.1", "10.0.0.1", true},
	} {
		ka, kb := addrKey(netip.MustParseAddr(c.a)), addrKey(netip.MustParseAddr(c.b))
		if (ka == kb) != c.same {
			t.Errorf("%s (%v) and %s (%v): same key %v, want %v", c.a, ka, c.b, kb, ka == kb, c.same)
		}
	}
}

// TestTCPPendingFairAcrossPrefixes: a party that fills every pending slot
// from many addresses of one prefix (a /57 of IPv6 is 128 /64s; here
// loopback addresses of one /24) does not lock callers of other prefixes
// out: a newcomer takes the slot of that prefix's oldest pending
// connection (closed, pending_evicted) and completes its handshake, while
// another connection from the full prefix is refused (pending_limit).
// With a plain count of pending connections every newcomer was refused.
func TestTCPPendingFairAcrossPrefixes(t *testing.T) {
	const max = 6
	r := newTCPRig(t, Config{}, TCPConfig{MaxPending: max, HandshakeTimeout: time.Minute})
	dialFrom := func(ip string) (*net.TCPConn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", r.addr.String())
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.TCPConn), nil
	}
	var slow []*net.TCPConn
	for i := range max {
		c, err := dialFrom(fmt.Sprintf("127.0.9.%d", 1+i%3)) // three hosts of one /24
		if err != nil {
			t.Fatal(err)
		}
		slow = append(slow, c)
	}
	waitPending := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			r.tcp.mu.Lock()
			got := r.tcp.pend.n
			r.tcp.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pending connections %d, want %d", got, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitPending(max)
	// One more from the full prefix is refused.
	if c, err := dialFrom("127.0.9.4"); err == nil {
		awaitClosed(t, c)
	}
	if v := counter(t, r.reg, "rtcedge_globalrelay_tcp_closed_total", "reason", tcpCloseLabels[tcpClosePendingLimit]); v != 1 {
		t.Errorf("pending_limit closes = %v, want 1", v)
	}
	// A caller from another prefix gets in, in the oldest slow one's place.
	caller, err := dialFrom("127.0.10.1")
	if err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, slow[0])
	if v := counter(t, r.reg, "rtcedge_globalrelay_tcp_closed_total", "reason", tcpCloseLabels[tcpClosePendingEvicted]); v != 1 {
		t.Errorf("pending_evicted closes = %v, want 1", v)
	}
	check := r.validCheck(t, 1)
	caller.Write(frame(check))
	if got, _ := read(t, r.cluster); !bytes.HasSuffix(got, check) {
		t.Fatal("the caller's check was not forwarded")
	}
	waitPending(max - 1)
}
