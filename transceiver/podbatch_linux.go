package transceiver

import (
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// batchReader reads up to ioBatch datagrams per recvmmsg into pooled
// buffers. Everything a call needs is preallocated, and the closure handed
// to RawConn.Read is made once, so a read allocates nothing.
type batchReader struct {
	rc    syscall.RawConn
	bufs  [ioBatch]*podBuf
	hdrs  [ioBatch]unix.Mmsghdr
	iovs  [ioBatch]unix.Iovec
	names [ioBatch]unix.RawSockaddrInet6
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

func newBatchReader(conn *net.UDPConn) (*batchReader, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &batchReader{rc: rc}
	for i := range r.bufs {
		r.bufs[i] = bufPool.Get().(*podBuf)
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(len(r.bufs[i]))
		r.hdrs[i].Hdr.Iov = &r.iovs[i]
		r.hdrs[i].Hdr.SetIovlen(1)
		r.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&r.names[i]))
	}
	r.fn = r.recv
	return r, nil
}

// recv is the RawConn.Read callback: false asks to wait for readability.
func (r *batchReader) recv(fd uintptr) bool {
	var ok bool
	r.n, r.errno, ok = mmsg(unix.SYS_RECVMMSG, fd, &r.hdrs[0], ioBatch)
	return ok
}

// mmsg runs recvmmsg or sendmmsg on cnt headers without blocking. It
// reports false when the socket is not ready (the RawConn then waits);
// otherwise the count or the error.
func mmsg(trap, fd uintptr, hdrs *unix.Mmsghdr, cnt int) (int, syscall.Errno, bool) {
	for {
		n, _, e := unix.Syscall6(trap, fd, uintptr(unsafe.Pointer(hdrs)), uintptr(cnt), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return int(n), 0, true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, 0, false
		default:
			return 0, e, true
		}
	}
}

// read fills the batch and returns how many datagrams it holds.
func (r *batchReader) read() (int, error) {
	for i := range r.hdrs {
		r.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		r.hdrs[i].Hdr.Flags = 0
		r.hdrs[i].Len = 0
	}
	if err := r.rc.Read(r.fn); err != nil {
		return 0, err
	}
	if r.errno != 0 {
		return 0, r.errno
	}
	return r.n, nil
}

// message returns datagram i of the last read: its buffer, length and
// source, and whether it filled the buffer (may have been truncated).
func (r *batchReader) message(i int) (*podBuf, int, netip.AddrPort, bool) {
	h := &r.hdrs[i]
	n := int(h.Len)
	trunc := n >= len(r.bufs[i]) || h.Hdr.Flags&unix.MSG_TRUNC != 0
	return r.bufs[i], n, sockaddrAddrPort(&r.names[i]), trunc
}

// replace gives slot i a fresh buffer after its datagram was handed on.
func (r *batchReader) replace(i int) {
	r.bufs[i] = bufPool.Get().(*podBuf)
	r.iovs[i].Base = &r.bufs[i][0]
}

// release returns the slots' buffers to the pool.
func (r *batchReader) release() {
	for i := range r.bufs {
		bufPool.Put(r.bufs[i])
		r.bufs[i] = nil
	}
}

// sockaddrAddrPort decodes a sockaddr_in or sockaddr_in6.
func sockaddrAddrPort(sa *unix.RawSockaddrInet6) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), ntohs(sa4.Port))
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), ntohs(sa.Port))
	}
	return netip.AddrPort{}
}

// putSockaddr encodes ap for a socket of the given family (an IPv4
// destination on an IPv6 socket becomes IPv4-mapped) and returns its
// length. An IPv6 destination on an IPv4 socket gets an empty sockaddr,
// which the kernel refuses for that datagram alone.
func putSockaddr(sa *unix.RawSockaddrInet6, ap netip.AddrPort, v6 bool) uint32 {
	a := ap.Addr()
	if !v6 {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		if a = a.Unmap(); !a.Is4() {
			*sa4 = unix.RawSockaddrInet4{}
			return unix.SizeofSockaddrInet4
		}
		*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Port: htons(ap.Port()), Addr: a.As4()}
		return unix.SizeofSockaddrInet4
	}
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Port: htons(ap.Port()), Addr: a.As16()}
	return unix.SizeofSockaddrInet6
}

// A sockaddr's port is in network byte order: ntohs and htons read and
// write its two bytes as stored, whatever the machine's byte order.
func ntohs(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return uint16(b[0])<<8 | uint16(b[1])
}

func htons(p uint16) uint16 {
	var out uint16
	b := (*[2]byte)(unsafe.Pointer(&out))
	b[0], b[1] = byte(p>>8), byte(p)
	return out
}

// batchWriter sends a batch with sendmmsg from preallocated headers.
type batchWriter struct {
	rc    syscall.RawConn
	rcErr error
	v6    bool // the socket is AF_INET6 (destinations in sockaddr_in6)
	hdrs  [ioBatch]unix.Mmsghdr
	iovs  [ioBatch]unix.Iovec
	names [ioBatch]unix.RawSockaddrInet6
	cnt   int // messages to send from hdrs[0]
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// newBatchWriter prepares the headers; a conn that cannot give its file
// descriptor fails every write with that error.
func newBatchWriter(conn *net.UDPConn) *batchWriter {
	w := &batchWriter{}
	w.rc, w.rcErr = conn.SyscallConn()
	// A socket bound to an IPv4 address is AF_INET; one bound to an IPv6
	// address (the unspecified one included: dual-stack) is AF_INET6.
	if la, ok := conn.LocalAddr().(*net.UDPAddr); ok {
		w.v6 = la.IP.To4() == nil
	}
	for i := range w.hdrs {
		w.hdrs[i].Hdr.Iov = &w.iovs[i]
		w.hdrs[i].Hdr.SetIovlen(1)
		w.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&w.names[i]))
	}
	w.fn = w.sendmmsg
	return w
}

func (w *batchWriter) sendmmsg(fd uintptr) bool {
	var ok bool
	w.n, w.errno, ok = mmsg(unix.SYS_SENDMMSG, fd, &w.hdrs[0], w.cnt)
	return ok
}

// write sends b's datagrams from index from on and returns how many went
// out; an error is the first unsent datagram's.
func (w *batchWriter) write(b *outBatch, from int) (int, error) {
	if w.rcErr != nil {
		return 0, w.rcErr
	}
	w.cnt = b.n - from
	for i := range w.cnt {
		j := from + i
		w.iovs[i].Base = &b.bufs[j][0]
		w.iovs[i].SetLen(b.lens[j])
		w.hdrs[i].Hdr.Namelen = putSockaddr(&w.names[i], b.to[j], w.v6)
	}
	if err := w.rc.Write(w.fn); err != nil {
		return 0, err
	}
	if w.errno != 0 {
		return 0, w.errno
	}
	return w.n, nil
}
