package netsim

import (
	"log/slog"
	"net"
	"time"
)

// NewTCPLinkWithHandshake is NewTCPLink for clients whose connection setup
// must cost what it costs over the distance, such as a browser opening an
// ICE-TCP connection to a POP: the handshake (SYN, SYN-ACK) takes one round
// trip before the client can send anything.
//
// A user-space link cannot delay the kernel's SYN-ACK: the client's connect
// returns at once. So the link charges the round trip to the bytes instead:
// after accepting, it waits up.Delay+down.Delay (no jitter) before it dials
// the target and starts reading the client, and every byte then takes its
// usual one-way delay. The first byte thus reaches the target one round
// trip plus one one-way delay after the client's connect, as it would after
// a real handshake; the target's accept comes one one-way delay early (as
// if the client's final ACK took no time), which only shifts when the
// target's handshake timeout starts.
func NewTCPLinkWithHandshake(ln net.Listener, target string, up, down LinkConfig, log *slog.Logger) (*TCPLink, error) {
	l, err := NewTCPLink(ln, target, up, down, log)
	if err != nil {
		return nil, err
	}
	l.handshake = up.Delay + down.Delay
	return l, nil
}

// holdHandshake waits until the emulated handshake of a connection
// accepted at accepted is over. It returns false if the link closed
// meanwhile.
func (l *TCPLink) holdHandshake(accepted time.Time) bool {
	wait := time.Until(accepted.Add(l.handshake))
	if l.handshake == 0 || wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}
