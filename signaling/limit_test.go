package signaling

import (
	"net/netip"
	"testing"
)

func TestLimitKey(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"192.0.2.7", "192.0.2.7"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"2001:db8:1:2:aaaa::1", "2001:db8:1:2::"},
		{"2001:db8:1:2:bbbb::9", "2001:db8:1:2::"},
	} {
		if got := limitKey(netip.MustParseAddr(tc.in)); got != netip.MustParseAddr(tc.want) {
			t.Errorf("limitKey(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
