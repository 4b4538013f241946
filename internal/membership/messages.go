package membership

import (
	"fmt"
	"slices"

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
	ms := p.ml.Members()
	i := slices.IndexFunc(ms, func(n *memberlist.Node) bool { return n.Name == name })
	if i < 0 {
		return fmt.Errorf("membership: send to %q: no such member", name)
	}
	if err := p.ml.SendBestEffort(ms[i], msg); err != nil {
		return fmt.Errorf("membership: send to %q: %w", name, err)
	}
	return nil
}
