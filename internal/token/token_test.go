package token

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

// vectorKey is the test vector key of docs/wire.md section 1: bytes 0x00..0x1f.
func vectorKey() []byte {
	k := make([]byte, KeyLen)
	for i := range k {
		k[i] = byte(i)
	}
	return k
}

const vectorUfrag = "ExI0AEKhssPU5fbG74W9"

var vectorToken = Token{
	KeyID:   3,
	Cluster: 0x1234,
	Pod:     0x0042,
	Nonce:   [6]byte{0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6},
}

func vectorRing(t testing.TB) *Keyring {
	t.Helper()
	k, err := NewKeyring(3, map[uint8][]byte{3: vectorKey()})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestVector(t *testing.T) {
	k := vectorRing(t)
	got, err := k.Encode(vectorToken)
	if err != nil {
		t.Fatal(err)
	}
	if got != vectorUfrag {
		t.Fatalf("Encode = %q, want %q", got, vectorUfrag)
	}
	tok, err := k.Verify([]byte(vectorUfrag))
	if err != nil {
		t.Fatal(err)
	}
	if tok != vectorToken {
		t.Fatalf("Verify = %+v, want %+v", tok, vectorToken)
	}
}

// forge builds a ufrag from raw fields with a correct MAC under key, so
// that tests can reach the checks after the MAC.
func forge(t *testing.T, k *Keyring, first byte, cluster uint16) string {
	t.Helper()
	raw := [RawLen]byte{first, byte(cluster >> 8), byte(cluster), 0, 0x42, 1, 2, 3, 4, 5, 6}
	mac := k.keys[3].sum(&raw)
	copy(raw[signedLen:], mac[:macLen])
	return base64.RawStdEncoding.EncodeToString(raw[:])
}

// rewriteFirst re-encodes a ufrag after changing its first byte, keeping
// the old MAC.
func rewriteFirst(t *testing.T, ufrag string, first byte) string {
	t.Helper()
	raw, err := base64.RawStdEncoding.DecodeString(ufrag)
	if err != nil {
		t.Fatal(err)
	}
	raw[0] = first
	return base64.RawStdEncoding.EncodeToString(raw)
}

func TestVerifyMalformed(t *testing.T) {
	k := vectorRing(t)
	flipped, _ := base64.RawStdEncoding.DecodeString(vectorUfrag)
	flipped[RawLen-1] ^= 0x01
	tests := []struct {
		name  string
		ufrag string
		want  error
	}{
		{"empty", "", ErrLength},
		{"19 chars", vectorUfrag[:19], ErrLength},
		{"21 chars", vectorUfrag + "A", ErrLength},
		{"with colon", vectorUfrag + ":abcd", ErrLength},
		{"dash", "-" + vectorUfrag[1:], ErrAlphabet},
		{"underscore", vectorUfrag[:10] + "_" + vectorUfrag[11:], ErrAlphabet},
		{"padding", vectorUfrag[:19] + "=", ErrAlphabet},
		{"newline", vectorUfrag[:19] + "\n", ErrAlphabet},
		{"carriage return", "\r" + vectorUfrag[1:], ErrAlphabet},
		{"space", vectorUfrag[:5] + " " + vectorUfrag[6:], ErrAlphabet},
		{"colon", vectorUfrag[:5] + ":" + vectorUfrag[6:], ErrAlphabet},
		{"high byte", vectorUfrag[:5] + "\xff" + vectorUfrag[6:], ErrAlphabet},
		{"version 2", rewriteFirst(t, vectorUfrag, 2<<4|3), ErrVersion},
		{"version 0", rewriteFirst(t, vectorUfrag, 0<<4|3), ErrVersion},
		{"key ID 5 not configured", rewriteFirst(t, vectorUfrag, Version<<4|5), ErrUnknownKey},
		{"cluster 0 with valid MAC", forge(t, k, Version<<4|3, 0), ErrCluster},
		{"flipped MAC bit", base64.RawStdEncoding.EncodeToString(flipped), ErrMAC},
		{"flipped pod bit", rewritePod(t, vectorUfrag), ErrMAC},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := k.Verify([]byte(tt.ufrag))
			if err != tt.want {
				t.Fatalf("Verify(%q) error = %v, want %v", tt.ufrag, err, tt.want)
			}
		})
	}
}

func rewritePod(t *testing.T, ufrag string) string {
	t.Helper()
	raw, _ := base64.RawStdEncoding.DecodeString(ufrag)
	raw[4] ^= 0x80
	return base64.RawStdEncoding.EncodeToString(raw)
}

func TestSentinelsDistinct(t *testing.T) {
	errs := []error{ErrLength, ErrAlphabet, ErrVersion, ErrUnknownKey, ErrCluster, ErrMAC}
	seen := map[string]bool{}
	for i, a := range errs {
		for j, b := range errs {
			if i != j && errors.Is(a, b) {
				t.Errorf("%v is %v", a, b)
			}
		}
		r := reasonLabel(a)
		if seen[r] || r == "other" {
			t.Errorf("reasonLabel(%v) = %q, not distinct", a, r)
		}
		seen[r] = true
	}
	if got := reasonLabel(errors.New("x")); got != "other" {
		t.Errorf("reasonLabel(unknown) = %q", got)
	}
	if got := reasonLabel(nil); got != "" {
		t.Errorf("reasonLabel(nil) = %q", got)
	}
	for _, r := range Reasons {
		if r != "other" && !seen[r] {
			t.Errorf("label %q in Reasons has no error", r)
		}
	}
	if len(Reasons) != len(errs)+1 {
		t.Errorf("Reasons has %d labels, want %d", len(Reasons), len(errs)+1)
	}
}

func TestRotation(t *testing.T) {
	old := bytes.Repeat([]byte{1}, KeyLen)
	cur := bytes.Repeat([]byte{2}, KeyLen)
	oldRing, err := NewKeyring(1, map[uint8][]byte{1: old})
	if err != nil {
		t.Fatal(err)
	}
	both, err := NewKeyring(2, map[uint8][]byte{1: old, 2: cur})
	if err != nil {
		t.Fatal(err)
	}
	if both.CurrentKeyID() != 2 {
		t.Fatalf("CurrentKeyID = %d", both.CurrentKeyID())
	}
	u, err := oldRing.Mint(7, 9)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := both.Verify([]byte(u))
	if err != nil || tok.KeyID != 1 || tok.Cluster != 7 || tok.Pod != 9 {
		t.Fatalf("old token on new ring: %+v, %v", tok, err)
	}
	u, err = both.Mint(7, 9)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oldRing.Verify([]byte(u)); err != ErrUnknownKey {
		t.Fatalf("new token on old ring: %v, want ErrUnknownKey", err)
	}
	// Same ID, different key bytes: the MAC must catch it.
	other, _ := NewKeyring(2, map[uint8][]byte{2: old})
	if _, err := other.Verify([]byte(u)); err != ErrMAC {
		t.Fatalf("token under wrong key bytes: %v, want ErrMAC", err)
	}
}

func TestMint(t *testing.T) {
	k := vectorRing(t)
	seen := map[string]bool{}
	for i := range 100 {
		u, err := k.Mint(0xffff, uint16(i))
		if err != nil {
			t.Fatal(err)
		}
		if len(u) != EncodedLen || strings.ContainsAny(u, ":=-_") {
			t.Fatalf("Mint = %q", u)
		}
		if seen[u] {
			t.Fatalf("Mint repeated %q", u)
		}
		seen[u] = true
		tok, err := k.Verify([]byte(u))
		if err != nil || tok.Cluster != 0xffff || tok.Pod != uint16(i) || tok.KeyID != 3 {
			t.Fatalf("Verify(Mint) = %+v, %v", tok, err)
		}
	}
	if _, err := k.Mint(0, 1); !errors.Is(err, ErrCluster) {
		t.Fatalf("Mint(cluster 0) error = %v, want ErrCluster", err)
	}
	if _, err := k.Encode(Token{KeyID: 4, Cluster: 1}); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("Encode(key 4) error = %v, want ErrUnknownKey", err)
	}
	if _, err := k.Encode(Token{KeyID: 200, Cluster: 1}); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("Encode(key 200) error = %v, want ErrUnknownKey", err)
	}
}

func TestNewKeyring(t *testing.T) {
	good := vectorKey()
	tests := []struct {
		name    string
		current uint8
		keys    map[uint8][]byte
		ok      bool
	}{
		{"one key", 3, map[uint8][]byte{3: good}, true},
		{"id 15", 15, map[uint8][]byte{15: good, 0: good}, true},
		{"id 16", 3, map[uint8][]byte{3: good, 16: good}, false},
		{"short key", 3, map[uint8][]byte{3: good[:31]}, false},
		{"long key", 3, map[uint8][]byte{3: append(vectorKey(), 0)}, false},
		{"current missing", 4, map[uint8][]byte{3: good}, false},
		{"current out of range", 200, map[uint8][]byte{3: good}, false},
		{"no keys", 0, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewKeyring(tt.current, tt.keys)
			if (err == nil) != tt.ok {
				t.Fatalf("NewKeyring error = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestParseKeySpec(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString(vectorKey())
	tests := []struct {
		spec string
		id   uint8
		ok   bool
	}{
		{"3:" + b64, 3, true},
		{"15:" + strings.TrimRight(b64, "="), 15, true},
		{"0:" + b64, 0, true},
		{"16:" + b64, 0, false},
		{"-1:" + b64, 0, false},
		{"x:" + b64, 0, false},
		{b64, 0, false},
		{"3:" + b64[:40], 0, false},
		{"3:" + b64 + "AAAA", 0, false},
		{"3:!!!!", 0, false},
		{"3:", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			id, key, err := ParseKeySpec(tt.spec)
			if (err == nil) != tt.ok {
				t.Fatalf("error = %v, want ok=%v", err, tt.ok)
			}
			if !tt.ok {
				if strings.Contains(err.Error(), b64[:16]) {
					t.Fatalf("error leaks key material: %v", err)
				}
				return
			}
			if id != tt.id || !bytes.Equal(key, vectorKey()) {
				t.Fatalf("got %d %x", id, key)
			}
		})
	}
}

func TestNewPassword(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		p, err := NewPassword()
		if err != nil {
			t.Fatal(err)
		}
		if len(p) != 24 {
			t.Fatalf("len(%q) = %d", p, len(p))
		}
		for i := 0; i < len(p); i++ {
			if !inAlphabet[p[i]] {
				t.Fatalf("%q has non ice-char %q", p, p[i])
			}
		}
		if seen[p] {
			t.Fatalf("repeated %q", p)
		}
		seen[p] = true
	}
}

func TestVerifyAllocs(t *testing.T) {
	k := vectorRing(t)
	inputs := [][]byte{[]byte(vectorUfrag), []byte("ExI0AEKhssPU5fbG74W8"), []byte("short"), []byte("ExI0AEKhssPU5fbG74W\n")}
	for _, in := range inputs {
		if n := testing.AllocsPerRun(100, func() { _, _ = k.Verify(in) }); n != 0 {
			t.Errorf("Verify(%q) allocates %v times", in, n)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	k := vectorRing(b)
	u := []byte(vectorUfrag)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Verify(u); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyBadMAC(b *testing.B) {
	k := vectorRing(b)
	u := []byte("ExI0AEKhssPU5fbG74W8")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Verify(u); err != ErrMAC {
			b.Fatal(err)
		}
	}
}

func BenchmarkMint(b *testing.B) {
	k := vectorRing(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Mint(1, 2); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzVerify(f *testing.F) {
	f.Add(vectorUfrag)
	for _, s := range []string{
		"", vectorUfrag[:19], vectorUfrag + "A", "-" + vectorUfrag[1:], vectorUfrag[:19] + "=",
		vectorUfrag[:19] + "\n", "ExI0AEKhssPU5fbG74W8", "IxI0AEKhssPU5fbG74W9", "FRI0AEKhssPU5fbG74W9",
		"EwAAAEKhssPU5fbG74W9", "AAAAAAAAAAAAAAAAAAAA", "////////////////////",
	} {
		f.Add(s)
	}
	k, err := NewKeyring(3, map[uint8][]byte{3: vectorKey()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := k.Verify([]byte(s))
		if err != nil {
			if reasonLabel(err) == "other" {
				t.Fatalf("unlabelled error %v", err)
			}
			return
		}
		again, err := k.Encode(tok)
		if err != nil {
			t.Fatalf("Encode(Verify(%q)): %v", s, err)
		}
		if again != s {
			t.Fatalf("Encode(Verify(%q)) = %q", s, again)
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

// TestMintHourAndExpiry: a token carries the hour it was minted in, and is
// expired once it is certainly lifetime old (at most lifetime + 1h after
// minting), never before; a token from one hour "ahead" (clock skew) is
// fresh.
func TestMintHourAndExpiry(t *testing.T) {
	k, err := NewKeyring(1, map[uint8][]byte{1: bytes.Repeat([]byte{9}, KeyLen)})
	if err != nil {
		t.Fatal(err)
	}
	mint := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
	u, err := k.MintAt(3, 4, mint)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := k.Verify([]byte(u))
	if err != nil {
		t.Fatal(err)
	}
	if tok.MintHour() != uint16(mint.Unix()/3600) {
		t.Fatalf("MintHour = %d, want %d", tok.MintHour(), mint.Unix()/3600)
	}
	const life = 24 * time.Hour
	for _, tc := range []struct {
		at      time.Duration // after mint
		expired bool
	}{
		{0, false}, {30 * time.Minute, false}, {23 * time.Hour, false}, {24 * time.Hour, false},
		{24*time.Hour + 29*time.Minute, false}, {24*time.Hour + 30*time.Minute, true}, {40 * time.Hour, true},
		{-time.Hour, false}, {-2 * time.Hour, true},
	} {
		if got := tok.Expired(mint.Add(tc.at), life); got != tc.expired {
			t.Errorf("Expired %v after mint = %v, want %v", tc.at, got, tc.expired)
		}
	}
}

// String returns the reason's metric label.
func (r Reason) String() string {
	if r < numReasons {
		return Reasons[r]
	}
	return Reasons[ReasonOther]
}
