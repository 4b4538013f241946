package udpio

import (
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLockThread: the goroutine's thread is pinned to the CPU asked for.
func TestLockThread(t *testing.T) {
	got := make(chan []int, 1)
	go func() {
		if err := LockThread(0); err != nil {
			t.Error(err)
		}
		var set unix.CPUSet
		_ = unix.SchedGetaffinity(0, &set)
		var cpus []int
		for c := range 1024 {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
		got <- cpus // exits locked: the runtime ends the thread
	}()
	if cpus := <-got; len(cpus) != 1 || cpus[0] != 0 {
		t.Fatalf("thread runs on %v, want [0]", cpus)
	}
}

// reusePortSpread sends from senders client sockets, each from a thread
// pinned to cpuOf(i) (-1: unpinned), count datagrams each, and returns for
// every client address the set of group sockets that received from it,
// and the clients' addresses in order.
func reusePortSpread(t *testing.T, group []*net.UDPConn, senders, count int, cpuOf func(int) int) (map[netip.AddrPort]map[int]bool, []netip.AddrPort) {
	t.Helper()
	to := LocalAddrPort(group[0])
	var addrs []netip.AddrPort
	for i := range senders {
		c := listenT(t, "127.0.0.1:0")
		addrs = append(addrs, LocalAddrPort(c))
		errc := make(chan error, 1)
		go func() {
			if err := LockThread(cpuOf(i)); err != nil {
				errc <- err
				return
			}
			for range count {
				if _, err := c.WriteToUDPAddrPort([]byte("x"), to); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	seen := map[netip.AddrPort]map[int]bool{}
	buf := make([]byte, 16)
	deadline := time.Now().Add(10 * time.Second)
	for total := 0; total < senders*count; {
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d datagrams", total, senders*count)
		}
		for i, g := range group {
			_ = g.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, from, err := g.ReadFromUDPAddrPort(buf)
			if err != nil {
				continue
			}
			if seen[from] == nil {
				seen[from] = map[int]bool{}
			}
			seen[from][i] = true
			total++
		}
	}
	return seen, addrs
}

// TestSteerHash: with the kernel's default steering every datagram of a
// flow (a client address) reaches the same worker socket, and the flows
// spread over more than one.
func TestSteerHash(t *testing.T) {
	group, err := ListenReusePort(netip.MustParseAddrPort("127.0.0.1:0"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(group)
	if err := Steer(group, SteerHash, nil); err != nil {
		t.Fatal(err)
	}
	seen, _ := reusePortSpread(t, group, 32, 5, func(int) int { return -1 })
	used := map[int]bool{}
	for from, socks := range seen {
		if len(socks) != 1 {
			t.Errorf("flow %v reached sockets %v, want one", from, socks)
		}
		for s := range socks {
			used[s] = true
		}
	}
	if len(used) != 2 {
		t.Errorf("32 flows used sockets %v, want both", used)
	}
}

// TestSteerCPU: with the CPU program, datagrams sent from a thread on CPU
// c reach the socket whose worker is on c (loopback processes a datagram
// on the sender's CPU), whatever the flow.
func TestSteerCPU(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Fatal("TestSteerCPU needs 2 CPUs")
	}
	group, err := ListenReusePort(netip.MustParseAddrPort("127.0.0.1:0"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(group)
	// Socket 0's worker on CPU 1, socket 1's on CPU 0: the mapping, not
	// the identity, is what steers.
	if err := Steer(group, SteerCPU, []int{1, 0}); err != nil {
		t.Fatal(err)
	}
	seen, addrs := reusePortSpread(t, group, 16, 5, func(i int) int { return i % 2 })
	for i, a := range addrs {
		want := 1 - i%2 // sent from CPU i%2, whose worker has socket 1-i%2
		if socks := seen[a]; len(socks) != 1 || !socks[want] {
			t.Errorf("flow %d (from CPU %d) reached sockets %v, want only %d", i, i%2, socks, want)
		}
	}
}

// TestSteerIncomingCPU: the option is set on every socket of the group.
func TestSteerIncomingCPU(t *testing.T) {
	group, err := ListenReusePort(netip.MustParseAddrPort("127.0.0.1:0"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(group)
	if err := Steer(group, SteerIncomingCPU, nil); err != nil {
		t.Fatal(err)
	}
	for i, c := range group {
		rc, _ := c.SyscallConn()
		var v int
		_ = rc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_INCOMING_CPU) })
		if v != i {
			t.Errorf("socket %d: SO_INCOMING_CPU %d", i, v)
		}
	}
}

func TestParseSteering(t *testing.T) {
	for _, s := range []Steering{SteerHash, SteerCPU, SteerIncomingCPU} {
		if got, err := ParseSteering(s.String()); err != nil || got != s {
			t.Errorf("ParseSteering(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseSteering("random"); err == nil {
		t.Error("unknown steering accepted")
	}
}

func closeAll(cs []*net.UDPConn) {
	for _, c := range cs {
		c.Close()
	}
}
