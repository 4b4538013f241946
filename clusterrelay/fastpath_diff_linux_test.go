package clusterrelay

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
)

// diffRig holds the same relay twice: the Go relay (its decide called
// directly, nothing running) and the kernel program, with the same pods,
// keys and ingresses, so that a datagram can be put to both.
type diffRig struct {
	r     *Relay
	fp    *fastpath.Cluster
	n     *fptest.Net
	from  []netip.AddrPort // the senders datagrams come from
	seeds [][]byte
}

func newDiffRig(t testing.TB) *diffRig {
	pods := map[uint16]netip.AddrPort{1: netip.MustParseAddrPort("10.5.0.1:5000"), 2: netip.MustParseAddrPort("10.5.0.2:5000")}
	ingress := netip.MustParseAddrPort("10.1.2.3:3478")
	stranger := netip.MustParseAddrPort("10.1.2.4:3478")
	// testHop's static key, and ID 9 derived per pod (the deployment authority).
	static := testHop
	ring, err := static.WithMasters(5, 9, map[uint8][]byte{9: bytes.Repeat([]byte{7}, encap.KeyLen)},
		map[uint8][]byte{9: bytes.Repeat([]byte{8}, encap.KeyLen)})
	if err != nil {
		t.Fatal(err)
	}
	conn := listen(t)
	r, err := New(Config{Cluster: 5, Pods: NewPods(pods), Hop: ring, Logger: quiet, Registerer: prometheus.NewRegistry()}, conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	d := &diffRig{r: r, n: fptest.NewNet(t), from: []netip.AddrPort{ingress, pods[1], pods[2], stranger}}
	if d.fp, err = fastpath.NewCluster(r.Addr(), 5); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.fp.Close() })
	if err := d.fp.SetPods(pods); err != nil {
		t.Fatal(err)
	}
	if err := d.fp.SetKeys(ring, []uint16{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	for _, a := range pods {
		d.n.Neigh(a.Addr())
	}
	d.n.Neigh(ingress.Addr())

	rtp := append([]byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef}, make([]byte, 40)...)
	for _, k := range []*encap.Keyring{static, ring} {
		for _, pod := range []uint16{1, 2, 3} {
			h := encap.Header{Cluster: 5, Pod: pod, POP: 1, Token: [6]byte{1, 2, 3, 4, 5, 6},
				Client: netip.MustParseAddrPort("198.51.100.7:40000"), Ingress: ingress}
			d.seeds = append(d.seeds, sealed(t, k, h, rtp))
			h.ToClient = true
			d.seeds = append(d.seeds, sealed(t, k, h, rtp[:20]))
		}
	}
	return d
}

func sealed(t testing.TB, k *encap.Keyring, h encap.Header, payload []byte) []byte {
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, payload...)
	k.Seal(b, h.Len())
	return b
}

// check puts one datagram to both. Whatever the kernel forwards, the Go
// relay must forward too, to the same address and byte for byte; what it
// does not forward it must pass up unchanged. It returns whether each
// forwarded.
func (d *diffRig) check(t testing.TB, from netip.AddrPort, payload []byte) (kernel, user bool) {
	frame := fptest.Frame(from, d.r.Addr(), payload)
	verdict, out := d.n.Run(t, d.fp.Program(), frame)
	buf := make([]byte, len(payload)+encap.MaxLen)
	copy(buf, payload)
	gout, gdst, ok := d.r.decide(buf, len(payload), from)
	switch verdict {
	case fptest.Redirect:
		got, err := fptest.Parse(out)
		if err != nil {
			t.Fatalf("forwarded a bad frame: %v", err)
		}
		if !ok {
			t.Fatalf("the kernel forwarded to %v what user space refuses: from %v\n% x", got.Dst, from, payload)
		}
		if got.Src != d.r.Addr() || got.Dst != gdst || !bytes.Equal(got.Payload, gout) {
			t.Fatalf("kernel sent %v → %v\n% x\nuser space %v\n% x", got.Src, got.Dst, got.Payload, gdst, gout)
		}
	case fptest.Pass:
		if !bytes.Equal(out, frame) {
			t.Fatalf("passed up a changed frame")
		}
	default:
		t.Fatalf("verdict %d", verdict)
	}
	if ok && len(payload) >= encap.MinLen && payload[1]&1 == 0 && !encap.IsProbe(payload) {
		// What the relay does after a datagram toward a pod: the
		// kernel learns the ingress user space just recorded.
		if err := d.fp.AddIngress(from); err != nil {
			t.Fatal(err)
		}
	}
	return verdict == fptest.Redirect, ok
}

// mutate changes b in one of a few ways a forger or a broken link would.
func mutate(rng *rand.Rand, b []byte) []byte {
	b = bytes.Clone(b)
	switch rng.IntN(5) {
	case 0: // one bit anywhere
		i := rng.IntN(len(b))
		b[i] ^= 1 << rng.IntN(8)
	case 1: // one bit in the header
		i := rng.IntN(min(len(b), encap.MaxLen))
		b[i] ^= 1 << rng.IntN(8)
	case 2: // truncated
		b = b[:rng.IntN(len(b))]
	case 3: // extended
		b = append(b, byte(rng.Uint32()))
	case 4: // the payload only (not covered by the tag)
		if len(b) > encap.MinLen {
			i := encap.MinLen + rng.IntN(len(b)-encap.MinLen)
			b[i] = byte(rng.Uint32())
		}
	}
	return b
}

// TestFastPathAgrees: the kernel program and the Go relay agree on the
// seeds and on mutations of them from every sender; the program forwards
// a fair share of what user space forwards.
func TestFastPathAgrees(t *testing.T) {
	d := newDiffRig(t)
	rng := rand.New(rand.NewPCG(1, 2))
	var both, userOnly, kernel int
	for i := range 20000 {
		b := d.seeds[i%len(d.seeds)]
		if i >= 4*len(d.seeds) {
			b = mutate(rng, b)
		}
		k, u := d.check(t, d.from[rng.IntN(len(d.from))], b)
		switch {
		case k:
			both++
			kernel++
		case u:
			userOnly++
		}
	}
	t.Logf("forwarded by both %d, by user space only %d", both, userOnly)
	if both == 0 || kernel < userOnly {
		t.Fatalf("the kernel forwarded %d of %d datagrams user space forwards", both, both+userOnly)
	}
}

// FuzzFastPathAgrees is TestFastPathAgrees's check on fuzzed datagrams.
func FuzzFastPathAgrees(f *testing.F) {
	d := newDiffRig(f)
	for i, s := range d.seeds {
		f.Add(s, uint8(i))
	}
	f.Add(make([]byte, 40), uint8(0))
	f.Add(binary.BigEndian.AppendUint16([]byte{encap.ProbeMagic, 0x10}, 5), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, from uint8) {
		if len(b) > encap.MaxDatagram {
			return // the socket path drops these before deciding
		}
		d.check(t, d.from[int(from)%len(d.from)], b)
	})
}
