package fastpath

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// Interface is where a relay's programs attach: the interface that holds
// the relay's address.
type Interface struct {
	Index    int
	Name     string
	Loopback bool
}

// InterfaceOf finds the interface holding a.
func InterfaceOf(a netip.Addr) (Interface, error) {
	a = a.Unmap()
	if !a.Is4() || a.IsUnspecified() {
		return Interface{}, fmt.Errorf("%w: %v is not a specific IPv4 address", ErrUnavailable, a)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return Interface{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			if n, ok := ad.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
					return Interface{Index: ifi.Index, Name: ifi.Name, Loopback: ifi.Flags&net.FlagLoopback != 0}, nil
				}
			}
		}
	}
	return Interface{}, fmt.Errorf("%w: no interface holds %v", ErrUnavailable, a)
}

// CheckForwarding fails with ErrUnavailable, naming the setting, unless
// IPv4 forwarding is on for the interface: the programs route with
// bpf_fib_lookup, which forwards only from such an interface
// (net.ipv4.conf.NAME.forwarding = 1).
func (i Interface) CheckForwarding() error {
	b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + i.Name + "/forwarding")
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		return fmt.Errorf("%w: IPv4 forwarding is off on %s (sysctl net.ipv4.conf.%s.forwarding=1)", ErrUnavailable, i.Name, i.Name)
	}
	return nil
}
