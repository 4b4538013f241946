// Package udpio holds the UDP plumbing the relays share: the
// read-decide-write loops, their buffers, and the Runner that runs a
// relay's paths on them as its Tuning says.
package udpio

import (
	"errors"
	"net"
	"net/netip"
)

// Hooks reports what the forwarding loop drops on its own, and switches
// ForwardBatch's bundling (docs/bundle.md). Nil funcs are ignored.
type Hooks struct {
	WriteErr func(error) // a send failed; the loop goes on
	Oversize func()      // a datagram was longer than the limit and was dropped
	// Unbundle, when set, makes the loop split every bundle of that
	// format it reads and call decide once per item, as if each had come
	// alone from the bundle's sender; a malformed bundle is dropped whole
	// (BadBundle). Needs headroom 0: items are decided where they lie.
	Unbundle  Bundling
	BadBundle func()
	// Bundle, when set, makes ForwardBatch send the datagrams of one
	// batch that decide sends to the same destination as bundles of that
	// format (each at most its MaxSize); a destination with a single
	// datagram gets it unbundled. Only for loops whose every output goes
	// to a tier that reads bundles. Bundled reports each batch's bundles
	// and the datagrams they carried.
	Bundle  Bundling
	Bundled func(bundles, datagrams int)
	// BlockingReads (experimental, Linux) makes conn blocking with a
	// 50 ms receive timeout and waits for datagrams inside recvmmsg, as a
	// C forwarder does, instead of in the runtime's poller. Closing conn
	// then takes up to 50 ms.
	BlockingReads bool
}

// Bundling is a bundle format (docs/bundle.md; encap.BundleFormat is
// rtcedge's): how several datagrams to one destination travel as one.
// Its methods must not allocate.
type Bundling interface {
	// IsBundle reports whether a datagram read is a bundle to split.
	IsBundle(b []byte) bool
	// Split appends the items of bundle b (aliasing b) to items and
	// returns it; a malformed bundle appends nothing and is an error.
	Split(b []byte, items [][]byte) ([][]byte, error)
	// MaxItems bounds the items of a valid bundle, MaxSize its length.
	MaxItems() int
	MaxSize() int
	// Start resets b to an empty bundle; Add appends one datagram to it,
	// reporting false (the bundle unchanged) when it cannot go in.
	Start(b []byte) []byte
	Add(bundle, item []byte) ([]byte, bool)
}

// splitter returns the buffer Split fills for h.Unbundle's bundles.
func (h Hooks) splitter() [][]byte {
	if h.Unbundle == nil {
		return nil
	}
	return make([][]byte, 0, h.Unbundle.MaxItems())
}

func (h Hooks) badBundle() {
	if h.BadBundle != nil {
		h.BadBundle()
	}
}

func (h Hooks) writeErr(err error) {
	if h.WriteErr != nil {
		h.WriteErr(err)
	}
}

func (h Hooks) oversize() {
	if h.Oversize != nil {
		h.Oversize()
	}
}

// unmap turns an IPv4-mapped IPv6 source (what a dual-stack socket bound to
// 0.0.0.0 or :: reports) into plain IPv4, the form every directory uses.
func unmap(a netip.AddrPort) netip.AddrPort {
	if a.Addr().Is4In6() {
		return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	}
	return a
}

// Decide inspects one datagram and returns where to send which bytes, or
// ok=false to drop it. out may be a subslice of buf (the usual case) and is
// written before the next read, so Decide must not retain buf.
type Decide func(buf []byte, n int, from netip.AddrPort) (out []byte, to netip.AddrPort, ok bool)

// forwardItems is Forward's unbundling: every item of a valid bundle is
// decided and sent on its own (Forward does not bundle).
func forwardItems(b []byte, items [][]byte, from netip.AddrPort, dst *net.UDPConn, decide Decide, hooks Hooks) {
	items, err := hooks.Unbundle.Split(b, items[:0])
	if err != nil {
		hooks.badBundle()
		return
	}
	for _, item := range items {
		if out, to, ok := decide(item, len(item), from); ok {
			if _, err := dst.WriteToUDPAddrPort(out, to); err != nil {
				hooks.writeErr(err)
			}
		}
	}
}

// Forward reads conn until it is closed, passing every datagram of at most
// limit bytes to decide and writing what it returns to dst (which may be
// conn itself). Longer datagrams are dropped (Hooks.Oversize): the buffer
// holds limit+1 bytes, so a longer one is seen as such, never truncated
// and forwarded. The relays' limit is encap.MaxPayload on a socket
// clients send to and encap.MaxDatagram between tiers. headroom
// bytes are left free in front of every datagram so that a decider can
// prepend a header without copying: the datagram is buf[headroom:headroom+n].
// Sources are unmapped (IPv4-mapped IPv6 becomes IPv4). With
// hooks.Unbundle (headroom 0) bundles are split as in ForwardBatch;
// Forward never bundles. A closed conn ends
// the loop with nil; a write error is reported to hooks and the loop goes
// on, as one unreachable peer must not stop a relay.
func Forward(conn, dst *net.UDPConn, headroom, limit int, decide Decide, hooks Hooks) error {
	buf, items := make([]byte, headroom+limit+1), hooks.splitter()
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf[headroom:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if n > limit {
			hooks.oversize()
			continue
		}
		from = unmap(from)
		if hooks.Unbundle != nil && hooks.Unbundle.IsBundle(buf[headroom:headroom+n]) {
			forwardItems(buf[headroom:headroom+n], items, from, dst, decide, hooks)
			continue
		}
		out, to, ok := decide(buf, n, from)
		if !ok {
			continue
		}
		if _, err := dst.WriteToUDPAddrPort(out, to); err != nil {
			hooks.writeErr(err)
		}
	}
}
