package globalrelay

// Benchmarks of the client path: fromClient alone, a round trip through
// the relay, and throughput over loopback.

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// BenchmarkFromClient is the per-packet decision for a known flow's media
// packet: flow lookup, header write. No syscalls.
func BenchmarkFromClient(b *testing.B) {
	cl := NewClusters([]Replica{{Cluster: 0x12, Addr: netip.MustParseAddrPort("127.0.0.1:9")}})
	relay, _, _ := newTestRelay(b, Config{Directory: cl}, netip.AddrPort{})
	defer relay.Close()
	ufrag, _ := relay.cfg.Keys.Mint(0x12, 1)
	check := bindingRequest(b, ufrag)
	client, ingress := netip.MustParseAddrPort("192.0.2.1:5000"), netip.MustParseAddrPort("127.0.0.1:7")
	buf := make([]byte, encap.MaxLen+2048)
	copy(buf[encap.MaxLen:], check)
	relay.fromClient(buf, len(check), client, ingress)
	media := make([]byte, 120)
	media[0] = 0x80
	b.Run("media", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			copy(buf[encap.MaxLen:], media)
			relay.fromClient(buf, len(media), client, ingress)
		}
	})
	// The same run's baseline: the media decision as it was before
	// inter-tier authentication (flow lookup, classification, relay pick,
	// header write, counters) without the hop-key lookup and the tag.
	b.Run("media-baseline-unauthenticated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			copy(buf[encap.MaxLen:], media)
			pkt := buf[encap.MaxLen : encap.MaxLen+len(media)]
			f := relay.flows.get(client)
			if f == nil || stunmsg.DemuxClass(pkt) == stunmsg.ClassSTUN {
				b.Fatal("not a known flow's media")
			}
			if _, _, _, ok := relay.encapsulate(buf, len(media), f, client, ingress, relay.now.Load()); !ok {
				b.Fatal("dropped")
			}
		}
	})
	b.Run("consent-check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			copy(buf[encap.MaxLen:], check)
			relay.fromClient(buf, len(check), client, ingress)
		}
	})
}

// BenchmarkRoundTrip measures one datagram's round trip over loopback, one
// in flight at a time, through three paths in the same run:
//
//	direct:      client → echo → client
//	naive:       client → plain read/write forwarder → echo → forwarder → client
//	globalrelay: client → global relay → echo (as the cluster side) → global relay → client
//
// The difference to "naive" is what the relay's header work, token checks
// and flow table cost on top of a forwarding hop.
func BenchmarkRoundTrip(b *testing.B) {
	payload := make([]byte, 120)
	payload[0] = 0x80 // RTP-like

	b.Run("direct", func(b *testing.B) {
		echo := startEcho(b, false)
		pingPong(b, echo, payload, nil)
	})
	b.Run("naive", func(b *testing.B) {
		echo := startEcho(b, false)
		fwd := startNaiveForwarder(b, echo)
		pingPong(b, fwd, payload, nil)
	})
	b.Run("globalrelay", func(b *testing.B) {
		echo := startEcho(b, true)
		keys := testKeys(b)
		cl := NewClusters([]Replica{{Cluster: 0x12, Addr: echo}})
		relay, pub, _ := newTestRelay(b, Config{Keys: keys, Directory: cl}, netip.AddrPort{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = relay.Run(ctx); close(done) }()
		b.Cleanup(func() { cancel(); <-done })
		ufrag, _ := keys.Mint(0x12, 1)
		pingPong(b, addrOf(pub), payload, bindingRequest(b, ufrag))
	})
}

// pingPong sends payload to target and waits for it back, b.N times. first,
// when set, is sent (and answered) once before timing: the flow's check.
func pingPong(b *testing.B, target netip.AddrPort, payload, first []byte) {
	c := listen(b)
	defer c.Close()
	buf := make([]byte, 2048)
	if first != nil {
		c.WriteToUDPAddrPort(first, target)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
			b.Fatalf("first packet: %v", err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.WriteToUDPAddrPort(payload, target); err != nil {
			b.Fatal(err)
		}
		if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// startEcho answers every datagram. As the cluster side of a global relay
// (encap=true) it flips the header's direction and replies to the ingress.
func startEcho(b *testing.B, encapMode bool) netip.AddrPort {
	c := listen(b)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			to := from
			if encapMode {
				h, _, err := encap.Decode(buf[:n])
				if err != nil {
					continue
				}
				h.ToClient = true
				hl, _ := h.Put(buf)
				testHop.For(h.Cluster).Seal(buf[:n], hl)
				to = h.Ingress
			}
			_, _ = c.WriteToUDPAddrPort(buf[:n], to)
		}
	}()
	b.Cleanup(func() { c.Close(); wg.Wait() })
	return addrOf(c)
}

// startNaiveForwarder relays datagrams between one client and target with
// plain reads and writes: the baseline for one forwarding hop.
func startNaiveForwarder(b *testing.B, target netip.AddrPort) netip.AddrPort {
	front, back := listen(b), listen(b)
	var wg sync.WaitGroup
	var client netip.AddrPort
	var mu sync.Mutex
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := front.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			mu.Lock()
			client = from
			mu.Unlock()
			_, _ = back.WriteToUDPAddrPort(buf[:n], target)
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, _, err := back.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			mu.Lock()
			to := client
			mu.Unlock()
			_, _ = front.WriteToUDPAddrPort(buf[:n], to)
		}
	}()
	b.Cleanup(func() { front.Close(); back.Close(); wg.Wait() })
	return addrOf(front)
}

// BenchmarkThroughput floods the relay from 8 clients and counts what
// reaches the cluster side: datagrams per second one relay worker forwards,
// with one datagram per system call and with batches, next to a naive
// forwarder in the same run. Reported as delivered pps and the share lost
// (loopback socket buffers overflow when the relay falls behind).
func BenchmarkThroughput(b *testing.B) {
	const clients = 8
	payload := make([]byte, 120)
	payload[0] = 0x80
	run := func(b *testing.B, target netip.AddrPort, sink *net.UDPConn, first func(c *net.UDPConn)) {
		cs := make([]*net.UDPConn, clients)
		for i := range cs {
			cs[i] = listen(b)
			defer cs[i].Close()
			if first != nil {
				first(cs[i])
			}
		}
		got := make(chan int)
		go func() {
			buf := make([]byte, 2048)
			n := 0
			for {
				_ = sink.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				if _, _, err := sink.ReadFromUDPAddrPort(buf); err != nil {
					got <- n
					return
				}
				n++
			}
		}()
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			cs[i%clients].WriteToUDPAddrPort(payload, target)
		}
		delivered := <-got
		elapsed := time.Since(start) - 200*time.Millisecond
		b.StopTimer()
		b.ReportMetric(float64(delivered)/elapsed.Seconds(), "delivered-pps")
		b.ReportMetric(1-float64(delivered)/float64(b.N), "lost-ratio")
	}
	b.Run("naive", func(b *testing.B) {
		sink := listen(b)
		defer sink.Close()
		run(b, startNaiveForwarder(b, addrOf(sink)), sink, nil)
	})
	for _, batch := range []int{1, 32} {
		b.Run("globalrelay-batch-"+strconv.Itoa(batch), func(b *testing.B) {
			sink := listen(b)
			defer sink.Close()
			keys := testKeys(b)
			relay, pub, _ := newTestRelay(b, Config{Keys: keys, Tuning: udpio.Tuning{Batch: batch}}, addrOf(sink))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = relay.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			ufrag, _ := keys.Mint(0x12, 1)
			check := bindingRequest(b, ufrag)
			buf := make([]byte, 2048)
			run(b, addrOf(pub), sink, func(c *net.UDPConn) {
				c.WriteToUDPAddrPort(check, addrOf(pub))
				_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, _, err := sink.ReadFromUDPAddrPort(buf); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
