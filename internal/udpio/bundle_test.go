package udpio

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// encapsulated returns an encapsulated datagram whose client port is
// port and whose payload is payload.
func encapsulated(t testing.TB, port uint16, payload ...byte) []byte {
	t.Helper()
	h := encap.Header{Cluster: 1, Pod: 1, POP: 1, Client: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port),
		Ingress: netip.MustParseAddrPort("127.0.0.1:9")}
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, payload...)
}

// readAll reads datagrams from c until none comes for a moment.
func readAll(t *testing.T, c *net.UDPConn, want int) [][]byte {
	t.Helper()
	var got [][]byte
	for len(got) < want {
		buf := make([]byte, 4096)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("after %d datagrams: %v", len(got), err)
		}
		got = append(got, buf[:n])
	}
	return got
}

// TestForwardBatchBundles: datagrams of one batch to the same destination
// leave as one bundle holding them in order; a destination with one
// datagram gets it as is.
func TestForwardBatchBundles(t *testing.T) {
	conn, client := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	sinks := []*net.UDPConn{listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")}
	// Queue the whole batch before the loop reads: one recvmmsg takes it.
	var sent [][]byte
	for i, dst := range []int{0, 1, 0, 2, 0, 2} {
		d := encapsulated(t, uint16(dst), byte(i))
		sent = append(sent, d)
		if _, err := client.WriteToUDPAddrPort(d, LocalAddrPort(conn)); err != nil {
			t.Fatal(err)
		}
	}
	var bundles, items int
	done := make(chan error, 1)
	go func() {
		done <- ForwardBatch(conn, conn, 0, encap.MaxDatagram, 32, func(buf []byte, n int, _ netip.AddrPort) ([]byte, netip.AddrPort, bool) {
			h, _, err := encap.Decode(buf[:n])
			if err != nil {
				return nil, netip.AddrPort{}, false
			}
			return buf[:n], LocalAddrPort(sinks[h.Client.Port()]), true
		}, Hooks{Bundle: encap.BundleFormat{}, Bundled: func(b, i int) { bundles += b; items += i }})
	}()
	stop := func() { conn.Close(); <-done; done <- nil }
	defer func() { conn.Close(); <-done }()
	want := map[int][][]byte{0: {sent[0], sent[2], sent[4]}, 1: {sent[1]}, 2: {sent[3], sent[5]}}
	for s, items := range want {
		got := readAll(t, sinks[s], 1)[0]
		if len(items) == 1 {
			if !bytes.Equal(got, items[0]) {
				t.Errorf("sink %d: %x, want the lone datagram %x", s, got, items[0])
			}
			continue
		}
		b := encap.StartBundle(nil)
		for _, it := range items {
			b, _ = encap.AddToBundle(b, it)
		}
		if !bytes.Equal(got, b) {
			t.Errorf("sink %d: %x, want the bundle %x", s, got, b)
		}
	}
	stop() // the hooks ran on the loop's goroutine
	if bundles != 2 || items != 5 {
		t.Errorf("Bundled reported %d bundles of %d datagrams, want 2 of 5", bundles, items)
	}
}

// TestForwardBatchUnbundles: each item of a bundle is decided as if it
// had come alone from the bundle's sender; a malformed bundle is dropped
// whole and counted.
func TestForwardBatchUnbundles(t *testing.T) {
	conn, client, sink := listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0"), listenT(t, "127.0.0.1:0")
	items := [][]byte{encapsulated(t, 1, 'a'), encapsulated(t, 2, 'b'), encapsulated(t, 3, 'c')}
	b := encap.StartBundle(nil)
	for _, it := range items {
		b, _ = encap.AddToBundle(b, it)
	}
	bad := append([]byte(nil), b[:len(b)-1]...)
	var badBundles int
	var froms []netip.AddrPort
	done := make(chan error, 1)
	go func() {
		done <- ForwardBatch(conn, conn, 0, encap.MaxDatagram, 32, func(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
			froms = append(froms, from)
			return buf[:n], LocalAddrPort(sink), true
		}, Hooks{Unbundle: encap.BundleFormat{}, BadBundle: func() { badBundles++ }})
	}()
	defer func() { conn.Close(); <-done }()
	for _, d := range [][]byte{bad, b, items[0]} {
		if _, err := client.WriteToUDPAddrPort(d, LocalAddrPort(conn)); err != nil {
			t.Fatal(err)
		}
	}
	got := readAll(t, sink, 4)
	for i, want := range append(items, items[0]) {
		if !bytes.Equal(got[i], want) {
			t.Errorf("datagram %d: %x, want %x", i, got[i], want)
		}
	}
	conn.Close() // the hooks ran on the loop's goroutine
	<-done
	done <- nil
	if badBundles != 1 {
		t.Errorf("%d malformed bundles counted, want 1", badBundles)
	}
	for _, f := range froms {
		if f != LocalAddrPort(client) {
			t.Errorf("an item was decided as from %v, want the bundle's sender %v", f, LocalAddrPort(client))
		}
	}
}
