package globalrelay

// The kernel fast path against the user-space path: the same datagrams
// must get the same verdicts (a test and a fuzz target).

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
)

// diffRig holds the same relay twice: the Go relay (fromClient and
// toClient called directly, nothing running) and the kernel program, fed
// the same flows as the relay installs them, so that a datagram can be put
// to both.
type diffRig struct {
	r            *Relay
	w            *worker
	fp           *fastpath.Global
	n            *fptest.Net
	vip, ingress netip.AddrPort
	relay        netip.AddrPort
	clients      []netip.AddrPort
	senders      []netip.AddrPort // every source a datagram may come from
	seeds        []diffInput
}

type diffInput struct {
	from    netip.AddrPort
	toVIP   bool // to the public socket (else to the ingress)
	payload []byte
}

func newDiffRig(t testing.TB) *diffRig {
	d := &diffRig{n: fptest.NewNet(t), relay: netip.MustParseAddrPort("10.9.8.7:7100"),
		clients: []netip.AddrPort{netip.MustParseAddrPort("198.51.100.7:50000"), netip.MustParseAddrPort("198.51.100.8:50001"),
			netip.MustParseAddrPort("198.51.100.9:50002")}}
	d.r, _, _ = newTestRelay(t, Config{Directory: NewClusters([]Replica{{Cluster: 0x12, Addr: d.relay}})}, d.relay)
	t.Cleanup(func() { d.r.Close() })
	d.w = &d.r.workers[0]
	d.vip, d.ingress = d.r.PublicAddr(), d.w.ingress
	d.senders = append(append([]netip.AddrPort{}, d.clients...), d.relay, netip.MustParseAddrPort("10.9.8.8:7100"))
	var err error
	if d.fp, err = fastpath.NewGlobal(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.fp.Close() })
	if err := d.fp.AddWorker(d.ingress, d.vip, d.r.cfg.POP); err != nil {
		t.Fatal(err)
	}
	if err := d.fp.SetRelays(map[netip.AddrPort]uint16{d.relay: 0x12}); err != nil {
		t.Fatal(err)
	}
	if err := d.fp.SetKeys(0x12, testHop.For(0x12), []uint16{1, 2}); err != nil {
		t.Fatal(err)
	}
	d.n.Neigh(d.relay.Addr())
	for _, c := range d.clients {
		d.n.Neigh(c.Addr())
	}

	keys := testKeys(t)
	for i, c := range d.clients[:2] {
		ufrag, err := keys.Mint(0x12, uint16(i+1))
		if err != nil {
			t.Fatal(err)
		}
		rtp := append([]byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0xca, 0xfe, 0, byte(i)}, make([]byte, 60)...)
		rtcp := append([]byte{0x81, 200, 0, 6, 0xca, 0xfe, 0, byte(i)}, make([]byte, 20)...)
		dtls := append([]byte{0x17, 0xfe, 0xfd}, make([]byte, 50)...)
		h := encap.Header{ToClient: true, Cluster: 0x12, Pod: uint16(i + 1), POP: d.r.cfg.POP, Client: c, Ingress: d.ingress}
		d.seeds = append(d.seeds,
			diffInput{c, true, bindingRequest(t, ufrag)},
			diffInput{c, true, dtls}, diffInput{c, true, rtp}, diffInput{c, true, rtcp},
			diffInput{d.relay, false, seal(t, h, dtls)}, diffInput{d.relay, false, seal(t, h, rtp)})
	}
	return d
}

// check puts one datagram to both. Whatever the kernel forwards, the Go
// relay must forward too, to the same address and byte for byte; what it
// does not forward it must pass up unchanged. After user space forwarded a
// client's datagram, its flow is installed in the kernel as the relay
// installs it. It returns whether each forwarded.
func (d *diffRig) check(t testing.TB, in diffInput) (kernel, user bool) {
	dst := d.ingress
	if in.toVIP {
		dst = d.vip
	}
	frame := fptest.Frame(in.from, dst, in.payload)
	verdict, out := d.n.Run(t, d.fp.Program(), frame)

	n := len(in.payload)
	var gout []byte
	var gdst, gsrc netip.AddrPort
	var ok bool
	if in.toVIP {
		buf := make([]byte, encap.MaxLen+n)
		copy(buf[encap.MaxLen:], in.payload)
		gout, gdst, ok = d.r.fromClient(buf, n, in.from, d.ingress)
		gsrc = d.ingress
	} else {
		buf := bytes.Clone(in.payload)
		gout, gdst, ok = d.r.toClient(buf, n, in.from)
		gsrc = d.vip
	}
	switch verdict {
	case fptest.Redirect:
		got, err := fptest.Parse(out)
		if err != nil {
			t.Fatalf("forwarded a bad frame: %v", err)
		}
		if !ok {
			t.Fatalf("the kernel forwarded to %v what user space refuses: from %v to %v\n% x", got.Dst, in.from, dst, in.payload)
		}
		if got.Src != gsrc || got.Dst != gdst || !bytes.Equal(got.Payload, gout) {
			t.Fatalf("kernel sent %v → %v\n% x\nuser space %v → %v\n% x", got.Src, got.Dst, got.Payload, gsrc, gdst, gout)
		}
	case fptest.Pass:
		if !bytes.Equal(out, frame) {
			t.Fatalf("passed up a changed frame")
		}
	default:
		t.Fatalf("verdict %d", verdict)
	}
	if ok && in.toVIP {
		if f := d.r.flows.get(in.from); f != nil {
			gf, ok := d.r.kernelFlow(f, in.from, d.vip, d.ingress, gdst, fastpath.Monotonic()+3600e9)
			if ok {
				if err := d.fp.Install(gf); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return verdict == fptest.Redirect, ok
}

func mutate(rng *rand.Rand, b []byte) []byte {
	b = bytes.Clone(b)
	if len(b) == 0 {
		return append(b, byte(rng.Uint32()))
	}
	switch rng.IntN(5) {
	case 0:
		b[rng.IntN(len(b))] ^= 1 << rng.IntN(8)
	case 1:
		b[rng.IntN(min(len(b), encap.MaxLen))] ^= 1 << rng.IntN(8)
	case 2:
		b = b[:rng.IntN(len(b))]
	case 3:
		b = append(b, byte(rng.Uint32()))
	case 4:
		b[0] = byte(rng.Uint32())
	}
	return b
}

// TestFastPathAgrees: the kernel program and the Go relay agree on the
// seeds and on mutations of them from every sender, to either socket; the
// program forwards most of what user space forwards once flows are in.
func TestFastPathAgrees(t *testing.T) {
	d := newDiffRig(t)
	rng := rand.New(rand.NewPCG(3, 4))
	var both, userOnly int
	for i := range 20000 {
		in := d.seeds[i%len(d.seeds)]
		if i >= 4*len(d.seeds) {
			in.payload = mutate(rng, in.payload)
			if rng.IntN(4) == 0 {
				in.from = d.senders[rng.IntN(len(d.senders))]
			}
			if rng.IntN(8) == 0 {
				in.toVIP = !in.toVIP
			}
		}
		k, u := d.check(t, in)
		switch {
		case k:
			both++
		case u:
			userOnly++
		}
	}
	t.Logf("forwarded by both %d, by user space only %d", both, userOnly)
	if both == 0 || both < userOnly {
		t.Fatalf("the kernel forwarded %d of %d datagrams user space forwards", both, both+userOnly)
	}
}

// FuzzFastPathAgrees is TestFastPathAgrees's check on fuzzed datagrams.
func FuzzFastPathAgrees(f *testing.F) {
	d := newDiffRig(f)
	for _, s := range d.seeds {
		for i, from := range d.senders {
			if from == s.from {
				f.Add(s.payload, uint8(i), s.toVIP)
			}
		}
	}
	f.Add(binary.BigEndian.AppendUint32([]byte{0, 1, 0, 0}, stunmsg.MagicCookie), uint8(0), true)
	f.Fuzz(func(t *testing.T, b []byte, from uint8, toVIP bool) {
		if len(b) > encap.MaxPayload && toVIP || len(b) > encap.MaxDatagram {
			return // the socket path drops these before deciding
		}
		d.check(t, diffInput{from: d.senders[int(from)%len(d.senders)], toVIP: toVIP, payload: b})
	})
}
