// Package fptest runs the fast path's kernel programs on byte-exact
// frames for tests (BPF_PROG_TEST_RUN): a network namespace of the test's
// own with a veth pair to route through, frame builders and a
// parser that checks every checksum. Only tests import it.
package fptest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// TC verdicts the programs return.
const (
	// Pass is TCX_NEXT: the datagram goes on, unchanged, to user space.
	Pass = -1
	// Redirect is TC_ACT_REDIRECT: the program forwarded the datagram.
	Redirect = 7
)

// MAC is fp0's address, the source of every frame the
// programs send.
var MAC = [6]byte{0x02, 0, 0, 0, 0, 1}

// Net is a network namespace with one veth pair, "fp0" and "fp1", through
// which every IPv4 destination routes, and a permanent neighbour entry
// for every address Neigh was given.
type Net struct {
	t       testing.TB
	name    string
	ns      *os.File
	ifindex int
	calls   chan func() // run on a thread inside the namespace
	done    chan struct{}
}

// Require skips the test with a message saying what is missing when the
// process cannot load BPF programs or make namespaces; anything else is a
// failure.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("fast path tests need root (CAP_BPF, CAP_NET_ADMIN): run them as root")
	}
	for _, tool := range []string{"ip", "ethtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("fast path tests need %s: apt-get install iproute2 ethtool", tool)
		}
	}
}

// NewNet makes the namespace; it is removed when the test ends.
func NewNet(t testing.TB) *Net {
	t.Helper()
	Require(t)
	n := bareNet(t)
	n.ip("-n", n.name, "link", "add", "fp0", "address", "02:00:00:00:00:01", "type", "veth", "peer", "name", "fp1")
	n.ip("-n", n.name, "link", "set", "fp1", "up")
	n.ip("-n", n.name, "link", "set", "fp0", "up")
	n.ip("-n", n.name, "route", "add", "default", "dev", "fp0")
	// The programs route with bpf_fib_lookup, which wants forwarding on
	// the interface (docs/fastpath.md).
	n.ip("netns", "exec", n.name, "sysctl", "-qw", "net.ipv4.conf.fp0.forwarding=1")
	n.start(t, "fp0")
	return n
}

// serve runs calls on a thread inside the namespace until calls closes.
// The thread stays locked, so it ends with the goroutine rather than
// going back to the pool inside the namespace.
func (n *Net) serve(entered chan<- error) {
	defer close(n.done)
	runtime.LockOSThread()
	if err := unix.Setns(int(n.ns.Fd()), unix.CLONE_NEWNET); err != nil {
		entered <- fmt.Errorf("setns: %w", err)
		return
	}
	entered <- nil
	for f := range n.calls {
		f()
	}
}

// ifindex reads dev's index inside the namespace name.
func ifindex(name, dev string) (int, error) {
	out, err := exec.Command("ip", "-n", name, "-o", "link", "show", dev).Output()
	if err != nil {
		return 0, fmt.Errorf("ip link show %s: %w", dev, err)
	}
	var i int
	if _, err := fmt.Sscanf(string(out), "%d:", &i); err != nil {
		return 0, fmt.Errorf("ifindex of %s in %q: %w", dev, out, err)
	}
	return i, nil
}

func (n *Net) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Neigh adds a permanent neighbour entry for a, with the MAC NeighMAC(a).
func (n *Net) Neigh(a netip.Addr) {
	m := NeighMAC(a)
	n.ip("-n", n.name, "neigh", "replace", a.String(), "lladdr",
		fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]), "dev", "fp0", "nud", "permanent")
}

// NeighMAC is the MAC Neigh gives an address: 02 00 and its IPv4 bytes.
func NeighMAC(a netip.Addr) [6]byte {
	b := a.As4()
	return [6]byte{0x02, 0, b[0], b[1], b[2], b[3]}
}

// MTU sets fp0's MTU.
func (n *Net) MTU(mtu int) { n.ip("-n", n.name, "link", "set", "fp0", "mtu", fmt.Sprint(mtu)) }

// Run runs prog on frame as if it had arrived on fp0, inside the
// namespace, and returns the verdict and the frame as the program left it.
// Failures go to t (a fuzz target's own T).
func (n *Net) Run(t testing.TB, prog *ebpf.Program, frame []byte) (int, []byte) {
	t.Helper()
	var ctx [48]byte                                           // struct __sk_buff up to ifindex
	binary.NativeEndian.PutUint32(ctx[36:], uint32(n.ifindex)) // ingress_ifindex
	binary.NativeEndian.PutUint32(ctx[40:], uint32(n.ifindex)) // ifindex
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out, Context: ctx[:]}
	var ret uint32
	err := n.in(func() error {
		var err error
		ret, err = prog.Run(opts)
		return err
	})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return int(int32(ret)), opts.DataOut
}

// in runs f on the namespace's thread.
func (n *Net) in(f func() error) error {
	var err error
	ran := make(chan struct{})
	n.calls <- func() { err = f(); close(ran) }
	<-ran
	return err
}

// Frame builds an Ethernet/IPv4/UDP frame from src to dst carrying
// payload, with valid checksums.
func Frame(src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 14+20+8+len(payload))
	copy(b[0:6], MAC[:])
	copy(b[6:12], []byte{0x02, 0, 0, 0, 0, 0xee})
	binary.BigEndian.PutUint16(b[12:14], 0x0800)
	ip := b[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+8+len(payload)))
	binary.BigEndian.PutUint16(ip[6:8], 0x4000) // DF
	ip[8] = 64
	ip[9] = 17
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:12], ^fold(sum(ip, 0)))
	udp := b[34:]
	binary.BigEndian.PutUint16(udp[0:2], src.Port())
	binary.BigEndian.PutUint16(udp[2:4], dst.Port())
	binary.BigEndian.PutUint16(udp[4:6], uint16(8+len(payload)))
	copy(udp[8:], payload)
	c := ^fold(sum(udp, pseudo(ip, len(udp))))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:8], c)
	return b
}

// Datagram is a frame read back: its Ethernet addresses, the UDP
// datagram's addresses and payload.
type Datagram struct {
	DstMAC, SrcMAC [6]byte
	Src, Dst       netip.AddrPort
	TTL            uint8
	Payload        []byte
}

// ErrChecksum means a frame's IP or UDP checksum is wrong.
var ErrChecksum = errors.New("fptest: bad checksum")

// Parse reads a frame Frame built or a program rewrote, checking its
// lengths and both checksums (a UDP checksum of 0 means none).
func Parse(b []byte) (Datagram, error) {
	var d Datagram
	if len(b) < 42 || binary.BigEndian.Uint16(b[12:14]) != 0x0800 || b[14] != 0x45 {
		return d, fmt.Errorf("fptest: not an IPv4 frame without options: % x", b[:min(len(b), 42)])
	}
	ip := b[14:34]
	if int(binary.BigEndian.Uint16(ip[2:4])) != len(b)-14 {
		return d, fmt.Errorf("fptest: IP length %d, frame %d", binary.BigEndian.Uint16(ip[2:4]), len(b)-14)
	}
	if fold(sum(ip, 0)) != 0xffff {
		return d, fmt.Errorf("%w: IP", ErrChecksum)
	}
	udp := b[34:]
	if int(binary.BigEndian.Uint16(udp[4:6])) != len(udp) {
		return d, fmt.Errorf("fptest: UDP length %d, datagram %d", binary.BigEndian.Uint16(udp[4:6]), len(udp))
	}
	if binary.BigEndian.Uint16(udp[6:8]) != 0 && fold(sum(udp, pseudo(ip, len(udp)))) != 0xffff {
		return d, fmt.Errorf("%w: UDP", ErrChecksum)
	}
	copy(d.DstMAC[:], b[0:6])
	copy(d.SrcMAC[:], b[6:12])
	d.TTL = ip[8]
	d.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(udp[0:2]))
	d.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(udp[2:4]))
	d.Payload = udp[8:]
	return d, nil
}

// pseudo is the sum of the UDP pseudo-header.
func pseudo(ip []byte, udpLen int) uint32 {
	s := sum(ip[12:20], 0)
	return s + 17 + uint32(udpLen)
}

func sum(b []byte, s uint32) uint32 {
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
