package transceiver

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
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
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := newPodSocket(conn, 7, 3, testHop, nil, m, time.Now)
	pc, _, err := s.popConn(1, netip.MustParseAddrPort("192.0.2.1:3478"))
	if err != nil {
		t.Fatal(err)
	}
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
	done := make(chan error, readers)
	for range readers {
		go func() { done <- s.readLoop() }()
	}
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
	for range readers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
