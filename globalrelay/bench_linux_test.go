package globalrelay

import (
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
