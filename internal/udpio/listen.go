package udpio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// SocketBuffer is the receive and send buffer the relays ask for. A
// forwarder's reader stalls for a moment now and then (GC, scheduling); the
// kernel's default buffer (about 200 KiB) then overflows and drops silently.
// Best effort: the kernel caps it at net.core.rmem_max / wmem_max.
const SocketBuffer = 4 << 20

func setBuffers(c *net.UDPConn) {
	_ = c.SetReadBuffer(SocketBuffer)
	_ = c.SetWriteBuffer(SocketBuffer)
}

// ReceiveBuffer is the receive buffer c's socket has, as the kernel reports
// it (Linux reports twice what it granted, for its own bookkeeping), or 0
// when it cannot be read.
func ReceiveBuffer(c *net.UDPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var n int
	var serr error
	if err := rc.Control(func(fd uintptr) { n, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) }); err != nil || serr != nil {
		return 0
	}
	return n
}

// ListenReusePort opens n UDP sockets on the same address with SO_REUSEPORT,
// so the kernel spreads clients over them by 4-tuple hash: one reader per
// socket, one socket per core. With port 0 the first socket picks the port
// and the rest join it. On error every socket opened so far is closed.
func ListenReusePort(addr netip.AddrPort, n int) ([]*net.UDPConn, error) {
	if n < 1 {
		return nil, errors.New("udpio: need at least one socket")
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	conns := make([]*net.UDPConn, 0, n)
	for i := range n {
		pc, err := lc.ListenPacket(context.Background(), "udp", addr.String())
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("listen udp %s (reuseport socket %d): %w", addr, i, err)
		}
		c := pc.(*net.UDPConn)
		setBuffers(c)
		if i == 0 {
			addr = c.LocalAddr().(*net.UDPAddr).AddrPort()
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// Listen opens one UDP socket with SocketBuffer buffers.
func Listen(addr netip.AddrPort) (*net.UDPConn, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("listen udp %s: %w", addr, err)
	}
	setBuffers(c)
	return c, nil
}

// LocalAddrPort returns a UDP socket's local address, unmapped.
func LocalAddrPort(c *net.UDPConn) netip.AddrPort {
	ap := c.LocalAddr().(*net.UDPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// ListenWorkerPairs opens n SO_REUSEPORT sockets on public and, for each,
// a socket of its own on internal's IP: the public/internal pair a relay
// worker owns. With internal port 0 the kernel picks every internal port;
// otherwise worker i binds internal port + i, so a replica restarted on
// the same address gets the same ingress addresses back. On error every
// socket opened so far is closed.
func ListenWorkerPairs(public, internal netip.AddrPort, n int) (pubs, ins []*net.UDPConn, err error) {
	pubs, err = ListenReusePort(public, n)
	if err != nil {
		return nil, nil, err
	}
	for i := range pubs {
		port := internal.Port()
		if port != 0 {
			port += uint16(i)
		}
		in, err := Listen(netip.AddrPortFrom(internal.Addr(), port))
		if err != nil {
			for _, c := range append(pubs, ins...) {
				c.Close()
			}
			return nil, nil, err
		}
		ins = append(ins, in)
	}
	return pubs, ins, nil
}
