// Package encap implements the relay encapsulation header (WIRE.md
// section 2), carried in front of every client datagram between tiers:
// global relay ⇄ cluster relay ⇄ transceiver.
//
// The header names the cluster, pod and POP of the flow, the client's real
// address and the global relay replica that owns the flow. With it the
// cluster relay routes every packet with no per-flow state, the transceiver
// sees the client's real address, and the return path finds the ingress
// replica. The client's datagram follows the header byte for byte.
//
// Layout (big-endian):
//
//	0      magic 0x5E
//	1      version<<4 | flags (bit 0 to-client, bit 1 client IPv6,
//	       bit 2 ingress IPv6, bit 3 reserved = 0)
//	2..3   cluster ID
//	4..5   pod ID
//	6..7   POP ID
//	8..9   client port
//	10..   client IP (4 or 16 bytes)
//	..     ingress port (2), ingress IP (4 or 16 bytes)
//
// The magic 0x5E lies outside every range of RFC 7983, so an encapsulated
// datagram can never be mistaken for STUN, DTLS or RTP. Decode and Put do
// not allocate.
package encap

import (
	"encoding/binary"
	"net/netip"
	"slices"
)

const (
	// Magic is the first byte of every encapsulated datagram.
	Magic = 0x5E
	// Version is the header version this package writes and accepts.
	Version = 1
	// MinLen is the header length with IPv4 client and ingress addresses.
	MinLen = 20
	// MaxLen is the header length with IPv6 client and ingress addresses.
	MaxLen = 44
	// MaxPayload is the largest client datagram any tier carries: the
	// global relay drops a longer one from a client at once, and the
	// cluster relay and the pod accept MaxPayload under any header, so a
	// datagram either crosses every tier or is dropped (and counted) at
	// the first. WebRTC keeps its datagrams below the path MTU (browsers
	// send at most about 1200 bytes); a longer one is not ours.
	MaxPayload = 1500
	// MaxDatagram is the largest datagram between tiers: the longest
	// header and a MaxPayload client datagram.
	MaxDatagram = MaxLen + MaxPayload

	flagToClient   = 1 << 0
	flagClientV6   = 1 << 1
	flagIngressV6  = 1 << 2
	flagReserved   = 1 << 3
	fixedLen       = 10 // magic, version/flags, cluster, pod, POP, client port
	extraPerV6Addr = 16 - 4
)

// Header is the relay encapsulation header. Client and Ingress are
// unmapped: an IPv4-mapped IPv6 address is encoded as IPv4, and Decode
// never returns one. Zones are not carried.
type Header struct {
	// ToClient is the direction flag (bit 0): false toward the
	// transceiver, true toward the client.
	ToClient bool
	// Cluster is the cluster that owns the flow.
	Cluster uint16
	// Pod is the transceiver pod that owns the flow.
	Pod uint16
	// POP is the public ingress (relay VIP) where the client's packets
	// enter; the transceiver picks its per-POP virtual conn by it.
	POP uint16
	// Client is the client's public address as seen by the global relay.
	Client netip.AddrPort
	// Ingress is the internal address of the global relay replica that
	// owns the flow and takes its return traffic.
	Ingress netip.AddrPort
}

// Len returns the encoded length of h: MinLen plus 12 for each IPv6
// address.
func (h *Header) Len() int {
	n := MinLen
	if !is4(h.Client.Addr()) {
		n += extraPerV6Addr
	}
	if !is4(h.Ingress.Addr()) {
		n += extraPerV6Addr
	}
	return n
}

// is4 reports whether a is encoded as IPv4 (plain or IPv4-mapped). The
// zero Addr counts as IPv4 so that Len stays small for invalid headers,
// which Put rejects anyway.
func is4(a netip.Addr) bool { return !a.Is6() || a.Is4In6() }

// Put writes h into b[:h.Len()] and returns the length written. It fails
// with ErrShortBuffer if b is too small and ErrAddr if Client or Ingress
// is not a valid address. Put does not allocate.
func (h *Header) Put(b []byte) (int, error) {
	if !h.Client.Addr().IsValid() || !h.Ingress.Addr().IsValid() {
		return 0, ErrAddr
	}
	n := h.Len()
	if len(b) < n {
		return 0, ErrShortBuffer
	}
	b = b[:n]
	flags := byte(0)
	if h.ToClient {
		flags |= flagToClient
	}
	b[0] = Magic
	binary.BigEndian.PutUint16(b[2:4], h.Cluster)
	binary.BigEndian.PutUint16(b[4:6], h.Pod)
	binary.BigEndian.PutUint16(b[6:8], h.POP)
	off, v6 := putAddrPort(b, 8, h.Client)
	if v6 {
		flags |= flagClientV6
	}
	_, v6 = putAddrPort(b, off, h.Ingress)
	if v6 {
		flags |= flagIngressV6
	}
	b[1] = Version<<4 | flags
	return n, nil
}

// putAddrPort writes port then IP at b[off:], returning the offset after
// it and whether the IP was written as IPv6.
func putAddrPort(b []byte, off int, ap netip.AddrPort) (int, bool) {
	binary.BigEndian.PutUint16(b[off:], ap.Port())
	off += 2
	a := ap.Addr().Unmap()
	if a.Is4() {
		ip := a.As4()
		return off + copy(b[off:], ip[:]), false
	}
	ip := a.As16()
	return off + copy(b[off:], ip[:]), true
}

// AppendTo appends the encoding of h to b and returns the extended slice;
// it allocates only if b lacks capacity for Len more bytes. On error b is
// returned with its original length.
func (h *Header) AppendTo(b []byte) ([]byte, error) {
	n := h.Len()
	start := len(b)
	b = slices.Grow(b, n)[:start+n]
	if _, err := h.Put(b[start:]); err != nil {
		return b[:start], err
	}
	return b, nil
}

// Decode parses the header at the start of b. n is the header length; the
// client's datagram is b[n:]. Errors are the bare sentinels ErrShort,
// ErrMagic, ErrVersion, ErrReservedFlag and ErrAddr. Decode does not
// allocate and does not retain b.
func Decode(b []byte) (h Header, n int, err error) {
	if len(b) < 2 {
		return Header{}, 0, ErrShort
	}
	if b[0] != Magic {
		return Header{}, 0, ErrMagic
	}
	if b[1]>>4 != Version {
		return Header{}, 0, ErrVersion
	}
	flags := b[1] & 0x0f
	if flags&flagReserved != 0 {
		return Header{}, 0, ErrReservedFlag
	}
	n = MinLen
	if flags&flagClientV6 != 0 {
		n += extraPerV6Addr
	}
	if flags&flagIngressV6 != 0 {
		n += extraPerV6Addr
	}
	if len(b) < n {
		return Header{}, 0, ErrShort
	}
	h.ToClient = flags&flagToClient != 0
	h.Cluster = binary.BigEndian.Uint16(b[2:4])
	h.Pod = binary.BigEndian.Uint16(b[4:6])
	h.POP = binary.BigEndian.Uint16(b[6:8])
	off := 8
	var ok bool
	if h.Client, off, ok = readAddrPort(b, off, flags&flagClientV6 != 0); !ok {
		return Header{}, 0, ErrAddr
	}
	if h.Ingress, _, ok = readAddrPort(b, off, flags&flagIngressV6 != 0); !ok {
		return Header{}, 0, ErrAddr
	}
	return h, n, nil
}

// readAddrPort reads port then IP at b[off:]; b is known to be long
// enough. It rejects IPv4-mapped IPv6 addresses, which Put never writes,
// so that every header has exactly one encoding.
func readAddrPort(b []byte, off int, v6 bool) (netip.AddrPort, int, bool) {
	port := binary.BigEndian.Uint16(b[off:])
	off += 2
	if !v6 {
		a := netip.AddrFrom4([4]byte(b[off : off+4]))
		return netip.AddrPortFrom(a, port), off + 4, true
	}
	a := netip.AddrFrom16([16]byte(b[off : off+16]))
	if a.Is4In6() {
		return netip.AddrPort{}, 0, false
	}
	return netip.AddrPortFrom(a, port), off + 16, true
}

// PeekDirection is a cheap demultiplexing check: ok reports whether b is
// long enough and starts with Magic and Version, and toClient is the
// direction flag. It does not validate the rest; call Decode for that.
func PeekDirection(b []byte) (toClient bool, ok bool) {
	if len(b) < MinLen || b[0] != Magic || b[1]>>4 != Version {
		return false, false
	}
	return b[1]&flagToClient != 0, true
}
