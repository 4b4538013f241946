package dtmf

import (
	"testing"
	"time"
)

// FuzzReceiver feeds a Receiver arbitrary packets: it never panics, a
// payload that parses round-trips through Append, and a digit is only
// ever delivered for a timestamp it has not delivered before while it
// still remembers it.
func FuzzReceiver(f *testing.F) {
	f.Add(uint32(0), []byte{5, 0x0a, 0x00, 0xa0})
	f.Add(uint32(1<<31), []byte{11, 0x8a, 0x03, 0x20, 1, 2, 3, 4})
	f.Add(uint32(7), []byte{16, 0, 0})
	f.Fuzz(func(t *testing.T, ts uint32, payload []byte) {
		var r Receiver
		now := time.Unix(1, 0)
		res, d := r.Packet(ts, payload, now)
		e, err := Parse(payload)
		if err != nil {
			if res != ResultMalformed {
				t.Fatalf("unparseable payload gave %v", res)
			}
			return
		}
		if back, err := Parse(Append(nil, e)); err != nil || back != e {
			t.Fatalf("round trip: %+v -> %+v, %v", e, back, err)
		}
		if want, ok := Digit(e.Code); ok != (res == ResultDigit) || (ok && d != want) {
			t.Fatalf("code %d: %v %q", e.Code, res, d)
		}
		for range 3 {
			if again, _ := r.Packet(ts, payload, now); again == ResultDigit {
				t.Fatal("the same event delivered twice")
			}
		}
	})
}
