// Package g711 is the phone network's audio codec (ITU-T G.711): 8 kHz
// samples companded to one byte each, by the μ-law (PCMU, RTP payload type
// 0) or the A-law (PCMA, payload type 8). A pod decodes a carrier's RTP
// with it and encodes its replies (docs/sip.md).
//
// Decoding is a table lookup; encoding follows the segment search of the
// recommendation's reference code. Nothing allocates: both write into the
// caller's buffers.
package g711

import "math/bits"

// Law is one of G.711's two companding laws.
type Law uint8

// The two laws, named as their RTP payload formats (RFC 3551).
const (
	PCMU Law = iota // μ-law, payload type 0
	PCMA            // A-law, payload type 8
)

// PayloadType is the law's static RTP payload type.
func (l Law) PayloadType() uint8 {
	if l == PCMA {
		return 8
	}
	return 0
}

// Name is the law's RTP encoding name.
func (l Law) Name() string {
	if l == PCMA {
		return "PCMA"
	}
	return "PCMU"
}

// ClockRate is G.711's sampling rate and RTP clock.
const ClockRate = 8000

var ulawTable, alawTable [256]int16

func init() {
	for i := range 256 {
		ulawTable[i] = ulawDecode(byte(i))
		alawTable[i] = alawDecode(byte(i))
	}
}

// Decode appends the samples of code (one byte each) to pcm and returns
// the extended slice; it allocates only when pcm lacks capacity.
func (l Law) Decode(pcm []int16, code []byte) []int16 {
	t := &ulawTable
	if l == PCMA {
		t = &alawTable
	}
	for _, c := range code {
		pcm = append(pcm, t[c])
	}
	return pcm
}

// Encode appends the code of every sample of pcm to dst and returns the
// extended slice; it allocates only when dst lacks capacity.
func (l Law) Encode(dst []byte, pcm []int16) []byte {
	if l == PCMA {
		for _, s := range pcm {
			dst = append(dst, alawEncode(s))
		}
		return dst
	}
	for _, s := range pcm {
		dst = append(dst, ulawEncode(s))
	}
	return dst
}

const (
	ulawBias = 0x84
	ulawClip = 32635
)

func ulawEncode(pcm int16) byte {
	s := int(pcm)
	var sign int
	if s < 0 {
		sign, s = 0x80, -s
	}
	s = min(s, ulawClip) + ulawBias
	exp := bits.Len(uint(s>>7)) - 1 // s>>7 is 1 to 255
	mant := (s >> (exp + 3)) & 0x0f
	return ^byte(sign | exp<<4 | mant)
}

func ulawDecode(u byte) int16 {
	u = ^u
	exp := int(u>>4) & 7
	s := ((int(u&0x0f) << 3) + ulawBias) << exp
	s -= ulawBias
	if u&0x80 != 0 {
		return int16(-s)
	}
	return int16(s)
}

func alawEncode(pcm int16) byte {
	s := int(pcm) >> 3 // A-law codes 13 bits
	mask := byte(0xd5)
	if s < 0 {
		mask, s = 0x55, -s-1
	}
	// The segment: 0 below 32, then one per doubling up to 7.
	seg := max(0, bits.Len(uint(s))-5)
	if seg >= 8 {
		return 0x7f ^ mask
	}
	a := seg << 4
	if seg < 2 {
		a |= (s >> 1) & 0x0f
	} else {
		a |= (s >> seg) & 0x0f
	}
	return byte(a) ^ mask
}

func alawDecode(a byte) int16 {
	a ^= 0x55
	t := int(a&0x0f) << 4
	switch seg := int(a&0x70) >> 4; seg {
	case 0:
		t += 8
	case 1:
		t += 0x108
	default:
		t = (t + 0x108) << (seg - 1)
	}
	if a&0x80 != 0 {
		return int16(t)
	}
	return int16(-t)
}
