package clusterrelay

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func listen(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

func read(t *testing.T, c *net.UDPConn) []byte {
	t.Helper()
	buf := make([]byte, 2048)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return buf[:n]
}

func drops(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "rtcedge_clusterrelay_dropped_packets_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestForwardAndDrop: datagrams toward a pod go to the pod the header
// names, replies go to the ingress the header names — but only from that
// pod; everything else is dropped and counted, never sent anywhere.
func TestForwardAndDrop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		batch int
		cpus  []int
	}{{"batch-0", 0, nil}, {"batch-32", 32, nil}, {"batch-32-pinned", 32, []int{0}}} {
		t.Run(tc.name, func(t *testing.T) { testForwardAndDrop(t, tc.batch, tc.cpus) })
	}
}

func testForwardAndDrop(t *testing.T, batch int, cpus []int) {
	pod1, pod2, ingress, stranger := listen(t), listen(t), listen(t), listen(t)
	reg := prometheus.NewRegistry()
	conn := listen(t)
	r, err := New(Config{Cluster: 5, Pods: NewPods(map[uint16]netip.AddrPort{1: addrOf(pod1), 2: addrOf(pod2)}),
		Batch: batch, CPUs: cpus, Logger: quiet, Registerer: reg}, conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	relay := r.Addr()
	client := netip.MustParseAddrPort("198.51.100.7:40000")

	pkt := func(h encap.Header, payload string) []byte {
		b, err := h.AppendTo(nil)
		if err != nil {
			t.Fatal(err)
		}
		return append(b, payload...)
	}
	toPod := func(pod uint16) encap.Header {
		return encap.Header{Cluster: 5, Pod: pod, POP: 1, Client: client, Ingress: addrOf(ingress)}
	}
	toClient := func(pod uint16) encap.Header {
		h := toPod(pod)
		h.ToClient = true
		return h
	}

	// Bad ones first, each followed by a good one on the same path.
	bad := []struct {
		name   string
		from   *net.UDPConn
		pkt    []byte
		reason string
		// the good datagram that must arrive first at check
		good  []byte
		check *net.UDPConn
	}{
		{"garbage", stranger, []byte("garbage"), "encap_magic", pkt(toPod(2), "g1"), pod2},
		{"truncated header", stranger, pkt(toPod(2), "")[:10], "encap_short", pkt(toPod(2), "g2"), pod2},
		{"wrong cluster", ingress, pkt(encap.Header{Cluster: 6, Pod: 2, POP: 1, Client: client, Ingress: addrOf(ingress)}, "x"), DropWrongCluster, pkt(toPod(2), "g3"), pod2},
		{"unknown pod", ingress, pkt(toPod(3), "x"), DropUnknownPod, pkt(toPod(2), "g4"), pod2},
		{"empty payload", ingress, pkt(toPod(2), ""), DropEmpty, pkt(toPod(2), "g5"), pod2},
		{"ingress is not the sender", stranger, pkt(toPod(2), "steer replies to a victim"), DropIngress, pkt(toPod(2), "g8"), pod2},
		{"reply from a stranger", stranger, pkt(toClient(1), "reflect me"), DropNotFromPod, pkt(toClient(1), "g6"), ingress},
		{"reply in another pod's name", pod2, pkt(toClient(1), "x"), DropPodMismatch, pkt(toClient(2), "g7"), ingress},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			before := drops(t, reg, tc.reason)
			tc.from.WriteToUDPAddrPort(tc.pkt, relay)
			sender := ingress // toward a pod, good datagrams come from the ingress they name
			if tc.check == ingress {
				// good replies must come from the pod they name
				h, _, _ := encap.Decode(tc.good)
				if h.Pod == 1 {
					sender = pod1
				} else {
					sender = pod2
				}
			}
			sender.WriteToUDPAddrPort(tc.good, relay)
			if got := read(t, tc.check); !bytes.Equal(got, tc.good) {
				t.Fatalf("first datagram through was %q, want the good one unchanged", got)
			}
			if after := drops(t, reg, tc.reason); after != before+1 {
				t.Errorf("drops{reason=%q} %v → %v, want +1", tc.reason, before, after)
			}
		})
	}
}

// TestNoPerFlowState shows the relay is stateless per flow: the same
// datagrams give the same decisions in any order and from a fresh replica,
// and the Relay type holds nothing keyed by client.
func TestNoPerFlowState(t *testing.T) {
	pods := NewPods(map[uint16]netip.AddrPort{1: netip.MustParseAddrPort("127.0.0.1:7001")})
	mk := func() *Relay {
		r, err := New(Config{Cluster: 5, Pods: pods, Logger: quiet}, listen(t))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := mk(), mk()
	h := encap.Header{Cluster: 5, Pod: 1, POP: 1, Client: netip.MustParseAddrPort("198.51.100.7:1"), Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	p, _ := h.AppendTo(nil)
	p = append(p, 'x')
	from := h.Ingress // a global relay sends from the ingress it names
	_, d1, ok1 := a.decide(p, len(p), from)
	_, d2, ok2 := b.decide(p, len(p), from) // a replica that never saw the flow
	if !ok1 || !ok2 || d1 != d2 {
		t.Fatalf("replicas disagree: %v/%v vs %v/%v", d1, ok1, d2, ok2)
	}
	if allocs := testing.AllocsPerRun(1000, func() { a.decide(p, len(p), from) }); allocs != 0 {
		t.Errorf("decide allocates %v per packet, want 0", allocs)
	}
}

func BenchmarkDecide(b *testing.B) {
	r, err := New(Config{Cluster: 5, Pods: NewPods(map[uint16]netip.AddrPort{1: netip.MustParseAddrPort("127.0.0.1:7001")}),
		Logger: quiet, Registerer: prometheus.NewRegistry()}, listen(b))
	if err != nil {
		b.Fatal(err)
	}
	h := encap.Header{Cluster: 5, Pod: 1, POP: 1, Client: netip.MustParseAddrPort("198.51.100.7:1"), Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	p, _ := h.AppendTo(nil)
	p = append(p, make([]byte, 120)...)
	from := h.Ingress
	b.ReportAllocs()
	for b.Loop() {
		r.decide(p, len(p), from)
	}
}

func TestAggregateIgnoresFullAndDrainingPods(t *testing.T) {
	d := NewDirectory()
	d.SetPods([]PodInfo{
		{ID: 1, API: "http://a", Load: 500, Capacity: 500},                 // full
		{ID: 2, API: "http://b", Load: 10, Capacity: 500},                  // ready
		{ID: 3, API: "http://c", Load: 100, Capacity: 500, Draining: true}, // draining
	})
	load, capacity, ready := d.Aggregate()
	if load != 10 || capacity != 500 || ready != 1 {
		t.Fatalf("Aggregate = %d/%d with %d ready, want 10/500 with 1", load, capacity, ready)
	}
}

func TestPickPods(t *testing.T) {
	pods := []PodInfo{
		{ID: 1, API: "a", Load: 90, Capacity: 100},
		{ID: 2, API: "b", Load: 10, Capacity: 100},
		{ID: 3, API: "c", Load: 100, Capacity: 100}, // full
		{ID: 4, API: "d", Draining: true, Capacity: 100},
	}
	first := map[uint16]int{}
	for range 200 {
		got := pickPods(pods, 2)
		if len(got) != 2 {
			t.Fatalf("picked %d pods, want 2", len(got))
		}
		for _, p := range got {
			if p.ID == 3 || p.ID == 4 {
				t.Fatalf("picked pod %d, which is not ready", p.ID)
			}
		}
		first[got[0].ID]++
	}
	// With two ready pods, both are always picked and the less loaded
	// goes first.
	if first[2] != 200 {
		t.Errorf("less loaded pod first %d of 200 times", first[2])
	}
}
