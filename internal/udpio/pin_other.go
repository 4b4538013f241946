//go:build !linux

package udpio

import (
	"errors"
	"net"
	"runtime"
)

// LockThread locks the calling goroutine to its OS thread; CPU affinity is
// Linux only and cpu is ignored here.
func LockThread(cpu int) error {
	runtime.LockOSThread()
	return nil
}

// Steer supports only SteerHash (the kernel default) off Linux.
func Steer(conns []*net.UDPConn, s Steering, cpus []int) error {
	if s == SteerHash {
		return nil
	}
	return errors.New("udpio: reuseport steering other than hash needs Linux")
}

// ReusePort is false off Linux: no reuseport steering there.
func ReusePort(*net.UDPConn) bool { return false }
