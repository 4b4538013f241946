// Package dtmf reads and writes RFC 4733 telephone events, the keypad
// digits a phone call carries in its RTP stream beside the audio: Parse
// and Append for one event's payload, Receiver for the digits of a
// carrier's stream (each digit once, whatever the repetitions, losses and
// reordering), and Tone for the packets of one digit the pod sends.
package dtmf

import (
	"errors"
	"time"
)

// Event is one telephone-event payload (RFC 4733 §2.3): the event code,
// the end bit, the volume (dBm0, as a positive number) and the duration
// so far, in RTP clock ticks, from the event's timestamp on.
type Event struct {
	Code     uint8
	End      bool
	Volume   uint8 // 0–63
	Duration uint16
}

// PayloadLen is the length of one event's payload.
const PayloadLen = 4

// ErrMalformed is returned by Parse for a payload that is no event: not a
// whole number of 4-byte events, or none.
var ErrMalformed = errors.New("dtmf: malformed telephone-event payload")

// Parse reads the event of an RTP payload of a telephone-event payload
// type. A payload of several events (redundancy packing) yields its first.
func Parse(p []byte) (Event, error) {
	if len(p) < PayloadLen || len(p)%PayloadLen != 0 {
		return Event{}, ErrMalformed
	}
	return Event{Code: p[0], End: p[1]&0x80 != 0, Volume: p[1] & 0x3f, Duration: uint16(p[2])<<8 | uint16(p[3])}, nil
}

// Append appends e's payload to dst.
func Append(dst []byte, e Event) []byte {
	b := e.Volume & 0x3f
	if e.End {
		b |= 0x80
	}
	return append(dst, e.Code, b, byte(e.Duration>>8), byte(e.Duration))
}

// digits are the DTMF events 0–15 (RFC 4733 §3.2) by code.
const digits = "0123456789*#ABCD"

// Digit is the keypad digit of a DTMF event code; false for codes above 15
// (flash and the other tone events, which are not digits).
func Digit(code uint8) (byte, bool) {
	if int(code) >= len(digits) {
		return 0, false
	}
	return digits[code], true
}

// Code is the event code of a keypad digit (0–9, *, #, A–D; a–d too).
func Code(d byte) (uint8, bool) {
	if d >= 'a' && d <= 'd' {
		d -= 'a' - 'A'
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] == d {
			return uint8(i), true
		}
	}
	return 0, false
}

// ValidDigits reports whether s is made of keypad digits only.
func ValidDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if _, ok := Code(s[i]); !ok {
			return false
		}
	}
	return true
}

// Tone is the sequence of events the pod sends for one digit (RFC 4733
// §2.5.1): one every step ticks with the duration so far, the first one
// step long, up to duration, whose end is sent three times (§2.5.1.4).
// All of them carry the timestamp of the event's start; the first one the
// marker bit.
func Tone(code uint8, volume uint8, duration, step uint16) []Event {
	if step == 0 {
		step = 160
	}
	duration = max(duration, step)
	out := make([]Event, 0, int(duration/step)+3)
	for d := step; d < duration; d += step {
		out = append(out, Event{Code: code, Volume: volume, Duration: d})
	}
	end := Event{Code: code, End: true, Volume: volume, Duration: duration}
	return append(out, end, end, end)
}

// Result is what a Receiver made of one packet; its String is the reason
// label of the pod's counter.
type Result uint8

// What became of a telephone-event packet.
const (
	// Digit: the first packet of a new digit; deliver it.
	ResultDigit Result = iota
	// Repeat: a packet of a digit already delivered (the repetitions of
	// start, update and end packets), or of an event continued past
	// 0xffff ticks in a new segment.
	ResultRepeat
	// Malformed: no event.
	ResultMalformed
	// NotDigit: an event that is no keypad digit (flash, tones).
	ResultNotDigit
	// Stale: an event older than every one the receiver remembers (a
	// replay, or far too late).
	ResultStale
	// Rate: a new digit beyond the call's digit rate; dropped.
	ResultRate
)

// NumResults is the number of Results.
const NumResults = int(ResultRate) + 1

// Results are every Result, for labels set at start-up.
var Results = [NumResults]Result{ResultDigit, ResultRepeat, ResultMalformed, ResultNotDigit, ResultStale, ResultRate}

func (r Result) String() string {
	return [...]string{"digit", "repeat", "malformed", "not_digit", "stale", "rate"}[r]
}

// Bounds of a Receiver: it remembers the timestamps of the last
// recentEvents digits and lets through at most Rate digits a second with
// bursts of Burst. A human presses at most about 10 keys a second; a
// carrier's stream of stored digits (a PBX dialing a string) is as fast
// as 10 a second too (RFC 4733 §2.5.1.6: 40 ms tone, 40 ms pause at least).
const (
	recentEvents = 16
	Rate         = 12
	Burst        = 24
)

// Receiver turns a stream's telephone-event packets into digits, each
// once. An event's packets all carry its start timestamp: the first
// packet of a timestamp not seen yet is the digit, whatever it is (start,
// update or end: a lost start packet loses nothing), and the others are
// repeats. A stream's memory is fixed (the last recentEvents timestamps),
// so no flood of events grows it. The zero value is ready; it is not safe
// for concurrent use (the pod calls it under the call's reader lock).
type Receiver struct {
	recent [recentEvents]uint32 // timestamps of the last digits, a ring
	n      int                  // how many of recent are set
	next   int                  // the ring's next slot

	// The last event seen: a segment continuing it (RFC 4733 §2.5.1.3,
	// events over 0xffff ticks) is no new digit.
	last    Event
	lastTS  uint32
	hasLast bool

	tokens float64
	refill time.Time
}

// Packet takes one telephone-event packet of timestamp ts at now and says
// what it is; for ResultDigit, digit is the key.
func (r *Receiver) Packet(ts uint32, payload []byte, now time.Time) (res Result, digit byte) {
	e, err := Parse(payload)
	if err != nil {
		return ResultMalformed, 0
	}
	d, ok := Digit(e.Code)
	if !ok {
		return ResultNotDigit, 0
	}
	if r.seen(ts) {
		r.note(e, ts)
		return ResultRepeat, 0
	}
	if r.hasLast && !r.last.End && e.Code == r.last.Code && ts == r.lastTS+uint32(r.last.Duration) && r.last.Duration == 0xffff {
		r.remember(ts) // the next segment of a long event
		r.note(e, ts)
		return ResultRepeat, 0
	}
	if r.n == recentEvents && int32(ts-r.recent[r.next]) <= 0 {
		return ResultStale, 0 // older than the oldest remembered
	}
	if !r.take(now) {
		return ResultRate, 0
	}
	r.remember(ts)
	r.note(e, ts)
	return ResultDigit, d
}

func (r *Receiver) seen(ts uint32) bool {
	for i := 0; i < r.n; i++ {
		if r.recent[i] == ts {
			return true
		}
	}
	return false
}

func (r *Receiver) remember(ts uint32) {
	r.recent[r.next] = ts
	r.next = (r.next + 1) % recentEvents
	r.n = min(r.n+1, recentEvents)
}

func (r *Receiver) note(e Event, ts uint32) {
	if !r.hasLast || int32(ts-r.lastTS) >= 0 {
		r.last, r.lastTS, r.hasLast = e, ts, true
	}
}

// take spends one token of the digit rate.
func (r *Receiver) take(now time.Time) bool {
	if r.refill.IsZero() {
		r.tokens, r.refill = Burst, now
	}
	if el := now.Sub(r.refill); el > 0 {
		r.tokens = min(Burst, r.tokens+el.Seconds()*Rate)
		r.refill = now
	}
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	return true
}
