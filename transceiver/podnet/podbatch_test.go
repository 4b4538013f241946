package podnet

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/pion/rtp"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

func listenLoopback(t testing.TB, network, addr string) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newTestOutQueue(t *testing.T, conn *net.UDPConn) *outQueue {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return newOutQueue(conn, m)
}

// TestOutQueueSends: datagrams queued from many goroutines at once all
// arrive, whole, over IPv4 and IPv6 sockets.
func TestOutQueueSends(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{{"udp4", "127.0.0.1:0"}, {"udp6", "[::1]:0"}} {
		t.Run(tc.network, func(t *testing.T) {
			pod := listenLoopback(t, tc.network, tc.addr)
			peer := listenLoopback(t, tc.network, tc.addr)
			_ = peer.SetReadBuffer(4 << 20)
			peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
			q := newTestOutQueue(t, pod)
			const senders, each = 8, 50
			done := make(chan error, senders)
			for g := range senders {
				go func() {
					var err error
					for i := range each {
						if e := q.send([]byte{byte(g), byte(i), 0xee}, peerAddr); e != nil {
							err = e
						}
					}
					done <- err
				}()
			}
			for range senders {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			seen := map[[2]byte]bool{}
			_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 64)
			for len(seen) < senders*each {
				n, _, err := peer.ReadFromUDPAddrPort(b)
				if err != nil {
					t.Fatalf("after %d datagrams: %v", len(seen), err)
				}
				if n != 3 || b[2] != 0xee || seen[[2]byte{b[0], b[1]}] {
					t.Fatalf("datagram %x: wrong or repeated", b[:n])
				}
				seen[[2]byte{b[0], b[1]}] = true
			}
		})
	}
}

// TestOutQueueNoAllocs: a queued send allocates nothing.
func TestOutQueueNoAllocs(t *testing.T) {
	pod := listenLoopback(t, "udp4", "127.0.0.1:0")
	peer := listenLoopback(t, "udp4", "127.0.0.1:0")
	q := newTestOutQueue(t, pod)
	to := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	pkt := make([]byte, 120)
	if allocs := testing.AllocsPerRun(500, func() {
		if err := q.send(pkt, to); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("%.1f allocations per queued send, want 0", allocs)
	}
}

// TestSeveralReaders: with several readLoops on one pod socket every
// datagram reaches its session exactly once.
func TestSeveralReaders(t *testing.T) {
	conn := listenLoopback(t, "udp4", "127.0.0.1:0")
	_ = conn.SetReadBuffer(4 << 20)
	s, pc := testPOP(t, conn)
	sc, err := pc.mux.GetConn("u", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := sc.(*muxConn)
	client := netip.MustParseAddrPort("198.51.100.1:5000")
	pc.mux.mu.Lock()
	pc.mux.byAddr[client] = c
	pc.mux.mu.Unlock()
	const readers = 3
	done := make(chan error, 1)
	go func() { done <- s.Read(readers) }()
	relay := listenLoopback(t, "udp4", "127.0.0.1:0")
	h := encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: client, Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	const total = 300
	seen := make([]bool, total)
	b := make([]byte, 64)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for sent, got := 0, 0; got < total; {
		// At most a session queue's worth in flight, so none is dropped.
		for ; sent < total && sent-got < sessionQueueLen/2; sent++ {
			if _, err := relay.WriteToUDPAddrPort(sealed(t, h, string([]byte{byte(sent >> 8), byte(sent)})), conn.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
				t.Fatal(err)
			}
		}
		n, _, err := c.ReadFromAddrPort(b)
		if err != nil {
			t.Fatalf("after %d of %d: %v", got, total, err)
		}
		i := int(b[0])<<8 | int(b[1])
		if n != 2 || i >= total || seen[i] {
			t.Fatalf("datagram %x: wrong or repeated", b[:n])
		}
		seen[i] = true
		got++
	}
	conn.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// blockingAudio is a Handler whose Audio blocks until release closes.
type blockingAudio struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingAudio) Audio([]byte, time.Duration) {
	b.once.Do(func() { close(b.entered) })
	<-b.release
}
func (b *blockingAudio) Event([]byte) {}
func (b *blockingAudio) Close() error { return nil }

// TestReadersRunInParallel holds one reader inside a session's backend and
// checks another reader still delivers: readers of one descriptor would
// take turns (podSocket.readers). With a SO_REUSEPORT socket (the pod's
// own) the readers' sockets are steered by client port: a datagram of
// another client whose port maps to the held reader waits for it, and
// comes once it is released.
func TestReadersRunInParallel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		steered bool
	}{{"duplicated descriptor", false}, {"reuseport, steered by client", true}} {
		t.Run(tc.name, func(t *testing.T) { readersRunInParallel(t, tc.steered) })
	}
}

func readersRunInParallel(t *testing.T, steered bool) {
	var conn *net.UDPConn
	if steered {
		cs, err := udpio.ListenReusePort(netip.MustParseAddrPort("127.0.0.1:0"), 1)
		if err != nil {
			t.Fatal(err)
		}
		conn = cs[0]
		t.Cleanup(func() { conn.Close() })
	} else {
		conn = listenLoopback(t, "udp4", "127.0.0.1:0")
	}
	s, pc := testPOP(t, conn)
	// Session 1 is on the pod's media path with a backend that blocks;
	// sessions 2 and 3 take their datagrams from their queues. Ports 5000
	// and 5002 map to one reader, 5001 to the other.
	rx, client := srtpPair(t)
	block := &blockingAudio{entered: make(chan struct{}), release: make(chan struct{})}
	c1, c2, c3 := getConn(t, pc, "u1"), getConn(t, pc, "u2"), getConn(t, pc, "u3")
	c1.media.Store(&Media{sess: &fakeSession{audio: block}, sock: s, rx: rx})
	client1 := netip.MustParseAddrPort("198.51.100.1:5000")
	client2 := netip.MustParseAddrPort("198.51.100.2:5001")
	client3 := netip.MustParseAddrPort("198.51.100.3:5002")
	pc.mux.mu.Lock()
	pc.mux.byAddr[client1], pc.mux.byAddr[client2], pc.mux.byAddr[client3] = c1, c2, c3
	pc.mux.mu.Unlock()

	done := make(chan error, 1)
	go func() { done <- s.Read(2) }()
	released := false
	defer func() {
		if !released {
			close(block.release)
		}
		conn.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	relay := listenLoopback(t, "udp4", "127.0.0.1:0")
	to := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	send := func(client netip.AddrPort, payload []byte) {
		t.Helper()
		h := encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: client, Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
		if _, err := relay.WriteToUDPAddrPort(sealed(t, h, string(payload)), to); err != nil {
			t.Fatal(err)
		}
	}
	plain, err := (&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: 1, SSRC: 9}, Payload: []byte("a")}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	srtpPkt, err := client.EncryptRTP(nil, plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	send(client1, srtpPkt)
	select {
	case <-block.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the media path's backend never got the audio")
	}
	dtls := []byte{0x16, 0xfe, 0xfd} // DTLS-looking, for a queue
	if steered {
		send(client3, dtls) // to the held reader
	}
	send(client2, dtls)
	b := make([]byte, 64)
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _, err := c2.ReadFromAddrPort(b); err != nil || n != 3 {
		t.Fatalf("with one reader held in a backend, the other delivered nothing: %d bytes, %v", n, err)
	}
	if !steered {
		return
	}
	// client2's datagram was sent after client3's and has arrived: client3's
	// is with the held reader, behind its batch.
	select {
	case d := <-c3.in:
		t.Fatalf("a datagram of client port 5002 (%d bytes) came past the held reader of port 5000: not steered by client", d.n)
	default:
	}
	close(block.release)
	released = true
	_ = c3.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _, err := c3.ReadFromAddrPort(b); err != nil || n != 3 {
		t.Fatalf("the held reader's other client got nothing after the release: %d bytes, %v", n, err)
	}
}

func getConn(t *testing.T, pc *popConn, ufrag string) *muxConn {
	t.Helper()
	c, err := pc.mux.GetConn(ufrag, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*muxConn)
}

// TestCorkHoldsSends: between Socket.Cork and Uncork (the pacer's slot)
// datagrams wait in the queue, all of them, and Uncork sends them.
func TestCorkHoldsSends(t *testing.T) {
	conn := listenLoopback(t, "udp4", "127.0.0.1:0")
	s, _ := testPOP(t, conn)
	peer := listenLoopback(t, "udp4", "127.0.0.1:0")
	to := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	const n = 5
	s.Cork()
	for i := range n {
		if err := s.out.send([]byte{byte(i)}, to); err != nil {
			t.Fatal(err)
		}
	}
	s.out.mu.Lock()
	held := s.out.pending.n
	s.out.mu.Unlock()
	if held != n {
		t.Fatalf("%d of %d datagrams held while corked", held, n)
	}
	s.Uncork()
	b := make([]byte, 8)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range n {
		if k, _, err := peer.ReadFromUDPAddrPort(b); err != nil || k != 1 || b[0] != byte(i) {
			t.Fatalf("datagram %d after uncork: %x, %v", i, b[:k], err)
		}
	}
}
