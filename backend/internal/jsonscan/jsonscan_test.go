package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		in      string
		end     int
		escaped bool
	}{
		{`""`, 2, false},
		{`"abc",`, 5, false},
		{`"a\"b"x`, 6, true},
		{`"a\\"x`, 5, true},
		{`"\u00e9"`, 8, true},
		{`"open`, -1, false},
		{`"open\"`, -1, true},
	} {
		end, esc := String([]byte(tc.in), 0)
		if end != tc.end || esc != tc.escaped {
			t.Errorf("String(%q) = %d, %v; want %d, %v", tc.in, end, esc, tc.end, tc.escaped)
		}
	}
}

func TestPlainString(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`"abc" `, "abc", true},
		{`""`, "", true},
		{`"a\"b"`, "", false},
		{"\"a\x01\"", "", false},
		{"\"\xc3\xa9\"", "", false}, // not ASCII: encoding/json decides
		{`"open`, "", false},
	} {
		s, next, ok := PlainString([]byte(tc.in), 0)
		if ok != tc.ok || string(s) != tc.want || (ok && next != len(tc.want)+2) {
			t.Errorf("PlainString(%q) = %q, %d, %v; want %q, %v", tc.in, s, next, ok, tc.want, tc.ok)
		}
	}
}

func TestSkipValue(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{`123,`, 3},
		{`true}`, 4},
		{`null`, 4},
		{`{"a":[1,"]}"]},`, 14},
		{`[{}, [], "x"] `, 13},
		{`"s" `, 3},
		{`{"open":1`, -1},
		{`["open`, -1},
	} {
		if got := SkipValue([]byte(tc.in), 0); got != tc.want {
			t.Errorf("SkipValue(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestScanAllocatesNothing(t *testing.T) {
	b := []byte(`  {"type":"x","n":[1,{"y":"z\"w"}]}`)
	if n := testing.AllocsPerRun(100, func() {
		i := SkipSpace(b, 0)
		_ = SkipValue(b, i)
		_, _ = String(b, 3)
		_, _, _ = PlainString(b, 3)
	}); n != 0 {
		t.Errorf("%v allocations per scan, want 0", n)
	}
}

// FuzzScan: on any input nothing panics, and on valid JSON each function
// agrees with encoding/json: a string literal ends where String says, a
// plain string's bytes are its value, and a whole value is skipped.
func FuzzScan(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b"`, `{"a":[1,"]"]}`, `[1, 2]`, `true`, `-1.5e3`, `"é"`, `{"x":"\u0041"}`, "\"\x7f\"", `"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		i := SkipSpace(b, 0)
		end, esc := String(b, i)
		s, next, plain := PlainString(b, i)
		skip := SkipValue(b, i)
		if end > len(b) || next > len(b) || skip > len(b) {
			t.Fatalf("index past the input: %d %d %d of %d", end, next, skip, len(b))
		}
		if !json.Valid(b) {
			return
		}
		v := bytes.TrimRight(b[i:], " \t\r\n")
		j := i + len(v) // the end of the value
		if skip != j {
			t.Fatalf("SkipValue(%q) = %d, want %d", b, skip, j)
		}
		if v[0] != '"' {
			return
		}
		if end != j || esc != bytes.Contains(v, []byte{'\\'}) {
			t.Fatalf("String(%q) = %d, %v; want %d", b, end, esc, j)
		}
		var want string
		if err := json.Unmarshal(v, &want); err != nil {
			t.Fatal(err)
		}
		if plain && (next != j || string(s) != want) {
			t.Fatalf("PlainString(%q) = %q, %d; value %q ending at %d", b, s, next, want, j)
		}
	})
}
