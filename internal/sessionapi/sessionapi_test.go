package sessionapi

import (
	"encoding/json"
	"net/netip"
	"testing"
)

// The wire form is what pods written before this package expect: the VIP
// as an "ip:port" string, config as a raw JSON object, omitted when empty.
func TestCreateRequestWireForm(t *testing.T) {
	tests := []struct {
		name string
		req  CreateRequest
		want string
	}{
		{"no config", CreateRequest{Offer: "v=0", POPs: []POP{{ID: 7, VIP: netip.MustParseAddrPort("203.0.113.10:3478")}}},
			`{"offer":"v=0","pops":[{"id":7,"vip":"203.0.113.10:3478"}]}`},
		{"config", CreateRequest{Offer: "v=0", POPs: []POP{{ID: 1, VIP: netip.MustParseAddrPort("[2001:db8::1]:3478")}}, Config: json.RawMessage(`{"model":"m"}`)},
			`{"offer":"v=0","pops":[{"id":1,"vip":"[2001:db8::1]:3478"}],"config":{"model":"m"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("got %s\nwant %s", b, tc.want)
			}
			var back CreateRequest
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if back.POPs[0] != tc.req.POPs[0] || string(back.Config) != string(tc.req.Config) {
				t.Fatalf("round trip: %+v", back)
			}
		})
	}
}
