package stunmsg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"github.com/pion/stun/v4"
)

const (
	ufrag    = "ExI0AEKhssPU5fbG74W9"
	username = ufrag + ":cLiE"
)

// build returns the raw bytes of a STUN message built by pion/stun, the
// implementation browsers' peers (and our transceiver) actually speak.
func build(t testing.TB, setters ...stun.Setter) []byte {
	t.Helper()
	setters = append([]stun.Setter{stun.TransactionID}, setters...)
	m, err := stun.Build(setters...)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(m.Raw)
}

// iceCheck is a connectivity check as an ICE agent sends it.
func iceCheck(t testing.TB, user string) []byte {
	t.Helper()
	return build(t, stun.BindingRequest, stun.NewUsername(user),
		stun.RawAttribute{Type: stun.AttrICEControlling, Value: make([]byte, 8)},
		stun.RawAttribute{Type: stun.AttrPriority, Value: []byte{0x6e, 0x00, 0x1e, 0xff}},
		stun.RawAttribute{Type: stun.AttrUseCandidate},
		stun.NewShortTermIntegrity("server-password-24-chars"), stun.Fingerprint)
}

// setLen overwrites the message length field.
func setLen(b []byte, n int) []byte {
	binary.BigEndian.PutUint16(b[2:4], uint16(n))
	return b
}

// attrOffset returns the offset of the first attribute of type typ in b.
func attrOffset(t testing.TB, b []byte, typ stun.AttrType) int {
	t.Helper()
	for off := 20; off+4 <= len(b); {
		if stun.AttrType(binary.BigEndian.Uint16(b[off:])) == typ {
			return off
		}
		off += 4 + (int(binary.BigEndian.Uint16(b[off+2:]))+3)&^3
	}
	t.Fatalf("no attribute %v", typ)
	return 0
}

func TestUsername(t *testing.T) {
	check := iceCheck(t, username)
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(check)) }
	userOff := attrOffset(t, check, stun.AttrUsername)
	// A USERNAME appended after MESSAGE-INTEGRITY must be ignored.
	late, err := stun.Build(stun.TransactionID, stun.BindingRequest,
		stun.NewShortTermIntegrity("pwd"), stun.NewUsername("late:user"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		b    []byte
		want string
		err  error
	}{
		{"ICE check", check, username, nil},
		{"odd length username, padded", iceCheck(t, "abc:de"), "abc:de", nil},
		{"username only", build(t, stun.BindingRequest, stun.NewUsername("a:b")), "a:b", nil},
		{"empty username", build(t, stun.BindingRequest, stun.NewUsername("")), "", nil},
		{"first of two usernames", build(t, stun.BindingRequest, stun.NewUsername("one:1"), stun.NewUsername("two:2")), "one:1", nil},
		{"binding success", build(t, stun.BindingSuccess, stun.NewUsername(username)), "", ErrNotBindingRequest},
		{"binding indication", build(t, stun.NewType(stun.MethodBinding, stun.ClassIndication), stun.NewUsername(username)), "", ErrNotBindingRequest},
		{"allocate request", build(t, stun.NewType(stun.MethodAllocate, stun.ClassRequest), stun.NewUsername(username)), "", ErrNotBindingRequest},
		{"no username", build(t, stun.BindingRequest, stun.NewShortTermIntegrity("pwd"), stun.Fingerprint), "", ErrNoUsername},
		{"no attributes", build(t, stun.BindingRequest), "", ErrNoUsername},
		{"username after integrity", bytes.Clone(late.Raw), "", ErrNoUsername},
		{"nil", nil, "", ErrNotSTUN},
		{"DTLS", append([]byte{22, 0xfe, 0xfd}, make([]byte, 30)...), "", ErrNotSTUN},
		{"top bits set", mutate(func(b []byte) []byte { b[0] |= 0x80; return b }), "", ErrNotSTUN},
		{"bad cookie", mutate(func(b []byte) []byte { b[7] ^= 1; return b }), "", ErrNotSTUN},
		{"length not multiple of 4", mutate(func(b []byte) []byte { return setLen(b, len(b)-20-2)[:len(b)-2] }), "", ErrNotSTUN},
		{"length too long", mutate(func(b []byte) []byte { return setLen(b, len(b)-20+4) }), "", ErrNotSTUN},
		{"length too short", mutate(func(b []byte) []byte { return setLen(b, len(b)-20-4) }), "", ErrNotSTUN},
		{"trailing garbage", append(bytes.Clone(check), 0, 0, 0, 0), "", ErrNotSTUN},
		{"username length past end", mutate(func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[userOff+2:], uint16(len(b)-userOff))
			return b
		}), "", ErrMalformed},
		{"username length 0xffff", mutate(func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[userOff+2:], 0xffff)
			return b
		}), "", ErrMalformed},
		{"last attribute length past end", mutate(func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[len(b)-6:], 5) // FINGERPRINT is 4 bytes; 5 pads to 8
			return b
		}), "", ErrMalformed},
		{"cut after username, length fixed", mutate(func(b []byte) []byte {
			end := userOff + 4 + (len(username)+3)&^3
			return setLen(b[:end+4], end+4-20)
		}), "", ErrMalformed},
		{"cut after username at boundary", mutate(func(b []byte) []byte {
			end := userOff + 4 + (len(username)+3)&^3
			return setLen(b[:end], end-20)
		}), username, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Username(tt.b)
			if err != tt.err {
				t.Fatalf("Username error = %v, want %v", err, tt.err)
			}
			if err == nil && string(got) != tt.want {
				t.Fatalf("Username = %q, want %q", got, tt.want)
			}
			if err == nil && !within(got, tt.b) {
				t.Fatalf("Username did not return a subslice of its input")
			}
		})
	}
}

// within reports whether sub is a subslice of b (zero length counts).
func within(sub, b []byte) bool {
	if len(sub) == 0 {
		return true
	}
	s, e := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(sub)))
	return e >= s && e+uintptr(cap(sub)) <= s+uintptr(len(b))
}

// TestTruncations cuts a real check at every length: with the header
// length untouched it is never STUN; with the length field patched to match
// it is malformed unless the cut falls on an attribute boundary.
func TestTruncations(t *testing.T) {
	check := iceCheck(t, username)
	for i := range len(check) {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			b := bytes.Clone(check[:i])
			if _, err := Username(b); err != ErrNotSTUN {
				t.Fatalf("raw cut: %v, want ErrNotSTUN", err)
			}
			if i < 20 || (i-20)%4 != 0 {
				return
			}
			setLen(b, i-20)
			got, err := Username(b)
			m := &stun.Message{Raw: bytes.Clone(b)}
			pionErr := m.Decode()
			switch {
			case err == nil:
				if string(got) != username || pionErr != nil {
					t.Fatalf("patched cut: %q (pion: %v)", got, pionErr)
				}
			case err == ErrMalformed || err == ErrNoUsername:
				if err == ErrNoUsername && pionErr != nil {
					t.Fatalf("ErrNoUsername but pion fails: %v", pionErr)
				}
			default:
				t.Fatalf("patched cut: %v", err)
			}
		})
	}
}

func TestIsSTUN(t *testing.T) {
	check := iceCheck(t, username)
	resp := build(t, stun.BindingSuccess, stun.NewShortTermIntegrity("pwd"), stun.Fingerprint)
	tests := []struct {
		name          string
		b             []byte
		stun, binding bool
	}{
		{"check", check, true, true},
		{"response", resp, true, false},
		{"bare header", build(t, stun.BindingRequest), true, true},
		{"19 bytes", check[:19], false, false},
		{"empty", nil, false, false},
		{"RTP", append([]byte{0x80}, check[1:]...), false, false},
		{"top bit 6", append([]byte{0x40}, check[1:]...), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsSTUN(tt.b); got != tt.stun {
				t.Errorf("IsSTUN = %v", got)
			}
			if got := IsBindingRequest(tt.b); got != tt.binding {
				t.Errorf("IsBindingRequest = %v", got)
			}
		})
	}
}

func TestServerUfrag(t *testing.T) {
	tests := []struct {
		in, want string
		err      error
	}{
		{username, ufrag, nil},
		{"a:b:c", "a", nil},
		{"a:", "a", nil},
		{":b", "", nil},
		{"ab", "", ErrNoColon},
		{"", "", ErrNoColon},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			in := []byte(tt.in)
			got, err := ServerUfrag(in)
			if err != tt.err || string(got) != tt.want {
				t.Fatalf("ServerUfrag = %q, %v; want %q, %v", got, err, tt.want, tt.err)
			}
			if err == nil && cap(got) != len(got) {
				t.Fatalf("result capacity %d reaches past the colon", cap(got))
			}
		})
	}
}

func TestDemuxClass(t *testing.T) {
	tests := []struct {
		b    []byte
		want Class
	}{
		{nil, ClassOther},
		{[]byte{0}, ClassSTUN},
		{[]byte{3}, ClassSTUN},
		{[]byte{4}, ClassOther},
		{[]byte{16}, ClassOther}, // ZRTP
		{[]byte{19}, ClassOther},
		{[]byte{20}, ClassDTLS},
		{[]byte{22, 0xfe}, ClassDTLS},
		{[]byte{63}, ClassDTLS},
		{[]byte{64}, ClassOther},   // TURN channel
		{[]byte{0x5e}, ClassOther}, // relay encapsulation magic
		{[]byte{127}, ClassOther},
		{[]byte{128}, ClassRTP},
		{[]byte{0x80, 0x6f}, ClassRTP},
		{[]byte{191}, ClassRTP},
		{[]byte{192}, ClassOther},
		{[]byte{255}, ClassOther},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%x", tt.b), func(t *testing.T) {
			if got := DemuxClass(tt.b); got != tt.want {
				t.Fatalf("DemuxClass = %v, want %v", got, tt.want)
			}
		})
	}
	names := map[string]bool{}
	for _, c := range []Class{ClassOther, ClassSTUN, ClassDTLS, ClassRTP} {
		names[c.String()] = true
	}
	if len(names) != 4 || Class(200).String() != "other" {
		t.Fatalf("class names not distinct: %v", names)
	}
}

func TestReason(t *testing.T) {
	errs := []error{ErrNotSTUN, ErrNotBindingRequest, ErrNoUsername, ErrMalformed, ErrNoColon}
	seen := map[string]bool{}
	for _, err := range errs {
		r := reasonLabel(fmt.Errorf("wrapped: %w", err))
		if r == "other" || seen[r] {
			t.Errorf("reasonLabel(%v) = %q, not distinct", err, r)
		}
		seen[r] = true
	}
	if reasonLabel(errors.New("x")) != "other" || reasonLabel(nil) != "" {
		t.Error("Reason of unknown or nil error")
	}
	for _, r := range Reasons {
		if r != "other" && !seen[r] {
			t.Errorf("label %q has no error", r)
		}
	}
}

func TestAllocs(t *testing.T) {
	check := iceCheck(t, username)
	bad := setLen(bytes.Clone(check), 0xfffc)
	if n := testing.AllocsPerRun(100, func() {
		u, _ := Username(check)
		_, _ = ServerUfrag(u)
		_, _ = Username(bad)
		_ = DemuxClass(check)
		_ = IsBindingRequest(check)
	}); n != 0 {
		t.Fatalf("allocates %v times", n)
	}
}

func BenchmarkUsername(b *testing.B) {
	check := iceCheck(b, username)
	b.ReportAllocs()
	for b.Loop() {
		u, err := Username(check)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ServerUfrag(u); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDemuxClass(b *testing.B) {
	pkt := []byte{0x80, 0x6f, 0, 1}
	b.ReportAllocs()
	for b.Loop() {
		if DemuxClass(pkt) != ClassRTP {
			b.Fatal("class")
		}
	}
}

func FuzzUsername(f *testing.F) {
	check := iceCheck(f, username)
	f.Add(check)
	f.Add(iceCheck(f, "abc:de"))
	f.Add(build(f, stun.BindingRequest))
	f.Add(build(f, stun.BindingSuccess, stun.NewUsername(username)))
	f.Add(setLen(bytes.Clone(check), 0xfffc))
	f.Add(check[:len(check)-4])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := Username(b)
		if err != nil {
			if reasonLabel(err) == "other" {
				t.Fatalf("unlabelled error %v", err)
			}
			return
		}
		if !IsBindingRequest(b) || !within(u, b) {
			t.Fatalf("Username(%x) = %x outside a binding request", b, u)
		}
		// Whatever we accept, pion's full parser must accept too.
		m := &stun.Message{Raw: bytes.Clone(b)}
		if err := m.Decode(); err != nil {
			t.Fatalf("accepted %x that pion rejects: %v", b, err)
		}
		if s, err := ServerUfrag(u); err == nil && len(s) > len(u) {
			t.Fatalf("ServerUfrag longer than username")
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
