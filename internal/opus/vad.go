package opus

// Inactive reports whether packet is one the caller's encoder marked as
// carrying no speech, read from its header bits without decoding it: a DTX
// packet (2 bytes or fewer, which libopus's encoder makes in a pause with
// DTX on), or a mono single-frame SILK or hybrid packet (what a browser
// sends for voice) whose every SILK frame has its voice-activity flag
// clear. CELT-only, stereo and multi-frame packets carry no such flag and
// report false, as does anything malformed. It allocates nothing.
//
// The flags are the first symbols of the packet's range-coded payload
// (RFC 6716, 4.2.3), each coded with probability 1/2, so reading them needs
// only the range decoder's start (4.1.1), written out here.
func Inactive(packet []byte) bool {
	if len(packet) <= 2 {
		return len(packet) > 0
	}
	toc := packet[0]
	if toc&0x04 != 0 || toc&0x03 != 0 { // stereo, or not one frame
		return false
	}
	config := toc >> 3
	silkFrames := 1 // SILK frames in the Opus frame: 10 and 20 ms hold one
	switch {
	case config < 12: // SILK-only: 10, 20, 40 or 60 ms
		silkFrames = max(1, []int{10, 20, 40, 60}[config&3]/20)
	case config < 16: // hybrid: 10 or 20 ms
	default: // CELT-only
		return false
	}
	d := rangeDecoder{buf: packet[1:]}
	d.init()
	for range silkFrames {
		if d.bit() { // voice activity
			return false
		}
	}
	return true
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
