package fastpath

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
)

// BenchmarkOverVeth sends datagrams through each program attached to a
// veth pair between two namespaces, one at a time (send, then wait for it
// on the far socket), and reports the program's own run time per
// datagram (kernel.bpf_stats_enabled: prog-ns/datagram) beside the round
// of send and receive (ns/op). The baseline in the same run, "direct",
// is the same send and receive with no relay at all. Whole-machine CPU per
// datagram against the C forwarder is bench/relay's job.
func BenchmarkOverVeth(b *testing.B) {
	p := fptest.NewPair(b)
	ring := vectorRing(b)
	payload := append([]byte{0x17, 0xfe, 0xfd}, bytes.Repeat([]byte{0x42}, 157)...) // a 20 ms Opus frame's size
	from := p.A.ListenUDP(netip.AddrPortFrom(p.AddrA, 3478))
	to := p.A.ListenUDP(netip.AddrPortFrom(p.AddrA, 5000))
	sink := p.B.ListenUDP(netip.AddrPortFrom(p.AddrB, 6000)) // direct: A → B

	b.Run("direct", func(b *testing.B) { roundTrips(b, from, sink, netip.AddrPortFrom(p.AddrB, 6000), payload, nil) })

	b.Run("cluster_relay", func(b *testing.B) {
		relay := netip.AddrPortFrom(p.AddrB, 7100)
		c, err := NewCluster(relay, 0x1234)
		must(b, err)
		defer c.Close()
		must(b, c.SetPods(map[uint16]netip.AddrPort{0x42: netip.AddrPortFrom(p.AddrA, 5000)}))
		must(b, c.SetKeys(ring, []uint16{0x42}))
		must(b, c.AddIngress(netip.AddrPortFrom(p.AddrA, 3478)))
		must(b, p.B.In(func() error { return c.Attach(p.IfindexB, ModeTC) }))
		h := vectorHeader()
		h.Ingress = netip.AddrPortFrom(p.AddrA, 3478)
		pkt, err := h.AppendTo(nil)
		must(b, err)
		pkt = append(pkt, payload...)
		ring.Seal(pkt, encap.MinLen)
		roundTrips(b, from, to, relay, pkt, c.Program())
	})

	b.Run("global_relay", func(b *testing.B) {
		vip := netip.AddrPortFrom(p.AddrB, 3478)
		g, err := NewGlobal()
		must(b, err)
		defer g.Close()
		h := vectorHeader()
		h.Client = netip.AddrPortFrom(p.AddrA, 3478)
		h.Ingress = netip.AddrPortFrom(p.AddrB, 4000)
		id, key := ring.SealKey(0x42)
		h.KeyID = id
		must(b, g.Install(GlobalFlow{Client: h.Client, VIP: vip, Relay: netip.AddrPortFrom(p.AddrA, 5000), Header: h, Key: key,
			RefreshAt: Monotonic() + 3600e9}))
		must(b, p.B.In(func() error { return g.Attach(p.IfindexB, ModeTC) }))
		roundTrips(b, from, to, vip, payload, g.Program())
	})
}

// roundTrips sends pkt from from to dst b.N times, each time awaiting a
// datagram on to, and reports prog's run time per datagram.
func roundTrips(b *testing.B, from, to interface {
	WriteToUDPAddrPort([]byte, netip.AddrPort) (int, error)
	ReadFromUDPAddrPort([]byte) (int, netip.AddrPort, error)
	SetReadDeadline(time.Time) error
}, dst netip.AddrPort, pkt []byte, prog *ebpf.Program) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	must(b, err)
	defer stats.Close()
	var before *ebpf.ProgramStats
	if prog != nil {
		before, err = prog.Stats()
		must(b, err)
	}
	buf := make([]byte, 2048)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := from.WriteToUDPAddrPort(pkt, dst); err != nil {
			b.Fatal(err)
		}
		_ = to.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := to.ReadFromUDPAddrPort(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if prog != nil {
		after, err := prog.Stats()
		must(b, err)
		if n := after.RunCount - before.RunCount; n > 0 {
			b.ReportMetric(float64(after.Runtime-before.Runtime)/float64(n), "prog-ns/datagram")
		}
	}
}
