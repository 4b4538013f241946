package encap

import "errors"

// Sentinel errors. Decode returns them unwrapped so that it stays
// allocation-free; Reason maps each to a drop-counter label.
var (
	// ErrShort means the datagram ends before the header does.
	ErrShort = errors.New("encap: datagram shorter than header")
	// ErrMagic means the first byte is not Magic: not an encapsulated
	// datagram at all.
	ErrMagic = errors.New("encap: bad magic")
	// ErrVersion means the version nibble is not Version.
	ErrVersion = errors.New("encap: unknown version")
	// ErrReservedFlag means the reserved flag bit 3 is set.
	ErrReservedFlag = errors.New("encap: reserved flag set")
	// ErrShortBuffer means the buffer given to Put is smaller than Len.
	ErrShortBuffer = errors.New("encap: buffer too small for header")
	// ErrAddr means an address is not usable: a zero netip.AddrPort when
	// encoding, or an IPv4-mapped IPv6 address in an IPv6 field when
	// decoding (always encoded as IPv4, so it is non-canonical).
	ErrAddr = errors.New("encap: invalid address")
)

// Reasons lists every label Reason can return, so that drop counters can be
// initialised to zero at start-up.
var Reasons = []string{"short", "magic", "version", "reserved", "addr", "other"}

// Reason returns a short, stable metric label for an error from this
// package ("other" for any error it does not know, "" for nil).
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrShort):
		return "short"
	case errors.Is(err, ErrMagic):
		return "magic"
	case errors.Is(err, ErrVersion):
		return "version"
	case errors.Is(err, ErrReservedFlag):
		return "reserved"
	case errors.Is(err, ErrAddr):
		return "addr"
	default:
		return "other"
	}
}
