package node

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"

	"github.com/rtcedge/rtcedge/internal/udpio"
)

// Listen opens a TCP listener on addr; "" returns nil (not wanted).
func Listen(what, addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return ln, nil
}

// DataSocket returns a role's data-plane UDP socket — conn when given,
// else one opened on bind — and the address others should send to:
// advertise when set, else the bound address. A wildcard result is
// refused: gossiped to others, "0.0.0.0" would send their datagrams to
// themselves. On error conn (given or opened) is closed.
func DataSocket(conn *net.UDPConn, bind, advertise string, log *slog.Logger) (*net.UDPConn, netip.AddrPort, error) {
	if conn == nil {
		b, err := netip.ParseAddrPort(bind)
		if err != nil {
			return nil, netip.AddrPort{}, fmt.Errorf("data_addr %q: %w", bind, err)
		}
		if conn, err = udpio.Listen(b); err != nil {
			return nil, netip.AddrPort{}, err
		}
	}
	data, err := Advertised("data", udpio.LocalAddrPort(conn), advertise)
	if err != nil {
		conn.Close()
		return nil, netip.AddrPort{}, err
	}
	WarnSmallBuffer(log, conn)
	return conn, data, nil
}

// bufferCapped reports the receive buffer the kernel granted c and
// whether it is below udpio.SocketBuffer.
func bufferCapped(c *net.UDPConn) (int, bool) {
	if runtime.GOOS != "linux" {
		return 0, false // only Linux reports the buffer it granted so
	}
	got := udpio.ReceiveBuffer(c) / 2
	return got, got > 0 && got < udpio.SocketBuffer
}

// WarnSmallBuffer logs a warning when the kernel gave c less receive
// buffer than udpio.SocketBuffer: net.core.rmem_max is below it on this
// node, and a reader's short stall (GC, scheduling) then loses datagrams
// instead of queueing them (docs/deploy.md). It reports whether it warned.
// Sockets on loopback (the dev world, tests) are not reported.
func WarnSmallBuffer(log *slog.Logger, c *net.UDPConn) bool {
	got, capped := bufferCapped(c)
	if !capped || udpio.LocalAddrPort(c).Addr().IsLoopback() {
		return false
	}
	log.Warn("UDP receive buffer capped by net.core.rmem_max: set it (and wmem_max) to at least 4 MiB on this node, or bursts are dropped",
		"granted_bytes", got, "wanted_bytes", udpio.SocketBuffer, "socket", udpio.LocalAddrPort(c))
	return true
}

// Advertised is advertise when set, else bound; a wildcard is refused. The
// result is unmapped (::ffff:a.b.c.d becomes a.b.c.d): packet sources are
// always unmapped, so a mapped advertised address would match none of them
// and every reply would be dropped.
func Advertised(what string, bound netip.AddrPort, advertise string) (netip.AddrPort, error) {
	ap := bound
	if advertise != "" {
		var err error
		if ap, err = netip.ParseAddrPort(advertise); err != nil {
			return netip.AddrPort{}, fmt.Errorf("%s_advertise %q: %w", what, advertise, err)
		}
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if ap.Addr().IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("%s address %v is not one others can reach: set %s_advertise (e.g. \"${POD_IP}:%d\")", what, ap, what, ap.Port())
	}
	return ap, nil
}

// AdvertisedURL is "http://" + advertise (host:port, a name allowed), or
// ln's address when advertise is empty; a wildcard address is refused.
func AdvertisedURL(ln net.Listener, advertise string) (string, error) {
	if advertise != "" {
		if _, err := netip.ParseAddrPort(advertise); err != nil {
			if err := CheckHostPort("api_advertise", advertise, false); err != nil {
				return "", err
			}
			return "http://" + advertise, nil
		}
	}
	ap, err := netip.ParseAddrPort(ln.Addr().String())
	if err != nil {
		return "", err
	}
	if ap, err = Advertised("api", ap, advertise); err != nil {
		return "", err
	}
	return "http://" + ap.String(), nil
}
