package podnet

import (
	"net/netip"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"
)

// Round trips through a POP. The pod measures a call's client through
// each POP the client checked with one Binding Request of its own, the
// same request as the return-routability probe (route.go): the client
// answers it as any check, and the time from the request to its valid
// answer is the round trip pod → cluster relay → global relay → client
// and back. The session layer reports it for steering
// (transceiver/rttreport.go, docs/steering.md).

// newProbe is a Binding Request with USERNAME user (client ufrag ":"
// server ufrag), signed with the client's password pwd.
func newProbe(user, pwd string) (*stun.Message, error) {
	return stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(user),
		ice.AttrControlled(tieBreaker()), ice.PriorityAttr(1),
		stun.NewShortTermIntegrity(pwd), stun.Fingerprint)
}

// MeasureRTT sends the client at the POP route a Binding Request (as Probe
// does, but whether or not the address is proven already) and calls done
// with the round trip when its valid answer comes back; done runs on the
// socket's read path and must not block. A later probe of the same route
// replaces the measurement (done is then never called). username is the
// USERNAME of one of the client's checks ("local:remote"); pwd is the
// client's ICE password. It reports whether the request went out.
func (s *Socket) MeasureRTT(pop uint16, client netip.AddrPort, username, pwd string, done func(time.Duration)) bool {
	pc := s.lookup(pop)
	if pc == nil {
		return false
	}
	r := pc.route(client)
	local, remote, ok := cut(username)
	if r == nil || !ok || pwd == "" {
		return false
	}
	msg, err := newProbe(remote+":"+local, pwd)
	if err != nil {
		return false
	}
	r.reach.mu.Lock()
	r.reach.sent, r.reach.sentAt, r.reach.txID, r.reach.pwd, r.reach.onRTT = true, s.now().UnixNano(), msg.TransactionID, pwd, done
	r.reach.mu.Unlock()
	_, err = pc.sock.send(&r.hdr, r.relay, msg.Raw)
	return err == nil
}

// measured hands the round trip of the route's measuring probe, whose
// authenticated answer carries txID, to its done function, once. It
// reports whether the answer was one.
func (c *popConn) measured(r *route, txID [12]byte) bool {
	r.reach.mu.Lock()
	done, sentAt := r.reach.onRTT, r.reach.sentAt
	if done == nil || txID != r.reach.txID {
		r.reach.mu.Unlock()
		return false
	}
	r.reach.onRTT = nil
	r.reach.mu.Unlock()
	done(time.Duration(c.sock.now().UnixNano() - sentAt))
	return true
}
