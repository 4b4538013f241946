package encap

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash"
	"testing"
)

// testKey is the key 00 01 … 0f, as in the SipHash paper's vectors.
func testKey() []byte {
	k := make([]byte, KeyLen)
	for i := range k {
		k[i] = byte(i)
	}
	return k
}

func testRing(t testing.TB, current uint8, ids ...uint8) *Keyring {
	t.Helper()
	keys := map[uint8][]byte{}
	for _, id := range ids {
		k := testKey()
		k[0] = id // each ID its own key; ID 0 is the paper's key
		keys[id] = k
	}
	r, err := NewKeyring(current, keys)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSipHashVectors: the reference outputs of SipHash-2-4 (the paper's
// appendix: key 00..0f, message 00..0e, and the empty message), and every
// message length 0..63 against the paper's vector table entries we keep.
func TestSipHashVectors(t *testing.T) {
	k := testKey()
	k0, k1 := binary.LittleEndian.Uint64(k[:8]), binary.LittleEndian.Uint64(k[8:])
	msg := make([]byte, 64)
	for i := range msg {
		msg[i] = byte(i)
	}
	for _, v := range []struct {
		n    int
		want uint64
	}{
		{0, 0x726fdb47dd0e0e31},
		{1, 0x74f839c593dc67fd},
		{7, 0xab0200f58b01d137},
		{8, 0x93f5f5799a932462},
		{15, 0xa129ca6149be45e5},
		{63, 0x958a324ceb064572},
	} {
		if got := sipHash24(k0, k1, msg[:v.n]); got != v.want {
			t.Errorf("SipHash-2-4 of %d bytes = %016x, want %016x", v.n, got, v.want)
		}
	}
}

// sealedVectors are datagrams (header + payload "\x00\x01payload") sealed
// with hop key 00 01 … 0f as key ID 0: the exact bytes every implementation
// must produce (docs/wire.md repeats the first).
var sealedVectors = []struct {
	name string
	h    Header
	hex  string
}{
	{
		"v4/v4 to transceiver, token",
		Header{Cluster: 0x1234, Pod: 0x0042, POP: 0x0007, Token: [6]byte{0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6}, Client: v4Client, Ingress: v4Ingress},
		"5e 20 00 00 1234 0042 0007 a1b2c3d4e5f6 c350 c6336407 0d96 0a010203 fca0b61d785423ea 0001 7061796c6f6164",
	},
	{
		"v6/v6 to client",
		Header{ToClient: true, Cluster: 0x0100, Pod: 0x0200, POP: 0x0300, Client: v6Client, Ingress: v6Ingress},
		"5e 27 00 00 0100 0200 0300 000000000000 c350 20010db8000000000000000000000007 0d96 fd000000000000000000000000010002 2f1d1ccba8f1dc93 0001 7061796c6f6164",
	}, {
		"v4/v4 TCP client to transceiver, token (flag bit 3)",
		Header{TCP: true, Cluster: 0x1234, Pod: 0x0042, POP: 0x0007, Token: [6]byte{0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6}, Client: v4Client, Ingress: v4Ingress},
		"5e 28 00 00 1234 0042 0007 a1b2c3d4e5f6 c350 c6336407 0d96 0a010203 d9e7b2fdfd433cc5 0001 7061796c6f6164",
	},
}

var vectorPayload = []byte("\x00\x01payload")

func seal(t testing.TB, k *Keyring, h Header, payload []byte) []byte {
	t.Helper()
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	hl := len(b)
	b = append(b, payload...)
	k.Seal(b, hl)
	return b
}

func TestSealedVectors(t *testing.T) {
	k := testRing(t, 0, 0)
	for _, v := range sealedVectors {
		got := seal(t, k, v.h, vectorPayload)
		if want := unhex(t, v.hex); !bytes.Equal(got, want) {
			t.Errorf("%s: sealed\n%x\nwant\n%x", v.name, got, want)
		}
		h, n, err := Decode(got)
		if err != nil || h != v.h || k.Verify(got, n) != nil {
			t.Errorf("%s: Decode/Verify = %+v, %v, %v", v.name, h, err, k.Verify(got, n))
		}
	}
}

// TestVerifyRejectsEveryChange: flipping any bit of a sealed datagram's
// header, or changing its payload length, fails Verify; a payload byte
// change does not (the payload is authenticated end to end by DTLS/SRTP).
func TestVerifyRejectsEveryChange(t *testing.T) {
	k := testRing(t, 0, 0)
	for _, v := range sealedVectors {
		good := seal(t, k, v.h, vectorPayload)
		hl := v.h.Len()
		for i := range hl * 8 {
			b := bytes.Clone(good)
			b[i/8] ^= 1 << (i % 8)
			h, n, err := Decode(b)
			if err != nil {
				continue // no longer parses: dropped anyway
			}
			if err := k.Verify(b, n); err == nil {
				t.Fatalf("%s: bit %d flipped, header %+v still verifies", v.name, i, h)
			}
		}
		if err := k.Verify(good[:len(good)-1], hl); err != ErrMAC {
			t.Errorf("%s: truncated payload: %v, want ErrMAC", v.name, err)
		}
		if err := k.Verify(append(bytes.Clone(good), 0), hl); err != ErrMAC {
			t.Errorf("%s: extended payload: %v, want ErrMAC", v.name, err)
		}
	}
}

// TestRotation: a keyring holding old and new accepts datagrams sealed with
// either; one without the old key refuses old datagrams as unknown_key, and
// a sender without any key of the cluster is refused.
func TestRotation(t *testing.T) {
	old, both, next := testRing(t, 1, 1), testRing(t, 1, 1, 2), testRing(t, 2, 1, 2)
	only2 := testRing(t, 2, 2)
	h := sealedVectors[0].h
	a, b := seal(t, old, h, vectorPayload), seal(t, next, h, vectorPayload)
	hl := h.Len()
	for _, tc := range []struct {
		name string
		k    *Keyring
		pkt  []byte
		want error
	}{
		{"old by both", both, a, nil},
		{"new by both", both, b, nil},
		{"new by next", next, b, nil},
		{"old by next", next, a, nil},
		{"new by old", old, b, ErrUnknownKey},
		{"old after retirement", only2, a, ErrUnknownKey},
		{"nil keyring", nil, a, ErrUnknownKey},
		{"other cluster's key, same ID", testRingSeed(t, 1, 0x55), a, ErrMAC},
	} {
		if err := tc.k.Verify(tc.pkt, hl); err != tc.want {
			t.Errorf("%s: Verify = %v, want %v", tc.name, err, tc.want)
		}
	}
	if a[offKeyID] != 1 || b[offKeyID] != 2 {
		t.Errorf("key IDs on the wire %d, %d; want 1, 2", a[offKeyID], b[offKeyID])
	}
}

func testRingSeed(t *testing.T, id, seed byte) *Keyring {
	k := bytes.Repeat([]byte{seed}, KeyLen)
	r, err := NewKeyring(id, map[uint8][]byte{id: k})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseKeys(t *testing.T) {
	k1 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, KeyLen))
	k2 := base64.RawStdEncoding.EncodeToString(bytes.Repeat([]byte{2}, KeyLen))
	r, err := ParseKeyring([]string{"2:" + k2, "1:" + k1})
	if err != nil || r.CurrentKeyID() != 2 {
		t.Fatalf("ParseKeyring = %v, %v; want current 2", r, err)
	}
	for _, bad := range [][]string{nil, {"1"}, {"16:" + k1}, {"1:" + k1, "1:" + k2}, {"1:AAAA"}, {"1:!!"}} {
		if _, err := ParseKeyring(bad); err == nil {
			t.Errorf("ParseKeyring(%q) accepted", bad)
		} else if bytes.Contains([]byte(err.Error()), []byte(k1[5:])) {
			t.Errorf("error %q prints key material", err)
		}
	}
	ck, err := ParseClusterKeys([]string{"7/1:" + k1, "7/2:" + k2, "9/2:" + k2})
	if err != nil || ck.For(7).CurrentKeyID() != 1 || ck.For(9).CurrentKeyID() != 2 || ck.For(8) != nil {
		t.Fatalf("ParseClusterKeys = %v, %v", ck, err)
	}
	for _, bad := range []string{"1:" + k1, "0/1:" + k1, "x/1:" + k1, "7/1:AA"} {
		if _, err := ParseClusterKeys([]string{bad}); err == nil {
			t.Errorf("ParseClusterKeys(%q) accepted", bad)
		}
	}
}

func TestKeyAllocs(t *testing.T) {
	k := testRing(t, 0, 0)
	pkt := seal(t, k, sealedVectors[1].h, vectorPayload)
	hl := sealedVectors[1].h.Len()
	if n := testing.AllocsPerRun(100, func() { k.Seal(pkt, hl) }); n != 0 {
		t.Errorf("Seal allocates %v", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = k.Verify(pkt, hl) }); n != 0 {
		t.Errorf("Verify allocates %v", n)
	}
}

// BenchmarkTag compares candidate MACs over one IPv4 header (28 signed
// bytes + length) on this machine: SipHash-2-4 (chosen) against a
// truncated HMAC-SHA256 as the token uses, in the same run.
func BenchmarkTag(b *testing.B) {
	k := testRing(b, 0, 0)
	h := sealedVectors[0].h
	pkt := seal(b, k, h, make([]byte, 120))
	hl := h.Len()
	b.Run("siphash24-seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			k.Seal(pkt, hl)
		}
	})
	b.Run("siphash24-verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if k.Verify(pkt, hl) != nil {
				b.Fatal("verify")
			}
		}
	})
	b.Run("hmac-sha256", func(b *testing.B) {
		mac := hmac.New(sha256.New, testKey())
		var sum [sha256.Size]byte
		b.ReportAllocs()
		for b.Loop() {
			hmacTag(mac, pkt[:hl-TagLen], sum[:0])
		}
	})
}

func hmacTag(mac hash.Hash, m, out []byte) []byte {
	mac.Reset()
	mac.Write(m)
	return mac.Sum(out)
}

// FuzzOpen: Decode then Verify never panic on any input; whatever
// verifies re-encodes to the same header bytes and seals to the same tag.
func FuzzOpen(f *testing.F) {
	k := testRing(f, 0, 0)
	for _, v := range sealedVectors {
		p := seal(f, k, v.h, vectorPayload)
		f.Add(p)
		f.Add(p[:len(p)-1])
	}
	f.Add([]byte{Magic, Version << 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := Decode(b)
		if err != nil {
			return
		}
		if err := k.Verify(b, n); err != nil {
			if !errors.Is(err, ErrMAC) && !errors.Is(err, ErrUnknownKey) {
				t.Fatalf("Verify: unexpected %v", err)
			}
			return
		}
		again := seal(t, k, h, b[n:])
		if !bytes.Equal(again, b) {
			t.Fatalf("verified %x re-seals to %x", b, again)
		}
	})
}
