//go:build !linux

package transceiver

import (
	"net"
	"net/netip"
)

// Without recvmmsg and sendmmsg a batch is one datagram.

type batchReader struct {
	conn *net.UDPConn
	buf  *podBuf
	n    int
	from netip.AddrPort
}

func newBatchReader(conn *net.UDPConn) (*batchReader, error) {
	return &batchReader{conn: conn, buf: bufPool.Get().(*podBuf)}, nil
}

func (r *batchReader) read() (int, error) {
	n, from, err := r.conn.ReadFromUDPAddrPort(r.buf[:])
	if err != nil {
		return 0, err
	}
	r.n, r.from = n, from
	return 1, nil
}

func (r *batchReader) message(int) (*podBuf, int, netip.AddrPort, bool) {
	return r.buf, r.n, r.from, r.n == len(r.buf)
}

func (r *batchReader) replace(int) { r.buf = bufPool.Get().(*podBuf) }

func (r *batchReader) release() { bufPool.Put(r.buf) }

type batchWriter struct{ conn *net.UDPConn }

func newBatchWriter(conn *net.UDPConn) *batchWriter { return &batchWriter{conn: conn} }

func (w *batchWriter) write(b *outBatch, from int) (int, error) {
	if _, err := w.conn.WriteToUDPAddrPort(b.bufs[from][:b.lens[from]], b.to[from]); err != nil {
		return 0, err
	}
	return 1, nil
}
