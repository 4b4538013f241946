package udpio

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// detachT detaches a fresh loopback socket.
func detachT(t testing.TB) *RawConn { return detachOn(t, "127.0.0.1:0") }

func detachOn(t testing.TB, addr string) *RawConn {
	t.Helper()
	r, err := Detach(listenT(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// loopT starts a Loop over paths on a goroutine of its own and stops it at
// cleanup (or earlier through the returned stop, which waits for Run).
func loopT(t testing.TB, paths []LoopPath) (stop func() error) {
	t.Helper()
	l, err := NewLoop(paths)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run() }()
	var ended bool
	var res error
	stop = func() error {
		if !ended {
			ended = true
			l.Close()
			select {
			case res = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after Close")
			}
		}
		return res
	}
	t.Cleanup(func() { stop() })
	return stop
}

// relayPaths is a relay worker in miniature: datagrams from clients on
// front get a 4-byte header (the client's port, "c:" and two bytes) and go
// to the back peer; datagrams from the back peer lose it and go to the
// client whose port it names.
func relayPaths(front, back *RawConn, peer netip.AddrPort, hooks Hooks) []LoopPath {
	host := front.LocalAddrPort().Addr()
	return []LoopPath{
		{From: front, To: back, Headroom: 4, Limit: 1500, Batch: 8, Hooks: hooks,
			Decide: func(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
				buf[0], buf[1], buf[2], buf[3] = 'c', ':', byte(from.Port()>>8), byte(from.Port())
				return buf[:4+n], peer, true
			}},
		{From: back, To: front, Limit: 1500, Batch: 8, Hooks: hooks,
			Decide: func(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
				if n < 4 || string(buf[:2]) != "c:" {
					return nil, netip.AddrPort{}, false
				}
				port := uint16(buf[2])<<8 | uint16(buf[3])
				return buf[4:n], netip.AddrPortFrom(host, port), true
			}},
	}
}

// TestLoopForwards: a Loop forwards both ways of a worker, batches and
// oversized datagrams as ForwardBatch does, and the sockets keep their
// addresses.
func TestLoopForwards(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "[::1]"} {
		t.Run(host, func(t *testing.T) { testLoopForwards(t, host) })
	}
}

func testLoopForwards(t *testing.T, host string) {
	front, back := detachOn(t, host+":0"), detachOn(t, host+":0")
	peer, client := listenT(t, host+":0"), listenT(t, host+":0")
	var oversize atomic.Int32
	loopT(t, relayPaths(front, back, LocalAddrPort(peer), Hooks{Oversize: func() { oversize.Add(1) }}))
	if !front.LocalAddrPort().IsValid() || front.LocalAddrPort().Port() == 0 {
		t.Fatalf("front address %v", front.LocalAddrPort())
	}
	const n = 50
	for i := range n {
		if _, err := client.WriteToUDPAddrPort(fmt.Appendf(nil, "m%02d", i), front.LocalAddrPort()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.WriteToUDPAddrPort(make([]byte, 1501), front.LocalAddrPort()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range n {
		k, from, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("datagram %d at the back peer: %v", i, err)
		}
		if from != back.LocalAddrPort() || string(buf[4:k]) != fmt.Sprintf("m%02d", i) {
			t.Fatalf("got %q from %v", buf[:k], from)
		}
		if _, err := peer.WriteToUDPAddrPort(buf[:k], from); err != nil {
			t.Fatal(err)
		}
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range n {
		k, from, err := client.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if from != front.LocalAddrPort() || string(buf[:k]) != fmt.Sprintf("m%02d", i) {
			t.Fatalf("reply %q from %v", buf[:k], from)
		}
	}
	if got := oversize.Load(); got != 1 {
		t.Errorf("oversize %d, want 1", got)
	}
}

// TestLoopCloseAndProcs: Close ends Run with nil and closes the sockets
// (a send from another goroutine then fails with net.ErrClosed), Run adds
// one P while it runs and gives it back, and a Loop closed before Run
// closes its sockets at once.
func TestLoopCloseAndProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	front, back := detachT(t), detachT(t)
	peer := listenT(t, "127.0.0.1:0")
	stop := loopT(t, relayPaths(front, back, LocalAddrPort(peer), Hooks{}))
	// Sends from outside the loop work while it runs.
	if _, err := back.WriteToUDPAddrPort([]byte("x"), LocalAddrPort(peer)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.GOMAXPROCS(0) != before+1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := runtime.GOMAXPROCS(0); got != before+1 {
		t.Errorf("GOMAXPROCS %d while the loop runs, want %d", got, before+1)
	}
	if got := Procs(); got != before {
		t.Errorf("Procs %d while the loop runs, want %d (the loop's P is not a CPU to size workers by)", got, before)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Errorf("GOMAXPROCS %d after the loop, want %d", got, before)
	}
	if _, err := back.WriteToUDPAddrPort([]byte("x"), LocalAddrPort(peer)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("send after Close: %v, want net.ErrClosed", err)
	}

	a, b := detachT(t), detachT(t)
	l, err := NewLoop(relayPaths(a, b, LocalAddrPort(peer), Hooks{}))
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := a.WriteToUDPAddrPort([]byte("x"), LocalAddrPort(peer)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("send on a loop closed before Run: %v, want net.ErrClosed", err)
	}
	if err := l.Run(); err != nil {
		t.Errorf("Run after Close: %v", err)
	}
}

// TestLoopLetsTheCollectorStop: collections (which stop every goroutine,
// the loop's too, while it waits in a raw epoll_pwait that holds its P)
// finish while the loop idles. A raw wait is never preempted on its own:
// without the yield after an interrupted wait, the collector waits for the
// next datagram.
func TestLoopLetsTheCollectorStop(t *testing.T) {
	front, back := detachT(t), detachT(t)
	peer := listenT(t, "127.0.0.1:0")
	loopT(t, relayPaths(front, back, LocalAddrPort(peer), Hooks{}))
	time.Sleep(20 * time.Millisecond) // let it reach the wait
	done := make(chan struct{})
	go func() {
		for range 20 {
			runtime.GC()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("collections did not finish while the loop idled")
	}
}

// TestDetachLeavesThePoller: a detached socket is in the loop's epoll set
// and in no other: the runtime's poller is not woken by its datagrams.
// (A duplicate of the descriptor alone stays in the poller's set: epoll
// watches the open file.)
func TestDetachLeavesThePoller(t *testing.T) {
	c := listenT(t, "127.0.0.1:0")
	ino := socketInode(t, c)
	if sets := epollSetsWatching(t, ino); len(sets) != 1 {
		t.Fatalf("a socket in the poller is in %d epoll sets, want 1 (the test cannot see the poller)", len(sets))
	}
	front, err := Detach(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	if sets := epollSetsWatching(t, ino); len(sets) != 0 {
		t.Fatalf("detached socket still in %d epoll sets", len(sets))
	}
	back := detachT(t)
	loopT(t, relayPaths(front, back, LocalAddrPort(listenT(t, "127.0.0.1:0")), Hooks{}))
	if sets := epollSetsWatching(t, ino); len(sets) != 1 {
		t.Fatalf("detached socket in %d epoll sets with its loop running, want 1", len(sets))
	}
}

func socketInode(t *testing.T, c *net.UDPConn) uint64 {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return st.Ino
}

// epollSetsWatching lists this process's epoll descriptors whose watch list
// (/proc/self/fdinfo) has the socket with inode ino.
func epollSetsWatching(t *testing.T, ino uint64) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var sets []string
	want := fmt.Sprintf(" ino:%x ", ino)
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || target != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if strings.HasPrefix(line, "tfd:") && strings.Contains(line+" ", want) {
				sets = append(sets, e.Name())
			}
		}
	}
	return sets
}

// TestLoopOwnsItsSockets: a Loop's sockets are closed only with the Loop
// (closing one under it would leave the loop on a descriptor number the
// kernel may hand to another file), and no two Loops share one.
func TestLoopOwnsItsSockets(t *testing.T) {
	front, back := detachT(t), detachT(t)
	peer := LocalAddrPort(listenT(t, "127.0.0.1:0"))
	loopT(t, relayPaths(front, back, peer, Hooks{}))
	if err := front.Close(); err == nil {
		t.Error("Close of a loop's socket succeeded")
	}
	if _, err := front.WriteToUDPAddrPort([]byte("x"), peer); err != nil {
		t.Errorf("the loop's socket was closed under it: %v", err)
	}
	other := detachT(t)
	if _, err := NewLoop(relayPaths(other, back, peer, Hooks{})); err == nil {
		t.Error("a second loop took a socket of the first")
	}
}

// TestReadNowFollowsBuffers: the loop's reader sets its iovecs once, and
// again when it is handed other buffers.
func TestReadNowFollowsBuffers(t *testing.T) {
	rx := detachT(t)
	tx := listenT(t, "127.0.0.1:0")
	m := rx.batchConn(4).mm
	read := func(ms []Msg, want string) {
		t.Helper()
		if _, err := tx.WriteToUDPAddrPort([]byte(want), rx.LocalAddrPort()); err != nil {
			t.Fatal(err)
		}
		pfd := []unix.PollFd{{Fd: int32(rx.fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, 5000); n != 1 || err != nil {
			t.Fatalf("poll: %d, %v", n, err)
		}
		n, err := m.readNow(ms)
		if err != nil || n != 1 || string(ms[0].Buf[:ms[0].N]) != want || ms[0].Addr != LocalAddrPort(tx) {
			t.Fatalf("read %d, %v: %q from %v, want %q from %v", n, err, ms[0].Buf[:ms[0].N], ms[0].Addr, want, LocalAddrPort(tx))
		}
	}
	msgs := func() []Msg {
		ms := make([]Msg, 4)
		for i := range ms {
			ms[i].Buf = make([]byte, 64)
		}
		return ms
	}
	a, b := msgs(), msgs()
	read(a, "one")
	read(a, "two")
	read(b, "three")
	if string(a[0].Buf[:5]) == "three" {
		t.Error("the read went into the old buffers")
	}
}

// TestFullSendBufferDropsTheBatch: when a raw socket's send buffer stays
// full, a batch costs one wait and one error, not a call and an error per
// datagram; with room, the same batch goes out whole.
func TestFullSendBufferDropsTheBatch(t *testing.T) {
	out := detachT(t)
	sink := listenT(t, "127.0.0.1:0")
	var writeErrs atomic.Int32
	f, err := newBatchForwarder(out.batchConn, 0, 100, 8, func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) {
		return buf[:n], LocalAddrPort(sink), true
	}, Hooks{WriteErr: func(error) { writeErrs.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		f.in[i].N = copy(f.in[i].Buf, fmt.Sprintf("d%d", i))
	}
	var calls int
	sendHook = func() syscall.Errno { calls++; return unix.EAGAIN }
	f.forward(8)
	sendHook = nil
	if writeErrs.Load() != 1 || calls != 2 {
		t.Errorf("a full buffer cost %d errors and %d sends, want 1 and 2 (one wait)", writeErrs.Load(), calls)
	}
	f.forward(8)
	buf := make([]byte, 64)
	_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range 8 {
		n, _, err := sink.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != fmt.Sprintf("d%d", i) {
			t.Fatalf("datagram %d: %q, %v", i, buf[:n], err)
		}
	}
}
