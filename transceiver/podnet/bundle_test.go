package podnet

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// TestTiersBundles: a bundle from a global relay's ingress reaches the pod
// through a bundling cluster relay, and every item comes out of the pod's
// POP conn as its own datagram, from its own client; replies find their
// way back to that ingress, bundled or not. A malformed bundle is dropped
// and counted at the cluster relay.
func TestTiersBundles(t *testing.T) {
	tr := startTiersBatch(t, 32, true)
	ingress := udp4(t) // plays a global relay worker's internal socket
	defer ingress.Close()
	clients := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:1000"), netip.MustParseAddrPort("192.0.2.2:2000"), netip.MustParseAddrPort("192.0.2.3:3000")}
	for _, c := range clients {
		tr.mapClient(c) // as if each had sent the session a check
	}
	b := encap.StartBundle(nil)
	var payloads [][]byte
	for i, c := range clients {
		h := encap.Header{Cluster: 7, Pod: 3, POP: 1, Client: c, Ingress: ingress.LocalAddr().(*net.UDPAddr).AddrPort()}
		d, _ := h.AppendTo(nil)
		hl := len(d)
		p := []byte{0x80, byte(i), 0xaa, 0xbb}
		payloads = append(payloads, p)
		d = append(d, p...)
		testHop.Seal(d, hl)
		b, _ = encap.AddToBundle(b, d)
	}
	for _, d := range [][]byte{b[:len(b)-1], b} {
		if _, err := ingress.WriteToUDPAddrPort(d, tr.cr.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 2048)
	for i, c := range clients {
		_ = tr.session.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := tr.session.ReadFromAddrPort(buf)
		if err != nil || from != c || !bytes.Equal(buf[:n], payloads[i]) {
			t.Fatalf("item %d: %x from %v (%v), want %x from %v", i, buf[:n], from, err, payloads[i], c)
		}
	}
	// Replies: each client's goes back toward the ingress (once Pion would
	// have authenticated the client's check and the client answered the
	// pod's probe: authenticated stands in for both).
	for i, c := range clients {
		tr.authenticated(c)
		if _, err := tr.pc.write([]byte{0x80, byte(i)}, c, "feed"); err != nil {
			t.Fatal(err)
		}
	}
	got := map[netip.AddrPort]bool{}
	for len(got) < len(clients) {
		_ = ingress.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := ingress.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("replies: got %d of %d: %v", len(got), len(clients), err)
		}
		dgrams := [][]byte{buf[:n]}
		if encap.IsBundle(buf[:n]) {
			dgrams = nil
			for off := encap.BundleHeaderLen; off < n; {
				var it []byte
				it, off = encap.NextItem(buf[:n], off)
				dgrams = append(dgrams, it)
			}
		}
		for _, d := range dgrams {
			h, _, err := encap.Decode(d)
			if err != nil || !h.ToClient {
				t.Fatalf("reply %x: %v", d, err)
			}
			got[h.Client] = true
		}
	}
	if v := metricValue(t, tr.crReg, "rtcedge_clusterrelay_dropped_packets_total", "encap_bundle"); v != 1 {
		t.Errorf("cluster relay counted %v malformed bundles, want 1", v)
	}
}
