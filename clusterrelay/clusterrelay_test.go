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
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testHop is cluster 5's inter-tier key.
var testHop = func() *encap.Keyring {
	k, err := encap.NewKeyring(2, map[uint8][]byte{2: bytes.Repeat([]byte{5}, encap.KeyLen)})
	if err != nil {
		panic(err)
	}
	return k
}()

// seal returns h and payload as a datagram sealed with k.
func seal(t testing.TB, k *encap.Keyring, h encap.Header, payload string) []byte {
	t.Helper()
	b := unsealed(t, h, payload)
	k.Seal(b, h.Len())
	return b
}

// unsealed returns h and payload with a zero tag, as a forger without the
// key would send it.
func unsealed(t testing.TB, h encap.Header, payload string) []byte {
	t.Helper()
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, payload...)
}

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
		loop  bool
	}{{"batch-0", 0, nil, false}, {"batch-32", 32, nil, false}, {"batch-32-pinned", 32, []int{0}, false},
		{"event-loop", 32, nil, true}, {"event-loop-pinned", 32, []int{0}, true}} {
		t.Run(tc.name, func(t *testing.T) {
			testForwardAndDrop(t, loopback, udpio.Tuning{Batch: tc.batch, CPUs: tc.cpus, EventLoop: &tc.loop})
		})
	}
}

// testNet is where a test's sockets live: loopback, or two network
// namespaces joined by a veth pair with the relay's fast path attached
// (vethNet, fastpath_suite_linux_test.go), so that the same tests show the
// same behaviour with the datagrams forwarded by the kernel.
type testNet struct {
	peer  func(testing.TB) *net.UDPConn // a pod's, an ingress's or an attacker's socket
	relay func(testing.TB) *net.UDPConn // the relay's socket
	in    func(func() error) error      // runs New where the relay's socket is
	addr  netip.Addr                    // the relay's socket's address
	fast  fastpath.Mode
	// done, if set, checks the relay once the test is over, before it
	// stops (that the kernel took part).
	done func(*testing.T, *Relay)
}

// loopback is the testNet of the package's tests: every socket on
// 127.0.0.1, where the fast path never attaches.
var loopback = testNet{peer: listen, relay: listen, in: func(f func() error) error { return f() },
	addr: netip.MustParseAddr("127.0.0.1"), fast: fastpath.ModeOff}

// start builds a relay on n from cfg and runs it until the test ends.
func (n testNet) start(t *testing.T, cfg Config) *Relay {
	t.Helper()
	conn := n.relay(t)
	cfg.FastPath = n.fast
	var r *Relay
	if err := n.in(func() (err error) { r, err = New(cfg, conn); return err }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if n.done != nil {
		t.Cleanup(func() { n.done(t, r) }) // before the relay stops
	}
	return r
}

func testForwardAndDrop(t *testing.T, n testNet, tuning udpio.Tuning) {
	pod1, pod2, ingress, stranger := n.peer(t), n.peer(t), n.peer(t), n.peer(t)
	reg := prometheus.NewRegistry()
	r := n.start(t, Config{Cluster: 5, Pods: NewPods(map[uint16]netip.AddrPort{1: addrOf(pod1), 2: addrOf(pod2)}),
		Hop: testHop, Tuning: tuning, Logger: quiet, Registerer: reg})
	relay := r.Addr()
	client := netip.MustParseAddrPort("198.51.100.7:40000")

	pkt := func(h encap.Header, payload string) []byte { return seal(t, testHop, h, payload) }
	other, _ := encap.NewKeyring(2, map[uint8][]byte{2: bytes.Repeat([]byte{6}, encap.KeyLen)})
	retired, _ := encap.NewKeyring(4, map[uint8][]byte{4: bytes.Repeat([]byte{5}, encap.KeyLen)})
	// A host on the cluster network without the key forges a header that
	// names a victim client and itself as ingress: the ingress check
	// alone would pass it, and the pod would send the victim's downlink
	// to the forger.
	// The key ID is no secret: the forger uses the real one.
	forged := encap.Header{KeyID: 2, Cluster: 5, Pod: 2, POP: 1, Client: client, Ingress: addrOf(stranger)}

	toPod := func(pod uint16) encap.Header {
		return encap.Header{Cluster: 5, Pod: pod, POP: 1, Client: client, Ingress: addrOf(ingress)}
	}
	toClient := func(pod uint16) encap.Header {
		h := toPod(pod)
		h.ToClient = true
		return h
	}

	forgedReply := toClient(1)
	forgedReply.KeyID = 2
	// A pod (a compromised one holds the hop key) names as ingress an
	// address no global relay sent from.
	toStranger := toClient(1)
	toStranger.Ingress = addrOf(stranger)

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
		{"forged header naming itself as ingress", stranger, unsealed(t, forged, "hijack"), "encap_mac", pkt(toPod(2), "g9"), pod2},
		{"header sealed with another cluster's key", stranger, seal(t, other, forged, "hijack"), "encap_mac", pkt(toPod(2), "g10"), pod2},
		{"header sealed with an unknown key ID", stranger, seal(t, retired, forged, "hijack"), "encap_unknown_key", pkt(toPod(2), "g11"), pod2},
		{"forged reply", stranger, unsealed(t, forgedReply, "reflect"), "encap_mac", pkt(toClient(1), "g12"), ingress},
		{"payload extended after sealing", ingress, append(pkt(toPod(2), "x"), 'y'), "encap_mac", pkt(toPod(2), "g13"), pod2},
		{"truncated header", stranger, pkt(toPod(2), "")[:10], "encap_short", pkt(toPod(2), "g2"), pod2},
		{"wrong cluster", ingress, pkt(encap.Header{Cluster: 6, Pod: 2, POP: 1, Client: client, Ingress: addrOf(ingress)}, "x"), dropLabels[dropWrongCluster], pkt(toPod(2), "g3"), pod2},
		{"unknown pod", ingress, pkt(toPod(3), "x"), dropLabels[dropUnknownPod], pkt(toPod(2), "g4"), pod2},
		{"empty payload", ingress, pkt(toPod(2), ""), dropLabels[dropEmpty], pkt(toPod(2), "g5"), pod2},
		{"ingress is not the sender", stranger, pkt(toPod(2), "steer replies to a victim"), dropLabels[dropIngress], pkt(toPod(2), "g8"), pod2},
		{"reply from a stranger", stranger, pkt(toClient(1), "reflect me"), dropLabels[dropNotFromPod], pkt(toClient(1), "g6"), ingress},
		{"reply in another pod's name", pod2, pkt(toClient(1), "x"), dropLabels[dropPodMismatch], pkt(toClient(2), "g7"), ingress},
		{"reply toward an address no global relay sent from", pod1, pkt(toStranger, "forward me anywhere"), dropLabels[dropUnknownIngress], pkt(toClient(1), "g14"), ingress},
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
			// With the fast path on, the good datagram crosses the kernel
			// and may overtake the bad one, which goes up: await its drop
			// (dropped, so sent nowhere), then count it.
			awaitDrops(t, reg, tc.reason, before+1)
			if after := drops(t, reg, tc.reason); after != before+1 {
				t.Errorf("drops{reason=%q} %v → %v, want +1", tc.reason, before, after)
			}
		})
	}
}

// awaitDrops waits until drops{reason} reaches want.
func awaitDrops(t *testing.T, reg *prometheus.Registry, reason string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for drops(t, reg, reason) < want {
		if time.Now().After(deadline) {
			t.Fatalf("drops{reason=%q} = %v after 5 s, want %v", reason, drops(t, reg, reason), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNoPerFlowState shows the relay is stateless per flow: the same
// datagrams give the same decisions in any order and from a fresh replica,
// and the Relay type holds nothing keyed by client.
func TestNoPerFlowState(t *testing.T) {
	pods := NewPods(map[uint16]netip.AddrPort{1: netip.MustParseAddrPort("127.0.0.1:7001")})
	mk := func() *Relay {
		r, err := New(Config{Cluster: 5, Pods: pods, Hop: testHop, Logger: quiet}, listen(t))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := mk(), mk()
	h := encap.Header{Cluster: 5, Pod: 1, POP: 1, Client: netip.MustParseAddrPort("198.51.100.7:1"), Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	p := seal(t, testHop, h, "x")
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

// BenchmarkDecide is the per-packet decision for a 120-byte datagram
// toward a pod: "authenticated" is the relay as built (decode, MAC check,
// route); "baseline-unauthenticated" is the same run's decode and route
// without the MAC check, the relay before inter-tier authentication.
func BenchmarkDecide(b *testing.B) {
	r, err := New(Config{Cluster: 5, Pods: NewPods(map[uint16]netip.AddrPort{1: netip.MustParseAddrPort("127.0.0.1:7001")}),
		Hop: testHop, Logger: quiet, Registerer: prometheus.NewRegistry()}, listen(b))
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	h := encap.Header{Cluster: 5, Pod: 1, POP: 1, Client: netip.MustParseAddrPort("198.51.100.7:1"), Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	p := seal(b, testHop, h, string(make([]byte, 120)))
	from := h.Ingress
	b.Run("authenticated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, ok := r.decide(p, len(p), from); !ok {
				b.Fatal("dropped")
			}
		}
	})
	// The same with the deployment authority: the relay derives the
	// header's pod's key (cached after the first datagram) and the pod
	// sealed with its own.
	sec := testAuthority(b, 5)
	derived, err := sec.HopKeyring(5, nil)
	if err != nil {
		b.Fatal(err)
	}
	podKeys, _ := sec.Pod(5, 1)
	podHop, err := encap.ParseClusterKeys(podKeys.Hop)
	if err != nil {
		b.Fatal(err)
	}
	pd := seal(b, podHop.For(5), h, string(make([]byte, 120)))
	b.Run("authenticated-per-pod-key", func(b *testing.B) {
		r.SetHopKeys(derived)
		defer r.SetHopKeys(testHop)
		b.ReportAllocs()
		for b.Loop() {
			if _, _, ok := r.decide(pd, len(pd), from); !ok {
				b.Fatal("dropped")
			}
		}
	})
	b.Run("baseline-unauthenticated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h, hl, err := encap.Decode(p)
			if err != nil || h.Cluster != 5 {
				b.Fatal("decode")
			}
			if _, _, ok := r.route(p, h, hl, from); !ok {
				b.Fatal("dropped")
			}
		}
	})
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
		got := newPlacer(0, 0, time.Now).pick(pods, 2)
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

// TestPodIDClaimedTwice: every member of the cluster pool holds its key, a
// compromised pod too. A second member claiming a live pod's ID must not
// take that pod's calls (the last claim used to win); the ID stays with the
// member that held it, and an ID whose holder is not among its claimants
// goes to nobody until one claim is left.
func TestPodIDClaimedTwice(t *testing.T) {
	pod := func(name string, id uint16, data string) membership.Member {
		return membership.Member{Name: name, State: membership.StateAlive, Meta: membership.Meta{
			Role: membership.RoleTransceiver, Cluster: 3, Pod: id, Data: netip.MustParseAddrPort(data)}}
	}
	victim, other := pod("transceiver-4", 5, "10.0.0.5:7000"), pod("transceiver-5", 6, "10.0.0.6:7000")
	evil := pod("zzz-evil", 5, "10.6.6.6:7000") // sorts last, as the attacker chose
	holders := map[uint16]string{}
	podInfos([]membership.Member{victim, other}, 3, holders)
	infos, refused := podInfos([]membership.Member{victim, other, evil}, 3, holders)
	if len(infos) != 2 || infos[0].Data != victim.Meta.Data || len(refused) != 1 || refused[0].Name != "zzz-evil" {
		t.Fatalf("directory %+v, refused %v: want pod 5 kept at the victim's address and the newcomer refused", infos, refused)
	}
	// Two claimants for an ID neither held before: nobody gets it.
	infos, refused = podInfos([]membership.Member{pod("a", 9, "10.0.0.9:7000"), pod("b", 9, "10.6.6.9:7000")}, 3, map[uint16]string{})
	if len(infos) != 0 || len(refused) != 2 {
		t.Errorf("an ID claimed twice at once: directory %+v, %d refused; want none and both", infos, len(refused))
	}
	// The victim leaves: its ID is free, and the one claim left gets it.
	infos, _ = podInfos([]membership.Member{other, evil}, 3, holders)
	if len(infos) != 2 || infos[0].Data != evil.Meta.Data {
		t.Errorf("after the holder left, directory %+v, want the remaining claim", infos)
	}
}

// TestProbeAnsweredOnlyWhenAuthentic: a global relay's probe, sealed from
// its socket to this relay's advertised address, is answered to that
// socket, as long as the probe and nothing more; a probe without the key,
// under a retired key, for another cluster, replayed from another source,
// meant for another relay, or an answer sent back as a probe gets nothing
// sent anywhere and is counted.
func TestProbeAnsweredOnlyWhenAuthentic(t *testing.T) {
	testProbeAnsweredOnlyWhenAuthentic(t, loopback)
}

func testProbeAnsweredOnlyWhenAuthentic(t *testing.T, n testNet) {
	ingress, stranger := n.peer(t), n.peer(t)
	reg := prometheus.NewRegistry()
	advertised := netip.AddrPortFrom(n.addr, 7100) // what gossip announces, not the socket
	r := n.start(t, Config{Cluster: 5, Pods: NewPods(nil), Hop: testHop, Advertise: advertised, Logger: quiet, Registerer: reg})

	nonce := uint64(0)
	probe := func(k *encap.Keyring, cluster uint16, from *net.UDPConn, to netip.AddrPort) []byte {
		nonce++
		return k.SealProbe(make([]byte, encap.ProbeLen), cluster, nonce, addrOf(from), to)
	}
	other, _ := encap.NewKeyring(2, map[uint8][]byte{2: bytes.Repeat([]byte{6}, encap.KeyLen)})
	retired, _ := encap.NewKeyring(4, map[uint8][]byte{4: bytes.Repeat([]byte{5}, encap.KeyLen)})
	answered := probe(testHop, 5, ingress, advertised)
	if err := testHop.AnswerProbe(answered, addrOf(ingress), advertised); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		from   *net.UDPConn
		pkt    []byte
		reason string
	}{
		{"sealed without the key", stranger, probe(other, 5, stranger, advertised), "encap_mac"},
		{"sealed with a retired key ID", stranger, probe(retired, 5, stranger, advertised), "encap_unknown_key"},
		{"another cluster", ingress, probe(testHop, 6, ingress, advertised), dropLabels[dropWrongCluster]},
		{"replayed from another source", stranger, probe(testHop, 5, ingress, advertised), "encap_mac"},
		{"meant for another relay", ingress, probe(testHop, 5, ingress, r.Addr()), "encap_mac"},
		{"an answer sent back as a probe", ingress, answered, "encap_reserved"},
		{"truncated", ingress, probe(testHop, 5, ingress, advertised)[:encap.ProbeLen-1], "encap_short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := drops(t, reg, tc.reason)
			tc.from.WriteToUDPAddrPort(tc.pkt, r.Addr())
			// A good probe from the same socket: its answer must be the
			// first datagram there.
			good := probe(testHop, 5, tc.from, advertised)
			tc.from.WriteToUDPAddrPort(good, r.Addr())
			got := read(t, tc.from)
			if n, err := testHop.OpenProbeAnswer(got, addrOf(tc.from), advertised); err != nil || n != nonce {
				t.Fatalf("first datagram back: %x (%v, nonce %d), want the answer to nonce %d", got, err, n, nonce)
			}
			if len(got) != len(good) {
				t.Errorf("answer of %d bytes to a probe of %d", len(got), len(good))
			}
			if after := drops(t, reg, tc.reason); after != before+1 {
				t.Errorf("drops{reason=%q} %v → %v, want +1", tc.reason, before, after)
			}
		})
	}
}
