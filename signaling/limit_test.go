package signaling

import (
	"net/netip"
	"testing"
	"time"
)

func testLimits(max int) *limits {
	cfg := Config{RatePerSecond: 5, RateBurst: 20, MaxLimiters: max}
	return newLimits(&cfg, nil)
}

// drain spends an address's whole burst and reports whether the next
// request was refused.
func drain(l *limits, ip netip.Addr, now time.Time) bool {
	for range 20 {
		l.allowAddr(ip, now)
	}
	return !l.allowAddr(ip, now)
}

// TestAddrLimitKeys: an IPv4 address and an IPv6 /64 each have their own
// budget; addresses inside one /64 (one subscriber) share it.
func TestAddrLimitKeys(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name      string
		a, b      string
		sameKeyed bool
	}{
		{"two IPv4 addresses", "192.0.2.7", "192.0.2.8", false},
		{"mapped and plain IPv4", "::ffff:192.0.2.7", "192.0.2.7", true},
		{"one IPv6 /64", "2001:db8:1:2:aaaa::1", "2001:db8:1:2:bbbb::9", true},
		{"two IPv6 /64s", "2001:db8:1:2::1", "2001:db8:1:3::1", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := testLimits(1000)
			if !drain(l, netip.MustParseAddr(tc.a), now) {
				t.Fatal("the burst did not run out")
			}
			refused := !l.allowAddr(netip.MustParseAddr(tc.b), now)
			if refused != tc.sameKeyed {
				t.Fatalf("after draining %s, %s refused = %v, want %v", tc.a, tc.b, refused, tc.sameKeyed)
			}
		})
	}
}

// TestAddrLimitFlood is the flood: 200,000 requests from distinct
// IPv6 /64s fill the table; honest clients arriving afterwards (their
// first request each, from elsewhere) must still be served, at least 99 %
// of them. With one shared overflow bucket (the old design) 20 of them
// would be.
func TestAddrLimitFlood(t *testing.T) {
	const flood = 200_000
	tests := []struct {
		name     string
		attacker func(i int) netip.Addr
	}{
		// /64s in a few /48s: what one subscriber's allocation yields.
		{"/64s of a few /48s", func(i int) netip.Addr {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, byte(i >> 16), byte(i >> 8), byte(i), 15: 1})
		}},
		// Every request from its own /48, spread over a few /32s.
		{"one /48 each", func(i int) netip.Addr {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, byte(0xb8 + i>>16), byte(i >> 8), byte(i), 15: 1})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := testLimits(flood)
			now := time.Unix(1_700_000_000, 0)
			for i := range flood {
				l.allowAddr(tc.attacker(i), now)
			}
			// The flood keeps going while honest clients arrive.
			served, honest := 0, 0
			for i := range 2000 {
				l.allowAddr(tc.attacker(i), now)
				var ip netip.Addr
				if i%2 == 0 {
					ip = netip.AddrFrom4([4]byte{byte(11 + i%200), byte(i >> 3), byte(i), 7})
				} else {
					ip = netip.AddrFrom16([16]byte{0x2a, 0x02, byte(i >> 8), byte(i), 1, 2, 3, 4, 15: 9})
				}
				honest++
				if l.allowAddr(ip, now) {
					served++
				}
			}
			if len(l.addrs.m) > flood+256+65536 {
				t.Errorf("table grew to %d entries", len(l.addrs.m))
			}
			if served*100 < honest*99 {
				t.Fatalf("%d of %d honest first requests served, want >= 99 %%", served, honest)
			}
			t.Logf("%d of %d honest first requests served; table %d entries", served, honest, len(l.addrs.m))
		})
	}
}

// TestSecretLimit: each client secret has its own budget, and a full
// secret table falls back to a per-tenant bucket instead of refusing.
func TestSecretLimit(t *testing.T) {
	cfg := Config{SecretRatePerSecond: 1, SecretRateBurst: 2, MaxLimiters: 2}
	l := newLimits(&cfg, nil)
	now := time.Unix(1_700_000_000, 0)
	a, b := secretClaims{id: [12]byte{1}, tenant: "t"}, secretClaims{id: [12]byte{2}, tenant: "t"}
	for range 2 {
		if !l.allowSecret(a, now) {
			t.Fatal("secret a refused within its burst")
		}
	}
	if l.allowSecret(a, now) {
		t.Fatal("secret a allowed past its burst")
	}
	if !l.allowSecret(b, now) {
		t.Fatal("secret b refused: budgets are shared")
	}
	c := secretClaims{id: [12]byte{3}, tenant: "t"}
	if !l.allowSecret(c, now) || len(l.secrets.m) != 2 {
		t.Fatalf("a third secret with the table full: want served from the tenant bucket, table %d", len(l.secrets.m))
	}
	if !l.allowSecret(a, now.Add(time.Second)) {
		t.Fatal("secret a did not refill")
	}
}

// BenchmarkAllowAddr is the per-request cost of the address limit with a
// full table (the flood case), where aggregation lookups happen.
func BenchmarkAllowAddr(b *testing.B) {
	for _, tc := range []struct {
		name string
		fill int
	}{{"empty table", 0}, {"full table", 100_000}} {
		b.Run(tc.name, func(b *testing.B) {
			l := testLimits(100_000)
			now := time.Unix(1_700_000_000, 0)
			for i := range tc.fill {
				l.allowAddr(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, byte(i >> 16), byte(i >> 8), byte(i), 15: 1}), now)
			}
			ips := make([]netip.Addr, 1024)
			for i := range ips {
				ips[i] = netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				l.allowAddr(ips[i%len(ips)], now)
			}
		})
	}
}
