// Package opus is the edge's audio codec: it turns a caller's Opus into
// PCM16 mono at a model backend's rate and the backend's PCM16 back into
// 20 ms Opus packets toward the caller.
//
// It wraps libopus (the reference implementation, Debian's libopus-dev)
// through cgo, linked statically into the release image. libopus decodes to
// and encodes from 8, 12, 16, 24 and 48 kHz natively (the codec's internal
// bands are those rates, and the decoder's output resampler and encoder's
// input filters are part of the codec), so a 24 kHz or 16 kHz backend needs
// no separate resampler: decode at the backend's rate, encode from it. The
// tests check it (a 1 kHz tone encoded at 48 kHz comes out at 1 kHz from a
// 24 kHz decoder, and the reverse). docs/codec.md says why libopus rather than
// a pure-Go codec: none in Go encodes.
//
// Built without cgo or with the noopus build tag, the package compiles to a
// stub whose constructors return ErrUnavailable, so the rest of rtcedge
// builds and vets on a machine without a C toolchain or libopus.
//
// A Decoder or Encoder is owned by one goroutine (one call's direction); it
// is not safe for concurrent use. Decode, Conceal and Encode allocate
// nothing: they write into the caller's buffers.
package opus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// FrameDuration is the frame the edge encodes toward the caller and paces
// (transceiver/pace): one RTP packet, one slot of the scheduler's round.
// 20 ms is WebRTC's usual Opus frame: shorter costs more packets and
// headers per second, longer adds its length to the reply's delay.
const FrameDuration = 20 * time.Millisecond

// DefaultComplexity is the complexity NewEncoder sets; Encoder.SetComplexity
// changes it. Measured in docs/benchmarks.md ("Audio codec"): for NewEncoder's
// CELT on 24 kHz speech, 0 costs two thirds of 1 to 3 and under half of 5 to
// 10, with the waveform as close (correlation 0.98) and a spectral distance
// within 0.25 dB of 10's. The codec is most of the transcoding's CPU, which
// bounds the calls a pod carries.
const DefaultComplexity = 0

// MaxPacket is the largest Opus packet (RFC 6716, 3.2.1): an Encode
// destination of this size is always large enough.
const MaxPacket = 1275

// ErrUnavailable is returned by NewDecoder and NewEncoder in a build
// without libopus (no cgo, or the noopus tag).
var ErrUnavailable = errors.New("opus: built without libopus (cgo disabled or noopus tag)")

// Errors of Decode, DecodeFEC, Conceal and Encode. They are returned
// unwrapped so that a per-packet failure costs no allocation; the caller
// counts them.
var (
	// ErrInvalidPacket: the packet is empty or not valid Opus.
	ErrInvalidPacket = errors.New("opus: invalid packet")
	// ErrBufferTooSmall: pcm is shorter than the packet's duration.
	ErrBufferTooSmall = errors.New("opus: buffer too small for the packet")
	// ErrBadArg: a length that is not a whole frame (Encode) or not a
	// multiple of 2.5 ms (Conceal, DecodeFEC).
	ErrBadArg = errors.New("opus: bad frame length")
	// ErrClosed: the Decoder or Encoder was closed.
	ErrClosed = errors.New("opus: closed")
	// ErrInternal: libopus failed for another reason.
	ErrInternal = errors.New("opus: internal libopus error")
)

// validRate reports whether libopus decodes to and encodes from rate.
func validRate(rate int) error {
	switch rate {
	case 8000, 12000, 16000, 24000, 48000:
		return nil
	}
	return fmt.Errorf("opus: rate %d Hz not supported (8000, 12000, 16000, 24000 or 48000)", rate)
}

// AppendPCM16LE appends pcm to dst as 16-bit little-endian samples, the
// layout of the Realtime protocol's base64 audio, and returns the extended
// slice. It allocates only when dst lacks capacity.
func AppendPCM16LE(dst []byte, pcm []int16) []byte {
	for _, s := range pcm {
		dst = binary.LittleEndian.AppendUint16(dst, uint16(s))
	}
	return dst
}

// DecodePCM16LE reads 16-bit little-endian samples from src into pcm and
// returns how many it wrote: min(len(src)/2, len(pcm)). An odd trailing byte
// is ignored.
func DecodePCM16LE(src []byte, pcm []int16) int {
	n := min(len(src)/2, len(pcm))
	for i := range n {
		pcm[i] = int16(binary.LittleEndian.Uint16(src[2*i:]))
	}
	return n
}

// PacketDuration is the audio an Opus packet holds by its TOC byte and
// frame count (RFC 6716, 3.1), whatever the RTP timestamps around it
// claim; 0 for an empty or malformed packet, at most 120 ms. It
// allocates nothing.
func PacketDuration(packet []byte) time.Duration {
	if len(packet) == 0 {
		return 0
	}
	toc := packet[0]
	config := toc >> 3
	var frame time.Duration
	switch {
	case config < 12: // SILK-only: 10, 20, 40, 60 ms
		frame = [4]time.Duration{10, 20, 40, 60}[config&3] * time.Millisecond
	case config < 16: // hybrid: 10, 20 ms
		frame = [2]time.Duration{10, 20}[config&1] * time.Millisecond
	default: // CELT-only: 2.5, 5, 10, 20 ms
		frame = [4]time.Duration{2500, 5000, 10000, 20000}[config&3] * time.Microsecond
	}
	frames := 1
	switch toc & 3 {
	case 1, 2:
		frames = 2
	case 3:
		if len(packet) < 2 {
			return 0
		}
		frames = int(packet[1] & 0x3f)
	}
	return min(time.Duration(frames)*frame, 120*time.Millisecond)
}
