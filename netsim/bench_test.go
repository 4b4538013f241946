package netsim_test

import (
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/netsim"
)

// sink counts the datagrams reaching a socket.
type sink struct {
	conn *net.UDPConn
	got  atomic.Int64
	done chan struct{}
}

func startSink(b *testing.B) *sink {
	s := &sink{conn: listenUDP(b), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, 2048)
		for {
			if _, _, err := s.conn.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			s.got.Add(1)
		}
	}()
	b.Cleanup(func() { s.conn.Close(); <-s.done })
	return s
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pump sends b.N datagrams of size bytes to dst, keeping at most window in
// flight so that no socket buffer overflows; a window that stalls for
// 100 ms (a datagram lost in the kernel) is written off. It reports
// datagrams per second and the process CPU time (sender, link and sink
// together) per datagram.
func pump(b *testing.B, dst netip.AddrPort, s *sink, size int) {
	c := listenUDP(b)
	defer c.Close()
	payload := make([]byte, size)
	const window = 64
	var lost int64
	b.SetBytes(int64(size))
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if int64(i)-s.got.Load()-lost >= window {
			stall := time.Now()
			for int64(i)-s.got.Load()-lost >= window {
				if time.Since(stall) > 100*time.Millisecond {
					lost = int64(i) - s.got.Load()
					break
				}
				time.Sleep(20 * time.Microsecond)
			}
		}
		if _, err := c.WriteToUDPAddrPort(payload, dst); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for s.got.Load()+lost < int64(b.N) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Microsecond)
	}
	b.StopTimer()
	elapsed := time.Since(start)
	b.ReportMetric(float64(s.got.Load())/elapsed.Seconds(), "pkt/s")
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/pkt")
}

// BenchmarkUDPDirect is the baseline: the same traffic without a link. The
// difference to BenchmarkUDPLink is what the link adds per datagram.
func BenchmarkUDPDirect(b *testing.B) {
	s := startSink(b)
	pump(b, addrOf(s.conn), s, 200)
}

// BenchmarkUDPLink forwards voice-sized datagrams through a link without
// delay (the scheduler still runs: every datagram goes through the heap).
func BenchmarkUDPLink(b *testing.B) {
	for _, d := range []time.Duration{0, time.Millisecond} {
		b.Run("delay="+d.String(), func(b *testing.B) {
			s := startSink(b)
			l := startUDPLink(b, addrOf(s.conn), netsim.LinkConfig{Delay: d}, netsim.LinkConfig{})
			pump(b, l.Addr(), s, 200)
		})
	}
}
