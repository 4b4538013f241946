// Package encap implements the relay encapsulation header (docs/wire.md
// section 2), carried in front of every client datagram between tiers:
// global relay ⇄ cluster relay ⇄ transceiver.
//
// The header names the cluster, pod and POP of the flow, the routing token
// that opened it, the client's real address and the global relay replica
// that owns the flow. With it the cluster relay routes every packet with no
// per-flow state, the transceiver sees the client's real address, and the
// return path finds the ingress replica. The client's datagram follows the
// header byte for byte.
//
// Every header ends in a 64-bit tag, SipHash-2-4 under the cluster's hop
// key (Keyring) over the header and the payload length, so a host without
// the key can neither forge a header nor alter one it has seen. Receivers
// call Decode (parse, no state) and then Keyring.Verify before acting on
// any field.
//
// Layout (version 2, big-endian):
//
//	0      magic 0x5E
//	1      version<<4 | flags (bit 0 to-client, bit 1 client IPv6,
//	       bit 2 ingress IPv6, bit 3 client on TCP)
//	2      key ID of the hop key the tag is made with
//	3      reserved = 0
//	4..5   cluster ID
//	6..7   pod ID
//	8..9   POP ID
//	10..15 token: nonce of the routing token that opened the flow (0: none)
//	16..17 client port
//	18..   client IP (4 or 16 bytes)
//	..     ingress port (2), ingress IP (4 or 16 bytes)
//	..     tag (8): SipHash-2-4(key, header without tag || payload length)
//
// The magic 0x5E lies outside every range of RFC 7983, so an encapsulated
// datagram can never be mistaken for STUN, DTLS or RTP. Decode, Put, Seal
// and Verify do not allocate.
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
	Version = 2
	// TagLen is the length of the MAC tag that ends every header.
	TagLen = 8
	// MinLen is the header length with IPv4 client and ingress addresses.
	MinLen = fixedLen + 2*(2+4) + TagLen
	// MaxLen is the header length with IPv6 client and ingress addresses.
	MaxLen = MinLen + 2*extraPerV6Addr
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
	flagTCP        = 1 << 3
	fixedLen       = 16 // magic, version/flags, key ID, reserved, cluster, pod, POP, token
	extraPerV6Addr = 16 - 4
	offKeyID       = 2
)

// ClientPortOffset is where the client's port starts in every header,
// whatever the address families: right after the fixed part. The pod
// steers its sockets' datagrams by it (transceiver, readers_linux.go).
const ClientPortOffset = fixedLen

// Header is the relay encapsulation header. Client and Ingress are
// unmapped: an IPv4-mapped IPv6 address is encoded as IPv4, and Decode
// never returns one. Zones are not carried.
type Header struct {
	// ToClient is the direction flag (bit 0): false toward the
	// transceiver, true toward the client.
	ToClient bool
	// TCP is flag bit 3: the client reaches the POP over TCP (RFC 4571
	// framing, ICE-TCP) rather than UDP. The global relay de-frames the
	// stream, so the datagram that follows is the same either way; the
	// pod presents such clients to Pion as ICE-TCP peers, and replies
	// carry the flag back so the relay writes them into the client's
	// connection. Covered by the tag like every other field.
	TCP bool
	// KeyID is the hop key the tag was made with. Decode fills it in;
	// Keyring.Seal overwrites it with the keyring's current ID.
	KeyID uint8
	// Cluster is the cluster that owns the flow.
	Cluster uint16
	// Pod is the transceiver pod that owns the flow.
	Pod uint16
	// POP is the public ingress (relay VIP) where the client's packets
	// enter; the transceiver picks its per-POP virtual conn by it.
	POP uint16
	// Token is the nonce of the routing token that opened the flow, so
	// that a flow restored from the return path counts against its
	// token's cap; zero when unknown.
	Token [6]byte
	// Client is the client's public address as seen by the global relay.
	Client netip.AddrPort
	// Ingress is the internal address of the global relay replica that
	// owns the flow and takes its return traffic.
	Ingress netip.AddrPort
}

// Len returns the encoded length of h, tag included: MinLen plus 12 for
// each IPv6 address.
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

// Put writes h into b[:h.Len()] with a zero tag and returns the length
// written; Keyring.Seal then signs the datagram. It fails with
// ErrShortBuffer if b is too small and ErrAddr if Client or Ingress is not
// a valid address. Put does not allocate.
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
	if h.TCP {
		flags |= flagTCP
	}
	b[0] = Magic
	b[offKeyID] = h.KeyID
	b[3] = 0
	binary.BigEndian.PutUint16(b[4:6], h.Cluster)
	binary.BigEndian.PutUint16(b[6:8], h.Pod)
	binary.BigEndian.PutUint16(b[8:10], h.POP)
	copy(b[10:16], h.Token[:])
	off, v6 := putAddrPort(b, fixedLen, h.Client)
	if v6 {
		flags |= flagClientV6
	}
	off, v6 = putAddrPort(b, off, h.Ingress)
	if v6 {
		flags |= flagIngressV6
	}
	clear(b[off:n])
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

// AppendTo appends the encoding of h (zero tag) to b and returns the
// extended slice; it allocates only if b lacks capacity for Len more bytes.
// On error b is returned with its original length.
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
// client's datagram is b[n:]. Decode does not authenticate: call
// Keyring.Verify(b, n) with the key of h.Cluster before trusting any field.
// Errors are the bare sentinels ErrShort, ErrMagic, ErrVersion,
// ErrReservedFlag and ErrAddr. Decode does not allocate and does not
// retain b.
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
	if b[3] != 0 {
		return Header{}, 0, ErrReservedFlag
	}
	h.ToClient = flags&flagToClient != 0
	h.TCP = flags&flagTCP != 0
	h.KeyID = b[offKeyID]
	h.Cluster = binary.BigEndian.Uint16(b[4:6])
	h.Pod = binary.BigEndian.Uint16(b[6:8])
	h.POP = binary.BigEndian.Uint16(b[8:10])
	copy(h.Token[:], b[10:16])
	off := fixedLen
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
