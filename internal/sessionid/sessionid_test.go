package sessionid

import (
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	id, err := New(0x1234, 0x0042)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(id.String())
	if err != nil {
		t.Fatalf("Parse(%q): %v", id, err)
	}
	if got != id {
		t.Fatalf("round trip: got %+v, want %+v", got, id)
	}
}

func TestVector(t *testing.T) {
	id := ID{Cluster: 1, Pod: 2, Random: [12]byte{0xff, 0xfe, 0xfd}}
	const want = "rtc_AAEAAv_-_QAAAAAAAAAAAA"
	if got := id.String(); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestMalformed(t *testing.T) {
	for _, s := range []string{
		"",
		"rtc_",
		"rtc_AAEAAv_-_QAAAAAAAAAAA",   // short
		"rtc_AAEAAv_-_QAAAAAAAAAAAAA", // long
		"xyz_AAEAAv_-_QAAAAAAAAAAAA",  // prefix
		"rtc_AAEAAv+/+QAAAAAAAAAAAA",  // std alphabet
		"rtc_AAAAAv_-_QAAAAAAAAAAAA",  // cluster 0
		"rtc_AAEAAv_-_QAAAAAAAAAAAB",  // non-canonical trailing bits
		"rtc_AAEAAv_-_QAAAAAAAAAA\nA",
	} {
		if _, err := Parse(s); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse(%q) = %v, want ErrMalformed", s, err)
		}
	}
}
