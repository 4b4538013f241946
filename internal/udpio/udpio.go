// Package udpio holds the small pieces of UDP plumbing the relays share:
// the read-decide-write loop and its buffers.
package udpio

import (
	"errors"
	"net"
	"net/netip"
)

// MaxDatagram is the receive buffer size. WebRTC keeps datagrams below the
// path MTU; anything that fills the buffer is truncated and so discarded.
const MaxDatagram = 2048

// Decide inspects one datagram and returns where to send which bytes, or
// ok=false to drop it. out may be a subslice of buf (the usual case) and is
// written before the next read, so Decide must not retain buf.
type Decide func(buf []byte, n int, from netip.AddrPort) (out []byte, to netip.AddrPort, ok bool)

// Forward reads conn until it is closed, passing every datagram to decide
// and writing what it returns to dst (which may be conn itself). headroom
// bytes are left free in front of every datagram so that a decider can
// prepend a header without copying: the datagram is buf[headroom:headroom+n].
// A closed conn ends the loop with nil; a write error is reported to
// onWriteErr and the loop goes on, as one unreachable peer must not stop a
// relay.
func Forward(conn, dst *net.UDPConn, headroom int, decide Decide, onWriteErr func(error)) error {
	buf := make([]byte, headroom+MaxDatagram)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf[headroom:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		out, to, ok := decide(buf, n, from)
		if !ok {
			continue
		}
		if _, err := dst.WriteToUDPAddrPort(out, to); err != nil && onWriteErr != nil {
			onWriteErr(err)
		}
	}
}
