package globalrelay

// Tests of bundling toward cluster relays: many datagrams in one.

import (
	"bytes"
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// TestBundlesToCluster: with Bundle on, the datagrams of one receive batch
// for the same cluster relay leave as one bundle, in order, each item the
// datagram the relay would have sent alone; replies in a bundle reach the
// client one by one, and a malformed bundle is dropped and counted.
func TestBundlesToCluster(t *testing.T) {
	reg := prometheus.NewRegistry()
	cluster, client, pub, in := listen(t), listen(t), listen(t), listen(t)
	defer cluster.Close()
	defer client.Close()
	keys := testKeys(t)
	relay, err := New(Config{POP: 9, Keys: keys, Hop: testHop, Directory: NewClusters([]Replica{{Cluster: 0x12, Addr: addrOf(cluster)}}),
		Tuning: udpio.Tuning{Batch: 32, Bundle: true}, Logger: quiet, Registerer: reg}, []Worker{{Public: pub, Internal: in}})
	if err != nil {
		t.Fatal(err)
	}
	ufrag, _ := keys.Mint(0x12, 0x42)
	check := bindingRequest(t, ufrag)
	media := [][]byte{{0x80, 1, 2, 3}, {0x80, 4, 5, 6}}
	// Queued before the relay reads: one recvmmsg takes all three, the
	// check makes the flow and the media follow it.
	for _, d := range append([][]byte{check}, media...) {
		if _, err := client.WriteToUDPAddrPort(d, addrOf(pub)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	got, _ := read(t, cluster)
	if _, err := encap.CheckBundle(got); err != nil {
		t.Fatalf("the cluster relay got %x, want one bundle: %v", got, err)
	}
	var items [][]byte
	for off := encap.BundleHeaderLen; off < len(got); {
		var it []byte
		it, off = encap.NextItem(got, off)
		items = append(items, it)
	}
	sent := append([][]byte{check}, media...)
	if len(items) != len(sent) {
		t.Fatalf("bundle of %d items, want %d", len(items), len(sent))
	}
	var h encap.Header
	for i, payload := range sent {
		var hl int
		var err error
		h, hl, err = encap.Decode(items[i])
		if err != nil || testHop.For(0x12).Verify(items[i], hl) != nil {
			t.Fatalf("item %d: %v", i, err)
		}
		if h.Cluster != 0x12 || h.Pod != 0x42 || h.POP != 9 || h.Client != addrOf(client) || h.Ingress != addrOf(in) || !bytes.Equal(items[i][hl:], payload) {
			t.Fatalf("item %d: %+v + %x, want the flow's header + %x", i, h, items[i][hl:], payload)
		}
	}
	if v := counter(t, reg, "rtcedge_globalrelay_bundled_packets_total", "", ""); v != 3 {
		t.Errorf("bundled_packets_total = %v, want 3", v)
	}

	// Replies bundled by the cluster relay.
	h.ToClient = true
	replies := encap.StartBundle(nil)
	for _, p := range []string{"r1", "r2"} {
		replies, _ = encap.AddToBundle(replies, seal(t, h, []byte(p)))
	}
	bad := replies[:len(replies)-1]
	for _, d := range [][]byte{bad, replies} {
		if _, err := cluster.WriteToUDPAddrPort(d, addrOf(in)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"r1", "r2"} {
		if b, _ := read(t, client); string(b) != want {
			t.Fatalf("client got %q, want %q", b, want)
		}
	}
	if v := counter(t, reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "encap_bundle"); v != 1 {
		t.Errorf("encap_bundle drops = %v, want 1", v)
	}
}
