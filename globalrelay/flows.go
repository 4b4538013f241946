package globalrelay

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// flow is what the relay remembers about one client address: the session's
// cluster and pod (from its token) and the cluster relay it currently uses.
// cluster and pod never change; a new token from the same address replaces
// the flow.
type flow struct {
	cluster, pod uint16
	lastSeen     atomic.Int64 // coarse unix nanos of the last packet from the client
	choice       atomic.Pointer[relayChoice]
}

// relayChoice caches RelayFor's answer for one directory generation.
type relayChoice struct {
	gen   uint64
	addr  netip.AddrPort
	found bool
}

// relay returns the flow's cluster relay, re-picking it only when the
// directory has changed since the last pick.
func (f *flow) relay(dir ClusterDirectory, client netip.AddrPort) (netip.AddrPort, bool) {
	gen := dir.Generation()
	if c := f.choice.Load(); c != nil && c.gen == gen {
		return c.addr, c.found
	}
	addr, ok := dir.RelayFor(f.cluster, client)
	f.choice.Store(&relayChoice{gen: gen, addr: addr, found: ok})
	return addr, ok
}

// flowShards spreads the table over independently locked maps so workers on
// different cores rarely contend.
const flowShards = 64

// flowTable maps client addresses to flows, with a global cap.
type flowTable struct {
	max    int
	count  atomic.Int64
	shards [flowShards]flowShard
}

type flowShard struct {
	mu sync.RWMutex
	m  map[netip.AddrPort]*flow
}

func newFlowTable(max int) *flowTable {
	t := &flowTable{max: max}
	for i := range t.shards {
		t.shards[i].m = map[netip.AddrPort]*flow{}
	}
	return t
}

func (t *flowTable) shard(a netip.AddrPort) *flowShard {
	b := a.Addr().As16()
	h := uint32(a.Port()) ^ uint32(b[15]) ^ uint32(b[14])<<8 ^ uint32(b[13])<<16 ^ uint32(b[12])<<24
	h ^= h >> 16
	h *= 0x45d9f3b
	h ^= h >> 16
	return &t.shards[h%flowShards]
}

func (t *flowTable) get(a netip.AddrPort) *flow {
	s := t.shard(a)
	s.mu.RLock()
	f := s.m[a]
	s.mu.RUnlock()
	return f
}

// put stores f for a, replacing any flow there. It fails when a is new and
// the table is full.
func (t *flowTable) put(a netip.AddrPort, f *flow) bool {
	s := t.shard(a)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[a]; !ok {
		if t.count.Load() >= int64(t.max) {
			return false
		}
		t.count.Add(1)
	}
	s.m[a] = f
	return true
}

// expire removes flows not seen since cutoff and returns how many it removed.
func (t *flowTable) expire(cutoff int64) int {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for a, f := range s.m {
			if f.lastSeen.Load() < cutoff {
				delete(s.m, a)
				removed++
			}
		}
		s.mu.Unlock()
	}
	t.count.Add(int64(-removed))
	return removed
}

func (t *flowTable) len() int { return int(t.count.Load()) }
