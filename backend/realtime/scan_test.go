package realtime

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestScanEvent: the fields the connector routes by, as a server writes
// them, and false for anything but one object.
func TestScanEvent(t *testing.T) {
	for _, tc := range []struct {
		in                         string
		ok, escaped                bool
		typ, delta, resp, item, bb string
	}{
		{in: `{"type":"response.output_audio.delta","response_id":"r1","item_id":"i1","output_index":0,"delta":"AAAA"}`, ok: true,
			typ: "response.output_audio.delta", delta: "AAAA", resp: "r1", item: "i1"},
		{in: ` { "type" : "error" , "error" : { "type" : "x", "delta" : "inner" } } `, ok: true, typ: "error"},
		{in: `{"type":"a","type":"b"}`, ok: true, typ: "b"}, // the last wins, as encoding/json
		{in: `{"delta":"AA\/A"}`, ok: true, escaped: true, delta: `AA\/A`},
		{in: `{"type":"a\"b","delta":"x"}`, ok: true, escaped: true, typ: `a\"b`, delta: "x"},
		{in: `{"TYPE":"x","n":[1,2,{"type":"y"}]}`, ok: true},
		{in: `{}`, ok: true},
		{in: `{"type":"x"}trailing`, ok: true, typ: "x"}, // read for routing, not validated
		{in: `[]`},
		{in: `{"type":"x"`},
		{in: `{"type":"x",}`},
		{in: `{"a\"b":1}`},
		{in: `{"type" "x"}`},
		{in: ``},
	} {
		var f fields
		ok := scanEvent([]byte(tc.in), &f)
		if ok != tc.ok || ok && (f.escaped != tc.escaped || string(f.typ) != tc.typ || string(f.delta) != tc.delta ||
			string(f.responseID) != tc.resp || string(f.itemID) != tc.item) {
			t.Errorf("scanEvent(%s) = %v %+v", tc.in, ok, f)
		}
	}
}

func TestScanEventAllocatesNothing(t *testing.T) {
	ev := []byte(`{"type":"response.output_audio.delta","response_id":"r1","item_id":"i1","output_index":0,"content_index":0,"delta":"AAAAAAAA"}`)
	var f fields
	if n := testing.AllocsPerRun(100, func() { scanEvent(ev, &f) }); n != 0 {
		t.Errorf("%v allocations per event, want 0", n)
	}
}

// FuzzScanEvent: no input panics the scan, and on any valid JSON object
// in valid UTF-8 it reads the same top-level strings as encoding/json
// (exact keys, the last of equal ones), through unescape when they hold
// escapes. Invalid UTF-8 encoding/json replaces with U+FFFD where the scan
// keeps the bytes: such a type names no event, such a delta is no base64.
func FuzzScanEvent(f *testing.F) {
	for _, s := range []string{
		`{"type":"response.output_audio.delta","response_id":"r","item_id":"i","delta":"AAAA"}`,
		`{"type":"x","type":"y","n":{"delta":"z"}}`, `{"delta":"A\/A="}`, `{"Type":"x"}`, `{"type":5}`, `[1]`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fs fields
		ok := scanEvent(data, &fs)
		var m map[string]any
		if !utf8.Valid(data) || json.Unmarshal(data, &m) != nil || m == nil {
			return
		}
		if !ok {
			t.Fatalf("scanEvent refused a valid object: %q", data)
		}
		if fs.escaped {
			return // unescape reads through encoding/json
		}
		str := func(k string) string { s, _ := m[k].(string); return s }
		if string(fs.typ) != str("type") || string(fs.delta) != str("delta") || string(fs.responseID) != str("response_id") || string(fs.itemID) != str("item_id") {
			t.Fatalf("scanEvent(%q) = %+v, encoding/json read %v", data, fs, m)
		}
	})
}

// BenchmarkScanEvent is the scan of one 20 ms audio delta at 24 kHz, the
// event a server sends most (no allocation: TestScanEventAllocatesNothing).
func BenchmarkScanEvent(b *testing.B) {
	ev := []byte(`{"type":"response.output_audio.delta","event_id":"event_1","response_id":"resp_1","item_id":"item_1","output_index":0,"content_index":0,"delta":"` +
		strings.Repeat("AAAA", 320) + `"}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	var f fields
	for b.Loop() {
		if !scanEvent(ev, &f) {
			b.Fatal("scan failed")
		}
	}
}
