package encap

import (
	"encoding/binary"
	"errors"
)

// A bundle carries several encapsulated datagrams bound for the same next
// hop in one UDP datagram (docs/bundle.md): a relay that reads them in one
// receive batch sends one datagram instead of many, and the kernel, whose
// per-datagram work is most of a relay's cost, handles one. A bundle is
// made only of what one batch already holds; nothing waits for more.
//
// Layout (big-endian):
//
//	0      BundleMagic 0x5D
//	1      BundleVersion<<4 | flags (all four reserved, 0)
//	2..    items, at least one: length (2 bytes, > MinLen), then that
//	       many bytes, one encapsulated datagram exactly as it would be
//	       sent alone (header included, so it starts with Magic)
//
// 0x5D, like Magic, lies outside every range of RFC 7983 and differs from
// Magic, so a receiver tells a bundle, a single datagram and client
// traffic apart by the first byte. The frame carries no addresses and no
// authentication of its own: every item is checked by the receiver as if
// it had come alone, and items are never bundles themselves.
const (
	// BundleMagic is the first byte of a bundle.
	BundleMagic = 0x5D
	// BundleVersion is the bundle frame version this package writes and
	// accepts.
	BundleVersion = 1
	// BundleHeaderLen is the length of the bundle frame's header.
	BundleHeaderLen = 2
	// BundleItemOverhead is the length prefix in front of every item.
	BundleItemOverhead = 2
	// MaxBundle is the largest bundle: no larger than the largest single
	// datagram between tiers, so bundling never needs a larger path MTU.
	MaxBundle = MaxDatagram
	// MaxBundleItems bounds the items of a valid bundle (each item is at
	// least a minimal header and one byte).
	MaxBundleItems = (MaxBundle - BundleHeaderLen) / (BundleItemOverhead + MinLen + 1)
)

// ErrBundle means a datagram that starts with BundleMagic is not a valid
// bundle: wrong version, reserved flags set, no items, an item shorter
// than a header and one byte or not starting with Magic (a bundle inside a
// bundle included), an item that overruns the datagram, or a bundle longer
// than MaxBundle.
var ErrBundle = errors.New("encap: malformed bundle")

// IsBundle reports whether b starts like a bundle (CheckBundle validates
// it).
func IsBundle(b []byte) bool { return len(b) > 0 && b[0] == BundleMagic }

// StartBundle resets b to an empty bundle (header only) and returns it;
// with cap(b) >= MaxBundle nothing is allocated by it or by AddToBundle.
func StartBundle(b []byte) []byte { return append(b[:0], BundleMagic, BundleVersion<<4) }

// AddToBundle appends one encapsulated datagram to a bundle begun with
// StartBundle. It reports false, and leaves the bundle as it was, when the
// datagram is no longer than a header, does not start with Magic, or
// would grow the bundle past MaxBundle.
func AddToBundle(bundle, item []byte) ([]byte, bool) {
	if len(item) <= MinLen || item[0] != Magic || len(bundle)+BundleItemOverhead+len(item) > MaxBundle {
		return bundle, false
	}
	bundle = binary.BigEndian.AppendUint16(bundle, uint16(len(item)))
	return append(bundle, item...), true
}

// CheckBundle validates a whole bundle and returns its number of items, so
// that a malformed bundle is dropped whole before any item is forwarded.
// Errors are the bare sentinel ErrBundle.
func CheckBundle(b []byte) (int, error) {
	if len(b) < BundleHeaderLen+BundleItemOverhead+1 || len(b) > MaxBundle || b[0] != BundleMagic || b[1] != BundleVersion<<4 {
		return 0, ErrBundle
	}
	items := 0
	for off := BundleHeaderLen; off < len(b); items++ {
		if len(b)-off < BundleItemOverhead {
			return 0, ErrBundle
		}
		n := int(binary.BigEndian.Uint16(b[off:]))
		off += BundleItemOverhead
		if n <= MinLen || n > len(b)-off || b[off] != Magic {
			return 0, ErrBundle
		}
		off += n
	}
	return items, nil
}

// NextItem returns the item at off of a bundle CheckBundle accepted and
// the offset of the next; start at BundleHeaderLen and stop when next is
// len(b). It does not allocate; the item aliases b.
func NextItem(b []byte, off int) (item []byte, next int) {
	n := int(binary.BigEndian.Uint16(b[off:]))
	off += BundleItemOverhead
	return b[off : off+n], off + n
}

// BundleFormat is the bundle format above in the form the relays' read
// loops take it (udpio.Bundling), so that udpio need not know it. The
// zero value is ready; no method allocates.
type BundleFormat struct{}

// IsBundle is IsBundle.
func (BundleFormat) IsBundle(b []byte) bool { return IsBundle(b) }

// Split appends the items of bundle b to items and returns it; a bundle
// CheckBundle refuses appends nothing and returns ErrBundle.
func (BundleFormat) Split(b []byte, items [][]byte) ([][]byte, error) {
	if _, err := CheckBundle(b); err != nil {
		return items, err
	}
	for off := BundleHeaderLen; off < len(b); {
		var item []byte
		item, off = NextItem(b, off)
		items = append(items, item)
	}
	return items, nil
}

// MaxItems is MaxBundleItems.
func (BundleFormat) MaxItems() int { return MaxBundleItems }

// MaxSize is MaxBundle.
func (BundleFormat) MaxSize() int { return MaxBundle }

// Start is StartBundle.
func (BundleFormat) Start(b []byte) []byte { return StartBundle(b) }

// Add is AddToBundle.
func (BundleFormat) Add(bundle, item []byte) ([]byte, bool) { return AddToBundle(bundle, item) }
