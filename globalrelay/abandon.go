package globalrelay

// Abandoned flows: a client that moved to a new address leaves its old
// flow behind; expireAbandoned drops it at the next scan instead of
// after FlowIdle.

import "time"

// abandonQuiet is how long a flow must have been silent, while another flow
// of the same token carried traffic later than it, before it counts as
// abandoned: the client moved to a new address (a NAT rebinding, a network
// change, an ICE restart from a new port) and will not come back to this
// one. Such a flow is expired at the next scan instead of after FlowIdle,
// so the table does not hold a rebinding caller twice for minutes. Should
// the client use the old address after all, its next check (with the
// token) opens the flow again.
const abandonQuiet = 2 * time.Second

// expireAbandoned removes flows that are quiet for abandonQuiet while a
// flow of the same token has carried a packet more than abandonQuiet after
// them. It returns how many it removed. Only tokens with more than one flow
// are looked at, which are few.
func (t *flowTable) expireAbandoned(now int64) int {
	quiet := int64(abandonQuiet)
	t.tmu.Lock()
	multi := make(map[tokenKey]int64)
	for tok, n := range t.tokens {
		if n > 1 {
			multi[tok] = 0
		}
	}
	t.tmu.Unlock()
	if len(multi) == 0 {
		return 0
	}
	// Pass 1: the latest packet of each such token's flows.
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		for _, f := range s.m {
			if latest, ok := multi[f.tok]; ok {
				multi[f.tok] = max(latest, f.lastSeen.Load())
			}
		}
		s.mu.RUnlock()
	}
	// Pass 2: remove the flows left behind.
	return t.removeIf(func(f *flow) bool {
		latest, ok := multi[f.tok]
		seen := f.lastSeen.Load()
		return ok && seen < now-quiet && seen < latest-quiet
	})
}
