package udpio

import (
	"net/netip"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"
)

// TestForwardBatchRawSyscalls: a forwarding loop's recvmmsg and sendmmsg
// on non-blocking sockets are raw system calls, which the scheduler never
// sees: no goroutine is ever counted in a system call
// (/sched/goroutines/not-in-go) however many datagrams go through, so
// none wakes sysmon or loses its P. Through syscall.Syscall6 the loop and
// the sender would spend most of the test in counted system calls. A
// blocking read (Hooks.BlockingReads) must still tell the scheduler:
// TestBlockingReadReleasesP.
func TestForwardBatchRawSyscalls(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))) // the sampler runs beside the loop
	conn, sink, client := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	to, dst := LocalAddrPort(sink), LocalAddrPort(conn)
	var forwarded atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- ForwardBatch(conn, conn, 0, 1500, 32, func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) {
			forwarded.Add(1)
			return buf[:n], to, true // nobody reads the sink: the kernel drops what overflows it
		}, Hooks{})
	}()
	defer func() { conn.Close(); <-done }()

	sample := []metrics.Sample{{Name: "/sched/goroutines/not-in-go:goroutines"}}
	inSyscall := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	if n := inSyscall(); n != 0 {
		t.Fatalf("%d goroutines in system calls before the test", n)
	}
	stop := make(chan struct{})
	type result struct{ samples, busy int }
	res := make(chan result)
	go func() {
		var r result
		for {
			select {
			case <-stop:
				res <- r
				return
			default:
			}
			r.samples++
			if inSyscall() > 0 {
				r.busy++
			}
			runtime.Gosched() // leave the loop a P now and then
		}
	}()
	w := NewBatchConn(client, 32)
	out := make([]Msg, 32)
	for i := range out {
		out[i] = Msg{Buf: make([]byte, 120), Addr: dst}
	}
	const toSend = 50000
	deadline := time.Now().Add(20 * time.Second)
	for sent := 0; sent < toSend && time.Now().Before(deadline); {
		n, err := w.WriteBatch(out)
		if err != nil {
			t.Fatal(err)
		}
		sent += n
	}
	for forwarded.Load() < 1000 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	close(stop)
	r := <-res
	if forwarded.Load() < 1000 {
		t.Fatalf("only %d datagrams forwarded", forwarded.Load())
	}
	if r.busy != 0 {
		t.Errorf("a goroutine was in a scheduler-visible system call in %d of %d samples while %d datagrams were sent and %d forwarded",
			r.busy, r.samples, toSend, forwarded.Load())
	}
	t.Logf("%d samples, %d datagrams forwarded", r.samples, forwarded.Load())
}

// TestBlockingReadReleasesP: a read loop waiting inside recvmmsg
// (Hooks.BlockingReads) goes through the scheduler, so with a single P
// other goroutines still run while it waits: as a raw system call it would
// hold the only P until a datagram came.
func TestBlockingReadReleasesP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	conn, sink := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	to := LocalAddrPort(sink)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		close(started)
		done <- ForwardBatch(conn, conn, 0, 1500, 8, func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) {
			return buf[:n], to, true
		}, Hooks{BlockingReads: true})
	}()
	<-started
	// Wait until the loop is blocked in its read: counted in a system call.
	sample := []metrics.Sample{{Name: "/sched/goroutines/not-in-go:goroutines"}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		metrics.Read(sample)
		if sample[0].Value.Uint64() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the blocking read never showed as a system call")
		}
		runtime.Gosched()
	}
	// This goroutine runs, so the P was released; a datagram ends the wait.
	ran := make(chan struct{})
	go func() { close(ran) }()
	select {
	case <-ran:
	case <-time.After(20 * time.Second):
		t.Fatal("no other goroutine ran while the loop waited in recvmmsg")
	}
	conn.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
