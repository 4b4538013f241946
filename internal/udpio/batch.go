package udpio

import (
	"errors"
	"net"
	"net/netip"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// Msg is one datagram of a batch.
type Msg struct {
	// Buf is, for ReadBatch, the buffer the datagram is read into (its
	// whole length is offered) and, for WriteBatch, the datagram.
	Buf []byte
	// N is the length ReadBatch read into Buf; a datagram longer than Buf
	// is truncated to len(Buf), so offer one byte more than the longest
	// datagram you accept and drop those of that length.
	N int
	// Addr is the source ReadBatch saw (unmapped: IPv4-mapped IPv6 is
	// IPv4) or the destination WriteBatch sends to.
	Addr netip.AddrPort
}

// BatchConn reads and writes batches of datagrams on one UDP socket: on
// Linux with recvmmsg/sendmmsg, with every message header, iovec and
// address preallocated, so a batch is one system call and allocates
// nothing; elsewhere (or when the socket gives no raw access) one datagram
// per call, still without allocating. On a non-blocking socket (every
// *net.UDPConn) the calls are raw system calls that the scheduler does not
// see: they never wait, and a call it saw would wake sysmon after every
// idle spell (mmsg.rawRead). ReadBatch and WriteBatch may run
// concurrently with each other, but neither with itself.
type BatchConn struct {
	conn *net.UDPConn
	size int
	mm   *mmsg // nil: the plain fallback
}

// NewBatchConn returns a BatchConn over c moving up to size datagrams per
// call. c stays the caller's to close; closing it ends blocked calls with
// an error that matches net.ErrClosed.
func NewBatchConn(c *net.UDPConn, size int) *BatchConn {
	size = max(size, 1)
	b := &BatchConn{conn: c, size: size}
	if mm, ok := newMmsg(c, size); ok {
		b.mm = mm
	}
	return b
}

// Size is the most datagrams one call moves.
func (b *BatchConn) Size() int { return b.size }

// Batched reports whether batch system calls are in use (false: the
// one-datagram-per-call fallback).
func (b *BatchConn) Batched() bool { return b.mm != nil }

// ReadBatch blocks until at least one datagram is there and reads up to
// min(len(ms), Size()) of them, filling Buf, N and Addr of ms[:n].
func (b *BatchConn) ReadBatch(ms []Msg) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	if b.mm != nil {
		return b.mm.read(ms)
	}
	n, from, err := b.conn.ReadFromUDPAddrPort(ms[0].Buf)
	if err != nil {
		return 0, err
	}
	ms[0].N, ms[0].Addr = n, unmap(from)
	return 1, nil
}

// ReadLoop reads batches into ms, as ReadBatch does, and calls handle with
// the number read, until handle returns false (ReadLoop then returns nil)
// or a read fails (a closed socket: an error matching net.ErrClosed). On
// Linux it makes one recvmmsg per wake-up where ReadBatch in a loop makes
// two (the second returning EAGAIN). handle runs on the reading goroutine
// and must be done with ms before it returns.
func (b *BatchConn) ReadLoop(ms []Msg, handle func(n int) bool) error {
	if len(ms) == 0 {
		return errors.New("udpio: ReadLoop needs at least one message")
	}
	if b.mm != nil && !b.mm.blocking {
		return b.mm.readLoop(ms, handle)
	}
	for {
		n, err := b.ReadBatch(ms)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if !handle(n) {
			return nil
		}
	}
}

// WriteBatch sends up to min(len(ms), Size()) datagrams and returns how
// many were sent. A datagram the kernel refuses ends the call with an
// error; n datagrams before it were sent, and the caller decides whether
// to skip it and go on.
func (b *BatchConn) WriteBatch(ms []Msg) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	if b.mm != nil {
		return b.mm.write(ms)
	}
	if _, err := b.conn.WriteToUDPAddrPort(ms[0].Buf, ms[0].Addr); err != nil {
		return 0, err
	}
	return 1, nil
}

// ForwardBatch is Forward with batched system calls: it reads up to batch
// datagrams per recvmmsg and sends the results with one sendmmsg. Under
// load this cuts the per-datagram syscall cost; when datagrams trickle in,
// batches are of one and it behaves like Forward. Message headers and
// addresses are preallocated: no allocation per datagram. With
// hooks.Unbundle it splits the bundles it reads, with hooks.Bundle it
// bundles what it sends (docs/bundle.md). Semantics otherwise match
// Forward.
func ForwardBatch(conn, dst *net.UDPConn, headroom, limit, batch int, decide Decide, hooks Hooks) error {
	batch = max(batch, 1)
	if hooks.Unbundle && headroom != 0 {
		return errors.New("udpio: unbundling needs headroom 0")
	}
	// Every item of every bundle of a batch may yield a datagram.
	outs := batch
	if hooks.Unbundle {
		outs = batch * encap.MaxBundleItems
	}
	rd, wr := NewBatchConn(conn, batch), NewBatchConn(dst, min(outs, maxWriteBatch))
	if hooks.BlockingReads && rd.mm != nil {
		if err := rd.mm.makeBlocking(); err != nil {
			return err
		}
	}
	bufs := make([][]byte, batch)
	in := make([]Msg, batch)
	out := make([]Msg, outs)
	for i := range batch {
		bufs[i] = make([]byte, headroom+limit+1)
		in[i].Buf = bufs[i][headroom:]
	}
	var bd *bundler
	if hooks.Bundle {
		bd = newBundler(outs)
	}
	err := rd.ReadLoop(in, func(n int) bool {
		k := 0
		for i := range n {
			if in[i].N > limit {
				hooks.oversize()
				continue
			}
			if hooks.Unbundle && encap.IsBundle(in[i].Buf[:in[i].N]) {
				k = unbundle(in[i].Buf[:in[i].N], in[i].Addr, decide, out, k, hooks)
				continue
			}
			pkt, to, ok := decide(bufs[i], in[i].N, in[i].Addr)
			if !ok {
				continue
			}
			out[k].Buf, out[k].Addr = pkt, to
			k++
		}
		send := out[:k]
		if bd != nil && k > 1 {
			var bundles, items int
			send, bundles, items = bd.pack(send)
			if bundles > 0 && hooks.Bundled != nil {
				hooks.Bundled(bundles, items)
			}
		}
		return writeAll(wr, send, hooks) == nil // nil: dst is open
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// maxWriteBatch is the most datagrams one sendmmsg takes (UIO_MAXIOV).
const maxWriteBatch = 1024

// unbundle decides every item of a bundle into out[k:] and returns the new
// k. A malformed bundle is dropped whole.
func unbundle(b []byte, from netip.AddrPort, decide Decide, out []Msg, k int, hooks Hooks) int {
	if _, err := encap.CheckBundle(b); err != nil {
		hooks.badBundle()
		return k
	}
	for off := encap.BundleHeaderLen; off < len(b); {
		var item []byte
		item, off = encap.NextItem(b, off)
		pkt, to, ok := decide(item, len(item), from)
		if !ok {
			continue
		}
		out[k].Buf, out[k].Addr = pkt, to
		k++
	}
	return k
}

// writeAll sends ms, skipping a datagram the kernel refuses (one bad peer
// must not stall the rest). It returns an error only when dst is closed.
func writeAll(wr *BatchConn, ms []Msg, hooks Hooks) error {
	for sent := 0; sent < len(ms); {
		m, err := wr.WriteBatch(ms[sent:])
		sent += m
		if err != nil {
			hooks.writeErr(err)
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			sent++
		}
	}
	return nil
}
