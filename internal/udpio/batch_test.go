package udpio

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

func listenT(t testing.TB, addr string) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBatchConn: a batch written with WriteBatch arrives whole at a
// BatchConn's ReadBatch with each datagram's bytes and source, over IPv4,
// IPv6 and a dual-stack socket (whose IPv4 peers must come out unmapped
// and be reachable by their IPv4 address).
func TestBatchConn(t *testing.T) {
	for _, tc := range []struct{ name, rx, tx string }{
		{"ipv4", "127.0.0.1:0", "127.0.0.1:0"},
		{"ipv6", "[::1]:0", "[::1]:0"},
		{"dual-stack", "[::]:0", "127.0.0.1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rx, tx := listenT(t, tc.rx), listenT(t, tc.tx)
			to := LocalAddrPort(rx)
			if to.Addr().IsUnspecified() {
				to = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), to.Port())
			}
			r, w := NewBatchConn(rx, 8), NewBatchConn(tx, 8)
			if !r.Batched() || !w.Batched() {
				t.Fatal("no batch system calls on Linux")
			}
			out := make([]Msg, 5)
			for i := range out {
				out[i] = Msg{Buf: bytes.Repeat([]byte{byte(i + 1)}, 10+i), Addr: to}
			}
			if n, err := w.WriteBatch(out); err != nil || n != len(out) {
				t.Fatalf("WriteBatch = %d, %v", n, err)
			}
			in := make([]Msg, 8)
			for i := range in {
				in[i].Buf = make([]byte, 64)
			}
			_ = rx.SetReadDeadline(time.Now().Add(5 * time.Second))
			from := LocalAddrPort(tx)
			for got := 0; got < len(out); {
				n, err := r.ReadBatch(in)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range in[:n] {
					want := out[got]
					if !bytes.Equal(m.Buf[:m.N], want.Buf) || m.Addr != from {
						t.Fatalf("datagram %d: %x from %v, want %x from %v", got, m.Buf[:m.N], m.Addr, want.Buf, from)
					}
					got++
				}
			}
		})
	}
}

// TestBatchConnTruncates: a datagram longer than its buffer is cut to the
// buffer's length, which is how the forwarders see it as oversized.
func TestBatchConnTruncates(t *testing.T) {
	rx, tx := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	if _, err := tx.WriteToUDPAddrPort(make([]byte, 100), LocalAddrPort(rx)); err != nil {
		t.Fatal(err)
	}
	in := []Msg{{Buf: make([]byte, 11)}}
	_ = rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := NewBatchConn(rx, 4).ReadBatch(in); err != nil || n != 1 || in[0].N != 11 {
		t.Fatalf("ReadBatch = %d, %v, N %d; want one datagram of 11", n, err, in[0].N)
	}
}

// TestBatchConnClosed: closing the socket ends a blocked ReadBatch with
// net.ErrClosed, and a write refused by the kernel (IPv6 destination on an
// IPv4 socket) is an error, not a silent success.
func TestBatchConnClosed(t *testing.T) {
	rx := listenT(t, "127.0.0.1:0")
	b := NewBatchConn(rx, 4)
	done := make(chan error, 1)
	go func() {
		_, err := b.ReadBatch([]Msg{{Buf: make([]byte, 8)}})
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it block; the test holds either way
	rx.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("ReadBatch after Close: %v, want net.ErrClosed", err)
	}
	tx := listenT(t, "127.0.0.1:0")
	n, err := NewBatchConn(tx, 4).WriteBatch([]Msg{{Buf: []byte("x"), Addr: netip.MustParseAddrPort("[::1]:9")}})
	if err == nil || n != 0 {
		t.Fatalf("IPv6 destination on an IPv4 socket: %d, %v; want an error", n, err)
	}
}

// TestForwardBatch: datagrams go through ForwardBatch's decide to the
// destination it names; oversized ones are dropped and counted, and a
// refused write is counted and skipped without stopping the loop.
func TestForwardBatch(t *testing.T) {
	conn, dst, sink, client := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	var oversize, writeErrs int
	bad := netip.MustParseAddrPort("[::1]:9") // refused by dst's IPv4 socket
	done := make(chan error, 1)
	go func() {
		done <- ForwardBatch(conn, dst, 4, 100, 8, func(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
			if buf[4] == 'b' {
				return buf[4 : 4+n], bad, true
			}
			copy(buf[:4], "hdr:")
			return buf[:4+n], LocalAddrPort(sink), true
		}, Hooks{Oversize: func() { oversize++ }, WriteErr: func(error) { writeErrs++ }})
	}()
	for _, p := range []string{"one", "bad", string(make([]byte, 101)), "two"} {
		if _, err := client.WriteToUDPAddrPort([]byte(p), LocalAddrPort(conn)); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 256)
	_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
	for _, want := range []string{"hdr:one", "hdr:two"} {
		n, _, err := sink.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("got %q, %v; want %q", buf[:n], err, want)
		}
	}
	conn.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if oversize != 1 || writeErrs != 1 {
		t.Errorf("oversize %d, write errors %d; want 1 and 1", oversize, writeErrs)
	}
}

// forwardRound starts a ForwardBatch loop (batches of 32, an 8-byte
// header put in front) and returns one round: 8 datagrams through it to a
// sink, then read there.
func forwardRound(t testing.TB) func() {
	conn, sink, client := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	to := LocalAddrPort(sink)
	done := make(chan error, 1)
	go func() {
		done <- ForwardBatch(conn, conn, 8, 1500, 32, func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) {
			return buf[:8+n], to, true
		}, Hooks{})
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	pkt, buf := make([]byte, 120), make([]byte, 2048)
	dst := LocalAddrPort(conn)
	_ = sink.SetReadDeadline(time.Now().Add(2 * time.Minute))
	return func() { eightThrough(t, client, sink, dst, pkt, buf) }
}

// eightThrough sends 8 copies of pkt from client to dst and reads 8
// datagrams at sink.
func eightThrough(t testing.TB, client, sink *net.UDPConn, dst netip.AddrPort, pkt, buf []byte) {
	for range 8 {
		if _, err := client.WriteToUDPAddrPort(pkt, dst); err != nil {
			t.Fatal(err)
		}
	}
	for range 8 {
		if _, _, err := sink.ReadFromUDPAddrPort(buf); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkForwardBatch: datagrams through a ForwardBatch loop over
// loopback, 8 in flight, per forwarded datagram (allocations included).
func BenchmarkForwardBatch(b *testing.B) {
	round := forwardRound(b)
	b.ReportAllocs()
	for b.Loop() {
		round()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(8*b.N), "ns/datagram")
}

// TestBatchConnAfterDrain: datagrams that arrive between two reads (no
// reader waiting) or while a read waits are all read. (A read that skips
// its first recvmmsg after a drained batch, to save the EAGAIN, fails
// this: the runtime forgets readiness at the start of every raw read.)
func TestBatchConnAfterDrain(t *testing.T) {
	rx, tx := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	r := NewBatchConn(rx, 8)
	in := make([]Msg, 8)
	for i := range in {
		in[i].Buf = make([]byte, 16)
	}
	to := LocalAddrPort(rx)
	_ = rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	for round := range 3 {
		if _, err := tx.WriteToUDPAddrPort([]byte{byte(round)}, to); err != nil {
			t.Fatal(err)
		}
		if round == 1 {
			time.Sleep(5 * time.Millisecond) // arrives before the read starts
		} else if round == 2 {
			go func() { // arrives while the read waits
				time.Sleep(5 * time.Millisecond)
				_, _ = tx.WriteToUDPAddrPort([]byte{9}, to)
			}()
		}
		n, err := r.ReadBatch(in)
		if err != nil || n != 1 || in[0].Buf[0] != byte(round) {
			t.Fatalf("round %d: %d datagrams, %v", round, n, err)
		}
	}
	if n, err := r.ReadBatch(in); err != nil || n != 1 || in[0].Buf[0] != 9 {
		t.Fatalf("datagram sent while waiting: %d, %v", n, err)
	}
}

// BenchmarkForwardCPU: one datagram in flight through a ForwardBatch loop,
// the process's CPU time per datagram (getrusage: sender, loop and sink
// together, so only the difference between the variants is the loop's):
// waiting in the runtime's poller against waiting inside recvmmsg.
func BenchmarkForwardCPU(b *testing.B) {
	for _, blocking := range []bool{false, true} {
		name := "poller"
		if blocking {
			name = "blocking"
		}
		b.Run(name, func(b *testing.B) {
			conn, sink, client := listenT(b, "127.0.0.1:0"), listenT(b, "127.0.0.1:0"), listenT(b, "127.0.0.1:0")
			to := LocalAddrPort(sink)
			done := make(chan error, 1)
			go func() {
				done <- ForwardBatch(conn, conn, 8, 1500, 32, func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) {
					return buf[:8+n], to, true
				}, Hooks{BlockingReads: blocking})
			}()
			defer func() { conn.Close(); <-done }()
			pkt, buf := make([]byte, 120), make([]byte, 2048)
			dst := LocalAddrPort(conn)
			_ = sink.SetReadDeadline(time.Now().Add(2 * time.Minute))
			var r0, r1 syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
			b.ResetTimer()
			for b.Loop() {
				if _, err := client.WriteToUDPAddrPort(pkt, dst); err != nil {
					b.Fatal(err)
				}
				if _, _, err := sink.ReadFromUDPAddrPort(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
			cpu := time.Duration(r1.Utime.Nano() + r1.Stime.Nano() - r0.Utime.Nano() - r0.Stime.Nano())
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/datagram")
		})
	}
}

// TestForwardBatchBlockingReads: with blocking reads the loop forwards,
// and closing the socket still ends it (after at most the receive
// timeout).
func TestForwardBatchBlockingReads(t *testing.T) {
	conn, sink, client := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	to := LocalAddrPort(sink)
	done := make(chan error, 1)
	go func() {
		done <- ForwardBatch(conn, conn, 0, 1500, 8, func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) {
			return buf[:n], to, true
		}, Hooks{BlockingReads: true})
	}()
	buf := make([]byte, 64)
	_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
	for _, p := range []string{"a", "b"} {
		if _, err := client.WriteToUDPAddrPort([]byte(p), LocalAddrPort(conn)); err != nil {
			t.Fatal(err)
		}
		if n, _, err := sink.ReadFromUDPAddrPort(buf); err != nil || string(buf[:n]) != p {
			t.Fatalf("got %q, %v; want %q", buf[:n], err, p)
		}
	}
	conn.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not end after Close")
	}
}

// TestReadLoopOneReadPerWake: ReadLoop reads a datagram that arrives while
// its handler runs (after a drained batch, with no reader waiting) and one
// that arrives while it waits, and makes one recvmmsg per datagram when
// datagrams come one at a time, where ReadBatch in a loop makes two (the
// second returning EAGAIN). Re-entering the raw read after a drained batch
// without reading would lose the first case: the runtime forgets readiness
// at the start of every raw read.
func TestReadLoopOneReadPerWake(t *testing.T) {
	for _, loop := range []bool{true, false} {
		name := "ReadLoop"
		if !loop {
			name = "ReadBatch"
		}
		t.Run(name, func(t *testing.T) {
			rx, tx := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
			r := NewBatchConn(rx, 8)
			if !r.Batched() {
				t.Skip("no recvmmsg on this platform") // the plain fallback has no EAGAIN read to save
			}
			in := make([]Msg, 8)
			for i := range in {
				in[i].Buf = make([]byte, 16)
			}
			to := LocalAddrPort(rx)
			send := func(b byte) {
				if _, err := tx.WriteToUDPAddrPort([]byte{b}, to); err != nil {
					t.Error(err)
				}
			}
			const rounds = 100
			got := make(chan byte, rounds+2)
			handle := func(n int) bool {
				for i := range n {
					got <- in[i].Buf[0]
				}
				// Datagram 0 brings 1 while the handler runs: it must
				// be read without another datagram to announce it.
				if in[n-1].Buf[0] == 0 {
					send(1)
					// Let the runtime's poller see it before the
					// handler returns (no event to await here).
					time.Sleep(5 * time.Millisecond)
				}
				return in[n-1].Buf[0] != rounds
			}
			done := make(chan error, 1)
			go func() {
				if loop {
					done <- r.ReadLoop(in, handle)
					return
				}
				for {
					n, err := r.ReadBatch(in)
					if err != nil || !handle(n) {
						done <- err
						return
					}
				}
			}()
			send(0)
			timeout := time.After(10 * time.Second)
			for want := byte(0); want <= rounds; want++ {
				select {
				case b := <-got:
					if b != want {
						t.Fatalf("datagram %d read where %d was due", b, want)
					}
				case <-timeout:
					t.Fatalf("datagram %d never read", want)
				}
				if want >= 1 && want < rounds {
					send(want + 1) // one in flight: each wakes a waiting reader
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			calls := r.mm.rd.calls
			t.Logf("%s: %d recvmmsg for %d datagrams", name, calls, rounds+1)
			if loop && calls > rounds+1+rounds/10 {
				t.Errorf("ReadLoop made %d recvmmsg for %d datagrams one at a time, want about one each", calls, rounds+1)
			}
			if !loop && calls < 3*rounds/2 {
				t.Errorf("ReadBatch made %d recvmmsg for %d datagrams, expected about two each (the baseline this test compares with)", calls, rounds+1)
			}
		})
	}
}

// TestReadLoopFollowsSwappedBuffers: a ReadLoop handler may hand a
// buffer on and put a fresh one in its place (the pod's reader does, for
// every datagram it queues); the next batch lands in the fresh buffer and
// leaves the handed-on one alone. A reader that set its iovecs once, or
// checked only the first and last, wrote the next datagram into the
// buffer already handed on (seen as loss in an end-to-end test). It needs
// two batches of two: a batch the kernel splits is read and the pair sent
// again (bounded).
func TestReadLoopFollowsSwappedBuffers(t *testing.T) {
	rx, tx := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	to := LocalAddrPort(rx)
	send := func(ps ...string) {
		for _, p := range ps {
			if _, err := tx.WriteToUDPAddrPort([]byte(p), to); err != nil {
				t.Fatal(err)
			}
		}
	}
	ms := make([]Msg, 4)
	for i := range ms {
		ms[i].Buf = make([]byte, 64)
	}
	var handedOn []byte // ms[1]'s buffer of the first pair, once swapped
	var handedWant string
	checked, attempts := false, 0
	send("a0", "a1")
	_ = rx.SetReadDeadline(time.Now().Add(10 * time.Second))
	err := NewBatchConn(rx, 4).ReadLoop(ms, func(n int) bool {
		if attempts++; attempts > 100 {
			t.Error("never two batches of two datagrams")
			return false
		}
		last := string(ms[n-1].Buf[:ms[n-1].N])
		switch {
		case handedOn == nil && n == 2:
			handedOn, handedWant = ms[1].Buf, string(ms[1].Buf[:ms[1].N])
			ms[1].Buf = make([]byte, 64)
			send("b0", "b1")
		case handedOn != nil && n == 2:
			if got := string(ms[1].Buf[:ms[1].N]); got != "b1" {
				t.Errorf("second batch's datagram 1 in the fresh buffer: %q, want b1", got)
			}
			if got := string(handedOn[:len(handedWant)]); got != handedWant {
				t.Errorf("the handed-on buffer now holds %q, want %q untouched", got, handedWant)
			}
			checked = true
			return false
		case last == "a1" || last == "b1": // split: the pair is read, start over
			handedOn = nil
			send("a0", "a1")
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if !checked && !t.Failed() {
		t.Error("the second batch was never checked")
	}
}
