//go:build !linux

package udpio

import (
	"errors"
	"net"
	"net/netip"
)

// LoopSupported reports whether Loop works here (Linux only).
const LoopSupported = false

var errNoLoop = errors.New("udpio: the event loop needs Linux")

// RawConn is, off Linux, never made (Detach fails).
type RawConn struct{}

// Detach fails off Linux; c is left open.
func Detach(*net.UDPConn) (*RawConn, error) { return nil, errNoLoop }

func (*RawConn) LocalAddrPort() netip.AddrPort { return netip.AddrPort{} }

func (*RawConn) WriteToUDPAddrPort([]byte, netip.AddrPort) (int, error) { return 0, errNoLoop }

func (*RawConn) Close() error { return nil }

// Loop is, off Linux, never made (NewLoop fails).
type Loop struct{}

func NewLoop([]LoopPath) (*Loop, error) { return nil, errNoLoop }

func (*Loop) Run() error { return errNoLoop }

func (*Loop) Close() error { return nil }
