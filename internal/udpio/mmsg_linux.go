package udpio

import (
	"net"
	"net/netip"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsg is recvmmsg/sendmmsg on one socket with every message header, iovec
// and address preallocated: a batch costs one system call and no
// allocation. The read half and the write half have their own storage, so
// one goroutine may read while another writes.
type mmsg struct {
	rc  syscall.RawConn
	v6  bool // the socket is AF_INET6 (IPv4 peers appear IPv4-mapped)
	rd  mmsgHalf
	wr  mmsgHalf
	rfn func(fd uintptr) bool // method values made once: passing them does not allocate
	wfn func(fd uintptr) bool
	// blocking: the socket was made blocking with a receive timeout, and
	// reads wait in recvmmsg (MSG_WAITFORONE) like a C forwarder instead
	// of in the runtime's poller (experimental, see ForwardBatchBlocking).
	blocking bool
	// rawRead: the socket is non-blocking, so recvmmsg returns at once
	// (EAGAIN when nothing is queued) and is made as a raw system call,
	// without entersyscall/exitsyscall; sendmmsg always is, with
	// MSG_DONTWAIT. A system call the scheduler is told about wakes
	// sysmon from its deep sleep whenever the process was idle: on a
	// relay that wakes per datagram, a futex wake and sysmon's 20 µs
	// naps (two more system calls and two context switches) per
	// wake-up, and a call sysmon sees twice loses its P to another
	// thread. A raw call keeps its P for the few microseconds it takes,
	// as Go code would. Blocking reads (makeBlocking) must go through
	// the scheduler. See docs/benchmarks.md, "Relays at the limit of
	// one hop".
	rawRead bool
	// fd >= 0: a socket outside the runtime's poller (RawConn), called
	// directly (rc is nil): a read that finds nothing returns 0 and a
	// send that would wait fails with EAGAIN.
	fd int
}

type mmsgHalf struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	ms    []Msg                   // the call's messages
	n     int                     // the call's result
	err   error
	calls int           // system calls made (read half: recvmmsg), for tests; only its goroutine touches it
	again syscall.Errno // the errno of the last call that reported not ready
	// recvBatch's: the batch size its iovecs were set up for (0: not yet)
	// and how many headers its last call filled.
	prepared, used int
}

func newMmsg(c *net.UDPConn, size int) (*mmsg, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, false
	}
	m := &mmsg{rc: rc, fd: -1}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		var dom, fl int
		dom, ferr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
		m.v6 = dom == unix.AF_INET6
		if ferr == nil {
			fl, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0)
			m.rawRead = fl&unix.O_NONBLOCK != 0
		}
	}); err != nil || ferr != nil {
		return nil, false
	}
	m.init(size)
	return m, true
}

// newRawMmsg is mmsg over a socket outside the runtime's poller.
func newRawMmsg(fd int, v6 bool, size int) *mmsg {
	m := &mmsg{fd: fd, v6: v6, rawRead: true}
	m.init(size)
	return m
}

func (m *mmsg) init(size int) {
	for _, h := range []*mmsgHalf{&m.rd, &m.wr} {
		h.hdrs = make([]unix.Mmsghdr, size)
		h.iovs = make([]unix.Iovec, size)
		h.names = make([]unix.RawSockaddrInet6, size)
		for i := range h.hdrs {
			h.hdrs[i].Hdr.Iov = &h.iovs[i]
			h.hdrs[i].Hdr.SetIovlen(1)
			h.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&h.names[i]))
		}
	}
	m.rfn, m.wfn = m.doRead, m.doWrite
}

// recvBatch makes one recvmmsg on fd into ms (retrying EINTR) and fills
// N and Addr of the n it read; e is the call's errno (EAGAIN: nothing was
// queued). With fixed, ms's buffers are the same every call (the Loop's
// are), so the iovecs are set once (again only when ms changes) and after
// a call only the headers the kernel wrote (h.used) get their address
// length back: a wake-up that reads one datagram touches one header, not
// the batch's. ReadLoop's handler may hand a buffer on and put a fresh one
// in its place (the pod's reader does), so there every iovec is set anew.
func (m *mmsg) recvBatch(fd uintptr, ms []Msg, fixed bool) (n int, e syscall.Errno) {
	h := &m.rd
	k := min(len(ms), len(h.hdrs))
	if !fixed || h.prepared != k || !sameBufs(h.iovs[:k], ms[:k]) {
		for i := range k {
			setIov(&h.iovs[i], ms[i].Buf)
			h.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		}
		h.prepared, h.used = k, 0
		if !fixed {
			h.prepared = 0
		}
	}
	for i := range h.used {
		h.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
	}
	h.used = 0
	for {
		h.calls++
		r, _, e := m.syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&h.hdrs[0])), uintptr(k), 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		n := int(r)
		h.used = n
		for i := range n {
			ms[i].N = int(h.hdrs[i].Len)
			ms[i].Addr = sockaddrToAddrPort(&h.names[i])
		}
		return n, 0
	}
}

// readNow makes one recvmmsg on a raw socket (fd >= 0) into ms: 0 when
// nothing is queued.
func (m *mmsg) readNow(ms []Msg) (int, error) {
	switch n, e := m.recvBatch(uintptr(m.fd), ms, true); e {
	case 0:
		return n, nil
	case unix.EAGAIN:
		return 0, nil
	default:
		return 0, errnoErr("recvmmsg", e)
	}
}

// sameBufs reports whether the first and the last iovec still point at
// ms's buffers, whole: a cheap guard, since the Loop's messages are set up
// once and never change (read, which takes any messages, sets every iovec
// itself and makes recvBatch set them again).
func sameBufs(iovs []unix.Iovec, ms []Msg) bool {
	same := func(i int) bool {
		return len(ms[i].Buf) > 0 && iovs[i].Base == &ms[i].Buf[0] && uint64(iovs[i].Len) == uint64(len(ms[i].Buf))
	}
	return same(0) && same(len(ms)-1)
}

func (m *mmsg) read(ms []Msg) (int, error) {
	h := &m.rd
	k := min(len(ms), len(h.hdrs))
	h.prepared = 0 // recvBatch sets its iovecs again
	for i := range k {
		setIov(&h.iovs[i], ms[i].Buf)
		h.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		h.hdrs[i].Len = 0
	}
	h.ms = ms[:k]
	if err := m.rc.Read(m.rfn); err != nil {
		h.ms = nil
		return 0, err
	}
	h.ms = nil
	if h.err != nil {
		return 0, h.err
	}
	for i := range h.n {
		ms[i].N = int(h.hdrs[i].Len)
		ms[i].Addr = sockaddrToAddrPort(&h.names[i])
	}
	return h.n, nil
}

// readLoop reads batches into ms and hands each to handle, for as long as
// handle returns true, all inside one raw read of the socket. After a
// batch smaller than ms (the queue was drained) it waits in the runtime's
// poller without another recvmmsg: within one raw read the poller keeps
// the readiness of datagrams that arrived since the read began, so one
// that came in while handle ran is read at once; a new raw read would
// forget it (TestReadLoopNoEAGAIN). A C forwarder blocked in recvmmsg
// makes one read per wake-up; so does this loop, where ReadBatch makes a
// second one that returns EAGAIN.
func (m *mmsg) readLoop(ms []Msg, handle func(n int) bool) error {
	k := min(len(ms), len(m.rd.hdrs))
	var stop bool
	var rerr error
	f := func(fd uintptr) bool {
		for {
			n, e := m.recvBatch(fd, ms, false)
			switch e {
			case 0:
			case unix.EAGAIN:
				return false
			default:
				rerr = errnoErr("recvmmsg", e)
				return true
			}
			if !handle(n) {
				stop = true
				return true
			}
			if n < k {
				return false // drained: wait for the next datagram
			}
		}
	}
	for {
		if err := m.rc.Read(f); err != nil {
			return err
		}
		if stop || rerr != nil {
			return rerr
		}
	}
}

func (m *mmsg) doRead(fd uintptr) bool {
	if m.blocking {
		return m.call(&m.rd, fd, unix.SYS_RECVMMSG, unix.MSG_WAITFORONE, "recvmmsg")
	}
	return m.call(&m.rd, fd, unix.SYS_RECVMMSG, 0, "recvmmsg")
}

func (m *mmsg) doWrite(fd uintptr) bool {
	return m.call(&m.wr, fd, unix.SYS_SENDMMSG, unix.MSG_DONTWAIT, "sendmmsg")
}

// writeRaw is doWrite on a raw socket (fd >= 0), where tests can make the
// call fail (sendHook).
func (m *mmsg) writeRaw() bool {
	if sendHook != nil {
		if e := sendHook(); e != 0 {
			m.wr.again = e
			return false
		}
	}
	return m.doWrite(uintptr(m.fd))
}

// sendHook, set only by tests, makes a raw socket's sendmmsg report an
// errno without sending (loopback never fills a send buffer: the skb is
// orphaned on transmit).
var sendHook func() syscall.Errno

// syscall6 makes a recvmmsg or sendmmsg: raw unless it is a read that may
// block (see mmsg.rawRead). A send never blocks: MSG_DONTWAIT.
func (m *mmsg) syscall6(trap, fd, hdrs, n, flags uintptr) (uintptr, uintptr, syscall.Errno) {
	if trap == unix.SYS_SENDMMSG || m.rawRead {
		return unix.RawSyscall6(trap, fd, hdrs, n, flags, 0, 0)
	}
	return unix.Syscall6(trap, fd, hdrs, n, flags, 0, 0)
}

// call makes the half's system call on fd. It reports false when the
// socket is not ready (the runtime then waits for it in the poller).
func (m *mmsg) call(h *mmsgHalf, fd uintptr, trap uintptr, flags int, op string) bool {
	h.calls++
	n, _, e := m.syscall6(trap, fd, uintptr(unsafe.Pointer(&h.hdrs[0])), uintptr(len(h.ms)), uintptr(flags))
	if e == unix.EAGAIN || e == unix.EINTR {
		h.again = e
		return false
	}
	h.n, h.err = int(n), nil
	if e != 0 {
		h.n, h.err = 0, errnoErr(op, e)
	}
	return true
}

func (m *mmsg) write(ms []Msg) (int, error) {
	h := &m.wr
	k := min(len(ms), len(h.hdrs))
	for i := range k {
		setIov(&h.iovs[i], ms[i].Buf)
		h.hdrs[i].Hdr.Namelen = putSockaddr(&h.names[i], ms[i].Addr, m.v6)
		h.hdrs[i].Len = 0
	}
	h.ms = ms[:k]
	if m.rc == nil {
		// A raw socket has no poller to wait in: EINTR is retried, and
		// on EAGAIN (the send buffer full) the call waits for room once,
		// briefly, then fails with EAGAIN (writeAll drops the rest of the
		// batch).
		waited := false
		for !m.writeRaw() {
			if m.wr.again != unix.EAGAIN {
				continue
			}
			if waited || !waitWritable(m.fd) {
				h.ms = nil
				return 0, errnoErr("sendmmsg", unix.EAGAIN)
			}
			waited = true
		}
	} else if err := m.rc.Write(m.wfn); err != nil {
		h.ms = nil
		return 0, err
	}
	h.ms = nil
	if h.err != nil {
		return h.n, h.err
	}
	return h.n, nil
}

func setIov(v *unix.Iovec, b []byte) {
	if len(b) == 0 {
		v.Base = nil
		v.SetLen(0)
		return
	}
	v.Base = &b[0]
	v.SetLen(len(b))
}

// errnoErr wraps a system call's errno the way net does, without
// allocating for the common errnos.
func errnoErr(op string, e syscall.Errno) error {
	return &net.OpError{Op: op, Net: "udp", Err: e}
}

// sockaddrToAddrPort reads the source address the kernel wrote, unmapped.
func sockaddrToAddrPort(sa *unix.RawSockaddrInet6) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), uint16(p[0])<<8|uint16(p[1]))
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}

// putSockaddr writes ap as the destination of a message on a socket of
// the given family and returns the address length. An IPv4 destination on
// an AF_INET6 socket is written IPv4-mapped; an IPv6 one on an AF_INET
// socket keeps the AF_INET6 family and the kernel refuses that message.
func putSockaddr(sa *unix.RawSockaddrInet6, ap netip.AddrPort, v6 bool) uint32 {
	a := ap.Addr()
	port := ap.Port()
	if a.Is4() && !v6 {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		sa4.Family = unix.AF_INET
		p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		sa4.Addr = a.As4()
		sa4.Zero = [8]uint8{}
		return unix.SizeofSockaddrInet4
	}
	sa.Family = unix.AF_INET6
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	sa.Flowinfo = 0
	sa.Addr = a.As16() // As16 maps IPv4
	sa.Scope_id = 0
	return unix.SizeofSockaddrInet6
}

// makeBlocking clears O_NONBLOCK on c's socket and sets a receive timeout,
// so a read can wait inside recvmmsg; the timeout bounds how long Close
// waits for a blocked read.
func (m *mmsg) makeBlocking() error {
	var serr error
	err := m.rc.Control(func(fd uintptr) {
		if serr = unix.SetNonblock(int(fd), false); serr != nil {
			return
		}
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		serr = unix.SetsockoptTimeval(int(fd), unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if err != nil {
		return err
	}
	if serr == nil {
		m.blocking, m.rawRead = true, false
	}
	return serr
}
