package globalrelay

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"time"
)

// Following a caller's audio to a new address (a NAT rebinding, a phone
// moving networks). The caller does not know its address changed: its
// audio simply leaves from a new one, and its next consent check, the only
// datagram with a routing token, may be seconds away (2 s for Pion, 5 s
// or so for browsers). Audio carries no token, but its RTP header carries
// the stream's SSRC in the clear, and the relay has seen that SSRC on the
// caller's old flow.
//
// So the relay remembers the SSRC each flow's client sends audio with, and
// an RTP datagram from an unknown address whose SSRC belongs to a flow that
// has gone silent opens a flow for the new address with the old flow's
// token: the same cluster, pod and token cap, nothing more. The pod then
// decides, as for any new address: it proves the address with a STUN probe
// signed with the client's ICE password before anything goes there, and it
// moves the call only once the old address has been silent long enough
// (transceiver/reach.go). Nothing here moves or ends the old flow. The
// relay applies it in followSSRC and noteSSRC (clientpath.go).
//
// What an attacker gains: an SSRC is 32 random bits seen only on the path,
// and a live flow's SSRC opens nothing (followSilence); a guess from a
// spoofed address opens at most one flow toward a pod that never answers
// it with media. On the path, the caller's consent checks already carry
// its token in the clear, which opens the same flow.

// followSilence is how long a flow must have been silent before an RTP
// datagram with its SSRC from another address opens a flow there. Audio
// comes every 20 ms (400 ms in Opus DTX silence, which does not matter
// here: a flow is only added, never moved).
const followSilence = 200 * time.Millisecond

const ssrcShards = 16

// ssrcIndex maps the SSRC of a client's audio to the client address of the
// flow that sends it. An entry is only a hint: its flow is looked up again
// (and must be the same flow) before it is used, and the expiry scan drops
// entries whose flow is gone.
type ssrcIndex struct {
	shards [ssrcShards]ssrcShard
}

type ssrcShard struct {
	mu sync.Mutex
	m  map[uint32]ssrcEntry // guarded by mu
}

type ssrcEntry struct {
	addr netip.AddrPort
	f    *flow
}

func newSSRCIndex() *ssrcIndex {
	x := &ssrcIndex{}
	for i := range x.shards {
		x.shards[i].m = map[uint32]ssrcEntry{}
	}
	return x
}

func (x *ssrcIndex) shard(ssrc uint32) *ssrcShard { return &x.shards[ssrc%ssrcShards] }

func (x *ssrcIndex) get(ssrc uint32) (ssrcEntry, bool) {
	s := x.shard(ssrc)
	s.mu.Lock()
	e, ok := s.m[ssrc]
	s.mu.Unlock()
	return e, ok
}

// note records that f, the flow of addr, carries ssrc. Another flow's
// entry is replaced only when that flow is gone, or when it is of the same
// token (the same call from a new address) and has been silent for
// followSilence: whoever sends with a call's SSRC under another token does
// not take its entry while the call's flow exists.
func (x *ssrcIndex) note(ssrc uint32, addr netip.AddrPort, f *flow, flows *flowTable, now int64) {
	s := x.shard(ssrc)
	s.mu.Lock()
	e, ok := s.m[ssrc]
	if !ok || e.f == f || flows.get(e.addr) != e.f || (e.f.tok == f.tok && now-e.f.lastSeen.Load() >= int64(followSilence)) {
		s.m[ssrc] = ssrcEntry{addr: addr, f: f}
	}
	s.mu.Unlock()
}

// sweep drops the entries whose flow is no longer in the table.
func (x *ssrcIndex) sweep(flows *flowTable) {
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.Lock()
		for ssrc, e := range s.m {
			if flows.get(e.addr) != e.f {
				delete(s.m, ssrc)
			}
		}
		s.mu.Unlock()
	}
}

// rtpSSRC returns the SSRC of an RTP packet (not RTCP: payload types 72–79
// with the marker bit are RTCP's 200–207, RFC 5761). pkt is of ClassRTP.
func rtpSSRC(pkt []byte) (uint32, bool) {
	if len(pkt) < 12 || pkt[0]>>6 != 2 {
		return 0, false
	}
	if pt := pkt[1] & 0x7f; pt >= 64 && pt < 96 {
		return 0, false // RTCP, or a payload type RFC 5761 keeps from RTP
	}
	return binary.BigEndian.Uint32(pkt[8:12]), true
}

// forget drops ssrc's entry if it is still f's.
func (x *ssrcIndex) forget(ssrc uint32, f *flow) {
	s := x.shard(ssrc)
	s.mu.Lock()
	if e, ok := s.m[ssrc]; ok && e.f == f {
		delete(s.m, ssrc)
	}
	s.mu.Unlock()
}

// len counts the entries (tests).
func (x *ssrcIndex) len() int {
	n := 0
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
