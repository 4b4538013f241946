//go:build !linux

package udpio

import "net"

// mmsg is never made here (newMmsg says so); blocking only keeps the
// shared code compiling.
type mmsg struct{ blocking bool }

// newMmsg reports that batch system calls are not available here: the
// BatchConn then moves one datagram per call.
func newMmsg(*net.UDPConn, int) (*mmsg, bool) { return nil, false }

func (*mmsg) read([]Msg) (int, error)                { panic("unreachable") }
func (*mmsg) readLoop([]Msg, func(n int) bool) error { panic("unreachable") }
func (*mmsg) write([]Msg) (int, error)               { panic("unreachable") }

func (*mmsg) makeBlocking() error { return nil }
