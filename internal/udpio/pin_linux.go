package udpio

import (
	"fmt"
	"net"
	"runtime"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// LockThread locks the calling goroutine to its OS thread and, when cpu >=
// 0, pins that thread to the CPU. Call it first in a goroutine that runs
// one read loop to its end and never unlock: a goroutine that exits locked
// takes its thread with it, so the narrowed CPU mask never reaches other
// goroutines. A failed pin leaves the goroutine locked but unpinned.
func LockThread(cpu int) error {
	runtime.LockOSThread()
	if cpu < 0 {
		return nil
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin read loop to CPU %d: %w", cpu, err)
	}
	return nil
}

// Steer applies a steering to a SO_REUSEPORT group as ListenReusePort
// opened it: conns[i] is the group's socket i (sockets join in bind
// order). cpus[i], when given, is the CPU of socket i's worker; by default
// socket i is CPU i.
func Steer(conns []*net.UDPConn, s Steering, cpus []int) error {
	cpuOf := func(i int) int {
		if i < len(cpus) {
			return cpus[i]
		}
		return i
	}
	switch s {
	case SteerHash:
		return nil
	case SteerIncomingCPU:
		for i, c := range conns {
			if err := setsockopt(c, unix.SO_INCOMING_CPU, cpuOf(i)); err != nil {
				return fmt.Errorf("SO_INCOMING_CPU on reuseport socket %d: %w", i, err)
			}
		}
		return nil
	case SteerCPU:
		return AttachReuseportProgram(conns[0], cpuProgram(len(conns), cpuOf))
	}
	return fmt.Errorf("unknown steering %v", s)
}

// cpuProgram returns a classic BPF program mapping the processing CPU to
// the index of the socket whose worker runs on it; CPUs with no worker
// fall back to the CPU number mod the group size n.
func cpuProgram(n int, cpuOf func(int) int) []bpf.Instruction {
	ins := []bpf.Instruction{bpf.LoadExtension{Num: bpf.ExtCPUID}}
	for i := range n {
		// if A == cpu(i) return i
		ins = append(ins, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(cpuOf(i)), SkipTrue: 1}, bpf.RetConstant{Val: uint32(i)})
	}
	return append(ins, bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)}, bpf.RetA{})
}

// AttachReuseportProgram attaches a classic BPF program to c's SO_REUSEPORT
// group (SO_ATTACH_REUSEPORT_CBPF): for each datagram the kernel runs it on
// the UDP payload and hands the datagram to the group's socket with the
// index it returns (sockets are numbered in the order they joined); an
// index out of range falls back to the kernel's hash.
func AttachReuseportProgram(c *net.UDPConn, ins []bpf.Instruction) error {
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

// ReusePort reports whether c was bound with SO_REUSEPORT.
func ReusePort(c *net.UDPConn) bool {
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

func setsockopt(c *net.UDPConn, opt, v int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, v) }); err != nil {
		return err
	}
	return serr
}
