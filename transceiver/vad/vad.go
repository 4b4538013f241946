// Package vad is the edge's voice activity detector, for backends that have none of
// their own (netbackend, echo): it reads the caller's Opus packets without
// decoding them, so it costs a few nanoseconds per frame on the media
// path, where a decode would cost tens of microseconds (docs/backends.md,
// "Barge-in"). TestDetectorEvidence measures the features on espeak-ng
// speech and on noise:
//   - SILK and hybrid packets (every packet a browser's VOIP encoder sends
//     for speech) carry the encoder's own VAD decision in their first
//     range-coded bit, the top bit of the first byte after the TOC byte
//     (libwebrtc's WebRtcOpus_PacketHasVoiceActivity reads the same bit).
//     The encoder tracks the noise floor, so stationary noise reads as
//     silence after a few hundred milliseconds; packet size does not.
//   - CELT-only packets carry no such bit: there a packet larger than
//     celtVoicedBytes counts as voiced (a DTX or near-silent frame is a few
//     bytes).
//
// It decides "is the caller speaking" for barge-in and the reply-delay
// clock. The transcoder's opus.Inactive decides another question, "may
// this packet's decode be skipped": a packet without the encoder's flag
// counts as active there (decode it), while here a large one counts as
// voiced. Both read the flag through opus.VoiceActivity.
package vad

import (
	"time"

	"github.com/rtcedge/rtcedge/internal/opus"
)

// Detector timing, in 20 ms frames: speech starts after onsetFrames voiced
// frames in a row (one voiced frame is a click), and stops after
// hangoverFrames unvoiced ones (the gaps between words are shorter).
const (
	onsetFrames     = 3
	hangoverFrames  = 25
	celtVoicedBytes = 60
)

// PacketVoiced reports whether one Opus packet carries voice, by its SILK
// VAD flags (opus.VoiceActivity) or, for packets without them (CELT-only,
// several frames), its size.
func PacketVoiced(p []byte) bool {
	if len(p) < 3 { // DTX, or nothing coded
		return false
	}
	if voiced, ok := opus.VoiceActivity(p); ok {
		return voiced
	}
	return len(p) > celtVoicedBytes
}

// Detector turns a caller's packets into speech start and stop, one call at
// a time (the session's audio path owns it).
type Detector struct {
	voiced, unvoiced int
	speaking         bool
	onset            time.Time
}

// Transition is what one frame changed.
type Transition int

// Transitions.
const (
	None Transition = iota
	SpeechStarted
	SpeechStopped
)

// Frame feeds one packet received at now. On SpeechStarted, Onset is the
// arrival of the first voiced frame of the run; on SpeechStopped, the end
// of speech is the arrival of the last voiced frame (Onset again).
func (d *Detector) Frame(p []byte, now time.Time) Transition {
	if PacketVoiced(p) {
		if d.voiced == 0 && !d.speaking {
			d.onset = now
		}
		d.voiced++
		d.unvoiced = 0
		if d.speaking {
			d.onset = now
			return None
		}
		if d.voiced >= onsetFrames {
			d.speaking = true
			return SpeechStarted
		}
		return None
	}
	d.voiced = 0
	if !d.speaking {
		return None
	}
	d.unvoiced++
	if d.unvoiced >= hangoverFrames {
		d.speaking, d.unvoiced = false, 0
		return SpeechStopped
	}
	return None
}

// Onset is the time the last transition refers to (see Frame).
func (d *Detector) Onset() time.Time { return d.onset }
