package globalrelay

// The fast path end to end over a veth pair in a network namespace of the
// test's own.

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
)

// TestFastPathOverVeth: a running relay with fast_path tc, in a namespace
// of its own reached over a veth pair. The client's check goes up and
// opens the flow; the flow's DTLS and media then cross the kernel both
// ways, sealed and verified there, byte for byte what user space would
// send; the counters reach packets_total; and the flow leaves the kernel
// when it expires.
func TestFastPathOverVeth(t *testing.T) {
	for _, offload := range []bool{false, true} {
		t.Run(map[bool]string{false: "checksummed", true: "offload"}[offload], func(t *testing.T) { testFastPathOverVeth(t, offload) })
	}
}

// testFastPathOverVeth runs TestFastPathOverVeth; with offload the
// client's datagrams arrive still to be checksummed (a sender on the same
// host), which the kernel passes up: every datagram still arrives, through
// user space.
func testFastPathOverVeth(t *testing.T, offload bool) {
	p := fptest.NewPairOffload(t, offload)
	pub := p.B.ListenUDP(netip.AddrPortFrom(p.AddrB, 3478))
	in := p.B.ListenUDP(netip.AddrPortFrom(p.AddrB, 4000))
	cluster := p.A.ListenUDP(netip.AddrPortFrom(p.AddrA, 7100))
	client := p.A.ListenUDP(netip.AddrPortFrom(p.AddrA, 50000))
	reg := prometheus.NewRegistry()
	keys := testKeys(t)
	var r *Relay
	if err := p.B.In(func() error {
		var err error
		r, err = New(Config{POP: 9, Keys: keys, Hop: testHop, Logger: quiet, Registerer: reg, FlowIdle: 2 * time.Second,
			Directory: NewClusters([]Replica{{Cluster: 0x12, Addr: addrOf(cluster)}}), FastPath: fastpath.ModeTC},
			[]Worker{{Public: pub, Internal: in}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	ufrag, err := keys.Mint(0x12, 3)
	if err != nil {
		t.Fatal(err)
	}
	send := func(b []byte) {
		t.Helper()
		if _, err := client.WriteToUDPAddrPort(b, addrOf(pub)); err != nil {
			t.Fatal(err)
		}
	}
	// receive reads one datagram at the cluster relay and checks its
	// header as the cluster relay would.
	receive := func(payload []byte) encap.Header {
		t.Helper()
		got, _ := read(t, cluster)
		h, hl, err := encap.Decode(got)
		if err == nil {
			err = testHop.For(0x12).Verify(got, hl)
		}
		if err != nil || !bytes.Equal(got[hl:], payload) {
			t.Fatalf("cluster relay got %v: % x", err, got)
		}
		return h
	}
	check := bindingRequest(t, ufrag)
	send(check)
	first := receive(check)

	const rounds = 5
	for i := range rounds {
		dtls := append([]byte{0x17, 0xfe, 0xfd, byte(i)}, bytes.Repeat([]byte{0x33}, 80)...)
		send(dtls)
		if h := receive(dtls); h != first {
			t.Fatalf("header %+v, user space wrote %+v", h, first)
		}
		h := first
		h.ToClient = true
		reply := seal(t, h, dtls[:40])
		if _, err := cluster.WriteToUDPAddrPort(reply, addrOf(in)); err != nil {
			t.Fatal(err)
		}
		if got, from := read(t, client); !bytes.Equal(got, dtls[:40]) || from != addrOf(pub) {
			t.Fatalf("client got % x from %v", got, from)
		}
	}
	if offload {
		waitCounter(t, reg, "rtcedge_globalrelay_fast_path_packets_total", "verdict", "csum", 2*rounds)
	} else {
		waitCounter(t, reg, "rtcedge_globalrelay_fast_path_packets_total", "verdict", "forward_down", rounds)
		if v := counter(t, reg, "rtcedge_globalrelay_fast_path_packets_total", "verdict", "forward_up"); v < rounds-1 {
			t.Fatalf("the kernel forwarded %v of the client's %d datagrams", v, rounds)
		}
	}
	waitCounter(t, reg, "rtcedge_globalrelay_packets_total", "direction", "to_client", rounds)
	waitCounter(t, reg, "rtcedge_globalrelay_packets_total", "direction", "to_cluster", rounds+1)

	// Idle: the flow expires in user space and leaves the kernel.
	deadline := time.Now().Add(20 * time.Second)
	for r.Flows() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the flow did not expire")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, ok := r.kernel.fp.Flow(addrOf(client), addrOf(pub)); ok {
		t.Fatal("the expired flow is still in the kernel")
	}
}
