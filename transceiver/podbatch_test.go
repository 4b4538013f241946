package transceiver

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"
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

// TestBatchIO: datagrams read in batches keep their sources and lengths, a
// datagram that fills the buffer is flagged, and batched sends arrive
// whole, over IPv4 and IPv6 sockets.
func TestBatchIO(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{{"udp4", "127.0.0.1:0"}, {"udp6", "[::1]:0"}} {
		t.Run(tc.network, func(t *testing.T) {
			pod := listenLoopback(t, tc.network, tc.addr)
			peer := listenLoopback(t, tc.network, tc.addr)
			podAddr := pod.LocalAddr().(*net.UDPAddr).AddrPort()
			peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
			r, err := newBatchReader(pod)
			if err != nil {
				t.Fatal(err)
			}
			defer r.release()
			want := [][]byte{[]byte("one"), bytes.Repeat([]byte{7}, 1200), make([]byte, len(podBuf{})), []byte("four")}
			for _, p := range want {
				if _, err := peer.WriteToUDPAddrPort(p, podAddr); err != nil {
					t.Fatal(err)
				}
			}
			_ = pod.SetReadDeadline(time.Now().Add(5 * time.Second))
			var got []string
			for len(got) < len(want) {
				n, err := r.read()
				if err != nil {
					t.Fatal(err)
				}
				for i := range n {
					buf, size, from, trunc := r.message(i)
					if unmap(from) != unmap(peerAddr) {
						t.Errorf("datagram from %v, want %v", from, peerAddr)
					}
					got = append(got, fmt.Sprintf("%d:%v", size, trunc))
					if !trunc && !bytes.Equal(buf[:size], want[len(got)-1]) {
						t.Errorf("datagram %d: wrong bytes", len(got))
					}
					r.replace(i)
				}
			}
			wantSizes := []string{"3:false", "1200:false", fmt.Sprintf("%d:true", len(podBuf{})), "4:false"}
			if fmt.Sprint(got) != fmt.Sprint(wantSizes) {
				t.Errorf("read %v, want %v", got, wantSizes)
			}

			q := newTestOutQueue(t, pod)
			for i := range 5 {
				if err := q.send([]byte{byte(i)}, peerAddr); err != nil {
					t.Fatal(err)
				}
			}
			_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 64)
			for i := range 5 {
				n, from, err := peer.ReadFromUDPAddrPort(b)
				if err != nil {
					t.Fatal(err)
				}
				if n != 1 || b[0] != byte(i) || unmap(from) != unmap(podAddr) {
					t.Errorf("datagram %d: %v from %v", i, b[:n], from)
				}
			}
		})
	}
}

// TestBatchIONoAllocs: a batched read and a queued send allocate nothing.
func TestBatchIONoAllocs(t *testing.T) {
	pod := listenLoopback(t, "udp4", "127.0.0.1:0")
	peer := listenLoopback(t, "udp4", "127.0.0.1:0")
	_ = peer.SetReadBuffer(4 << 20)
	podAddr := pod.LocalAddr().(*net.UDPAddr).AddrPort()
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	r, err := newBatchReader(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer r.release()
	q := newTestOutQueue(t, pod)
	pkt := make([]byte, 120)
	allocs := testing.AllocsPerRun(200, func() {
		for range 4 {
			if _, err := peer.WriteToUDPAddrPort(pkt, podAddr); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < 4; {
			n, err := r.read()
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		if err := q.send(pkt, peerAddr); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per batched read and send, want 0", allocs)
	}
}
