//go:build !linux

package fastpath

// The classic-BPF socket programs need Linux (socket_linux.go).

import (
	"errors"
	"net"

	"golang.org/x/net/bpf"
)

// AttachReuseport needs Linux.
func AttachReuseport(*net.UDPConn, []bpf.Instruction) error {
	return errors.New("fastpath: reuseport programs need Linux")
}
