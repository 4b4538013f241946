package globalrelay

// Benchmarks of one forwarding hop on real sockets (Linux), as CPU time
// of the forwarding thread per datagram: the authenticated hop against
// the unauthenticated one, and the TCP ingress against the UDP one, each
// direction, in the same run.

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// threadCPU returns the CPU time (user + system) of the calling OS thread.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkForwardCost is the per-packet cost of the client → cluster hop
// through the real forwarding loop (udpio.Forward: recvmsg, decision,
// sendmsg) over loopback, one datagram in flight: "authenticated" is the
// relay as built; "baseline-unauthenticated" is the same loop and sockets
// with the decision as it was before inter-tier authentication (no hop-key
// lookup, no tag), in the same run. The figure to compare is relay-cpu-ns:
// CPU time of the forwarding thread per datagram (getrusage of the locked
// OS thread), which a loaded machine disturbs far less than ns/op (wall
// time of the lockstep round, sender and sink included).
func BenchmarkForwardCost(b *testing.B) {
	for _, mode := range []string{"authenticated", "baseline-unauthenticated"} {
		b.Run(mode, func(b *testing.B) {
			sink, client := listen(b), listen(b)
			defer sink.Close()
			defer client.Close()
			relay, pub, in := newTestRelay(b, Config{}, addrOf(sink))
			defer relay.Close()
			from, ingress := addrOf(client), addrOf(in)
			ufrag, _ := relay.cfg.Keys.Mint(0x12, 1)
			check := bindingRequest(b, ufrag)
			tmp := make([]byte, encap.MaxLen+encap.MaxPayload)
			copy(tmp[encap.MaxLen:], check)
			if _, _, ok := relay.fromClient(tmp, len(check), from, ingress); !ok {
				b.Fatal("flow not opened")
			}
			decide := func(buf []byte, n int, src netip.AddrPort) ([]byte, netip.AddrPort, bool) {
				return relay.fromClient(buf, n, src, ingress)
			}
			if mode != "authenticated" {
				decide = func(buf []byte, n int, src netip.AddrPort) ([]byte, netip.AddrPort, bool) {
					f := relay.flows.get(src)
					if f == nil || stunmsg.DemuxClass(buf[encap.MaxLen:encap.MaxLen+n]) == stunmsg.ClassSTUN {
						return nil, netip.AddrPort{}, false
					}
					out, _, to, ok := relay.encapsulate(buf, n, f, src, ingress, relay.now.Load())
					return out, to, ok
				}
			}
			done := make(chan error, 1)
			var cpu time.Duration
			go func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				t0 := threadCPU()
				err := udpio.Forward(pub, in, encap.MaxLen, encap.MaxPayload, decide, udpio.Hooks{})
				cpu = threadCPU() - t0
				done <- err
			}()
			media := make([]byte, 120)
			media[0] = 0x80
			buf := make([]byte, 2048)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := client.WriteToUDPAddrPort(media, addrOf(pub)); err != nil {
					b.Fatal(err)
				}
				_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, _, err := sink.ReadFromUDPAddrPort(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			relay.Close()
			<-done
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "relay-cpu-ns")
		})
	}
}

// BenchmarkTCPForwardCost compares the client → cluster hop of the TCP
// ingress with the UDP one, in the same run: "udp" is the relay's public
// socket loop (udpio.Forward with the real decision), "tcp" is one client
// connection's reader (RFC 4571 de-framing, encapsulation, seal, sendmsg)
// through the real code. relay-cpu-ns is the CPU time of the forwarding
// thread per datagram (getrusage of its locked OS thread); the goal is tcp
// ≤ 2× udp. One 120-byte media datagram in flight at a time.
func BenchmarkTCPForwardCost(b *testing.B) {
	for _, mode := range []string{"udp", "tcp"} {
		b.Run(mode, func(b *testing.B) {
			sink := listen(b)
			defer sink.Close()
			relay, pub, in := newTestRelay(b, Config{}, addrOf(sink))
			defer relay.Close()
			ufrag, _ := relay.cfg.Keys.Mint(0x12, 1)
			check := bindingRequest(b, ufrag)
			media := make([]byte, 120)
			media[0] = 0x80
			buf := make([]byte, 2048)
			var send func()
			var cpu time.Duration
			done := make(chan error, 1)
			locked := func(run func() error) {
				go func() {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					t0 := threadCPU()
					err := run()
					cpu = threadCPU() - t0
					done <- err
				}()
			}
			var stop func()
			switch mode {
			case "udp":
				client := listen(b)
				defer client.Close()
				ingress := addrOf(in)
				locked(func() error {
					return udpio.Forward(pub, in, encap.MaxLen, encap.MaxPayload, func(buf []byte, n int, src netip.AddrPort) ([]byte, netip.AddrPort, bool) {
						return relay.fromClient(buf, n, src, ingress)
					}, udpio.Hooks{})
				})
				client.WriteToUDPAddrPort(check, addrOf(pub))
				send = func() { client.WriteToUDPAddrPort(media, addrOf(pub)) }
				stop = func() { relay.Close() }
			case "tcp":
				ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
				if err != nil {
					b.Fatal(err)
				}
				s, err := NewTCP(relay, ln, TCPConfig{Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				client, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
				if err != nil {
					b.Fatal(err)
				}
				defer client.Close()
				nc, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				// The connection as admit makes it, its reader on a
				// locked thread instead of admit's goroutine.
				a := nc.RemoteAddr().(*net.TCPAddr).AddrPort()
				c := &tcpConn{s: s, nc: nc, client: netip.AddrPortFrom(a.Addr().Unmap(), a.Port()), wake: make(chan struct{}, 1), closed: make(chan struct{})}
				s.mu.Lock()
				s.all[c] = struct{}{}
				s.perIP[addrKey(c.client.Addr())]++
				s.pend.add(c, c.client.Addr())
				c.pending = true
				s.mu.Unlock()
				locked(func() error { c.readLoop(); return nil })
				client.Write(frame(check))
				framed := frame(media)
				send = func() { client.Write(framed) }
				stop = func() { s.Close() }
			}
			_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, _, err := sink.ReadFromUDPAddrPort(buf); err != nil {
				b.Fatal("check not forwarded: ", err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				send()
				_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, _, err := sink.ReadFromUDPAddrPort(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			stop()
			<-done
			relay.Close()
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "relay-cpu-ns")
		})
	}
}

// processCPU returns the CPU time (user + system) of the whole process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTCPReturnCost compares the cluster → client hop of the TCP
// ingress (verify, queue, writer goroutine, framed write) with the UDP one
// (verify, sendmsg from the public socket), in the same run. The return
// path spans two goroutines on the TCP side, so the figure is the whole
// process's CPU per datagram (process-cpu-ns), which also holds the
// stand-in cluster relay's send and the client's read in both variants.
// One 120-byte media datagram in flight at a time.
func BenchmarkTCPReturnCost(b *testing.B) {
	for _, mode := range []string{"udp", "tcp"} {
		b.Run(mode, func(b *testing.B) {
			cluster := listen(b)
			defer cluster.Close()
			relay, pub, in := newTestRelay(b, Config{}, addrOf(cluster))
			defer relay.Close()
			done := make(chan error, 1)
			go func() { done <- udpio.Forward(in, pub, 0, encap.MaxDatagram, relay.toClient, udpio.Hooks{}) }()
			ufrag, _ := relay.cfg.Keys.Mint(0x12, 1)
			check := bindingRequest(b, ufrag)
			buf := make([]byte, 2048)
			var client netip.AddrPort
			var recv func() error
			var tcp bool
			switch mode {
			case "udp":
				c := listen(b)
				defer c.Close()
				c.WriteToUDPAddrPort(check, addrOf(pub))
				go udpio.Forward(pub, in, encap.MaxLen, encap.MaxPayload, func(buf []byte, n int, src netip.AddrPort) ([]byte, netip.AddrPort, bool) {
					return relay.fromClient(buf, n, src, addrOf(in))
				}, udpio.Hooks{})
				client = addrOf(c)
				recv = func() error {
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					_, _, err := c.ReadFromUDPAddrPort(buf)
					return err
				}
			case "tcp":
				tcp = true
				ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
				if err != nil {
					b.Fatal(err)
				}
				s, err := NewTCP(relay, ln, TCPConfig{Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				runDone := make(chan error, 1)
				ctx, cancel := context.WithCancel(context.Background())
				go func() { runDone <- s.Run(ctx) }()
				defer func() { cancel(); <-runDone }()
				c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				c.Write(frame(check))
				client = tcpAddrOf(c)
				var hdr [2]byte
				recv = func() error {
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						return err
					}
					_, err := io.ReadFull(c, buf[:binary.BigEndian.Uint16(hdr[:])])
					return err
				}
			}
			_ = cluster.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, _, err := cluster.ReadFromUDPAddrPort(buf)
			if err != nil {
				b.Fatal("check not forwarded: ", err)
			}
			fwd, _, err := encap.Decode(buf[:n])
			if err != nil {
				b.Fatal(err)
			}
			media := make([]byte, 120)
			media[0] = 0x80
			reply := seal(b, encap.Header{TCP: tcp, ToClient: true, Cluster: 0x12, Pod: 1, POP: 9, Token: fwd.Token, Client: client, Ingress: addrOf(in)}, media)
			b.ReportAllocs()
			b.ResetTimer()
			t0 := processCPU()
			for range b.N {
				if _, err := cluster.WriteToUDPAddrPort(reply, addrOf(in)); err != nil {
					b.Fatal(err)
				}
				if err := recv(); err != nil {
					b.Fatal(err)
				}
			}
			cpu := processCPU() - t0
			b.StopTimer()
			relay.Close()
			<-done
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "process-cpu-ns")
		})
	}
}
