package encap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

var (
	probeIngress = netip.MustParseAddrPort("10.1.2.3:3478")
	probeRelay   = netip.MustParseAddrPort("10.9.8.7:7100")
)

// TestProbeVectors: the exact bytes of a probe and its answer under hop
// key 00 01 … 0f as key ID 0 (static), cluster 0x1234, nonce
// 0102030405060708, from 10.1.2.3:3478 to the relay at 10.9.8.7:7100
// (docs/wire.md repeats them).
func TestProbeVectors(t *testing.T) {
	k := testRing(t, 0, 0)
	probe := k.SealProbe(make([]byte, 64), 0x1234, 0x0102030405060708, probeIngress, probeRelay)
	if want := unhex(t, "5c 10 00 00 1234 0000 0102030405060708 ee838084629e8729"); !bytes.Equal(probe, want) {
		t.Errorf("probe\n%x\nwant\n%x", probe, want)
	}
	if err := k.AnswerProbe(probe, probeIngress, probeRelay); err != nil {
		t.Fatal(err)
	}
	if want := unhex(t, "5c 11 00 00 1234 0000 0102030405060708 391ab1eacbdce43c"); !bytes.Equal(probe, want) {
		t.Errorf("answer\n%x\nwant\n%x", probe, want)
	}
	if n, err := k.OpenProbeAnswer(probe, probeIngress, probeRelay); err != nil || n != 0x0102030405060708 {
		t.Errorf("OpenProbeAnswer = %x, %v", n, err)
	}
	if !IsProbe(probe) || IsBundle(probe) || ProbeCluster(probe) != 0x1234 {
		t.Error("a probe not told apart by its first byte")
	}
}

// TestProbeRejectsEveryChange: a probe verifies only as a probe, between
// the ingress and the relay it names; an answer only as an answer; any
// bit flipped, any length changed, another key, another address on
// either side, and it fails — and a failed AnswerProbe leaves the bytes
// as they were (nothing to send).
func TestProbeRejectsEveryChange(t *testing.T) {
	k := testRing(t, 0, 0)
	probe := k.SealProbe(make([]byte, ProbeLen), 0x1234, 99, probeIngress, probeRelay)
	answer := bytes.Clone(probe)
	if err := k.AnswerProbe(answer, probeIngress, probeRelay); err != nil {
		t.Fatal(err)
	}
	for i := range ProbeLen * 8 {
		b := bytes.Clone(probe)
		b[i/8] ^= 1 << (i % 8)
		if err := k.AnswerProbe(b, probeIngress, probeRelay); err == nil {
			t.Fatalf("probe bit %d flipped: answered", i)
		}
		b = bytes.Clone(answer)
		b[i/8] ^= 1 << (i % 8)
		if _, err := k.OpenProbeAnswer(b, probeIngress, probeRelay); err == nil {
			t.Fatalf("answer bit %d flipped: accepted", i)
		}
	}
	other := netip.MustParseAddrPort("10.1.2.3:3479")
	for _, c := range []struct {
		name       string
		k          *Keyring
		pkt        []byte
		in, relay  netip.AddrPort
		answer     bool
		wantReason error
	}{
		{"answer sent as a probe", k, answer, probeIngress, probeRelay, false, ErrReservedFlag},
		{"probe taken as an answer", k, probe, probeIngress, probeRelay, true, ErrReservedFlag},
		{"probe from another source", k, probe, other, probeRelay, false, ErrMAC},
		{"probe at another relay", k, probe, probeIngress, other, false, ErrMAC},
		{"answer from another relay", k, answer, probeIngress, other, true, ErrMAC},
		{"answer at another socket", k, answer, other, probeRelay, true, ErrMAC},
		{"another key", testRing(t, 1, 1), probe, probeIngress, probeRelay, false, ErrUnknownKey},
		{"no key", nil, probe, probeIngress, probeRelay, false, ErrUnknownKey},
		{"short", k, probe[:ProbeLen-1], probeIngress, probeRelay, false, ErrShort},
		{"long", k, append(bytes.Clone(probe), 0), probeIngress, probeRelay, false, ErrShort},
	} {
		b := bytes.Clone(c.pkt)
		var err error
		if c.answer {
			_, err = c.k.OpenProbeAnswer(b, c.in, c.relay)
		} else {
			err = c.k.AnswerProbe(b, c.in, c.relay)
		}
		if !errors.Is(err, c.wantReason) {
			t.Errorf("%s: %v, want %v", c.name, err, c.wantReason)
		}
		if !bytes.Equal(b, c.pkt) {
			t.Errorf("%s: refused, yet the bytes changed", c.name)
		}
	}
}

func TestProbeAllocs(t *testing.T) {
	k := testRing(t, 0, 0)
	buf := make([]byte, ProbeLen)
	if n := testing.AllocsPerRun(100, func() {
		p := k.SealProbe(buf, 1, 2, probeIngress, probeRelay)
		_ = k.AnswerProbe(p, probeIngress, probeRelay)
		_, _ = k.OpenProbeAnswer(p, probeIngress, probeRelay)
	}); n != 0 {
		t.Errorf("a probe's round allocates %v", n)
	}
}

// FuzzAnswerProbe: AnswerProbe never panics; what it answers was a probe
// sealed between those addresses, and its answer opens to the same nonce.
func FuzzAnswerProbe(f *testing.F) {
	k := testRing(f, 0, 0)
	f.Add(k.SealProbe(make([]byte, ProbeLen), 0x1234, 7, probeIngress, probeRelay))
	f.Add([]byte{ProbeMagic, ProbeVersion << 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		if err := k.AnswerProbe(b, probeIngress, probeRelay); err != nil {
			if !bytes.Equal(b, in) {
				t.Fatal("a refused probe was changed")
			}
			return
		}
		again := k.SealProbe(make([]byte, ProbeLen), ProbeCluster(in), binary.BigEndian.Uint64(in[8:16]), probeIngress, probeRelay)
		if !bytes.Equal(again, in) {
			t.Fatalf("answered %x, which is not the probe %x", in, again)
		}
		if n, err := k.OpenProbeAnswer(b, probeIngress, probeRelay); err != nil || n != binary.BigEndian.Uint64(in[8:16]) {
			t.Fatalf("answered %x: answer %x does not open (%x, %v)", in, b, n, err)
		}
	})
}
