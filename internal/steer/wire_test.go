package steer

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"testing"
	"time"
)

// vectorSigner is the test vector's key: cluster 3's relay under key ID
// 1, the Ed25519 seed 00 01 … 1f.
func vectorSigner() *Signer {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i)
	}
	return &Signer{ID: SignerID{Role: SignerRelay, Cluster: 3, KeyID: 1}, Key: ed25519.NewKeyFromSeed(seed)}
}

// vectorTime is when the test vector was signed.
var vectorTime = time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)

// vectorSamples are the test vector's samples, from pod 7 of cluster 3.
func vectorSamples(t testing.TB) []Sample {
	k1, err := ParseKey("198.51.100.0/24@48,2")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := ParseKey("2001:db8::/48@-")
	if err != nil {
		t.Fatal(err)
	}
	return []Sample{{k1, 1, 21 * time.Millisecond}, {k2, 2, 160 * time.Millisecond}}
}

// messageVector is the reference samples message of docs/wire.md §7:
// vectorSamples from PodReporter(3, 7), signed by vectorSigner at
// vectorTime. Another implementation must produce these bytes.
const messageVector = "53" + "03" + "01" + "00030007" + "01" + "0003" + "01" + "6b171040" + "02" +
	"14" + "3139382e35312e3130302e302f32344034382c32" + "0001" + "00d2" +
	"0f" + "323030313a6462383a3a2f3438402d" + "0002" + "0640" +
	"bc4f7d74dceca868a781cef1c583c07e63068fa867115545430ac349ff1aa706" +
	"974dd8a96fcd686e7e121ec9706f859364d7bdb7de3cfc6da2b3bd360420a60a"

// TestSamplesMessageVector: AppendMessage makes the reference bytes, and
// they read back and verify under the signer's public key.
func TestSamplesMessageVector(t *testing.T) {
	sg := vectorSigner()
	b, n := AppendMessage(nil, sg, vectorTime, SourcePod, PodReporter(3, 7), vectorSamples(t))
	if n != 2 || hex.EncodeToString(b) != messageVector {
		t.Fatalf("message (%d samples):\n%x\nwant\n%s", n, b, messageVector)
	}
	m, err := ParseMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	want := vectorSamples(t)
	if m.Source != SourcePod || m.From != PodReporter(3, 7) || m.Signer != sg.ID || m.Time != uint32(vectorTime.Unix()) ||
		len(m.Samples) != 2 || m.Samples[0] != want[0] || m.Samples[1] != want[1] {
		t.Fatalf("read back %+v", m)
	}
	v := &Verifier{Key: func(id SignerID) ed25519.PublicKey {
		if id == sg.ID {
			return sg.Key.Public().(ed25519.PublicKey)
		}
		return nil
	}}
	if d := v.Verify(&m, vectorTime.Add(30*time.Second)); d != Accepted {
		t.Fatalf("the vector: %v", d)
	}
}

// TestSamplesMessageFormat: every truncation is refused, a reporter of
// the other source's kind is refused, and a full message stays within
// MaxMessage with its signature.
func TestSamplesMessageFormat(t *testing.T) {
	in := vectorSamples(t)
	signed, _ := AppendMessage(nil, vectorSigner(), vectorTime, SourcePod, PodReporter(3, 7), in)
	b := signed
	for i := range b {
		if _, err := ParseMessage(b[:i]); err == nil {
			t.Fatalf("truncated at %d accepted", i)
		}
	}
	if _, err := ParseMessage(append(bytes.Clone(b), 0)); err == nil {
		t.Fatal("a trailing byte accepted")
	}
	if b, _ := AppendMessage(nil, nil, vectorTime, SourcePod, ProbeReporter("k"), in); !errors.Is(parseErr(b), errMessage) {
		t.Fatal("pod samples with a probe's reporter accepted")
	}
	if b, _ := AppendMessage(nil, nil, vectorTime, SourceProbe, PodReporter(3, 7), in); !errors.Is(parseErr(b), errMessage) {
		t.Fatal("probe samples with a pod's reporter accepted")
	}
	many := make([]Sample, 300)
	for i := range many {
		many[i] = in[1]
	}
	b, n := AppendMessage(nil, vectorSigner(), vectorTime, SourceProbe, ProbeReporter("probe"), many)
	if len(b) > MaxMessage || n == 0 || n == 300 {
		t.Fatalf("%d bytes, %d samples", len(b), n)
	}
	if m, err := ParseMessage(b); err != nil || len(m.Samples) != n {
		t.Fatalf("full message: %v, %d", err, len(m.Samples))
	}
	// Unsigned (no authority): zero signer and signature, same length.
	u, _ := AppendMessage(nil, nil, vectorTime, SourcePod, PodReporter(3, 7), in)
	if m, err := ParseMessage(u); err != nil || m.Signer != (SignerID{}) || len(u) != len(signed) {
		t.Fatalf("unsigned: %+v %v", m, err)
	}
}

func parseErr(b []byte) error {
	_, err := ParseMessage(b)
	return err
}

// TestVerifyTakesOnlyTheReportersRoleKey: a message is believed only
// under the key of its reporter's role and scope, within MessageMaxAge;
// each refusal has its reason.
func TestVerifyTakesOnlyTheReportersRoleKey(t *testing.T) {
	relay3, relay4 := vectorSigner(), newSigner(t, SignerID{Role: SignerRelay, Cluster: 4, KeyID: 1})
	sig := newSigner(t, SignerID{Role: SignerSignaling, KeyID: 2})
	known := map[SignerID]*Signer{relay3.ID: relay3, relay4.ID: relay4, sig.ID: sig}
	v := &Verifier{Key: func(id SignerID) ed25519.PublicKey {
		if s := known[id]; s != nil {
			return s.Key.Public().(ed25519.PublicKey)
		}
		return nil
	}}
	rogue := newSigner(t, relay3.ID)                       // its own key, claiming cluster 3's ID 1
	unknownID := newSigner(t, SignerID{SignerRelay, 3, 9}) // a key ID the receiver does not hold
	unknownCluster := newSigner(t, SignerID{SignerRelay, 5, 1})
	sigAsRelay := &Signer{ID: SignerID{Role: SignerRelay, Cluster: 3, KeyID: 2}, Key: sig.Key}
	now := vectorTime
	in := vectorSamples(t)
	for _, tc := range []struct {
		name string
		sg   *Signer
		at   time.Time
		src  Source
		from Reporter
		want Drop
	}{
		{"cluster 3's relay, its pod", relay3, now, SourcePod, PodReporter(3, 7), Accepted},
		{"signaling, a probe", sig, now, SourceProbe, ProbeReporter("p"), Accepted},
		{"59 s old", relay3, now.Add(-59 * time.Second), SourcePod, PodReporter(3, 7), Accepted},
		{"unsigned", nil, now, SourcePod, PodReporter(3, 7), DropUnsigned},
		{"cluster 4's relay, cluster 3's pod", relay4, now, SourcePod, PodReporter(3, 7), DropWrongRole},
		{"a relay, a probe", relay3, now, SourceProbe, ProbeReporter("p"), DropWrongRole},
		{"signaling, a pod", sig, now, SourcePod, PodReporter(3, 7), DropWrongRole},
		{"signaling's key under a relay's ID", sigAsRelay, now, SourcePod, PodReporter(3, 7), DropUnknown},
		{"an unknown key ID", unknownID, now, SourcePod, PodReporter(3, 7), DropUnknown},
		{"an unknown cluster", unknownCluster, now, SourcePod, PodReporter(5, 1), DropUnknown},
		{"a key of its own under cluster 3's ID", rogue, now, SourcePod, PodReporter(3, 7), DropSignature},
		{"61 s old", relay3, now.Add(-61 * time.Second), SourcePod, PodReporter(3, 7), DropStale},
		{"11 s ahead", relay3, now.Add(11 * time.Second), SourcePod, PodReporter(3, 7), DropStale},
	} {
		b, _ := AppendMessage(nil, tc.sg, tc.at, tc.src, tc.from, in)
		m, err := ParseMessage(b)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := v.Verify(&m, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	// A bit flipped anywhere under the signature fails it.
	b, _ := AppendMessage(nil, relay3, now, SourcePod, PodReporter(3, 7), in)
	for i := headerLen; i < len(b)-SignatureLen; i++ {
		c := bytes.Clone(b)
		c[i] ^= 1
		if m, err := ParseMessage(c); err == nil && v.Verify(&m, now) == Accepted {
			t.Fatalf("byte %d flipped: accepted", i)
		}
	}
	// Without keys (no authority) everything well-formed is believed.
	m, _ := ParseMessage(b)
	if d := (*Verifier)(nil).Verify(&m, now.Add(time.Hour)); d != Accepted {
		t.Errorf("nil verifier: %v", d)
	}
}

func newSigner(t testing.TB, id SignerID) *Signer {
	t.Helper()
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Signer{ID: id, Key: k}
}

// FuzzParseMessage: the decoder never panics; what it reads is within
// its bounds, re-encodes to a message that reads the same, and never
// verifies without the signer's key.
func FuzzParseMessage(f *testing.F) {
	v, _ := hex.DecodeString(messageVector)
	f.Add(v)
	u, _ := AppendMessage(nil, nil, vectorTime, SourceProbe, ProbeReporter("p"), vectorSamples(f))
	f.Add(u)
	f.Add([]byte("S\x03"))
	sg := vectorSigner()
	other := newSigner(f, sg.ID)
	verifier := &Verifier{Key: func(SignerID) ed25519.PublicKey { return other.Key.Public().(ed25519.PublicKey) }}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMessage(b)
		if err != nil {
			return
		}
		if len(b) > MaxMessage || len(m.Samples) > 255 {
			t.Fatalf("%d bytes, %d samples", len(b), len(m.Samples))
		}
		for _, s := range m.Samples {
			if s.check() != nil {
				t.Fatalf("out-of-range sample %+v", s)
			}
		}
		again, n := AppendMessage(nil, nil, time.Unix(int64(m.Time), 0), m.Source, m.From, m.Samples)
		m2, err := ParseMessage(again)
		if err != nil || n != len(m.Samples) || len(m2.Samples) != n {
			t.Fatalf("re-encoded: %v, %d of %d", err, n, len(m.Samples))
		}
		for i := range n {
			if m2.Samples[i] != m.Samples[i] {
				t.Fatalf("sample %d: %+v, re-read %+v", i, m.Samples[i], m2.Samples[i])
			}
		}
		if verifier.Verify(&m, time.Unix(int64(m.Time), 0)) == Accepted {
			t.Fatal("verified under a key that signed nothing")
		}
	})
}

// BenchmarkParseMessage is the receiver's cost of a samples message of
// 20 samples without its signature check (the baseline), and with it.
func BenchmarkParseMessage(b *testing.B) {
	sg := vectorSigner()
	k := vectorSamples(b)[0].Key
	in := make([]Sample, 20)
	for i := range in {
		in[i] = Sample{Key: k, POP: uint16(1 + i%4), RTT: time.Duration(20+i) * time.Millisecond}
	}
	msg, _ := AppendMessage(nil, sg, vectorTime, SourcePod, PodReporter(3, 7), in)
	v := &Verifier{Key: func(SignerID) ed25519.PublicKey { return sg.Key.Public().(ed25519.PublicKey) }}
	for _, verify := range []bool{false, true} {
		name := "parse"
		if verify {
			name = "parse+verify"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m, err := ParseMessage(msg)
				if err != nil {
					b.Fatal(err)
				}
				if verify && v.Verify(&m, vectorTime) != Accepted {
					b.Fatal("refused")
				}
			}
		})
	}
}

// BenchmarkAppendMessage is the relay's cost of one samples message of
// 20 samples, unsigned (the baseline) and signed.
func BenchmarkAppendMessage(b *testing.B) {
	k := vectorSamples(b)[0].Key
	in := make([]Sample, 20)
	for i := range in {
		in[i] = Sample{Key: k, POP: uint16(1 + i%4), RTT: time.Duration(20+i) * time.Millisecond}
	}
	buf := make([]byte, 0, MaxMessage)
	for _, sg := range []*Signer{nil, vectorSigner()} {
		name := "unsigned"
		if sg != nil {
			name = "signed"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buf, _ = AppendMessage(buf[:0], sg, vectorTime, SourcePod, PodReporter(3, 7), in)
			}
		})
	}
}
