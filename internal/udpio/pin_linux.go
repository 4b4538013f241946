package udpio

import (
	"fmt"
	"net"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/rtcedge/rtcedge/internal/fastpath"
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
		// The program lives with the project's other kernel programs.
		return fastpath.AttachReuseport(conns[0], fastpath.CPUSteering(len(conns), cpuOf))
	}
	return fmt.Errorf("unknown steering %v", s)
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
