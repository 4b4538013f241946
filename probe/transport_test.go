package probe

import (
	"strings"
	"testing"
)

// TestTransportChoice: -transport picks the ICE network types; an unknown
// transport is an error before anything is sent.
func TestTransportChoice(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		err  bool
	}{{"", 2, false}, {TransportUDP, 2, false}, {TransportTCP, 2, false}, {TransportAny, 4, false}, {"sctp", 0, true}} {
		types, err := networkTypes(tc.in)
		if (err != nil) != tc.err || len(types) != tc.want {
			t.Errorf("transport %q: %v, %v", tc.in, types, err)
		}
		if tc.in == TransportTCP {
			for _, ty := range types {
				if !strings.HasPrefix(ty.String(), "tcp") {
					t.Errorf("transport tcp includes %v", ty)
				}
			}
		}
	}
}
