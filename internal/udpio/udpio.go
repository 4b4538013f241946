// Package udpio holds the small pieces of UDP plumbing the relays share:
// the read-decide-write loop and its buffers.
package udpio

import (
	"errors"
	"net"
	"net/netip"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// Hooks reports what the forwarding loop drops on its own, and switches
// ForwardBatch's bundling (docs/bundle.md). Nil funcs are ignored.
type Hooks struct {
	WriteErr func(error) // a send failed; the loop goes on
	Oversize func()      // a datagram was longer than the limit and was dropped
	// Unbundle makes ForwardBatch split every bundle it reads
	// (encap.IsBundle) and call decide once per item, as if each had come
	// alone from the bundle's sender; a malformed bundle is dropped whole
	// (BadBundle). Needs headroom 0: items are decided where they lie.
	Unbundle  bool
	BadBundle func()
	// Bundle makes ForwardBatch send the datagrams of one batch that
	// decide sends to the same destination as bundles (each at most
	// encap.MaxBundle bytes); a destination with a single datagram gets
	// it unbundled. Only for loops whose every output is an encapsulated
	// datagram to a tier that reads bundles. Bundled reports each batch's
	// bundles and the datagrams they carried.
	Bundle  bool
	Bundled func(bundles, datagrams int)
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
func forwardItems(b []byte, from netip.AddrPort, dst *net.UDPConn, decide Decide, hooks Hooks) {
	if _, err := encap.CheckBundle(b); err != nil {
		hooks.badBundle()
		return
	}
	for off := encap.BundleHeaderLen; off < len(b); {
		var item []byte
		item, off = encap.NextItem(b, off)
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
// and forwarded. The limit is encap.MaxPayload on a socket clients send to
// and encap.MaxDatagram between tiers: one size for every tier. headroom
// bytes are left free in front of every datagram so that a decider can
// prepend a header without copying: the datagram is buf[headroom:headroom+n].
// Sources are unmapped (IPv4-mapped IPv6 becomes IPv4). With
// hooks.Unbundle (headroom 0) bundles are split as in ForwardBatch;
// Forward never bundles. A closed conn ends
// the loop with nil; a write error is reported to hooks and the loop goes
// on, as one unreachable peer must not stop a relay.
func Forward(conn, dst *net.UDPConn, headroom, limit int, decide Decide, hooks Hooks) error {
	buf := make([]byte, headroom+limit+1)
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
		if hooks.Unbundle && encap.IsBundle(buf[headroom:headroom+n]) {
			forwardItems(buf[headroom:headroom+n], from, dst, decide, hooks)
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
