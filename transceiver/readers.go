package transceiver

import (
	"fmt"
	"net"

	"golang.org/x/net/bpf"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// readerConns returns n conns that together read the pod socket's port, the
// socket itself first; the caller closes the others.
//
// A socket bound with SO_REUSEPORT (the pod's own, NewNode) gets n-1
// siblings on its address and a classic BPF program that hands each
// datagram to socket (client port mod n), the port read from the
// encapsulation header: every datagram wakes one reader, a client's
// datagrams stay on one reader and in order, and a pod's few cluster relay
// peers no longer decide the spread (the kernel's own reuseport hash is by
// the relay's address and port). Any other socket (one a test or an
// embedding program passed in, or any socket off Linux) gets duplicates of
// its descriptor instead, which share its queue but wake every reader for
// each datagram.
func readerConns(c *net.UDPConn, n int) ([]*net.UDPConn, error) {
	conns := []*net.UDPConn{c}
	if n <= 1 {
		return conns, nil
	}
	shared := udpio.ReusePort(c)
	for range n - 1 {
		var sib *net.UDPConn
		var err error
		if shared {
			var cs []*net.UDPConn
			if cs, err = udpio.ListenReusePort(c.LocalAddr().(*net.UDPAddr).AddrPort(), 1); err == nil {
				sib = cs[0]
			}
		} else {
			sib, err = dupUDP(c)
		}
		if err != nil {
			closeConns(conns[1:])
			return nil, fmt.Errorf("pod socket reader: %w", err)
		}
		_ = sib.SetReadBuffer(podReadBuffer)
		conns = append(conns, sib)
	}
	if shared {
		// A datagram too short to hold a port goes to socket 0, whose
		// reader drops it.
		err := udpio.AttachReuseportProgram(c, []bpf.Instruction{
			bpf.LoadAbsolute{Off: encap.ClientPortOffset, Size: 2},
			bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)},
			bpf.RetA{},
		})
		if err != nil {
			closeConns(conns[1:])
			return nil, fmt.Errorf("pod socket steering: %w", err)
		}
	}
	return conns, nil
}

func closeConns(cs []*net.UDPConn) {
	for _, c := range cs {
		_ = c.Close()
	}
}
