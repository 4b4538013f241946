package encap

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

var (
	v4Client  = netip.MustParseAddrPort("198.51.100.7:50000")  // c6 33 64 07, port c3 50
	v6Client  = netip.MustParseAddrPort("[2001:db8::7]:50000") // port c3 50
	v4Ingress = netip.MustParseAddrPort("10.1.2.3:3478")       // 0a 01 02 03, port 0d 96
	v6Ingress = netip.MustParseAddrPort("[fd00::1:2]:3478")    // port 0d 96
	mapped    = netip.MustParseAddrPort("[::ffff:198.51.100.7]:50000")
)

// unhex decodes hex with spaces, for readable vectors.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var vectors = []struct {
	name string
	h    Header
	hex  string
}{
	{
		"v4/v4 to transceiver",
		Header{Cluster: 0x1234, Pod: 0x0042, POP: 0x0007, Client: v4Client, Ingress: v4Ingress},
		"5e 20 00 00 1234 0042 0007 000000000000 c350 c6336407 0d96 0a010203 0000000000000000",
	},
	{
		"v4/v4 to client",
		Header{ToClient: true, Cluster: 0x1234, Pod: 0x0042, POP: 0x0007, Client: v4Client, Ingress: v4Ingress},
		"5e 21 00 00 1234 0042 0007 000000000000 c350 c6336407 0d96 0a010203 0000000000000000",
	},
	{
		"v6/v4 to transceiver",
		Header{Cluster: 1, Pod: 2, POP: 3, Client: v6Client, Ingress: v4Ingress},
		"5e 22 00 00 0001 0002 0003 000000000000 c350 20010db8000000000000000000000007 0d96 0a010203 0000000000000000",
	},
	{
		"v6/v4 to client",
		Header{ToClient: true, Cluster: 1, Pod: 2, POP: 3, Client: v6Client, Ingress: v4Ingress},
		"5e 23 00 00 0001 0002 0003 000000000000 c350 20010db8000000000000000000000007 0d96 0a010203 0000000000000000",
	},
	{
		"v4/v6 to transceiver",
		Header{Cluster: 0xffff, Pod: 0xfffe, POP: 0xfffd, Client: v4Client, Ingress: v6Ingress},
		"5e 24 00 00 ffff fffe fffd 000000000000 c350 c6336407 0d96 fd000000000000000000000000010002 0000000000000000",
	},
	{
		"v4/v6 to client",
		Header{ToClient: true, Cluster: 0xffff, Pod: 0xfffe, POP: 0xfffd, Client: v4Client, Ingress: v6Ingress},
		"5e 25 00 00 ffff fffe fffd 000000000000 c350 c6336407 0d96 fd000000000000000000000000010002 0000000000000000",
	},
	{
		"v6/v6 to transceiver",
		Header{Cluster: 0x0100, Pod: 0x0200, POP: 0x0300, Client: v6Client, Ingress: v6Ingress},
		"5e 26 00 00 0100 0200 0300 000000000000 c350 20010db8000000000000000000000007 0d96 fd000000000000000000000000010002 0000000000000000",
	},
	{
		"v6/v6 to client",
		Header{ToClient: true, Cluster: 0x0100, Pod: 0x0200, POP: 0x0300, Client: v6Client, Ingress: v6Ingress},
		"5e 27 00 00 0100 0200 0300 000000000000 c350 20010db8000000000000000000000007 0d96 fd000000000000000000000000010002 0000000000000000",
	},
	// Flag bit 3: the client is on TCP (docs/wire.md §2, docs/tcp.md).
	{
		"v4/v4 TCP client to transceiver",
		Header{TCP: true, Cluster: 0x1234, Pod: 0x0042, POP: 0x0007, Token: [6]byte{0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6}, Client: v4Client, Ingress: v4Ingress},
		"5e 28 00 00 1234 0042 0007 a1b2c3d4e5f6 c350 c6336407 0d96 0a010203 0000000000000000",
	},
	{
		"v6/v6 TCP client to client",
		Header{TCP: true, ToClient: true, Cluster: 0x0100, Pod: 0x0200, POP: 0x0300, Client: v6Client, Ingress: v6Ingress},
		"5e 2f 00 00 0100 0200 0300 000000000000 c350 20010db8000000000000000000000007 0d96 fd000000000000000000000000010002 0000000000000000",
	},
}

func TestVectors(t *testing.T) {
	payload := []byte("\x00\x01payload")
	for _, tt := range vectors {
		t.Run(tt.name, func(t *testing.T) {
			want := unhex(t, tt.hex)
			if got := tt.h.Len(); got != len(want) {
				t.Fatalf("Len = %d, want %d", got, len(want))
			}
			var buf [MaxLen + 8]byte
			n, err := tt.h.Put(buf[:])
			if err != nil || !bytes.Equal(buf[:n], want) {
				t.Fatalf("Put = %x, %v\nwant  %x", buf[:n], err, want)
			}
			got, err := tt.h.AppendTo([]byte("pre"))
			if err != nil || !bytes.Equal(got, append([]byte("pre"), want...)) {
				t.Fatalf("AppendTo = %x, %v", got, err)
			}
			dec, n, err := Decode(append(want, payload...))
			if err != nil || n != len(want) || dec != tt.h {
				t.Fatalf("Decode = %+v, %d, %v\nwant     %+v, %d", dec, n, err, tt.h, len(want))
			}
			dir, ok := PeekDirection(want)
			if !ok || dir != tt.h.ToClient {
				t.Fatalf("PeekDirection = %v, %v", dir, ok)
			}
		})
	}
}

func TestLenBounds(t *testing.T) {
	if h := vectors[0].h; h.Len() != MinLen {
		t.Errorf("v4/v4 Len = %d, want MinLen %d", h.Len(), MinLen)
	}
	if h := vectors[6].h; h.Len() != MaxLen {
		t.Errorf("v6/v6 Len = %d, want MaxLen %d", h.Len(), MaxLen)
	}
}

func TestMappedEncodedAsV4(t *testing.T) {
	h := Header{Cluster: 0x1234, Pod: 0x0042, POP: 7, Client: mapped, Ingress: netip.MustParseAddrPort("[::ffff:10.1.2.3]:3478")}
	b, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := unhex(t, vectors[0].hex); !bytes.Equal(b, want) {
		t.Fatalf("got %x, want %x", b, want)
	}
	dec, _, err := Decode(b)
	if err != nil || dec.Client != v4Client {
		t.Fatalf("Decode = %+v, %v; want client unmapped", dec, err)
	}
}

func TestPutErrors(t *testing.T) {
	good := vectors[0].h
	tests := []struct {
		name string
		h    Header
		buf  int
		want error
	}{
		{"zero client", Header{Ingress: v4Ingress}, MaxLen, ErrAddr},
		{"zero ingress", Header{Client: v4Client}, MaxLen, ErrAddr},
		{"zero header", Header{}, MaxLen, ErrAddr},
		{"buffer one short", good, MinLen - 1, ErrShortBuffer},
		{"empty buffer", good, 0, ErrShortBuffer},
		{"v6 in v4 room", vectors[6].h, MinLen, ErrShortBuffer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			buf := make([]byte, tt.buf)
			if n, err := tt.h.Put(buf); err != tt.want || n != 0 {
				t.Fatalf("Put = %d, %v; want %v", n, err, tt.want)
			}
			out, err := tt.h.AppendTo([]byte("x"))
			if tt.want == ErrAddr && (!errors.Is(err, ErrAddr) || string(out) != "x") {
				t.Fatalf("AppendTo = %q, %v", out, err)
			}
		})
	}
}

func TestDecodeMalformed(t *testing.T) {
	type tc struct {
		name string
		b    []byte
		want error
	}
	var tests []tc
	// Every truncation point of every vector is ErrShort.
	for _, v := range vectors {
		full := unhex(t, v.hex)
		for i := range len(full) {
			tests = append(tests, tc{fmt.Sprintf("%s cut at %d", v.name, i), full[:i], ErrShort})
		}
	}
	set := func(hexs string, off int, v byte) []byte {
		b := unhex(t, hexs)
		b[off] = v
		return b
	}
	v4 := vectors[0].hex
	tests = append(tests,
		tc{"nil", nil, ErrShort},
		tc{"bad magic", set(v4, 0, 0x5f), ErrMagic},
		tc{"STUN first byte", set(v4, 0, 0x00), ErrMagic},
		tc{"version 0", set(v4, 1, 0x00), ErrVersion},
		tc{"version 1", set(v4, 1, 0x10), ErrVersion},
		tc{"version 3", set(v4, 1, 0x30), ErrVersion},
		tc{"reserved byte 3", set(v4, 3, 0x01), ErrReservedFlag},
		tc{"version 15", set(v4, 1, 0xf0), ErrVersion},
		tc{"reserved byte 3 with TCP flag", set(vectors[8].hex, 3, 0x80), ErrReservedFlag},
		tc{"TCP flag on a v4 body claiming v6 client", set(v4, 1, 0x2a), ErrShort},
		tc{"v4 body claims v6 client", set(v4, 1, 0x22), ErrShort},
		tc{"v4 body claims v6 ingress", set(v4, 1, 0x24), ErrShort},
		tc{"mapped v6 client", unhex(t, "5e 22 00 00 0001 0002 0003 000000000000 c350 00000000000000000000ffffc6336407 0d96 0a010203 0000000000000000"), ErrAddr},
		tc{"mapped v6 ingress", unhex(t, "5e 24 00 00 0001 0002 0003 000000000000 c350 c6336407 0d96 00000000000000000000ffff0a010203 0000000000000000"), ErrAddr},
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, n, err := Decode(tt.b)
			if err != tt.want || n != 0 || h != (Header{}) {
				t.Fatalf("Decode(%x) = %+v, %d, %v; want %v", tt.b, h, n, err, tt.want)
			}
		})
	}
}

func TestPeekDirection(t *testing.T) {
	tests := []struct {
		name         string
		b            []byte
		toClient, ok bool
	}{
		{"to transceiver", unhex(t, vectors[0].hex), false, true},
		{"to client", unhex(t, vectors[1].hex), true, true},
		{"short", unhex(t, vectors[1].hex)[:MinLen-1], false, false},
		{"bad magic", append([]byte{0x5d}, unhex(t, vectors[1].hex)[1:]...), false, false},
		{"bad version", append([]byte{0x5e, 0x11}, unhex(t, vectors[1].hex)[2:]...), false, false},
		{"nil", nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := PeekDirection(tt.b)
			if d != tt.toClient || ok != tt.ok {
				t.Fatalf("PeekDirection = %v, %v; want %v, %v", d, ok, tt.toClient, tt.ok)
			}
		})
	}
}

func TestReason(t *testing.T) {
	errs := []error{ErrShort, ErrMagic, ErrVersion, ErrReservedFlag, ErrAddr, ErrUnknownKey, ErrMAC, ErrBundle}
	seen := map[string]bool{}
	for _, err := range errs {
		r := reasonLabel(err)
		if r == "other" || seen[r] {
			t.Errorf("reasonLabel(%v) = %q, not distinct", err, r)
		}
		seen[r] = true
	}
	if reasonLabel(ErrShortBuffer) != "other" || reasonLabel(nil) != "" {
		t.Errorf("reasonLabel(ErrShortBuffer) = %q, reasonLabel(nil) = %q", reasonLabel(ErrShortBuffer), reasonLabel(nil))
	}
	for _, r := range Reasons {
		if r != "other" && !seen[r] {
			t.Errorf("label %q has no error", r)
		}
	}
}

func TestAllocs(t *testing.T) {
	for _, v := range vectors {
		h := v.h
		b := unhex(t, v.hex)
		var buf [MaxLen]byte
		if n := testing.AllocsPerRun(100, func() { _, _, _ = Decode(b) }); n != 0 {
			t.Errorf("%s: Decode allocates %v", v.name, n)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = h.Put(buf[:]) }); n != 0 {
			t.Errorf("%s: Put allocates %v", v.name, n)
		}
		out := make([]byte, 0, MaxLen)
		if n := testing.AllocsPerRun(100, func() { _, _ = h.AppendTo(out[:0]) }); n != 0 {
			t.Errorf("%s: AppendTo with capacity allocates %v", v.name, n)
		}
	}
}

func benchDecode(b *testing.B, i int) {
	buf := append(unhex(b, vectors[i].hex), make([]byte, 160)...)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func benchPut(b *testing.B, i int) {
	h := vectors[i].h
	var buf [MaxLen]byte
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Put(buf[:]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeV4(b *testing.B) { benchDecode(b, 0) }
func BenchmarkDecodeV6(b *testing.B) { benchDecode(b, 7) }
func BenchmarkPutV4(b *testing.B)    { benchPut(b, 0) }
func BenchmarkPutV6(b *testing.B)    { benchPut(b, 7) }

func FuzzDecode(f *testing.F) {
	for _, v := range vectors {
		b := unhex(f, v.hex)
		f.Add(b)
		f.Add(append(b, 0, 1, 2, 3))
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{0x5e, 0x28})
	f.Add([]byte{0x5e, 0x10})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := Decode(b)
		if err != nil {
			if reasonLabel(err) == "other" {
				t.Fatalf("unlabelled error %v", err)
			}
			return
		}
		if n < MinLen || n > MaxLen || n > len(b) || n != h.Len() {
			t.Fatalf("n = %d, Len = %d, len(b) = %d", n, h.Len(), len(b))
		}
		out, err := h.AppendTo(nil)
		if err != nil {
			t.Fatalf("AppendTo(Decode(%x)): %v", b, err)
		}
		// The tag is not part of Header: Put writes zeros there.
		if !bytes.Equal(out[:n-TagLen], b[:n-TagLen]) {
			t.Fatalf("round trip %x != %x", out, b[:n])
		}
		if d, ok := PeekDirection(b); !ok || d != h.ToClient {
			t.Fatalf("PeekDirection = %v, %v for %+v", d, ok, h)
		}
	})
}

// reasonLabel is the label of err's drop reason, "" for nil.
func reasonLabel(err error) string {
	if err == nil {
		return ""
	}
	return ReasonOf(err).String()
}

// String returns the reason's metric label.
func (r Reason) String() string {
	if r < numReasons {
		return Reasons[r]
	}
	return Reasons[ReasonOther]
}
