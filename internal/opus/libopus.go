//go:build cgo && !noopus

package opus

/*
// -lm after -lopus: a static link (scripts/build-image.sh) resolves
// libopus's math only in that order. The header's directory is the one
// every distribution's libopus-dev uses; elsewhere set CGO_CFLAGS and
// CGO_LDFLAGS.
#cgo LDFLAGS: -lopus -lm
#include <opus/opus.h>

// opus_encoder_ctl is variadic, which cgo cannot call: one wrapper sets
// everything a constructor chooses and returns the first error. loss 0
// turns in-band FEC off (CELT, the low-delay application, has none).
static int rtcedge_encoder_setup(OpusEncoder *e, int bitrate, int complexity, int loss) {
	int err;
	if ((err = opus_encoder_ctl(e, OPUS_SET_BITRATE(bitrate))) != OPUS_OK) return err;
	if ((err = opus_encoder_ctl(e, OPUS_SET_COMPLEXITY(complexity))) != OPUS_OK) return err;
	if ((err = opus_encoder_ctl(e, OPUS_SET_INBAND_FEC(loss > 0))) != OPUS_OK) return err;
	if ((err = opus_encoder_ctl(e, OPUS_SET_PACKET_LOSS_PERC(loss))) != OPUS_OK) return err;
	if ((err = opus_encoder_ctl(e, OPUS_SET_SIGNAL(OPUS_SIGNAL_VOICE))) != OPUS_OK) return err;
	return OPUS_OK;
}

static int rtcedge_encoder_set_complexity(OpusEncoder *e, int complexity) {
	return opus_encoder_ctl(e, OPUS_SET_COMPLEXITY(complexity));
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Encoder settings.
const (
	bitrate = 32000
	// expectedLoss (percent) is what a VoIP encoder plans in-band FEC for:
	// without a non-zero figure libopus sends no FEC at all.
	expectedLoss = 5
	// voipComplexity is what browsers' WebRTC stacks (libwebrtc on a
	// desktop) set for a microphone.
	voipComplexity = 9
)

// libError turns a libopus error code into an error without allocating:
// per-packet failures are counted by the caller, not formatted.
func libError(code C.int) error {
	switch code {
	case C.OPUS_INVALID_PACKET:
		return ErrInvalidPacket
	case C.OPUS_BUFFER_TOO_SMALL:
		return ErrBufferTooSmall
	case C.OPUS_BAD_ARG:
		return ErrBadArg
	}
	return ErrInternal
}

// Decoder turns one caller's Opus (RTP clock 48 kHz) into PCM16 mono at
// Rate. It owns a libopus decoder state in C memory, freed by Close (or,
// as a safety net, when the garbage collector finds it dropped). Not
// safe for concurrent use: one goroutine (the call's uplink) owns it.
type Decoder struct {
	st      *C.OpusDecoder // nil after Close
	rate    int
	unit    int             // samples per 2.5 ms: the granularity of Conceal and DecodeFEC
	cleanup runtime.Cleanup // frees st if the Decoder is dropped unclosed
}

// NewDecoder makes a mono decoder whose output is at rate: 8000, 12000,
// 16000, 24000 or 48000 Hz.
func NewDecoder(rate int) (*Decoder, error) {
	if err := validRate(rate); err != nil {
		return nil, err
	}
	var code C.int
	st := C.opus_decoder_create(C.opus_int32(rate), 1, &code)
	if code != C.OPUS_OK || st == nil {
		return nil, fmt.Errorf("opus: create %d Hz decoder: %s", rate, C.GoString(C.opus_strerror(code)))
	}
	d := &Decoder{st: st, rate: rate, unit: rate / 400}
	d.cleanup = runtime.AddCleanup(d, func(st *C.OpusDecoder) { C.opus_decoder_destroy(st) }, st)
	return d, nil
}

// Rate is the decoder's output rate in Hz.
func (d *Decoder) Rate() int { return d.rate }

// Decode decodes one Opus packet into pcm and returns the number of samples
// written. pcm must hold the packet's duration (up to 120 ms, 0.12*Rate
// samples) or Decode returns ErrBufferTooSmall. An empty packet is
// ErrInvalidPacket: a lost packet is Conceal's (or DecodeFEC's) job.
func (d *Decoder) Decode(packet []byte, pcm []int16) (int, error) {
	return d.decode(packet, pcm, 0)
}

// DecodeFEC recovers the frame lost just before packet from packet's
// in-band FEC data (a packet without FEC yields concealment instead). pcm's
// length is the lost frame's duration, a multiple of 2.5 ms. Decode packet
// itself afterwards as usual.
func (d *Decoder) DecodeFEC(packet []byte, pcm []int16) (int, error) {
	if len(pcm) == 0 || len(pcm)%d.unit != 0 {
		return 0, ErrBadArg
	}
	return d.decode(packet, pcm, 1)
}

func (d *Decoder) decode(packet []byte, pcm []int16, fec C.int) (int, error) {
	if d.st == nil {
		return 0, ErrClosed
	}
	if len(packet) == 0 {
		return 0, ErrInvalidPacket
	}
	if len(pcm) == 0 {
		return 0, ErrBufferTooSmall
	}
	n := C.opus_decode(d.st, (*C.uchar)(unsafe.Pointer(&packet[0])), C.opus_int32(len(packet)),
		(*C.opus_int16)(unsafe.Pointer(&pcm[0])), C.int(len(pcm)), fec)
	if n < 0 {
		return 0, libError(n)
	}
	return int(n), nil
}

// Conceal writes packet-loss concealment for one lost frame of len(pcm)
// samples (a multiple of 2.5 ms at Rate; 20 ms for a lost 20 ms packet),
// extrapolated from what the decoder heard last, and returns len(pcm).
func (d *Decoder) Conceal(pcm []int16) (int, error) {
	if d.st == nil {
		return 0, ErrClosed
	}
	if len(pcm) == 0 || len(pcm)%d.unit != 0 {
		return 0, ErrBadArg
	}
	n := C.opus_decode(d.st, nil, 0, (*C.opus_int16)(unsafe.Pointer(&pcm[0])), C.int(len(pcm)), 0)
	if n < 0 {
		return 0, libError(n)
	}
	return int(n), nil
}

// Close frees the decoder state. It is idempotent; after it, every call
// returns ErrClosed.
func (d *Decoder) Close() {
	if d.st != nil {
		d.cleanup.Stop()
		C.opus_decoder_destroy(d.st)
		d.st = nil
	}
}

// Encoder turns PCM16 mono at Rate into 20 ms Opus packets, decodable by any
// Opus decoder at any rate. NewEncoder's is the edge's (the model's audio
// toward the caller); NewVoIPEncoder's encodes as a caller's browser does.
// It owns a libopus encoder state in C memory, freed by Close (or when the
// garbage collector finds it dropped).
// Not safe for concurrent use: one goroutine (the call's downlink) owns it.
type Encoder struct {
	st      *C.OpusEncoder // nil after Close
	rate    int
	frame   int             // samples per 20 ms
	cleanup runtime.Cleanup // frees st if the Encoder is dropped unclosed
}

// NewEncoder makes the edge's mono encoder, whose input is at rate: 8000,
// 12000, 16000, 24000 or 48000 Hz. It is libopus's restricted-low-delay
// application, CELT only, at 32 kb/s VBR and DefaultComplexity: on speech
// at 24 kHz it costs a quarter of the VOIP application's SILK/CELT hybrid
// with a closer waveform, 2.5 ms of look-ahead instead of 6.5, and no
// in-band FEC (CELT has none; a lost packet is concealed by the caller's
// decoder, which on speech keeps more than the hybrid's FEC at 5 and 10 %
// loss). docs/codec.md has the measurements.
func NewEncoder(rate int) (*Encoder, error) {
	return newEncoder(rate, C.OPUS_APPLICATION_RESTRICTED_LOWDELAY, DefaultComplexity, 0)
}

// NewVoIPEncoder makes a mono encoder as a browser's WebRTC stack makes one
// for a microphone: libopus's VOIP application (SILK or SILK/CELT hybrid
// for voice), 32 kb/s VBR, in-band FEC planned for 5 % loss, complexity 9.
// Tests and load generators make a caller's packets with it, so that the
// edge decodes what it decodes from a browser.
func NewVoIPEncoder(rate int) (*Encoder, error) {
	return newEncoder(rate, C.OPUS_APPLICATION_VOIP, voipComplexity, expectedLoss)
}

func newEncoder(rate int, app C.int, complexity, loss int) (*Encoder, error) {
	if err := validRate(rate); err != nil {
		return nil, err
	}
	var code C.int
	st := C.opus_encoder_create(C.opus_int32(rate), 1, app, &code)
	if code != C.OPUS_OK || st == nil {
		return nil, fmt.Errorf("opus: create %d Hz encoder: %s", rate, C.GoString(C.opus_strerror(code)))
	}
	if code := C.rtcedge_encoder_setup(st, bitrate, C.int(complexity), C.int(loss)); code != C.OPUS_OK {
		C.opus_encoder_destroy(st)
		return nil, fmt.Errorf("opus: configure %d Hz encoder: %s", rate, C.GoString(C.opus_strerror(code)))
	}
	e := &Encoder{st: st, rate: rate, frame: rate * int(FrameDuration.Milliseconds()) / 1000}
	e.cleanup = runtime.AddCleanup(e, func(st *C.OpusEncoder) { C.opus_encoder_destroy(st) }, st)
	return e, nil
}

// Rate is the encoder's input rate in Hz.
func (e *Encoder) Rate() int { return e.rate }

// FrameSamples is the length of the pcm Encode takes: 20 ms at Rate.
func (e *Encoder) FrameSamples() int { return e.frame }

// SetComplexity sets the encoder's complexity, 0 (cheapest) to 10 (libopus's
// own default): docs/benchmarks.md measures what each step costs and gains.
func (e *Encoder) SetComplexity(c int) error {
	if e.st == nil {
		return ErrClosed
	}
	if c < 0 || c > 10 {
		return fmt.Errorf("opus: complexity %d out of 0..10", c)
	}
	if code := C.rtcedge_encoder_set_complexity(e.st, C.int(c)); code != C.OPUS_OK {
		return fmt.Errorf("opus: set complexity %d: %s", c, C.GoString(C.opus_strerror(code)))
	}
	return nil
}

// Encode encodes one 20 ms frame (len(pcm) == FrameSamples()) into out and
// returns the packet's length. out of MaxPacket bytes always suffices; a
// smaller one caps the packet's size.
func (e *Encoder) Encode(pcm []int16, out []byte) (int, error) {
	if e.st == nil {
		return 0, ErrClosed
	}
	if len(pcm) != e.frame || len(out) == 0 {
		return 0, ErrBadArg
	}
	n := C.opus_encode(e.st, (*C.opus_int16)(unsafe.Pointer(&pcm[0])), C.int(e.frame),
		(*C.uchar)(unsafe.Pointer(&out[0])), C.opus_int32(min(len(out), MaxPacket)))
	if n < 0 {
		return 0, libError(n)
	}
	return int(n), nil
}

// Close frees the encoder state. It is idempotent; after it, every call
// returns ErrClosed.
func (e *Encoder) Close() {
	if e.st != nil {
		e.cleanup.Stop()
		C.opus_encoder_destroy(e.st)
		e.st = nil
	}
}
