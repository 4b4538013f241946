package dtmf

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
)

// stream is the packets a carrier sends for digits, each digit's Tone,
// one packet per 20 ms, a new timestamp per digit.
type packet struct {
	ts      uint32
	payload []byte
}

func stream(keys string, ts uint32) []packet {
	var out []packet
	for i := 0; i < len(keys); i++ {
		code, _ := Code(keys[i])
		tone := Tone(code, 10, 800, 160)
		// Start packets repeat too (a carrier sends the first one 3 times).
		tone = append([]Event{tone[0], tone[0]}, tone...)
		for _, e := range tone {
			out = append(out, packet{ts: ts, payload: Append(nil, e)})
		}
		ts += 1600
	}
	return out
}

func digitsOf(t *testing.T, r *Receiver, pkts []packet, now time.Time) string {
	t.Helper()
	var got []byte
	for _, p := range pkts {
		res, d := r.Packet(p.ts, p.payload, now)
		if res == ResultDigit {
			got = append(got, d)
		}
		now = now.Add(20 * time.Millisecond)
	}
	return string(got)
}

const keys = "0123456789*#ABCD"

func TestParseAppend(t *testing.T) {
	e := Event{Code: 11, End: true, Volume: 37, Duration: 0x1234}
	b := Append(nil, e)
	if !bytes.Equal(b, []byte{11, 0x80 | 37, 0x12, 0x34}) {
		t.Fatalf("payload % x", b)
	}
	if got, err := Parse(b); err != nil || got != e {
		t.Fatalf("Parse = %+v, %v", got, err)
	}
	for _, bad := range [][]byte{nil, {1, 2, 3}, {1, 2, 3, 4, 5}} {
		if _, err := Parse(bad); err != ErrMalformed {
			t.Errorf("Parse(% x) = %v", bad, err)
		}
	}
	if got, err := Parse(append(b, 1, 2, 3, 4)); err != nil || got != e {
		t.Errorf("two events: %+v, %v", got, err)
	}
	for i := 0; i < len(keys); i++ {
		c, ok := Code(keys[i])
		if d, ok2 := Digit(c); !ok || !ok2 || d != keys[i] {
			t.Errorf("digit %c: code %d, back %c", keys[i], c, d)
		}
	}
	if _, ok := Digit(16); ok {
		t.Error("flash is a digit")
	}
	if !ValidDigits("12ab#*") || ValidDigits("12e") {
		t.Error("ValidDigits")
	}
}

func TestTone(t *testing.T) {
	tone := Tone(5, 10, 800, 160)
	if len(tone) != 7 {
		t.Fatalf("%d events: %+v", len(tone), tone)
	}
	for i, e := range tone[:4] {
		if e.End || e.Duration != uint16(160*(i+1)) {
			t.Errorf("event %d: %+v", i, e)
		}
	}
	for _, e := range tone[4:] {
		if !e.End || e.Duration != 800 {
			t.Errorf("end: %+v", e)
		}
	}
}

// TestReceiverOnce: 16 digits with their repetitions, delivered exactly
// once each, in order.
func TestReceiverOnce(t *testing.T) {
	var r Receiver
	if got := digitsOf(t, &r, stream(keys, 0xfffff000), time.Now()); got != keys {
		t.Fatalf("digits %q, want %q", got, keys)
	}
}

// TestReceiverLossReorder: lost start packets (and a lost whole middle
// of an event), and packets shuffled within a window of a few, still
// give each digit once.
func TestReceiverLossReorder(t *testing.T) {
	pkts := stream(keys, 1000)
	var lossy []packet
	for i, p := range pkts {
		e, _ := Parse(p.payload)
		if !e.End && (i%3 != 0) { // most start and update packets lost
			continue
		}
		lossy = append(lossy, p)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range lossy { // each packet moves up to 3 places
		j := min(len(lossy)-1, i+rng.IntN(4))
		lossy[i], lossy[j] = lossy[j], lossy[i]
	}
	var r Receiver
	got := digitsOf(t, &r, lossy, time.Now())
	if len(got) != len(keys) {
		t.Fatalf("digits %q, want each of %q once", got, keys)
	}
	for i := 0; i < len(keys); i++ {
		if bytes.Count([]byte(got), []byte{keys[i]}) != 1 {
			t.Errorf("digit %c: %d times in %q", keys[i], bytes.Count([]byte(got), []byte{keys[i]}), got)
		}
	}
}

// TestReceiverBounds: a flood of events of new timestamps delivers at
// most the burst and then the rate; replays of old ones are stale; the
// receiver's size never changes.
func TestReceiverBounds(t *testing.T) {
	var r Receiver
	now := time.Now()
	counts := map[Result]int{}
	for i := range 10000 {
		res, _ := r.Packet(uint32(i)*160, Append(nil, Event{Code: uint8(i % 16)}), now) // 10,000 in one instant
		counts[res]++
	}
	if counts[ResultDigit] != Burst || counts[ResultRate] != 10000-Burst {
		t.Errorf("flood: %v, want %d digits", counts, Burst)
	}
	now = now.Add(time.Second)
	ts := uint32(20000 * 160)
	delivered := 0
	for i := range 100 {
		if res, _ := r.Packet(ts+uint32(i)*160, Append(nil, Event{Code: 1}), now); res == ResultDigit {
			delivered++
		}
	}
	if delivered != Rate {
		t.Errorf("after 1 s: %d digits, want %d", delivered, Rate)
	}
	// Fill the memory, then replay the first: stale.
	now = now.Add(10 * time.Second)
	var r2 Receiver
	for i := range recentEvents + 1 {
		r2.Packet(uint32(i)*1600, Append(nil, Event{Code: 1}), now.Add(time.Duration(i)*time.Second))
	}
	if res, _ := r2.Packet(0, Append(nil, Event{Code: 1}), now.Add(time.Minute)); res != ResultStale {
		t.Errorf("replay of a forgotten digit: %v", res)
	}
	if res, _ := r2.Packet(0, Append(nil, Event{Code: 16}), now); res != ResultNotDigit {
		t.Errorf("flash: %v", res)
	}
	if res, _ := r2.Packet(0, []byte{1}, now); res != ResultMalformed {
		t.Errorf("short: %v", res)
	}
}

// TestReceiverLongEvent: an event past 0xffff ticks continues in a new
// segment with a new timestamp (RFC 4733 §2.5.1.3): no second digit.
func TestReceiverLongEvent(t *testing.T) {
	var r Receiver
	now := time.Now()
	if res, d := r.Packet(100, Append(nil, Event{Code: 7, Duration: 0xffff}), now); res != ResultDigit || d != '7' {
		t.Fatalf("first segment: %v %c", res, d)
	}
	if res, _ := r.Packet(100+0xffff, Append(nil, Event{Code: 7, Duration: 160}), now); res != ResultRepeat {
		t.Errorf("second segment: %v", res)
	}
	if res, _ := r.Packet(100+0xffff, Append(nil, Event{Code: 7, End: true, Duration: 320}), now); res != ResultRepeat {
		t.Errorf("its end: %v", res)
	}
}

func BenchmarkReceiver(b *testing.B) {
	b.ReportAllocs()
	var r Receiver
	p := Append(nil, Event{Code: 3, Duration: 160})
	now := time.Now()
	for i := 0; b.Loop(); i++ {
		r.Packet(uint32(i/7)*1600, p, now)
	}
}

// TestReceiverAllocs: reading a stream's events allocates nothing (the
// pod calls it for every telephone-event datagram).
func TestReceiverAllocs(t *testing.T) {
	var r Receiver
	p := Append(nil, Event{Code: 3, Duration: 160})
	now := time.Now()
	i := uint32(0)
	if n := testing.AllocsPerRun(1000, func() {
		r.Packet(i/7*1600, p, now)
		i++
	}); n != 0 {
		t.Errorf("%v allocations per packet", n)
	}
}
