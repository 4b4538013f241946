package udpio

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
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
	f, err := newBatchForwarder(func(size int) *BatchConn { return NewBatchConn(dst, size) }, headroom, limit, batch, decide, hooks)
	if err != nil {
		return err
	}
	rd := NewBatchConn(conn, len(f.in))
	if hooks.BlockingReads && rd.mm != nil {
		if err := rd.mm.makeBlocking(); err != nil {
			return err
		}
	}
	err = rd.ReadLoop(f.in, f.handle)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// batchForwarder is ForwardBatch's per-batch work, shared with Loop: its
// read buffers (in), what it decided (out) and the bundler, all made once.
type batchForwarder struct {
	wr     *BatchConn
	limit  int
	decide Decide
	hooks  Hooks
	bufs   [][]byte // the whole buffers, headroom included
	in     []Msg    // the read messages (one batch); Buf is bufs[i][headroom:]
	out    []Msg
	bd     *bundler
	items  [][]byte         // an unbundled bundle's items
	handle func(n int) bool // f.forward, made once: passing it does not allocate
}

// newBatchForwarder makes the buffers for batches of batch reads and the
// writer (writer(size): a BatchConn on the destination moving size
// datagrams a call) for what they may yield: every item of every bundle,
// when they are unbundled.
func newBatchForwarder(writer func(size int) *BatchConn, headroom, limit, batch int, decide Decide, hooks Hooks) (*batchForwarder, error) {
	if hooks.Unbundle != nil && headroom != 0 {
		return nil, errors.New("udpio: unbundling needs headroom 0")
	}
	batch = max(batch, 1)
	outs := batch
	if hooks.Unbundle != nil {
		outs = batch * hooks.Unbundle.MaxItems()
	}
	f := &batchForwarder{wr: writer(min(outs, maxWriteBatch)), limit: limit, decide: decide, hooks: hooks,
		bufs: make([][]byte, batch), in: make([]Msg, batch), out: make([]Msg, outs), items: hooks.splitter()}
	for i := range batch {
		f.bufs[i] = make([]byte, headroom+limit+1)
		f.in[i].Buf = f.bufs[i][headroom:]
	}
	if hooks.Bundle != nil {
		f.bd = newBundler(hooks.Bundle, len(f.out))
	}
	f.handle = f.forward
	return f, nil
}

// forward decides the n datagrams read into f.in and sends what they
// yield, bundled when asked. It reports false once the destination socket
// is closed.
func (f *batchForwarder) forward(n int) bool {
	in, out, hooks := f.in, f.out, f.hooks
	k := 0
	for i := range n {
		if in[i].N > f.limit {
			hooks.oversize()
			continue
		}
		if hooks.Unbundle != nil && hooks.Unbundle.IsBundle(in[i].Buf[:in[i].N]) {
			k = f.unbundle(in[i].Buf[:in[i].N], in[i].Addr, k)
			continue
		}
		pkt, to, ok := f.decide(f.bufs[i], in[i].N, in[i].Addr)
		if !ok {
			continue
		}
		out[k].Buf, out[k].Addr = pkt, to
		k++
	}
	send := out[:k]
	if f.bd != nil && k > 1 {
		var bundles, items int
		send, bundles, items = f.bd.pack(send)
		if bundles > 0 && hooks.Bundled != nil {
			hooks.Bundled(bundles, items)
		}
	}
	return writeAll(f.wr, send, hooks) == nil // nil: dst is open
}

// maxWriteBatch is the most datagrams one sendmmsg takes (UIO_MAXIOV).
const maxWriteBatch = 1024

// unbundle decides every item of a bundle into f.out[k:] and returns the
// new k. A malformed bundle is dropped whole.
func (f *batchForwarder) unbundle(b []byte, from netip.AddrPort, k int) int {
	var err error
	if f.items, err = f.hooks.Unbundle.Split(b, f.items[:0]); err != nil {
		f.hooks.badBundle()
		return k
	}
	for _, item := range f.items {
		pkt, to, ok := f.decide(item, len(item), from)
		if !ok {
			continue
		}
		f.out[k].Buf, f.out[k].Addr = pkt, to
		k++
	}
	return k
}

// writeAll sends ms, skipping a datagram the kernel refuses (one bad peer
// must not stall the rest). A full send buffer (EAGAIN, from a socket no
// poller waits for) drops the rest of ms, counted once: trying each of
// them would only cost more calls. It returns an error only when dst is
// closed.
func writeAll(wr *BatchConn, ms []Msg, hooks Hooks) error {
	for sent := 0; sent < len(ms); {
		m, err := wr.WriteBatch(ms[sent:])
		sent += m
		if err != nil {
			hooks.writeErr(err)
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			if errors.Is(err, syscall.EAGAIN) {
				return nil
			}
			sent++
		}
	}
	return nil
}
