package encap

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"testing"
)

// bundleVector is the test vector of docs/bundle.md: two encapsulated
// datagrams (IPv4 client and ingress, sealed with key ID 1 = bytes 0..15)
// in one bundle.
func bundleVector(t testing.TB) (bundle []byte, items [][]byte) {
	t.Helper()
	key := make([]byte, KeyLen)
	for i := range key {
		key[i] = byte(i)
	}
	kr, err := NewKeyring(1, map[uint8][]byte{1: key})
	if err != nil {
		t.Fatal(err)
	}
	item := func(h Header, payload ...byte) []byte {
		b, err := h.AppendTo(nil)
		if err != nil {
			t.Fatal(err)
		}
		hl := len(b)
		b = append(b, payload...)
		kr.Seal(b, hl)
		return b
	}
	h := Header{Cluster: 0x0102, Pod: 0x0304, POP: 0x0506, Token: [6]byte{0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6},
		Client: netip.MustParseAddrPort("192.0.2.1:5000"), Ingress: netip.MustParseAddrPort("10.0.0.7:7000")}
	a := item(h, 0x80, 0x01)
	h.Client = netip.MustParseAddrPort("192.0.2.2:5001")
	b := item(h, 0x16, 0xfe, 0xfd)
	bundle = StartBundle(make([]byte, 0, MaxBundle))
	for _, it := range [][]byte{a, b} {
		var ok bool
		if bundle, ok = AddToBundle(bundle, it); !ok {
			t.Fatal("item refused")
		}
	}
	return bundle, [][]byte{a, b}
}

// docVector is the bundle of docs/bundle.md, byte for byte.
const docVector = "5d1000265e200100010203040506a1a2a3a4a5a61388c00002011b580a0000075080d9f095b560b0800100275e200100010203040506a1a2a3a4a5a61389c00002021b580a0000074a90a900760070af16fefd"

// TestBundleVector: the bytes are exactly those docs/bundle.md shows, and
// they split back into the items.
func TestBundleVector(t *testing.T) {
	bundle, items := bundleVector(t)
	// Frame header, then per item its length and the datagram.
	want := "5d10" + "0026" + hex.EncodeToString(items[0]) + "0027" + hex.EncodeToString(items[1])
	if got := hex.EncodeToString(bundle); got != want || got != docVector {
		t.Fatalf("bundle\n got %s\nwant %s", got, want)
	}
	n, err := CheckBundle(bundle)
	if err != nil || n != 2 {
		t.Fatalf("CheckBundle = %d, %v", n, err)
	}
	for i, off := 0, BundleHeaderLen; off < len(bundle); i++ {
		var it []byte
		it, off = NextItem(bundle, off)
		if !bytes.Equal(it, items[i]) {
			t.Fatalf("item %d = %x, want %x", i, it, items[i])
		}
	}
}

// TestBundleMalformed: every malformed bundle is refused whole.
func TestBundleMalformed(t *testing.T) {
	good, _ := bundleVector(t)
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"header only", []byte{BundleMagic, BundleVersion << 4}},
		{"wrong magic", mod(func(b []byte) []byte { b[0] = Magic; return b })},
		{"wrong version", mod(func(b []byte) []byte { b[1] = 2 << 4; return b })},
		{"reserved flag", mod(func(b []byte) []byte { b[1] |= 1; return b })},
		{"zero-length item", []byte{BundleMagic, BundleVersion << 4, 0, 0}},
		{"item shorter than a header", []byte{BundleMagic, BundleVersion << 4, 0, 2, Magic, 0x10}},
		{"item not encapsulated", mod(func(b []byte) []byte { b[4] = 0x80; return b })},
		{"bundle in a bundle", mod(func(b []byte) []byte { b[4] = BundleMagic; return b })},
		{"item overruns", mod(func(b []byte) []byte { return b[:len(b)-1] })},
		{"dangling length byte", mod(func(b []byte) []byte { return append(b, 0) })},
		{"too long", append(StartBundle(nil), make([]byte, MaxBundle)...)},
	} {
		if _, err := CheckBundle(tc.b); err != ErrBundle {
			t.Errorf("%s: CheckBundle = %v, want ErrBundle", tc.name, err)
		}
	}
}

// TestAddToBundleLimit: a bundle never grows past MaxBundle, and empty
// items are refused.
func TestAddToBundleLimit(t *testing.T) {
	b := StartBundle(make([]byte, 0, MaxBundle))
	item := make([]byte, 500)
	item[0] = Magic
	added := 0
	for {
		var ok bool
		if b, ok = AddToBundle(b, item); !ok {
			break
		}
		added++
	}
	if added != 3 || len(b) > MaxBundle {
		t.Fatalf("%d items of 500 bytes, %d bytes; want 3 and at most %d", added, len(b), MaxBundle)
	}
	if _, ok := AddToBundle(StartBundle(nil), nil); ok {
		t.Error("empty item accepted")
	}
	if _, ok := AddToBundle(StartBundle(nil), append([]byte{BundleMagic}, make([]byte, 40)...)); ok {
		t.Error("bundle accepted as an item")
	}
	// docs/bundle.md gives both figures.
	if MaxBundle != 1560 || MaxBundleItems != 39 {
		t.Errorf("MaxBundle %d, MaxBundleItems %d: update docs/bundle.md (1560, 39)", MaxBundle, MaxBundleItems)
	}
}

// TestBundleNoAllocs: building and splitting a bundle allocate nothing.
func TestBundleNoAllocs(t *testing.T) {
	bundle, items := bundleVector(t)
	buf := make([]byte, 0, MaxBundle)
	if a := testing.AllocsPerRun(100, func() {
		b := StartBundle(buf)
		for _, it := range items {
			b, _ = AddToBundle(b, it)
		}
		if _, err := CheckBundle(b); err != nil {
			t.Fatal(err)
		}
		for off := BundleHeaderLen; off < len(b); {
			_, off = NextItem(b, off)
		}
	}); a != 0 {
		t.Errorf("%v allocations", a)
	}
	_ = bundle
}

// FuzzBundle: CheckBundle never panics, and whatever it accepts splits
// into items that exactly tile the bundle and rebuild it byte for byte.
func FuzzBundle(f *testing.F) {
	good, _ := bundleVector(f)
	f.Add(good)
	f.Add(append([]byte{BundleMagic, BundleVersion << 4, 0, MinLen + 1, Magic}, make([]byte, MinLen)...))
	f.Add([]byte{BundleMagic, BundleVersion << 4, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := CheckBundle(b)
		if err != nil {
			return
		}
		if n < 1 || n > MaxBundleItems {
			t.Fatalf("%d items", n)
		}
		re := StartBundle(nil)
		count := 0
		for off := BundleHeaderLen; off < len(b); count++ {
			var it []byte
			it, off = NextItem(b, off)
			var ok bool
			if re, ok = AddToBundle(re, it); !ok {
				t.Fatalf("item %d of an accepted bundle refused on rebuild", count)
			}
		}
		if count != n || !bytes.Equal(re, b) {
			t.Fatalf("rebuilt %x (%d items), want %x (%d)", re, count, b, n)
		}
	})
}
