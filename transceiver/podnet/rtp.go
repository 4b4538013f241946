// The packet layer's side of phone calls (docs/wire.md §6): a call's
// media arrives from the carrier's negotiated address, with no ICE and no
// ufrag, under the routing token the pod minted for the call. Datagrams
// from a registered address that carry that token go to the call, never
// to Pion; the call's replies go back through the route the datagrams
// came by, and only to that address.

package podnet

import (
	"errors"
	"net"
	"net/netip"
	"sync"
)

// RTPCall is a phone call's media as the packet layer sees it. RTP runs
// on a socket reader: it must not block.
type RTPCall interface {
	// RTP takes one datagram (RTP or RTCP) from the call's negotiated
	// address through POP pop; payload is only valid during the call.
	RTP(pop uint16, payload []byte)
}

// ErrRTPAddrInUse is returned by AddRTP when another call of the pod
// already receives from the address.
var ErrRTPAddrInUse = errors.New("podnet: another call receives from this media address")

// rtpTable finds a phone call by the carrier address of its media.
type rtpTable struct {
	mu sync.RWMutex
	m  map[netip.AddrPort]rtpEntry // guarded by mu
}

type rtpEntry struct {
	nonce [6]byte // the call's routing token nonce: the header must carry it
	call  RTPCall
}

// lookup returns the call registered for client, if any.
func (t *rtpTable) lookup(client netip.AddrPort) (rtpEntry, bool) {
	t.mu.RLock()
	e, ok := t.m[client]
	t.mu.RUnlock()
	return e, ok
}

// AddRTP registers a phone call: datagrams from client whose verified
// header carries the token nonce go to call. The address is the one the
// carrier's SDP names (the front checked it against the trunk's media
// CIDRs): it is the call's return route, confirmed from its first
// datagram on. One call per address.
func (s *Socket) AddRTP(client netip.AddrPort, nonce [6]byte, call RTPCall) error {
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	s.rtp.mu.Lock()
	defer s.rtp.mu.Unlock()
	if s.rtp.m == nil {
		s.rtp.m = map[netip.AddrPort]rtpEntry{}
	}
	if _, ok := s.rtp.m[client]; ok {
		return ErrRTPAddrInUse
	}
	s.rtp.m[client] = rtpEntry{nonce: nonce, call: call}
	return nil
}

// RemoveRTP forgets call's registration at client and the return routes
// to client through every POP: nothing of the call is left in the packet
// layer. Another call's registration is left alone.
func (s *Socket) RemoveRTP(client netip.AddrPort, call RTPCall) {
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	s.rtp.mu.Lock()
	e, ok := s.rtp.m[client]
	if !ok || e.call != call {
		s.rtp.mu.Unlock()
		return
	}
	delete(s.rtp.m, client)
	s.rtp.mu.Unlock()
	s.mu.RLock()
	pops := make([]*popConn, 0, len(s.pops))
	for _, pc := range s.pops {
		pops = append(pops, pc)
	}
	s.mu.RUnlock()
	for _, pc := range pops {
		pc.mu.Lock()
		if r := pc.routes[client]; r != nil {
			pc.remove(client, r)
		}
		pc.mu.Unlock()
	}
}

// RTPCalls is the number of registered phone calls.
func (s *Socket) RTPCalls() int {
	s.rtp.mu.RLock()
	defer s.rtp.mu.RUnlock()
	return len(s.rtp.m)
}

// Routes is the number of return routes the socket holds (UDP, every
// POP).
func (s *Socket) Routes() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, pc := range s.pops {
		pc.mu.RLock()
		n += len(pc.routes)
		pc.mu.RUnlock()
	}
	return n
}

// handleRTP hands a datagram from a registered phone call's address,
// under the call's token, to the call (handle checked both), and confirms
// the route it came by as the call's return route.
func (s *Socket) handleRTP(pc *popConn, e rtpEntry, client netip.AddrPort, payload []byte) {
	if r := pc.route(client); r != nil && !r.confirmed.Load() {
		// The address is the negotiated one and the token the call's: the
		// route is the call's return route (wire.md §6), not provisional.
		pc.mu.Lock()
		if r2 := pc.routes[client]; r2 != nil && !r2.confirmed.Swap(true) {
			pc.provisional--
		}
		pc.mu.Unlock()
	}
	s.m.in(len(payload))
	e.call.RTP(pc.id, payload)
}

// SendRTP sends b to a phone call's negotiated address through the route
// its datagrams came by through POP pop. Before the carrier's first
// datagram there is no route: errNoRoute, counted.
func (s *Socket) SendRTP(pop uint16, client netip.AddrPort, b []byte) error {
	pc := s.lookup(pop)
	if pc == nil {
		s.m.drop(dropNoRoute)
		return errNoRoute
	}
	select {
	case <-pc.closed:
		return net.ErrClosed
	default:
	}
	r := pc.route(client)
	if r == nil {
		s.m.drop(dropNoRoute)
		return errNoRoute
	}
	_, err := s.send(&r.hdr, r.relay, b)
	return err
}

// SealPodRoute seals a phone call's route-cache entry in this pod's name
// with its current hop key (encap.Keyring.SealPodRoute).
func (s *Socket) SealPodRoute(client netip.AddrPort, token [6]byte, stored uint32) (keyID uint8, tag uint64) {
	return s.keys.Load().SealPodRoute(client, s.cluster, s.pod, token, stored)
}
