package relay

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// runGoEpoll is the C forwarder (cfwd/fwd.c) written in Go: the same
// header, batches and system calls, all raw, on two sockets made with raw
// system calls, so that they stay out of the runtime's poller (which would
// otherwise be woken by every datagram as well). It measures what the Go
// runtime itself costs a forwarder, the floor for the relays:
//
//   - blocking (path goblock): the C forwarder's own shape, a locked
//     thread per direction waiting inside recvmmsg (MSG_WAITFORONE);
//   - otherwise (goepoll): one goroutine on a locked thread serving both
//     sockets from a raw epoll_pwait, as a C event loop would.
//
// A raw wait holds its P, so the process gets one more P than it has
// waiting threads.
func runGoEpoll(ctx context.Context, target [4]byte, tport int, blocking bool) error {
	if blocking {
		runtime.GOMAXPROCS(3)
	} else {
		runtime.GOMAXPROCS(2)
		runtime.LockOSThread()
	}
	sock := func() (int, int, error) {
		typ := unix.SOCK_DGRAM | unix.SOCK_CLOEXEC
		if !blocking {
			typ |= unix.SOCK_NONBLOCK
		}
		fd, err := unix.Socket(unix.AF_INET, typ, 0)
		if err != nil {
			return -1, 0, err
		}
		tv := unix.NsecToTimeval(100e6)
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			unix.Close(fd)
			return -1, 0, err
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			unix.Close(fd)
			return -1, 0, err
		}
		return fd, sa.(*unix.SockaddrInet4).Port, nil
	}
	front, fport, err := sock()
	if err != nil {
		return err
	}
	defer unix.Close(front)
	back, _, err := sock()
	if err != nil {
		return err
	}
	defer unix.Close(back)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	for i, fd := range []int{front, back} {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(i)}); err != nil {
			return err
		}
	}
	announce(ready{Addr: fmt.Sprintf("127.0.0.1:%d", fport)})

	var fwd, bwd goHalf
	tgt := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: target}
	p := (*[2]byte)(unsafe.Pointer(&tgt.Port))
	p[0], p[1] = byte(tport>>8), byte(tport)
	if blocking {
		// The C forwarder's own shape: a locked thread per direction,
		// each waiting inside a raw recvmmsg (MSG_WAITFORONE) on a
		// blocking socket; the receive timeout lets it see ctx end.
		var wg sync.WaitGroup
		for _, d := range []struct {
			h         *goHalf
			rfd, wfd  int
			fromFront bool
		}{{&fwd, front, back, true}, {&bwd, back, front, false}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				for ctx.Err() == nil {
					d.h.forward(d.rfd, d.wfd, d.fromFront, unix.MSG_WAITFORONE, &tgt)
				}
			}()
		}
		wg.Wait()
		return nil
	}
	events := make([]unix.EpollEvent, 2)
	for ctx.Err() == nil {
		r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), 2, 100, 0, 0)
		if e == unix.EINTR || r == 0 {
			continue
		}
		if e != 0 {
			return e
		}
		for _, ev := range events[:r] {
			if ev.Fd == 0 {
				fwd.forward(front, back, true, 0, &tgt)
			} else {
				bwd.forward(back, front, false, 0, &tgt)
			}
		}
	}
	return nil
}

// goHalf is one direction's preallocated messages.
type goHalf struct {
	in, out struct {
		hdrs  [goBatch]unix.Mmsghdr
		iovs  [goBatch][2]unix.Iovec
		names [goBatch]unix.RawSockaddrInet4
	}
	bufs  [goBatch][2048]byte
	heads [goBatch][hdrLen]byte
}

const goBatch = 32

// forward reads one batch on rfd (recvmmsg with flags) and sends it on
// wfd: from the front with the C forwarder's header put in front, toward
// tgt; from the back to the address in the header, without it.
func (g *goHalf) forward(rfd, wfd int, fromFront bool, flags uintptr, tgt *unix.RawSockaddrInet4) syscall.Errno {
	in, out := &g.in, &g.out
	for i := range goBatch {
		in.iovs[i][0] = unix.Iovec{Base: &g.bufs[i][0]}
		in.iovs[i][0].SetLen(len(g.bufs[i]))
		in.hdrs[i].Hdr.Iov = &in.iovs[i][0]
		in.hdrs[i].Hdr.SetIovlen(1)
		in.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&in.names[i]))
		in.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
	}
	n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(rfd), uintptr(unsafe.Pointer(&in.hdrs[0])), goBatch, flags, 0, 0)
	if e != 0 {
		return e
	}
	k := 0
	for i := range int(n) {
		l := int(in.hdrs[i].Len)
		o := &out.hdrs[k]
		if fromFront {
			h := &g.heads[k]
			h[0], h[1] = hdrMagic, 0
			np := (*[2]byte)(unsafe.Pointer(&in.names[i].Port))
			h[2], h[3] = np[0], np[1]
			copy(h[4:8], in.names[i].Addr[:])
			out.iovs[k][0] = unix.Iovec{Base: &h[0]}
			out.iovs[k][0].SetLen(hdrLen)
			out.iovs[k][1] = unix.Iovec{Base: &g.bufs[i][0]}
			out.iovs[k][1].SetLen(l)
			o.Hdr.SetIovlen(2)
			out.names[k] = *tgt
		} else {
			b := g.bufs[i][:l]
			if l <= hdrLen || b[0] != hdrMagic {
				continue
			}
			out.names[k] = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: [4]byte(b[4:8])}
			np := (*[2]byte)(unsafe.Pointer(&out.names[k].Port))
			np[0], np[1] = b[2], b[3]
			out.iovs[k][0] = unix.Iovec{Base: &b[hdrLen]}
			out.iovs[k][0].SetLen(l - hdrLen)
			o.Hdr.SetIovlen(1)
		}
		o.Hdr.Iov = &out.iovs[k][0]
		o.Hdr.Name = (*byte)(unsafe.Pointer(&out.names[k]))
		o.Hdr.Namelen = unix.SizeofSockaddrInet4
		k++
	}
	if k > 0 {
		unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(wfd), uintptr(unsafe.Pointer(&out.hdrs[0])), uintptr(k), unix.MSG_DONTWAIT, 0, 0)
	}
	return 0
}
