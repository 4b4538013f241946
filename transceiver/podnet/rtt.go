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
// does, but whether or not the address is proven for the session already,
// within the address's anti-amplification budget while it is not) and
// calls done with the round trip when its valid answer comes back; done
// runs on the socket's read path and must not block. A later measurement
// of the same session and route replaces this one (done is then never
// called). ufrag is the server ufrag of the session's agent; username is
// the USERNAME of one of the client's checks ("local:remote"); pwd is the
// client's ICE password. It reports whether the request went out.
func (s *Socket) MeasureRTT(pop uint16, client netip.AddrPort, ufrag, username, pwd string, done func(time.Duration)) bool {
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
	p := pc.proofLocked(r.reach, ufrag)
	if p == nil {
		r.reach.mu.Unlock()
		return false
	}
	if !p.ok && !pc.spend(r, len(msg.Raw)) {
		r.reach.mu.Unlock()
		s.m.drop(dropAmplification)
		return false
	}
	p.rttTx, p.rttAt, p.rttPwd, p.onRTT = msg.TransactionID, s.now().UnixNano(), pwd, done
	r.reach.mu.Unlock()
	_, err = pc.sock.send(&r.hdr, r.relay, msg.Raw)
	return err == nil
}

// measured hands the round trip of the session's measuring request, whose
// authenticated answer carries txID, to its done function, once. isRTT
// reports whether the answer was one; proven whether the address was
// already proven for the session (the answer then proves nothing new).
func (c *popConn) measured(r *route, p *proof, txID [12]byte) (proven, isRTT bool) {
	r.reach.mu.Lock()
	done, sentAt := p.onRTT, p.rttAt
	if done == nil || txID != p.rttTx {
		r.reach.mu.Unlock()
		return false, false
	}
	p.onRTT = nil
	proven = p.ok
	r.reach.mu.Unlock()
	done(time.Duration(c.sock.now().UnixNano() - sentAt))
	return proven, true
}
