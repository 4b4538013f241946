package membership

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func realisticMeta() Meta {
	return Meta{
		Role:     RoleTransceiver,
		Region:   "eu-west-1",
		Cluster:  7,
		Pod:      42,
		Data:     netip.MustParseAddrPort("10.12.34.56:40000"),
		API:      "http://10.12.34.56:8080/v1/sessions",
		Load:     123,
		Capacity: 500,
		Draining: true,
	}
}

func TestMetaRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		meta Meta
	}{
		{"zero", Meta{}},
		{"realistic transceiver", realisticMeta()},
		{"global relay ipv6", Meta{Role: RoleGlobalRelay, Region: "us-east-1", POP: 3,
			Data: netip.MustParseAddrPort("[2001:db8::1]:3478"), Load: 1 << 40, Capacity: -1}},
		{"signaling", Meta{Role: RoleSignaling, API: "https://signal.example.net"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.meta.MarshalBinary()
			if err != nil {
				t.Fatalf("MarshalBinary: %v", err)
			}
			var got Meta
			if err := got.UnmarshalBinary(b); err != nil {
				t.Fatalf("UnmarshalBinary: %v", err)
			}
			if got != tt.meta {
				t.Fatalf("round trip: got %+v, want %+v", got, tt.meta)
			}
			// Fields may be appended in later builds: trailing bytes are ignored.
			if err := got.UnmarshalBinary(append(b, 0xde, 0xad)); err != nil || got != tt.meta {
				t.Fatalf("with trailing bytes: %+v, %v", got, err)
			}
			// A proof round-trips, trailing bytes after it too.
			proved := tt.meta
			proved.Proof = "\x02proof"
			if b, err = proved.MarshalBinary(); err != nil {
				t.Fatal(err)
			}
			if err := got.UnmarshalBinary(append(b, 0xde, 0xad)); err != nil || got != proved {
				t.Fatalf("with a proof: %+v, %v", got, err)
			}
		})
	}
}

func TestMetaRealisticFits(t *testing.T) {
	b, err := realisticMeta().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MetaMaxSize/4 {
		t.Fatalf("realistic meta is %d bytes; want it well under %d", len(b), MetaMaxSize)
	}
	t.Logf("realistic meta: %d bytes of %d", len(b), MetaMaxSize)
}

func TestMetaUnmarshalRejects(t *testing.T) {
	valid, err := realisticMeta().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   []byte
	}{
		{"nil", nil},
		{"unknown version", append([]byte{99}, valid[1:]...)},
		{"string length past end", []byte{metaVersion, 0, 0x7f, 'a'}},
		{"huge uvarint length", []byte{metaVersion, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"bad address length", func() []byte {
			b, _ := Meta{}.MarshalBinary()
			// version, flags, role len, region len, 3×uint16, then addr len.
			b[2+1+1+6] = 5
			return b
		}()},
	}
	for i := 1; i < len(valid); i++ {
		tests = append(tests, struct {
			name string
			in   []byte
		}{"truncated", valid[:i]})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := realisticMeta()
			m := before
			err := m.UnmarshalBinary(tt.in)
			if !errors.Is(err, ErrMalformedMeta) {
				t.Fatalf("UnmarshalBinary(%x) = %v, want ErrMalformedMeta", tt.in, err)
			}
			if m != before {
				t.Fatalf("failed decode modified the receiver")
			}
		})
	}
}

func TestMetaTooLarge(t *testing.T) {
	long := strings.Repeat("x", 200)
	full := Meta{
		Role: Role(long), Region: long, Cluster: 65535, Pod: 65535, POP: 65535,
		Data: netip.MustParseAddrPort("[2001:db8::ffff]:65535"), API: long,
		Load: -1 << 62, Capacity: 1 << 62, Draining: true,
	}
	if _, err := full.MarshalBinary(); !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("MarshalBinary of oversized meta = %v, want ErrMetaTooLarge", err)
	}
	cfg := testConfig("big")
	if p, err := New(cfg, full); !errors.Is(err, ErrMetaTooLarge) {
		if p != nil {
			p.Close()
		}
		t.Fatalf("New with oversized meta = %v, want ErrMetaTooLarge", err)
	}

	p := newTestPool(t, "small", realisticMeta())
	err := p.UpdateMeta(func(m *Meta) { m.API = strings.Repeat("y", MetaMaxSize) })
	if !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("UpdateMeta with oversized API = %v, want ErrMetaTooLarge", err)
	}
	if got := p.LocalMeta(); got != realisticMeta() {
		t.Fatalf("rejected update changed local meta: %+v", got)
	}
}

func FuzzMetaUnmarshal(f *testing.F) {
	valid, _ := realisticMeta().MarshalBinary()
	f.Add(valid)
	f.Add([]byte{})
	f.Add([]byte{metaVersion, 0, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Meta
		if err := m.UnmarshalBinary(b); err != nil {
			return
		}
		// Whatever decodes must re-encode (unless it only fit thanks to
		// trailing garbage being ignored, which cannot grow the fields).
		if _, err := m.MarshalBinary(); err != nil && len(b) <= MetaMaxSize {
			t.Fatalf("decoded meta does not re-encode: %v", err)
		}
	})
}

// TestMetaDataUnmapped: an advertised data address written as
// ::ffff:a.b.c.d is gossiped and read back as plain IPv4, the form every
// packet source has; otherwise no datagram from it would ever match.
func TestMetaDataUnmapped(t *testing.T) {
	m := realisticMeta()
	m.Data = netip.MustParseAddrPort("[::ffff:10.1.2.3]:7000")
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Meta
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddrPort("10.1.2.3:7000"); got.Data != want {
		t.Fatalf("Data = %v, want %v", got.Data, want)
	}
}
