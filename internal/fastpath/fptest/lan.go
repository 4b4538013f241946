package fptest

// One Ethernet segment of network namespaces, for tests that run whole
// processes on hosts of their own.

import (
	"fmt"
	"net/netip"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// LAN is one Ethernet segment: a bridge in a namespace of its own and any
// number of hosts, each a namespace joined to the bridge by a veth pair
// ("eth0" on the host's side), all in 10.78.0.0/24. Every host sends
// checksummed datagrams (transmit checksum offload off, as from a NIC;
// docs/fastpath.md) and has IPv4 forwarding on its eth0, so a relay on
// any host can attach the fast path. Hosts reach each other through the
// bridge, never through a shared stack: a relay's next hop is another
// host on its own interface, as in a data centre.
type LAN struct {
	sw    *Net
	hosts int
}

// NewLAN makes the bridge; it and every host are removed when the test
// ends.
func NewLAN(t testing.TB) *LAN {
	t.Helper()
	Require(t)
	l := &LAN{sw: bareNet(t)}
	l.sw.ip("-n", l.sw.name, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
	l.sw.ip("-n", l.sw.name, "link", "set", "br0", "up")
	return l
}

// Host adds a host holding addrs (each a /24 of 10.78.0.0/24) on its eth0.
func (l *LAN) Host(t testing.TB, addrs ...netip.Addr) *Net {
	t.Helper()
	l.hosts++
	h := bareNet(t)
	port := fmt.Sprintf("p%d", l.hosts)
	h.ip("link", "add", port, "netns", l.sw.name, "type", "veth", "peer", "name", "eth0", "netns", h.name)
	h.ip("-n", l.sw.name, "link", "set", port, "master", "br0")
	h.ip("-n", l.sw.name, "link", "set", port, "up")
	for _, a := range addrs {
		h.ip("-n", h.name, "addr", "add", a.String()+"/24", "dev", "eth0")
	}
	h.ip("-n", h.name, "link", "set", "lo", "up")
	h.ip("-n", h.name, "link", "set", "eth0", "up")
	h.ip("netns", "exec", h.name, "sysctl", "-qw", "net.ipv4.conf.eth0.forwarding=1")
	if out, err := exec.Command("ip", "netns", "exec", h.name, "ethtool", "-K", "eth0", "tx", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K eth0 tx off: %v: %s", err, out)
	}
	h.start(t, "eth0")
	return h
}

// LANAddr is host i's address on a LAN: 10.78.0.i.
func LANAddr(i byte) netip.Addr { return netip.AddrFrom4([4]byte{10, 78, 0, i}) }

// Name is the namespace's name, for `ip netns exec`.
func (n *Net) Name() string { return n.name }

// Exec is the command line that runs argv inside the namespace.
func (n *Net) Exec(argv ...string) []string {
	return append([]string{"netns", "exec", n.name}, argv...)
}

// Spoof sends payload from src to dst out of the namespace with a forged
// source address (a raw IP socket), as an attacker who can spoof does.
func (n *Net) Spoof(src, dst netip.AddrPort, payload []byte) error {
	pkt := Frame(src, dst, payload)[14:]
	return n.in(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
			return fmt.Errorf("spoof %v → %v: %w", src, dst, err)
		}
		return nil
	})
}
