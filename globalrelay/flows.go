package globalrelay

// The flow table: what the relay remembers per client address (flow),
// sharded for the workers, with a global cap and a cap per token.

import (
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
)

// flow is what the relay remembers about one client address: the session's
// cluster and pod (from its token) and the cluster relay it currently uses.
// cluster and pod never change; a new token from the same address replaces
// the flow.
//
// Static after the flow is put in the table: cluster, pod, tok, created.
// The rest is written by whichever worker handles the client's or the
// relay's datagram (and the fast path's sync), hence atomic.
type flow struct {
	cluster, pod uint16
	tok          tokenKey     // the token that opened the flow (restored flows: from the cache entry or header)
	created      int64        // coarse unix nanos when this flow was made
	lastSeen     atomic.Int64 // coarse unix nanos of the last packet from the client
	lastStored   atomic.Int64 // coarse unix nanos of the last write to the route cache
	choice       atomic.Pointer[relayChoice]
	watch        relayWatch    // is the chosen relay still answering? (failover.go: who writes what)
	ssrc         atomic.Uint64 // 1<<32 | the SSRC of the client's audio, 0 before any (ssrc.go)
	// unconfirmed: restored from a reply's header (the return path) and
	// no datagram from the client since; replies are not forwarded.
	unconfirmed atomic.Bool
	// kernel is what the fast path was given of the flow (fastpath.go);
	// nil: the kernel does not have it.
	kernel atomic.Pointer[kernelState]
}

// tokenKey identifies one minted token (one session's server ufrag).
type tokenKey struct {
	cluster, pod uint16
	nonce        [6]byte
}

// maxFlowsPerToken bounds how many client addresses one token may open
// flows from. A client checks from a few candidates (IPv4, IPv6, a NAT
// rebinding); without a bound, one leaked ufrag could fill the table from
// many source ports.
const maxFlowsPerToken = 8

// relayChoice caches the flow's relay for one directory generation and one
// generation of the suspects (failover.go, suspects.go).
type relayChoice struct {
	gen, sgen uint64
	addr      netip.AddrPort
	found     bool
}

// flowShards spreads the table over independently locked maps so workers on
// different cores rarely contend.
const flowShards = 64

// flowTable maps client addresses to flows, with a global cap and a cap
// per token.
type flowTable struct {
	max    int
	seed   maphash.Seed // per table: shard choice is not predictable from outside
	count  atomic.Int64
	shards [flowShards]flowShard

	tmu    sync.Mutex
	tokens map[tokenKey]int // flows per token; guarded by tmu

	// gone, set before the relay runs, is told every flow that leaves
	// the table or is replaced (under its shard's lock).
	gone func(netip.AddrPort, *flow)
}

// putResult says why put did not store a flow.
type putResult int

const (
	putStored   putResult = iota
	putFull               // the table is at its cap
	putTokenCap           // the flow's token already has maxFlowsPerToken flows
	putExists             // putIfAbsent found a flow there
)

type flowShard struct {
	mu sync.RWMutex
	m  map[netip.AddrPort]*flow // guarded by mu
}

func newFlowTable(max int) *flowTable {
	t := &flowTable{max: max, seed: maphash.MakeSeed(), tokens: map[tokenKey]int{}}
	for i := range t.shards {
		t.shards[i].m = map[netip.AddrPort]*flow{}
	}
	return t
}

func (t *flowTable) shard(a netip.AddrPort) *flowShard {
	var b [18]byte
	ip := a.Addr().As16()
	copy(b[:16], ip[:])
	b[16], b[17] = byte(a.Port()>>8), byte(a.Port())
	return &t.shards[maphash.Bytes(t.seed, b[:])%flowShards]
}

func (t *flowTable) get(a netip.AddrPort) *flow {
	s := t.shard(a)
	s.mu.RLock()
	f := s.m[a]
	s.mu.RUnlock()
	return f
}

// putIfAbsent stores f for a only if a has no flow: restores from the cache
// or the return path must not overwrite a flow a fresh token just made.
func (t *flowTable) putIfAbsent(a netip.AddrPort, f *flow) putResult { return t.store(a, f, false) }

func (t *flowTable) store(a netip.AddrPort, f *flow, replace bool) putResult {
	s := t.shard(a)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, exists := s.m[a]
	if exists && !replace {
		return putExists
	}
	if !exists && t.count.Load() >= int64(t.max) {
		return putFull
	}
	if f.tok != (tokenKey{}) && (!exists || old.tok != f.tok) {
		t.tmu.Lock()
		if t.tokens[f.tok] >= maxFlowsPerToken {
			t.tmu.Unlock()
			return putTokenCap
		}
		t.tokens[f.tok]++
		t.tmu.Unlock()
	}
	if exists {
		t.release(old)
		if t.gone != nil {
			t.gone(a, old)
		}
	} else {
		t.count.Add(1)
	}
	s.m[a] = f
	return putStored
}

// release forgets a removed or replaced flow's share of its token.
func (t *flowTable) release(f *flow) {
	if f.tok == (tokenKey{}) {
		return
	}
	t.tmu.Lock()
	if n := t.tokens[f.tok] - 1; n > 0 {
		t.tokens[f.tok] = n
	} else {
		delete(t.tokens, f.tok)
	}
	t.tmu.Unlock()
}

// expire removes flows not seen since cutoff, and flows restored from the
// return path before unconfirmedCutoff that their client never confirmed,
// in one pass; it returns how many it removed.
func (t *flowTable) expire(cutoff, unconfirmedCutoff int64) int {
	return t.removeIf(func(f *flow) bool {
		return f.lastSeen.Load() < cutoff || (f.unconfirmed.Load() && f.created < unconfirmedCutoff)
	})
}

// removeIf removes the flows gone says are gone and returns how many.
func (t *flowTable) removeIf(gone func(*flow) bool) int {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for a, f := range s.m {
			if gone(f) {
				delete(s.m, a)
				t.release(f)
				if t.gone != nil {
					t.gone(a, f)
				}
				removed++
			}
		}
		s.mu.Unlock()
	}
	t.count.Add(int64(-removed))
	return removed
}

func (t *flowTable) len() int { return int(t.count.Load()) }

// each calls f for every flow, one shard at a time, outside the locks.
func (t *flowTable) each(f func(netip.AddrPort, *flow)) {
	type entry struct {
		a netip.AddrPort
		f *flow
	}
	var batch []entry
	for i := range t.shards {
		s := &t.shards[i]
		batch = batch[:0]
		s.mu.RLock()
		for a, fl := range s.m {
			batch = append(batch, entry{a, fl})
		}
		s.mu.RUnlock()
		for _, e := range batch {
			f(e.a, e.f)
		}
	}
}
