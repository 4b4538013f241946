package membership

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/hashicorp/memberlist"
)

// Role says what a member does; it decides which pools a node joins and
// how other tiers use its metadata.
type Role string

// The roles of rtcedge nodes.
const (
	// RoleGlobalRelay is a public UDP ingress replica at a POP (global pool).
	RoleGlobalRelay Role = "globalrelay"
	// RoleClusterRelay is a cluster relay replica (cluster and global pools).
	RoleClusterRelay Role = "clusterrelay"
	// RoleTransceiver is a transceiver pod (cluster pool).
	RoleTransceiver Role = "transceiver"
	// RoleSignaling is a signaling front (global pool).
	RoleSignaling Role = "signaling"
)

// Roles lists every known role, in a stable order (metrics pre-create a
// series for each).
var Roles = []Role{RoleGlobalRelay, RoleClusterRelay, RoleTransceiver, RoleSignaling}

// MetaMaxSize is the largest encoded Meta memberlist accepts for a node.
const MetaMaxSize = memberlist.MetaMaxSize

// metaVersion is the first byte of every encoded Meta. Decoders ignore
// bytes after the last field they know, so fields may be appended without a
// version bump; a different layout of existing fields needs a new version.
const metaVersion = 1

// Flag bits of the second byte.
const (
	flagDraining = 1 << 0
	// flagLeaving is set by Pool.Leave just before memberlist's leave
	// message. memberlist v0.7.0 never fills Node.State in its events, so
	// a member's last meta is the only way receivers can tell a graceful
	// leave (StateLeft) from a failure (StateDead).
	flagLeaving = 1 << 1
)

// Meta is a member's node metadata, gossiped with every alive message. It
// must encode to at most MetaMaxSize bytes; New and UpdateMeta reject a Meta
// that does not.
type Meta struct {
	Role     Role
	Region   string
	Cluster  uint16
	Pod      uint16         // transceivers
	POP      uint16         // global relays
	Data     netip.AddrPort // data-plane UDP address (relay socket, pod socket)
	API      string         // control address (transceiver session API base URL, signaling URL)
	Load     int            // sessions / flows
	Capacity int
	Draining bool
	// Proof authenticates the fields above and the member's name
	// (Config.Prove makes it, Config.CheckMember checks it, see
	// ProofInput); nil when the pool proves nothing. Encoded last, so
	// decoders that predate it ignore it. Binary, held in a string so
	// that Meta stays comparable.
	Proof string
}

// MarshalBinary encodes m in the compact versioned form gossiped by the
// pool. It fails with ErrMetaTooLarge when the result exceeds MetaMaxSize,
// because memberlist panics on oversized metadata rather than erroring.
func (m Meta) MarshalBinary() ([]byte, error) { return m.encode(false) }

// encode is MarshalBinary with the pool-internal leaving flag.
func (m Meta) encode(leaving bool) ([]byte, error) {
	b := make([]byte, 0, 64+len(m.Role)+len(m.Region)+len(m.API))
	b = append(b, metaVersion)
	var flags byte
	if m.Draining {
		flags |= flagDraining
	}
	if leaving {
		flags |= flagLeaving
	}
	b = append(b, flags)
	b = appendString(b, string(m.Role))
	b = appendString(b, m.Region)
	b = binary.BigEndian.AppendUint16(b, m.Cluster)
	b = binary.BigEndian.AppendUint16(b, m.Pod)
	b = binary.BigEndian.AppendUint16(b, m.POP)
	if m.Data.Addr().IsValid() {
		// Unmapped, and without any zone: data addresses are routable,
		// and packet sources are always unmapped, so a mapped address
		// would never match one.
		ip := m.Data.Addr().Unmap().AsSlice()
		b = append(b, byte(len(ip)))
		b = append(b, ip...)
	} else {
		b = append(b, 0)
	}
	b = binary.BigEndian.AppendUint16(b, m.Data.Port())
	b = appendString(b, m.API)
	b = binary.AppendVarint(b, int64(m.Load))
	b = binary.AppendVarint(b, int64(m.Capacity))
	if len(m.Proof) > 0 {
		b = appendString(b, m.Proof)
	}
	if len(b) > MetaMaxSize {
		return nil, fmt.Errorf("encode meta: %d bytes, limit %d: %w", len(b), MetaMaxSize, ErrMetaTooLarge)
	}
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary produced. Any inconsistency
// yields an error wrapping ErrMalformedMeta; it never panics on hostile
// input.
func (m *Meta) UnmarshalBinary(b []byte) error {
	out, _, _, err := decodeMeta(b)
	if err != nil {
		return err
	}
	*m = out
	return nil
}

// decodeMeta decodes a Meta, the pool-internal leaving flag, and how many
// leading bytes of b the proof covers (all of b without a proof).
func decodeMeta(b []byte) (Meta, bool, int, error) {
	d := metaDecoder{b: b}
	if v := d.byte(); d.err == nil && v != metaVersion {
		return Meta{}, false, 0, fmt.Errorf("decode meta: version %d: %w", v, ErrMalformedMeta)
	}
	var out Meta
	flags := d.byte()
	out.Draining = flags&flagDraining != 0
	out.Role = Role(d.string())
	out.Region = d.string()
	out.Cluster = d.uint16()
	out.Pod = d.uint16()
	out.POP = d.uint16()
	var addr netip.Addr
	switch n := int(d.byte()); n {
	case 0:
	case 4, 16:
		if ip := d.bytes(n); ip != nil {
			addr, _ = netip.AddrFromSlice(ip)
			addr = addr.Unmap() // ::ffff:a.b.c.d from an older encoder
		}
	default:
		d.fail("address length")
	}
	port := d.uint16()
	if addr.IsValid() {
		out.Data = netip.AddrPortFrom(addr, port)
	}
	out.API = d.string()
	out.Load = d.varint()
	out.Capacity = d.varint()
	signed := len(b) - len(d.b)
	if d.err == nil && len(d.b) > 0 {
		// A proof; bytes that do not parse as one are a later build's
		// fields, ignored like any trailing bytes.
		if n, k := binary.Uvarint(d.b); k > 0 && n <= uint64(len(d.b)-k) {
			out.Proof = string(d.b[k : k+int(n)])
		}
	}
	if d.err != nil {
		return Meta{}, false, 0, d.err
	}
	return out, flags&flagLeaving != 0, signed, nil
}

// proofDomain starts every proof input, so that no other message signed
// with a member's key can pass for its metadata.
const proofDomain = "rtcedge member meta v1\x00"

// ProofInput is what a member's proof covers: a domain string, the
// member's node name, and its encoded metadata up to the proof (signed).
// A proof thus names the member it was made for, and the receiver checks
// the gossiped bytes themselves, not a re-encoding of them.
func ProofInput(name string, signed []byte) []byte {
	b := make([]byte, 0, len(proofDomain)+binary.MaxVarintLen64+len(name)+len(signed))
	b = append(b, proofDomain...)
	b = appendString(b, name)
	return append(b, signed...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// metaDecoder reads fields in order and remembers the first error, so the
// decode path reads straight through without a check after every field.
type metaDecoder struct {
	b   []byte
	err error
}

func (d *metaDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("decode meta: %s: %w", what, ErrMalformedMeta)
	}
	d.b = nil
}

func (d *metaDecoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *metaDecoder) byte() byte {
	if v := d.bytes(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *metaDecoder) uint16() uint16 {
	if v := d.bytes(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (d *metaDecoder) string() string {
	if d.err != nil {
		return ""
	}
	n, k := binary.Uvarint(d.b)
	if k <= 0 || n > uint64(len(d.b)-k) {
		d.fail("string length")
		return ""
	}
	d.b = d.b[k:]
	return string(d.bytes(int(n)))
}

func (d *metaDecoder) varint() int {
	if d.err != nil {
		return 0
	}
	v, k := binary.Varint(d.b)
	if k <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[k:]
	return int(v)
}
