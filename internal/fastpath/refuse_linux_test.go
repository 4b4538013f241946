package fastpath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath/fptest"
)

// TestNeverPasses: forged tags, replays, wrong clusters, truncated and
// mangled datagrams, and everything that is user space's, go up unchanged
// from both programs, each counted under its reason, and nothing is
// forwarded.
func TestNeverPasses(t *testing.T) {
	n := fptest.NewNet(t)
	for _, a := range []netip.AddrPort{vRelay, vClient, vPod, vIngress} {
		n.Neigh(a.Addr())
	}
	ring := vectorRing(t)
	g := vectorGlobal(t, ring)
	c := vectorCluster(t, ring)
	cases, good, toPodPkt, dtls := refusals(t, ring)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, prog := &g.progs, g.Program()
			if tc.prog == "cluster" {
				p, prog = &c.progs, c.Program()
			}
			before := stats(t, p)
			verdict, out := n.Run(t, prog, tc.frame)
			if verdict != fptest.Pass || !bytes.Equal(out, tc.frame) {
				t.Fatalf("verdict %d (changed: %v), want it passed up unchanged; counters %v", verdict, !bytes.Equal(out, tc.frame), stats(t, p))
			}
			after := stats(t, p)
			if after[tc.reason] != before[tc.reason]+1 {
				t.Fatalf("counted %v, want one more %q", after, tc.reason)
			}
		})
	}

	// A datagram without a UDP checksum (0) is forwarded without one.
	noSum := fptest.Frame(vRelay, vIngress, good)
	noSum[40], noSum[41] = 0, 0
	if v, out := n.Run(t, g.Program(), noSum); v != fptest.Redirect {
		t.Fatalf("a reply without checksum: verdict %d", v)
	} else if d, err := fptest.Parse(out); err != nil || out[40] != 0 || out[41] != 0 || !bytes.Equal(d.Payload, dtls) {
		t.Fatalf("a reply without checksum: %v, checksum %x%x", err, out[40], out[41])
	}

	// And the datagrams that do pass, to show the world above is right.
	if v, _ := n.Run(t, g.Program(), fptest.Frame(vRelay, vIngress, good)); v != fptest.Redirect {
		t.Fatalf("a good reply: verdict %d", v)
	}
	if v, _ := n.Run(t, c.Program(), fptest.Frame(vIngress, vRelay, toPodPkt)); v != fptest.Redirect {
		t.Fatalf("a good datagram toward the pod: verdict %d", v)
	}
}

// refusal is a datagram a program must pass up, and the reason it counts.
type refusal struct {
	name   string
	prog   string // "global" or "cluster"
	frame  []byte
	reason string
}

// refusals lists TestNeverPasses's datagrams for the vectors' world; good
// is a reply the global relay's program forwards, toPod a datagram the
// cluster relay's forwards, dtls the payload of both.
func refusals(t testing.TB, ring *encap.Keyring) (cases []refusal, good, toPodPkt, dtls []byte) {
	other := netip.MustParseAddrPort("198.51.100.99:40000")

	seal := func(h encap.Header, payload []byte, r *encap.Keyring) []byte {
		b, err := h.AppendTo(nil)
		must(t, err)
		b = append(b, payload...)
		r.Seal(b, encap.MinLen)
		return b
	}
	dtls = append([]byte{0x17, 0xfe, 0xfd}, bytes.Repeat([]byte{0xaa}, 40)...)
	reply := vectorHeader()
	reply.ToClient = true
	toPod := vectorHeader()
	toPod.Client = vClient

	otherKey := make([]byte, encap.KeyLen)
	otherKey[0] = 0x99
	wrongRing, err := encap.NewKeyring(0, map[uint8][]byte{0: otherKey})
	must(t, err)
	unknownID, err := encap.NewKeyring(3, map[uint8][]byte{3: vectorKey()})
	must(t, err)

	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 0x01; return b }
	wrongCluster := toPod
	wrongCluster.Cluster = 0x4321
	otherClient := reply
	otherClient.Client = other
	wrongPOP := reply
	wrongPOP.POP = 8
	tcp := reply
	tcp.TCP = true
	upward := reply
	upward.ToClient = false
	otherIngress := toPod
	otherIngress.Ingress = netip.MustParseAddrPort("10.1.2.4:3478")

	good = seal(reply, dtls, ring)
	cases = []refusal{
		// The global relay, from a client.
		{"unknown client", "global", fptest.Frame(other, vVIP, dtls), "miss"},
		{"STUN", "global", fptest.Frame(vClient, vVIP, []byte{0, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42}), "stun"},
		{"other class", "global", fptest.Frame(vClient, vVIP, []byte{70, 1, 2}), "class"},
		{"empty", "global", fptest.Frame(vClient, vVIP, nil), "empty"},
		{"oversize", "global", fptest.Frame(vClient, vVIP, append([]byte{0x17}, make([]byte, encap.MaxPayload)...)), "oversize"},
		{"RTP of an SSRC not noted", "global", fptest.Frame(vClient, vVIP, rtp(0x11223344)), "ssrc"},
		{"fragment", "global", fragment(fptest.Frame(vClient, vVIP, dtls)), "fragment"},
		{"IP options", "global", options(fptest.Frame(vClient, vVIP, dtls)), "ip_options"},
		{"TCP", "global", proto(fptest.Frame(vClient, vVIP, dtls), 6), "not_udp"},
		{"truncated UDP", "global", truncate(fptest.Frame(vClient, vVIP, dtls), 5), "short"},
		{"bad UDP checksum", "global", corrupt(fptest.Frame(vClient, vVIP, dtls)), "csum"},
		// The global relay, replies.
		{"forged tag", "global", fptest.Frame(vRelay, vIngress, flip(good, encap.MinLen-1)), "tag"},
		{"altered field", "global", fptest.Frame(vRelay, vIngress, flip(good, 17)), "tag"},
		{"longer payload", "global", fptest.Frame(vRelay, vIngress, append(bytes.Clone(good), 0)), "tag"},
		{"truncated payload", "global", fptest.Frame(vRelay, vIngress, good[:len(good)-1]), "tag"},
		{"truncated header", "global", fptest.Frame(vRelay, vIngress, good[:encap.MinLen-1]), "header"},
		{"key of another", "global", fptest.Frame(vRelay, vIngress, seal(reply, dtls, wrongRing)), "tag"},
		{"unknown key ID", "global", fptest.Frame(vRelay, vIngress, seal(reply, dtls, unknownID)), "key"},
		{"replayed to another client", "global", fptest.Frame(vRelay, vIngress, seal(otherClient, dtls, ring)), "miss"},
		{"not from a cluster relay", "global", fptest.Frame(vPod, vIngress, good), "not_from_cluster"},
		{"wrong POP", "global", fptest.Frame(vRelay, vIngress, seal(wrongPOP, dtls, ring)), "pop"},
		{"toward the transceiver", "global", fptest.Frame(vRelay, vIngress, seal(upward, dtls, ring)), "direction"},
		{"TCP client", "global", fptest.Frame(vRelay, vIngress, seal(tcp, dtls, ring)), "tcp"},
		{"reply with a bad UDP checksum", "global", corrupt(fptest.Frame(vRelay, vIngress, good)), "csum"},
		{"empty reply", "global", fptest.Frame(vRelay, vIngress, seal(reply, nil, ring)), "empty"},
		{"probe", "global", fptest.Frame(vRelay, vIngress, append([]byte{encap.ProbeMagic, 0x11}, make([]byte, 22)...)), "probe"},
		{"bundle", "global", fptest.Frame(vRelay, vIngress, append([]byte{encap.BundleMagic, 0x10}, good...)), "bundle"},
		// The cluster relay.
		{"cluster: forged tag", "cluster", fptest.Frame(vIngress, vRelay, flip(seal(toPod, dtls, ring), encap.MinLen-2)), "tag"},
		{"cluster: wrong cluster", "cluster", fptest.Frame(vIngress, vRelay, seal(wrongCluster, dtls, ring)), "wrong_cluster"},
		{"cluster: truncated", "cluster", fptest.Frame(vIngress, vRelay, seal(toPod, dtls, ring)[:50]), "tag"},
		{"cluster: replayed from elsewhere", "cluster", fptest.Frame(other, vRelay, seal(toPod, dtls, ring)), "ingress"},
		{"cluster: ingress named elsewhere", "cluster", fptest.Frame(vIngress, vRelay, seal(otherIngress, dtls, ring)), "ingress"},
		{"cluster: reply not from a pod", "cluster", fptest.Frame(other, vRelay, seal(reply, dtls, ring)), "not_from_pod"},
		{"cluster: not our address", "cluster", fptest.Frame(vIngress, vPod, seal(toPod, dtls, ring)), "not_ours"},
		{"cluster: probe", "cluster", fptest.Frame(vIngress, vRelay, append([]byte{encap.ProbeMagic, 0x10}, make([]byte, 22)...)), "probe"},
	}
	return cases, good, seal(toPod, dtls, ring), dtls
}

// TestMTU: a datagram that would not fit the egress MTU once the header
// is pushed goes up (user space then sends it, or the kernel fragments).
func TestMTU(t *testing.T) {
	n := fptest.NewNet(t)
	n.Neigh(vRelay.Addr())
	g := vectorGlobal(t, vectorRing(t))
	payload := append([]byte{0x17}, make([]byte, 1500-20-8-1)...) // fills a 1500 MTU exactly
	in := fptest.Frame(vClient, vVIP, payload)
	if v, out := n.Run(t, g.Program(), in); v != fptest.Pass || !bytes.Equal(in, out) {
		t.Fatalf("verdict %d, want pass", v)
	}
	if s := stats(t, &g.progs); s["mtu"] != 1 {
		t.Fatalf("counters %v", s)
	}
	n.MTU(1500 + encap.MinLen)
	if v, _ := n.Run(t, g.Program(), in); v != fptest.Redirect {
		t.Fatalf("with room for the header: verdict %d", v)
	}
}

// corrupt changes the frame's last byte, leaving its UDP checksum wrong.
func corrupt(b []byte) []byte {
	b = bytes.Clone(b)
	b[len(b)-1] ^= 0x40
	return b
}

func vectorKey() []byte {
	k := make([]byte, encap.KeyLen)
	for i := range k {
		k[i] = byte(i)
	}
	return k
}

func rtp(ssrc uint32) []byte {
	b := make([]byte, 32)
	b[0], b[1] = 0x80, 111
	binary.BigEndian.PutUint32(b[8:], ssrc)
	return b
}

// The frame mutations below keep the IP checksum right, so that only the
// property named is wrong.

func fragment(b []byte) []byte {
	b = bytes.Clone(b)
	binary.BigEndian.PutUint16(b[20:22], 0x2000) // more fragments
	return fixIP(b)
}

func options(b []byte) []byte {
	out := append(bytes.Clone(b[:34]), 1, 1, 1, 0) // NOP NOP NOP EOL
	out = append(out, b[34:]...)
	out[14] = 0x46
	binary.BigEndian.PutUint16(out[16:18], binary.BigEndian.Uint16(out[16:18])+4)
	return fixIP(out)
}

func proto(b []byte, p byte) []byte {
	b = bytes.Clone(b)
	b[23] = p
	return fixIP(b)
}

// truncate cuts the frame's last k bytes, keeping the lengths it claims.
func truncate(b []byte, k int) []byte { return bytes.Clone(b[:len(b)-k]) }

func fixIP(b []byte) []byte {
	hl := int(b[14]&0x0f) * 4
	b[24], b[25] = 0, 0
	var s uint32
	for i := 14; i < 14+hl; i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	binary.BigEndian.PutUint16(b[24:26], ^uint16(s))
	return b
}
