package udpio

import (
	"errors"
	"net"
	"net/netip"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// batchConn is what x/net's ipv4 and ipv6 PacketConns share: recvmmsg and
// sendmmsg on Linux, one datagram per call elsewhere.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

func newBatchConn(c *net.UDPConn) batchConn {
	if ap := LocalAddrPort(c); ap.Addr().Is4() {
		return ipv4.NewPacketConn(c)
	}
	return ipv6.NewPacketConn(c)
}

// ForwardBatch is Forward with batched system calls: it reads up to batch
// datagrams per recvmmsg and sends the results with one sendmmsg. Under
// load this cuts the per-datagram syscall cost; when datagrams trickle in,
// batches are of one and it behaves like Forward. x/net allocates the
// source address of every datagram read (two small allocations), which is
// the price of the fewer syscalls. Semantics otherwise match Forward.
func ForwardBatch(conn, dst *net.UDPConn, headroom, limit, batch int, decide Decide, hooks Hooks) error {
	if batch < 1 {
		batch = 1
	}
	rd, wr := newBatchConn(conn), newBatchConn(dst)
	bufs := make([][]byte, batch)
	in := make([]ipv4.Message, batch)
	out := make([]ipv4.Message, batch)
	outAddrs := make([]net.UDPAddr, batch)
	for i := range batch {
		bufs[i] = make([]byte, headroom+limit+1)
		in[i].Buffers = [][]byte{bufs[i][headroom:]}
		out[i].Buffers = make([][]byte, 1)
		outAddrs[i].IP = make(net.IP, net.IPv6len)
		out[i].Addr = &outAddrs[i]
	}
	for {
		n, err := rd.ReadBatch(in, 0)
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
		k := 0
		for i := range n {
			ua, ok := in[i].Addr.(*net.UDPAddr)
			if !ok {
				continue
			}
			if in[i].N > limit {
				hooks.oversize()
				continue
			}
			pkt, to, ok := decide(bufs[i], in[i].N, unmap(ua.AddrPort()))
			if !ok {
				continue
			}
			out[k].Buffers[0] = pkt
			setUDPAddr(&outAddrs[k], to)
			k++
		}
		for sent := 0; sent < k; {
			m, err := wr.WriteBatch(out[sent:k], 0)
			if err != nil {
				hooks.writeErr(err)
				if errors.Is(err, net.ErrClosed) {
					return nil
				}
				sent++ // skip the datagram that failed; one bad peer must not stall the rest
				continue
			}
			sent += m
		}
	}
}

// setUDPAddr fills a preallocated UDPAddr without allocating.
func setUDPAddr(ua *net.UDPAddr, ap netip.AddrPort) {
	a := ap.Addr()
	if a.Is4() {
		b := a.As4()
		ua.IP = ua.IP[:net.IPv4len]
		copy(ua.IP, b[:])
	} else {
		b := a.As16()
		ua.IP = ua.IP[:net.IPv6len]
		copy(ua.IP, b[:])
	}
	ua.Port = int(ap.Port())
	ua.Zone = ""
}
