//go:build linux

package transceiver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// readerConns returns n conns that together read the pod socket's port, the
// socket itself first; the caller closes the others.
//
// A socket bound with SO_REUSEPORT (the pod's own, NewNode) gets n-1
// siblings on its address and a classic BPF program that hands each
// datagram to socket (client port mod n), the port read from the
// encapsulation header: every datagram wakes one reader, a client's
// datagrams stay on one reader and in order, and a pod's few cluster relay
// peers no longer decide the spread (the kernel's own reuseport hash is by
// the relay's address and port). Any other socket (one a test or an
// embedding program passed in) gets duplicates of its descriptor instead,
// which share its queue but wake every reader for each datagram.
func readerConns(c *net.UDPConn, n int) ([]*net.UDPConn, error) {
	conns := []*net.UDPConn{c}
	if n <= 1 {
		return conns, nil
	}
	open := dupUDP
	shared := reusePort(c)
	if shared {
		open = listenSibling
	}
	for range n - 1 {
		sib, err := open(c)
		if err != nil {
			closeConns(conns[1:])
			return nil, fmt.Errorf("pod socket reader: %w", err)
		}
		_ = sib.SetReadBuffer(podReadBuffer)
		conns = append(conns, sib)
	}
	if shared {
		if err := steerByClient(c, n); err != nil {
			closeConns(conns[1:])
			return nil, err
		}
	}
	return conns, nil
}

func closeConns(cs []*net.UDPConn) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// reusePort reports whether c was bound with SO_REUSEPORT.
func reusePort(c *net.UDPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	v := 0
	if rc.Control(func(fd uintptr) { v, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT) }) != nil || err != nil {
		return false
	}
	return v == 1
}

// listenSibling opens another SO_REUSEPORT socket on c's address.
func listenSibling(c *net.UDPConn) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) }); err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), c.LocalAddr().Network(), c.LocalAddr().String())
	if err != nil {
		return nil, err
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		_ = pc.Close()
		return nil, errors.New("sibling is not a UDP conn")
	}
	return uc, nil
}

// steerByClient attaches the program that picks socket (client port mod n)
// of c's reuseport group (see readerConns). A datagram too short to hold a
// port goes to socket 0, where the reader drops it.
func steerByClient(c *net.UDPConn, n int) error {
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: encap.ClientPortOffset, Size: 2},
		bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)},
		bpf.RetA{},
	})
	if err != nil {
		return fmt.Errorf("assemble pod steering program: %w", err)
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &prog)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("attach pod steering program: %w", serr)
	}
	return nil
}
