package encap

import "errors"

// Sentinel errors. Decode returns them unwrapped so that it stays
// allocation-free; ReasonOf maps each to a drop reason.
var (
	// ErrShort means the datagram ends before the header does.
	ErrShort = errors.New("encap: datagram shorter than header")
	// ErrMagic means the first byte is not Magic: not an encapsulated
	// datagram at all.
	ErrMagic = errors.New("encap: bad magic")
	// ErrVersion means the version nibble is not Version.
	ErrVersion = errors.New("encap: unknown version")
	// ErrReservedFlag means the reserved byte 3 is set. (Flag bit 3 was
	// reserved too; it now says the client is on TCP.)
	ErrReservedFlag = errors.New("encap: reserved flag set")
	// ErrUnknownKey means the header's key ID names no hop key of the
	// header's cluster that the receiver holds: a sender without the
	// cluster's keys, or a key retired too early.
	ErrUnknownKey = errors.New("encap: unknown hop key")
	// ErrMAC means the tag does not match: forged or altered in flight.
	ErrMAC = errors.New("encap: bad MAC")
	// ErrShortBuffer means the buffer given to Put is smaller than Len.
	ErrShortBuffer = errors.New("encap: buffer too small for header")
	// ErrAddr means an address is not usable: a zero netip.AddrPort when
	// encoding, or an IPv4-mapped IPv6 address in an IPv6 field when
	// decoding (always encoded as IPv4, so it is non-canonical).
	ErrAddr = errors.New("encap: invalid address")
)

// Reason is a typed drop reason for a decode failure: a small integer that
// indexes a preallocated counter (udpio.Drops), so counting a drop needs no
// string building or map lookup.
type Reason uint8

// Drop reasons; ReasonOther is any error this package does not know.
const (
	ReasonOther Reason = iota
	ReasonShort
	ReasonMagic
	ReasonVersion
	ReasonReserved
	ReasonAddr
	ReasonUnknownKey
	ReasonMAC
	ReasonBundle // ErrBundle: a malformed bundle (bundle.go)
	numReasons
)

// Reasons lists the label of every Reason, indexed by Reason, so that drop
// counters can be created (at zero) at start-up.
var Reasons = [numReasons]string{
	ReasonOther: "other", ReasonShort: "short", ReasonMagic: "magic", ReasonVersion: "version",
	ReasonReserved: "reserved", ReasonAddr: "addr", ReasonUnknownKey: "unknown_key", ReasonMAC: "mac", ReasonBundle: "bundle",
}

// reasonErrs is the sentinel of every Reason but ReasonOther, indexed by it.
var reasonErrs = [numReasons]error{nil, ErrShort, ErrMagic, ErrVersion, ErrReservedFlag, ErrAddr, ErrUnknownKey, ErrMAC, ErrBundle}

// ReasonOf maps an error from this package to its drop reason, without
// allocating (the hot path gets the sentinels bare).
func ReasonOf(err error) Reason {
	for r, e := range reasonErrs {
		if r > 0 && (err == e || errors.Is(err, e)) {
			return Reason(r)
		}
	}
	return ReasonOther
}
