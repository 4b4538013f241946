package fptest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Pair is two network namespaces joined by a veth pair: A holds AddrA on
// "fpa", B holds AddrB on "fpb", in 10.77.0.0/24, with IPv4 forwarding on
// in B (where a relay's program attaches: IfindexB) and transmit checksum
// offload off in A.
type Pair struct {
	A, B         *Net
	AddrA, AddrB netip.Addr
	IfindexB     int
}

// NewPair makes the namespaces; they are removed when the test ends.
func NewPair(t testing.TB) *Pair { return NewPairOffload(t, false) }

// NewPairOffload is NewPair with A's transmit checksum offload left on
// when offload is true: A's datagrams then reach B still to be
// checksummed, as from a socket on the same host.
func NewPairOffload(t testing.TB, offload bool) *Pair {
	t.Helper()
	Require(t)
	p := &Pair{AddrA: netip.MustParseAddr("10.77.0.1"), AddrB: netip.MustParseAddr("10.77.0.2")}
	p.A, p.B = bareNet(t), bareNet(t)
	p.A.ip("link", "add", "fpa", "netns", p.A.name, "type", "veth", "peer", "name", "fpb", "netns", p.B.name)
	p.A.ip("-n", p.A.name, "addr", "add", "10.77.0.1/24", "dev", "fpa")
	p.A.ip("-n", p.B.name, "addr", "add", "10.77.0.2/24", "dev", "fpb")
	for _, n := range []*Net{p.A, p.B} {
		n.ip("-n", n.name, "link", "set", "lo", "up")
	}
	p.A.ip("-n", p.A.name, "link", "set", "fpa", "up")
	p.A.ip("-n", p.B.name, "link", "set", "fpb", "up")
	p.A.ip("netns", "exec", p.B.name, "sysctl", "-qw", "net.ipv4.conf.fpb.forwarding=1")
	// Datagrams reach the programs as from a NIC: checksummed in full. A
	// veth with checksum offload hands them over still to be checksummed
	// (CHECKSUM_PARTIAL), which the programs pass up (docs/fastpath.md).
	if offload {
		// left on
	} else if out, err := exec.Command("ip", "netns", "exec", p.A.name, "ethtool", "-K", "fpa", "tx", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K fpa tx off: %v: %s", err, out)
	}
	p.A.start(t, "fpa")
	p.B.start(t, "fpb")
	p.IfindexB = p.B.ifindex
	return p
}

// bareNet makes an empty namespace, named after the process, and first
// removes those left by processes that are gone (a fuzzing worker is
// stopped without running its cleanups).
func bareNet(t testing.TB) *Net {
	sweep()
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := &Net{t: t, name: fmt.Sprintf("%s%d-%s", prefix, os.Getpid(), hex.EncodeToString(b[:]))}
	n.ip("netns", "add", n.name)
	t.Cleanup(func() {
		if n.calls != nil {
			close(n.calls)
			<-n.done
		}
		if n.ns != nil {
			n.ns.Close()
		}
		_ = exec.Command("ip", "netns", "del", n.name).Run()
	})
	return n
}

// prefix starts every namespace's name; the creating process's ID follows.
const prefix = "rtcedge-fp-"

// sweep deletes the namespaces of processes that no longer run.
func sweep() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		pid, _, ok := strings.Cut(strings.TrimPrefix(e.Name(), prefix), "-")
		if !strings.HasPrefix(e.Name(), prefix) || !ok {
			continue
		}
		if id, err := strconv.Atoi(pid); err == nil && id > 0 && unix.Kill(id, 0) == unix.ESRCH {
			_ = exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
}

// start opens the namespace, finds dev's index and starts its thread.
func (n *Net) start(t testing.TB, dev string) {
	t.Helper()
	f, err := os.Open("/run/netns/" + n.name)
	if err != nil {
		t.Fatal(err)
	}
	n.ns = f
	if n.ifindex, err = ifindex(n.name, dev); err != nil {
		t.Fatal(err)
	}
	n.calls, n.done = make(chan func()), make(chan struct{})
	entered := make(chan error, 1)
	go n.serve(entered)
	if err := <-entered; err != nil {
		n.calls = nil
		t.Fatal(err)
	}
}

// ListenUDP opens a UDP socket inside the namespace; it is closed when
// the test ends.
func (n *Net) ListenUDP(a netip.AddrPort) *net.UDPConn {
	n.t.Helper()
	var c *net.UDPConn
	if err := n.in(func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
		return err
	}); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { c.Close() })
	return c
}

// In runs f on a thread inside the namespace (to create sockets or
// attach programs there).
func (n *Net) In(f func() error) error { return n.in(f) }
