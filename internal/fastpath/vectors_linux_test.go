package fastpath

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
)

// The sealed vectors of docs/wire.md section 2 (hop key 00 01 … 0f as key
// ID 0, payload 00 01 "payload").
const (
	vectorV4    = "5e 20 00 00 1234 0042 0007 a1b2c3d4e5f6 c350 c6336407 0d96 0a010203 fca0b61d785423ea 0001 7061796c6f6164"
	vectorV6    = "5e 27 00 00 0100 0200 0300 000000000000 c350 20010db8000000000000000000000007 0d96 fd000000000000000000000000010002 2f1d1ccba8f1dc93 0001 7061796c6f6164"
	vectorV4TCP = "5e 28 00 00 1234 0042 0007 a1b2c3d4e5f6 c350 c6336407 0d96 0a010203 d9e7b2fdfd433cc5 0001 7061796c6f6164"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The addresses of the vectors, and the rest of a small world around them.
var (
	vClient  = netip.MustParseAddrPort("198.51.100.7:50000")
	vIngress = netip.MustParseAddrPort("10.1.2.3:3478")
	vVIP     = netip.MustParseAddrPort("203.0.113.10:3478")
	vRelay   = netip.MustParseAddrPort("10.9.8.7:7100")
	vPod     = netip.MustParseAddrPort("10.5.0.9:5000")
)

func vectorRing(t testing.TB) *encap.Keyring {
	t.Helper()
	k := make([]byte, encap.KeyLen)
	for i := range k {
		k[i] = byte(i)
	}
	r, err := encap.NewKeyring(0, map[uint8][]byte{0: k})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func vectorHeader() encap.Header {
	return encap.Header{Cluster: 0x1234, Pod: 0x42, POP: 7, Token: [6]byte{0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6},
		Client: vClient, Ingress: vIngress}
}

// vectorGlobal is a global relay's fast path holding the vectors' flow.
func vectorGlobal(t testing.TB, ring *encap.Keyring) *Global {
	t.Helper()
	g, err := NewGlobal()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	must(t, g.AddWorker(vIngress, vVIP, 7))
	must(t, g.SetRelays(map[netip.AddrPort]uint16{vRelay: 0x1234}))
	must(t, g.SetKeys(0x1234, ring, []uint16{0x42}))
	id, key := ring.SealKey(0x42)
	h := vectorHeader()
	h.KeyID = id
	must(t, g.Install(GlobalFlow{Client: vClient, VIP: vVIP, Relay: vRelay, Header: h, Key: key,
		RefreshAt: Monotonic() + 3600e9}))
	return g
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestSealedVectorsGlobal: the program seals a client's datagram with
// exactly wire.md's header (the tag covers the header and the payload's
// length, so a DTLS payload as long as the vector's gets the vector's tag)
// and sends it from the worker's ingress to the cluster relay; a reply
// sealed by internal/encap comes back to the client from the VIP without
// its header.
func TestSealedVectorsGlobal(t *testing.T) {
	n := fptest.NewNet(t)
	n.Neigh(vRelay.Addr())
	n.Neigh(vClient.Addr())
	ring := vectorRing(t)
	g := vectorGlobal(t, ring)
	want := unhex(t, vectorV4)

	dtls := append([]byte{0x16, 0xfe}, "payload"...)
	verdict, out := n.Run(t, g.Program(), fptest.Frame(vClient, vVIP, dtls))
	if verdict != fptest.Redirect {
		t.Fatalf("verdict %d, want redirect; counters %v", verdict, stats(t, &g.progs))
	}
	d, err := fptest.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if d.Src != vIngress || d.Dst != vRelay || d.DstMAC != fptest.NeighMAC(vRelay.Addr()) || d.SrcMAC != fptest.MAC {
		t.Fatalf("sent %v → %v (MAC %x → %x)", d.Src, d.Dst, d.SrcMAC, d.DstMAC)
	}
	if !bytes.Equal(d.Payload[:encap.MinLen], want[:encap.MinLen]) || !bytes.Equal(d.Payload[encap.MinLen:], dtls) {
		t.Fatalf("sealed\n% x\nwant header\n% x", d.Payload, want[:encap.MinLen])
	}
	if s, ok := g.Flow(vClient, vVIP); !ok || s.UpPackets != 1 || s.UpBytes != uint64(len(dtls)) || s.LastSeen == 0 {
		t.Fatalf("flow counters %+v", s)
	}

	// The vector's own payload starts with 0x00: STUN, which is user
	// space's, and goes up untouched.
	in := fptest.Frame(vClient, vVIP, want[encap.MinLen:])
	if verdict, out := n.Run(t, g.Program(), in); verdict != fptest.Pass || !bytes.Equal(out, in) {
		t.Fatalf("STUN: verdict %d, changed %v", verdict, !bytes.Equal(out, in))
	}

	// The return path.
	h := vectorHeader()
	h.ToClient = true
	reply, err := h.AppendTo(nil)
	must(t, err)
	reply = append(reply, dtls...)
	ring.Seal(reply, encap.MinLen)
	verdict, out = n.Run(t, g.Program(), fptest.Frame(vRelay, vIngress, reply))
	if verdict != fptest.Redirect {
		t.Fatalf("reply: verdict %d, want redirect; counters %v", verdict, stats(t, &g.progs))
	}
	if d, err = fptest.Parse(out); err != nil {
		t.Fatal(err)
	}
	if d.Src != vVIP || d.Dst != vClient || !bytes.Equal(d.Payload, dtls) || d.DstMAC != fptest.NeighMAC(vClient.Addr()) {
		t.Fatalf("reply sent %v → %v: % x", d.Src, d.Dst, d.Payload)
	}
	if s, _ := g.Flow(vClient, vVIP); s.DownPackets != 1 || s.DownBytes != uint64(len(dtls)) || s.ReplyRelay != vRelay || s.LastReply == 0 {
		t.Fatalf("flow counters %+v", s)
	}
}

// TestSealedVectorsCluster: the cluster relay's program forwards wire.md's
// v4 vectors to the pod byte for byte (it verifies, never re-seals), and
// passes the v6 one up.
func TestSealedVectorsCluster(t *testing.T) {
	n := fptest.NewNet(t)
	n.Neigh(vPod.Addr())
	c := vectorCluster(t, vectorRing(t))
	for _, v := range []string{vectorV4, vectorV4TCP} {
		pkt := unhex(t, v)
		verdict, out := n.Run(t, c.Program(), fptest.Frame(vIngress, vRelay, pkt))
		if verdict != fptest.Redirect {
			t.Fatalf("verdict %d, want redirect; counters %v", verdict, stats(t, &c.progs))
		}
		d, err := fptest.Parse(out)
		if err != nil {
			t.Fatal(err)
		}
		if d.Src != vRelay || d.Dst != vPod || !bytes.Equal(d.Payload, pkt) {
			t.Fatalf("sent %v → %v: % x", d.Src, d.Dst, d.Payload)
		}
	}
	in := fptest.Frame(vIngress, vRelay, unhex(t, vectorV6))
	if verdict, out := n.Run(t, c.Program(), in); verdict != fptest.Pass || !bytes.Equal(out, in) {
		t.Fatalf("v6 header: verdict %d", verdict)
	}
}

func vectorCluster(t testing.TB, ring *encap.Keyring) *Cluster {
	t.Helper()
	c, err := NewCluster(vRelay, 0x1234)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	must(t, c.SetPods(map[uint16]netip.AddrPort{0x42: vPod}))
	must(t, c.SetKeys(ring, []uint16{0x42}))
	must(t, c.AddIngress(vIngress))
	return c
}

// stats lists the non-zero counters by label.
func stats(t testing.TB, p *progs) map[string]uint64 {
	t.Helper()
	s, err := p.Stats()
	must(t, err)
	out := map[string]uint64{}
	for i, c := range s {
		if c.Packets > 0 {
			out[Reasons[i]] = c.Packets
		}
	}
	return out
}
