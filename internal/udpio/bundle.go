package udpio

import "net/netip"

// maxOpenBundles bounds the destinations one batch bundles for; datagrams
// to further destinations go unbundled. Relays have few next hops (cluster
// relays, a cluster's pods, global relay ingresses), and the search is
// linear.
const maxOpenBundles = 16

// bundler packs a batch's outgoing datagrams into bundles per destination.
// Owned by one forwarding loop; its buffers are reused for every batch,
// so pack allocates nothing.
type bundler struct {
	format Bundling
	slots  []bundleSlot
	out    []Msg
}

type bundleSlot struct {
	to    netip.AddrPort
	first Msg    // the destination's first datagram, sent as is if alone
	buf   []byte // the bundle, once a second datagram came (cap MaxSize)
	items int
	full  bool // the bundle took no more; later datagrams start another slot
}

func newBundler(format Bundling, batch int) *bundler {
	b := &bundler{format: format, slots: make([]bundleSlot, 0, maxOpenBundles), out: make([]Msg, 0, batch)}
	for range maxOpenBundles {
		b.slots = append(b.slots, bundleSlot{buf: make([]byte, 0, format.MaxSize())})
	}
	b.slots = b.slots[:0]
	return b
}

// pack returns ms with the datagrams to each destination bundled, and the
// number of bundles and of datagrams in them. The result and the bundles
// are valid until the next pack.
func (b *bundler) pack(ms []Msg) (out []Msg, bundles, bundled int) {
	b.out, b.slots = b.out[:0], b.slots[:0]
	for _, m := range ms {
		if !b.add(m) {
			b.out = append(b.out, m)
		}
	}
	for i := range b.slots {
		s := &b.slots[i]
		if s.items == 1 {
			b.out = append(b.out, s.first)
			continue
		}
		b.out = append(b.out, Msg{Buf: s.buf, Addr: s.to})
		bundles++
		bundled += s.items
	}
	return b.out, bundles, bundled
}

// add puts m into its destination's open bundle, reporting false when it
// must go alone (no slot left, or not bundleable).
func (b *bundler) add(m Msg) bool {
	for i := range b.slots {
		s := &b.slots[i]
		if s.to != m.Addr || s.full {
			continue
		}
		if s.items == 1 {
			s.buf = b.format.Start(s.buf)
			var ok bool
			if s.buf, ok = b.format.Add(s.buf, s.first.Buf); !ok {
				s.full = true // the first datagram is not bundleable
				return false
			}
		}
		var ok bool
		if s.buf, ok = b.format.Add(s.buf, m.Buf); !ok {
			s.full = true
			break // open another slot for this destination
		}
		s.items++
		return true
	}
	if len(b.slots) == cap(b.slots) {
		return false
	}
	b.slots = b.slots[:len(b.slots)+1]
	s := &b.slots[len(b.slots)-1]
	s.to, s.first, s.items, s.full = m.Addr, m, 1, false
	return true
}
