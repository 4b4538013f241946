package transceiver

import (
	"time"

	"github.com/rtcedge/rtcedge/internal/opus"
)

// The caller's audio, bounded by the wall clock: a caller holds its SRTP
// keys and writes its own RTP timestamps and Opus TOC bytes, so what a
// frame claims to last says nothing about how fast frames may come. A
// caller that sends faster than it speaks would have its backend hear
// (and the pod decode, and a model server bill) many seconds a second.

// Caller audio the pod hands its backend is at most intakeFactor times the
// wall clock over any intakeWindow: a caller may run up to maxAhead of the
// wall clock (a network stall's backlog delivered at once), never more,
// and from there no faster than real time.
const (
	intakeWindow = time.Second
	intakeFactor = 1.5
	maxAhead     = time.Duration((intakeFactor - 1) * float64(intakeWindow))
)

// intake is a session's credit of caller audio (a token bucket of audio
// time that fills at real time, up to maxAhead). Owned by the audio path,
// under the session's audioMu.
type intake struct {
	credit time.Duration
	last   time.Time // when credit was last filled; zero: the first frame
}

// admit reports whether a frame of audio d that arrived at now goes to the
// backend, and takes d from the credit if it does.
func (in *intake) admit(now time.Time, d time.Duration) bool {
	if in.last.IsZero() {
		in.credit = maxAhead
	} else if dt := now.Sub(in.last); dt > 0 {
		in.credit = min(maxAhead, in.credit+dt)
	}
	if !now.Before(in.last) {
		in.last = now
	}
	if d > in.credit {
		return false
	}
	in.credit -= d
	return true
}

// frameAudio is the audio a caller's frame costs its credit: what the RTP
// timestamps say (the backend sends a frame it cannot decode, or does not
// decode, as that much) or what the Opus packet holds (what it decodes
// to), whichever is longer.
func frameAudio(payload []byte, d time.Duration) time.Duration {
	return max(d, opus.PacketDuration(payload))
}
