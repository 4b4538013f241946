package transceiver

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/stun/v4"
)

// Following a caller's audio. A caller whose NAT rebinds sends its audio
// from the new address at once, its next consent check only up to a
// consent interval later (2 s for Pion, longer for browsers). The global
// relay routes such audio by its SSRC (globalrelay/ssrc.go), so it reaches
// the pod from an address no check has named: Pion would drop it, and the
// call would wait for the check.
//
// Audio proves nothing (the pod cannot read SRTP outside Pion, and an SSRC
// is visible on the path), so it only starts the proof the pod uses for
// every new address: a STUN Binding Request signed with the client's own
// ICE password (reach.go). Only the client can answer it from that
// address. Once the answer verifies, the pod has what an authenticated
// check gives it — someone holding the session's credentials is at that
// address — and more, since the address is proven; so it presents Pion
// a check for the address built with the session's own credentials (the
// check the client would send), and Pion and the binding-request hook take
// it from there as for any check: the hook moves the downlink only once the
// selected address has been silent for addressSwitchSilence (or defers,
// follow.go). Nothing moves on unauthenticated traffic, nothing moves while
// the current address is live.

// strayMediaSilence is how long the selected address must have been silent
// before audio from another address starts a probe: a live path is never
// probed away from, and a stray or replayed packet during a call costs
// nothing.
const strayMediaSilence = 200 * time.Millisecond

// reprobeAfter is how soon a probe that got no answer may be sent again to
// the same address (the probe or its answer was lost).
const reprobeAfter = 250 * time.Millisecond

// nonceIndex finds the session of a datagram's routing token (the nonce in
// its encapsulation header): a session's first server ufrag, and one per
// ICE restart.
type nonceIndex struct {
	mu sync.Mutex
	m  map[[6]byte]*session // guarded by mu
}

// maxNoncesPerSession bounds the tokens a session is found by: its first
// server ufrag's and its latest ICE restarts' (only the latest restart's
// ufrag is translated at all, restartTable), so that a client restarting
// over and over does not grow the index.
const maxNoncesPerSession = 3

func (x *nonceIndex) add(nonce [6]byte, s *session) {
	x.mu.Lock()
	if x.m == nil {
		x.m = map[[6]byte]*session{}
	}
	x.m[nonce] = s
	s.nonces = append(s.nonces, nonce)
	if len(s.nonces) > maxNoncesPerSession {
		// Keep the first; forget the oldest restart's.
		if old := s.nonces[1]; x.m[old] == s {
			delete(x.m, old)
		}
		s.nonces = append(s.nonces[:1], s.nonces[2:]...)
	}
	x.mu.Unlock()
}

func (x *nonceIndex) get(nonce [6]byte) *session {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.m[nonce]
}

func (x *nonceIndex) remove(s *session) {
	x.mu.Lock()
	for _, n := range s.nonces {
		if x.m[n] == s {
			delete(x.m, n)
		}
	}
	s.nonces = nil
	x.mu.Unlock()
}

// indexUfrag adds a server ufrag the pod minted for s to the index.
func (t *Transceiver) indexUfrag(ufrag string, s *session) {
	if tok, err := t.cfg.Keys.Verify([]byte(ufrag)); err == nil {
		t.byNonce.add(tok.Nonce, s)
	}
}

// strayMedia is called for an RTP datagram from a client address the POP's
// mux does not know (it was dropped): maybe the session's caller behind a
// rebound NAT.
func (t *Transceiver) strayMedia(pc *popConn, token [6]byte, client netip.AddrPort) {
	if s := t.byNonce.get(token); s != nil {
		s.strayMedia(pc, client)
	}
}

func (s *session) strayMedia(pc *popConn, client netip.AddrPort) {
	cur := uint16(s.selectedPOP.Load())
	peer := s.selectedPeer.Load()
	if cur == 0 || peer == nil || (pc.id == cur && client == *peer) {
		return
	}
	now := s.t.cfg.Now()
	if last, seen := s.t.sock.lastSeen(cur, *peer); seen && now.Sub(last) < strayMediaSilence {
		return
	}
	r := pc.route(client)
	if r == nil {
		return
	}
	if r.reachable.Load() {
		// Proven before (the client came back to an address it used).
		s.presentCheck(pc, client)
		return
	}
	user, pwd := s.clientCredentials()
	if pc.sendProbe(r, user, pwd, reprobeAfter, s, now.UnixNano()) {
		s.t.m.path.mediaProbes.Inc()
	}
}

// clientCredentials returns the USERNAME a request to the client carries
// (client ufrag ":" server ufrag) and the client's password: those of the
// last ICE restart, else of the offer.
func (s *session) clientCredentials() (user, pwd string) {
	if a, ufrag := s.t.restarts.current(s); a != nil {
		return a.client + ":" + ufrag, a.clientPwd
	}
	return s.client.ufrag + ":" + s.ufrag, s.client.pwd
}

// presentCheck hands Pion a Binding Request from client built with the
// session's own credentials, as the client's agent would send it: the
// address has proven that the client is there (its answer to a probe
// signed with the client's password). No USE-CANDIDATE: whether the path
// moves is the binding-request hook's decision alone.
func (s *session) presentCheck(pc *popConn, client netip.AddrPort) {
	msg, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(s.ufrag+":"+s.client.ufrag),
		ice.AttrControlling(tieBreaker()), ice.PriorityAttr(prflxPriority),
		stun.NewShortTermIntegrity(s.pwd), stun.Fingerprint)
	if err != nil {
		return
	}
	if pc.inject(msg.Raw, client) {
		s.t.m.path.mediaFollows.Inc()
	}
}

// prflxPriority is the PRIORITY of a presented check: that of a
// peer-reflexive UDP candidate (RFC 8445 5.1.2.1, type preference 110).
const prflxPriority = 110<<24 | 65535<<8 | 255

func tieBreaker() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}
