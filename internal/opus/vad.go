package opus

// Voice activity read from a packet's header bits, without decoding, and
// the level under which decoded audio counts as quiet.

// Inactive reports whether packet is one the caller's encoder marked as
// carrying no speech, read from its header bits without decoding it: a DTX
// packet (2 bytes or fewer, which libopus's encoder makes in a pause with
// DTX on), or a packet whose SILK voice-activity flags are all clear
// (VoiceActivity). Packets that carry no flags report false. It allocates
// nothing. The VAD is the sender's and it calls a steady sound inactive
// after a while: see Quiet.
//
// It answers the transcoder's question, "may this packet's decode be
// skipped", so a packet without flags counts as active (decode it); the
// edge's barge-in asks "is the caller speaking" (transceiver/vad), where a
// large packet without flags counts as voiced.
func Inactive(packet []byte) bool {
	if len(packet) <= 2 {
		return len(packet) > 0
	}
	voiced, ok := VoiceActivity(packet)
	return ok && !voiced
}

// VoiceActivity reads the voice-activity flags the sender's SILK encoder
// put in a mono single-frame SILK or hybrid packet (what a browser sends
// for voice): voiced when any SILK frame's flag is set. ok is false for a
// packet that carries none: CELT-only, stereo, multi-frame, DTX or
// malformed. It allocates nothing.
//
// The flags are the first symbols of the packet's range-coded payload
// (RFC 6716, 4.2.3), each coded with probability 1/2, so reading them needs
// only the range decoder's start (4.1.1), written out here.
func VoiceActivity(packet []byte) (voiced, ok bool) {
	if len(packet) <= 2 {
		return false, false
	}
	toc := packet[0]
	if toc&0x04 != 0 || toc&0x03 != 0 { // stereo, or not one frame
		return false, false
	}
	config := toc >> 3
	silkFrames := 1 // SILK frames in the Opus frame: 10 and 20 ms hold one
	switch {
	case config < 12: // SILK-only: 10, 20, 40 or 60 ms
		silkFrames = max(1, []int{10, 20, 40, 60}[config&3]/20)
	case config < 16: // hybrid: 10 or 20 ms
	default: // CELT-only
		return false, false
	}
	d := rangeDecoder{buf: packet[1:]}
	d.init()
	for range silkFrames {
		if d.bit() {
			return true, true
		}
	}
	return false, true
}

// QuietLevel is the level (RMS, a fraction of full scale: −40 dBFS) under
// which Quiet calls decoded audio quiet, the level under which the tests
// count a frame as not voiced.
const QuietLevel = 0.01

// Quiet reports whether pcm's RMS is under QuietLevel. A frame Inactive
// calls inactive may still be loud: libopus's VAD learns a steady sound
// (a held tone, a hum) as background after about 0.8 s and flags it
// inactive, so a caller that skips inactive frames checks that the ones it
// decoded were quiet too. It allocates nothing.
func Quiet(pcm []int16) bool {
	var sum int64
	for _, s := range pcm {
		sum += int64(s) * int64(s)
	}
	const level = QuietLevel * 32768
	return float64(sum) < level*level*float64(len(pcm))
}

// rangeDecoder is the start of RFC 6716's range decoder (libopus's
// entdec.c), enough to read symbols of probability 1/2.
type rangeDecoder struct {
	buf      []byte
	pos      int
	rng, val uint32
	rem      uint32
}

func (d *rangeDecoder) byte() uint32 {
	if d.pos < len(d.buf) {
		d.pos++
		return uint32(d.buf[d.pos-1])
	}
	return 0
}

func (d *rangeDecoder) init() {
	d.rng = 128
	d.rem = d.byte()
	d.val = d.rng - 1 - d.rem>>1
	d.normalize()
}

func (d *rangeDecoder) normalize() {
	for d.rng <= 1<<23 {
		d.rng <<= 8
		sym := d.rem
		d.rem = d.byte()
		sym = (sym<<8 | d.rem) >> 1
		d.val = (d.val<<8 + (255 &^ sym)) & (1<<31 - 1)
	}
}

// bit decodes one symbol of probability 1/2 (ec_dec_bit_logp with logp 1).
func (d *rangeDecoder) bit() bool {
	s := d.rng >> 1
	one := d.val < s
	if one {
		d.rng = s
	} else {
		d.val -= s
		d.rng -= s
	}
	d.normalize()
	return one
}
