package globalrelay

// Tests of expireAbandoned: a rebinding caller's old flow goes at the next
// scan, a lone quiet flow does not.

import (
	"net/netip"
	"testing"
	"time"
)

// TestExpireAbandoned: of a token's flows, those quiet while a newer one
// of the same token carried traffic well after them are expired at once;
// a token's only flow, and two flows of one token both live, are kept.
func TestExpireAbandoned(t *testing.T) {
	now := time.Now().UnixNano()
	ago := func(d time.Duration) int64 { return now - int64(d) }
	tokA := tokenKey{cluster: 1, pod: 2, nonce: [6]byte{1}}
	tokB := tokenKey{cluster: 1, pod: 2, nonce: [6]byte{2}}
	tokC := tokenKey{cluster: 1, pod: 3, nonce: [6]byte{3}}
	addr := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), port) }
	table := newFlowTable(100)
	type entry struct {
		name string
		a    netip.AddrPort
		kept bool
	}
	var entries []entry
	for _, tc := range []struct {
		name     string
		tok      tokenKey
		port     uint16
		lastSeen int64
		kept     bool
	}{
		{"rebound away from", tokA, 1000, ago(5 * time.Second), false},
		{"the new address", tokA, 1001, ago(10 * time.Millisecond), true},
		{"only flow of its token, quiet", tokB, 2000, ago(20 * time.Second), true},
		{"two live addresses (1)", tokC, 3000, ago(500 * time.Millisecond), true},
		{"two live addresses (2)", tokC, 3001, ago(10 * time.Millisecond), true},
	} {
		f := &flow{cluster: tc.tok.cluster, pod: tc.tok.pod, tok: tc.tok, created: tc.lastSeen}
		f.lastSeen.Store(tc.lastSeen)
		if r := table.put(addr(tc.port), f); r != putStored {
			t.Fatalf("put %s: %v", tc.name, r)
		}
		entries = append(entries, entry{tc.name, addr(tc.port), tc.kept})
	}
	if n := table.expireAbandoned(now); n != 1 {
		t.Errorf("expired %d flows, want 1", n)
	}
	for _, e := range entries {
		if got := table.get(e.a) != nil; got != e.kept {
			t.Errorf("%s: kept = %v, want %v", e.name, got, e.kept)
		}
	}
	if table.len() != 4 || table.tokens[tokA] != 1 {
		t.Errorf("table holds %d flows, token A %d, want 4 and 1", table.len(), table.tokens[tokA])
	}
}

// put stores f for a, replacing any flow there. It fails when a is new and
// the table is full, or f's token has its share of flows already.
func (t *flowTable) put(a netip.AddrPort, f *flow) putResult { return t.store(a, f, true) }
