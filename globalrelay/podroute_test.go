package globalrelay

import (
	"net/netip"
	"testing"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/routecache"
)

// TestPodSealedRoute: a phone call's route entry, sealed by the pod it
// names (wire.md §6), opens the carrier's flow: its RTP is forwarded to
// that pod under the entry's token, with 0 allocations per datagram. A
// relay-sealed tag presented as pod-sealed opens nothing; RTP from another
// address than the entry's is no flow's.
func TestPodSealedRoute(t *testing.T) {
	u := newUnit(t, Config{})
	u.at(0)
	carrier := netip.MustParseAddrPort("198.51.100.7:40000")
	tok := [6]byte{0, 1, 2, 3, 4, 5}
	keys := u.hop.For(0x12)

	forged := routecache.Route{Cluster: 0x12, Pod: 1, Token: tok, Stored: u.stamp()}
	forged.KeyID, forged.Tag = keys.SealRoute(carrier, 0x12, 1, tok, forged.Stored)
	forged.KeyID |= encap.PodSealed
	u.r.RestoreFlow(carrier, forged)
	if n := u.r.Flows(); n != 0 {
		t.Fatalf("a relay tag marked pod-sealed opened %d flows", n)
	}
	if n := counter(t, u.reg, "rtcedge_globalrelay_cache_rejected_total", "", ""); n != 1 {
		t.Fatalf("cache_rejected_total %v, want 1", n)
	}

	rt := routecache.Route{Cluster: 0x12, Pod: 1, Token: tok, Stored: u.stamp()}
	rt.KeyID, rt.Tag = keys.SealPodRoute(carrier, 0x12, 1, tok, rt.Stored)
	u.r.RestoreFlow(carrier, rt)
	rtp := []byte{0x80, 0, 0, 1, 0, 0, 0, 160, 0, 0, 0x12, 0x34, 0xff, 0xff, 0xff, 0xff}
	h, ok := u.send(t, carrier, rtp)
	if !ok || h.Cluster != 0x12 || h.Pod != 1 || h.Token != tok || h.Client != carrier {
		t.Fatalf("the carrier's RTP: forwarded %v with %+v", ok, h)
	}
	if _, ok := u.send(t, netip.MustParseAddrPort("198.51.100.7:40002"), rtp); ok {
		t.Fatal("RTP from another address than the entry's was forwarded")
	}
	copy(u.buf[encap.MaxLen:], rtp)
	if n := testing.AllocsPerRun(200, func() {
		copy(u.buf[encap.MaxLen:], rtp)
		if _, _, ok := u.r.fromClient(u.buf, len(rtp), carrier, u.ingress); !ok {
			t.Fatal("not forwarded")
		}
	}); n != 0 {
		t.Errorf("%v allocations per datagram of a pod-sealed flow", n)
	}
}
