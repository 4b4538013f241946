package fastpath

// Attaching the classic-BPF socket programs (socket.go).

import (
	"fmt"
	"net"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// AttachReuseport attaches a classic BPF program to c's SO_REUSEPORT group
// (SO_ATTACH_REUSEPORT_CBPF): for each datagram the kernel runs it on the
// UDP payload and hands the datagram to the group's socket with the index
// it returns (sockets are numbered in the order they joined); an index out
// of range falls back to the kernel's hash.
func AttachReuseport(c *net.UDPConn, ins []bpf.Instruction) error {
	raw, err := bpf.Assemble(ins)
	if err != nil {
		return fmt.Errorf("assemble reuseport program: %w", err)
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, prog)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("attach reuseport CBPF program: %w", serr)
	}
	return nil
}
