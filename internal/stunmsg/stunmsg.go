// Package stunmsg reads the few STUN fields a relay needs on its hot path,
// without allocating and without a full STUN parser.
//
// A global relay receiving a datagram from an unknown client address
// classifies it (DemuxClass), checks that it is a STUN Binding Request
// (IsBindingRequest), takes the USERNAME attribute (Username) and the
// server ufrag before the colon (ServerUfrag), and hands that to
// token.Keyring.Verify. Everything returned is a subslice of the input;
// nothing is copied or retained. Authentication of the message itself
// (MESSAGE-INTEGRITY) is left to the transceiver, which holds the ICE
// password; the relay trusts only the routing token's own MAC.
package stunmsg

import (
	"bytes"
	"encoding/binary"
)

const (
	// MagicCookie is the fixed value of bytes 4..7 of every STUN message
	// (RFC 8489 section 5).
	MagicCookie = 0x2112A442

	headerLen = 20
	attrHdr   = 4

	typeBindingRequest   = 0x0001
	attrUsername         = 0x0006
	attrMessageIntegrity = 0x0008
)

// IsSTUN reports whether b is exactly one STUN message: at least 20 bytes,
// top two bits zero, the magic cookie in place, and a length field that is
// a multiple of 4 and accounts for the rest of b.
func IsSTUN(b []byte) bool {
	if len(b) < headerLen || b[0]&0xc0 != 0 {
		return false
	}
	if binary.BigEndian.Uint32(b[4:8]) != MagicCookie {
		return false
	}
	n := int(binary.BigEndian.Uint16(b[2:4]))
	return n%4 == 0 && headerLen+n == len(b)
}

// IsBindingRequest reports whether b is a STUN message (IsSTUN) of type
// Binding Request (0x0001).
func IsBindingRequest(b []byte) bool {
	return IsSTUN(b) && binary.BigEndian.Uint16(b[0:2]) == typeBindingRequest
}

// Username returns the USERNAME attribute value of a STUN Binding Request,
// as a subslice of b (no copy). The whole attribute list is walked with
// strict bounds checks, so a message with any attribute running past the
// end is ErrMalformed even if its USERNAME is intact. A USERNAME after
// MESSAGE-INTEGRITY is ignored, as RFC 8489 requires. Errors are the bare
// sentinels ErrNotSTUN, ErrNotBindingRequest, ErrMalformed, ErrNoUsername.
func Username(b []byte) ([]byte, error) {
	if !IsSTUN(b) {
		return nil, ErrNotSTUN
	}
	if binary.BigEndian.Uint16(b[0:2]) != typeBindingRequest {
		return nil, ErrNotBindingRequest
	}
	var user []byte
	found, integrity := false, false
	for off := headerLen; off < len(b); {
		if len(b)-off < attrHdr {
			return nil, ErrMalformed
		}
		typ := binary.BigEndian.Uint16(b[off:])
		n := int(binary.BigEndian.Uint16(b[off+2:]))
		off += attrHdr
		padded := (n + 3) &^ 3
		if padded > len(b)-off {
			return nil, ErrMalformed
		}
		switch {
		case typ == attrMessageIntegrity:
			integrity = true
		case typ == attrUsername && !found && !integrity:
			user, found = b[off:off+n:off+n], true
		}
		off += padded
	}
	if !found {
		return nil, ErrNoUsername
	}
	return user, nil
}

// ServerUfrag returns the part of a "serverUfrag:clientUfrag" USERNAME
// before the first colon (a subslice, no copy), or ErrNoColon.
func ServerUfrag(username []byte) ([]byte, error) {
	i := bytes.IndexByte(username, ':')
	if i < 0 {
		return nil, ErrNoColon
	}
	return username[:i:i], nil
}

// Class is the protocol family of a datagram arriving on a socket shared
// by ICE, DTLS and SRTP, by its first byte (RFC 7983 section 7).
type Class uint8

// Classes of DemuxClass.
const (
	// ClassOther is anything not below, including an empty datagram and
	// an encapsulated one (its magic is outside every RFC 7983 range).
	ClassOther Class = iota
	// ClassSTUN is a first byte of 0..3.
	ClassSTUN
	// ClassDTLS is a first byte of 20..63.
	ClassDTLS
	// ClassRTP is a first byte of 128..191: RTP or RTCP (SRTP, SRTCP).
	ClassRTP
)

// String returns a lower-case name, usable as a metric label.
func (c Class) String() string {
	switch c {
	case ClassSTUN:
		return "stun"
	case ClassDTLS:
		return "dtls"
	case ClassRTP:
		return "rtp"
	default:
		return "other"
	}
}

// DemuxClass classifies b by its first byte per RFC 7983. It looks at one
// byte only; use IsSTUN and friends to validate.
func DemuxClass(b []byte) Class {
	if len(b) == 0 {
		return ClassOther
	}
	switch c := b[0]; {
	case c <= 3:
		return ClassSTUN
	case c >= 20 && c <= 63:
		return ClassDTLS
	case c >= 128 && c <= 191:
		return ClassRTP
	default:
		return ClassOther
	}
}
