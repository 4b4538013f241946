package membership

import (
	"fmt"
	"net/netip"

	"github.com/hashicorp/memberlist"
)

// User messages: small datagrams one member sends another over the pool's
// gossip transport (encrypted and authenticated with the pool's key, like
// everything else in the pool), best effort. The pool itself carries none;
// a role that does installs a handler (SetHandler) and sends with Send.
// Messages are kept under MaxMessage bytes so that they fit one datagram.

// MaxMessage bounds a user message.
const MaxMessage = 1200

// SetHandler makes fn receive the user messages that reach this member;
// nil drops them. fn runs on memberlist's packet goroutine: it must not
// block, and must copy msg to keep it.
func (p *Pool) SetHandler(fn func(msg []byte)) {
	if fn == nil {
		p.handler.Store(nil)
		return
	}
	p.handler.Store(&fn)
}

// Send sends msg to the member named name, best effort (one datagram).
func (p *Pool) Send(name string, msg []byte) error {
	if len(msg) > MaxMessage {
		return fmt.Errorf("membership: message of %d bytes, over %d", len(msg), MaxMessage)
	}
	if p.isClosed() {
		return fmt.Errorf("membership: send: %w", ErrClosed)
	}
	var addr netip.AddrPort
	p.mu.Lock()
	if e := p.members[name]; e != nil && e.gone.IsZero() {
		addr = e.member.Addr
	}
	p.mu.Unlock()
	if !addr.IsValid() {
		return fmt.Errorf("membership: send to %q: no such member", name)
	}
	// By the address the pool recorded, not through the *memberlist.Node
	// memberlist's Members returns: memberlist rewrites those in place
	// (a member's new metadata or incarnation) under a lock of its own.
	if err := p.ml.SendToAddress(memberlist.Address{Addr: addr.String(), Name: name}, msg); err != nil {
		return fmt.Errorf("membership: send to %q: %w", name, err)
	}
	return nil
}
