package e2e

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/geo"
)

// TestCallOverIPv6: the nearest POP's VIP is IPv6 (::1), so the client's
// datagrams, the encapsulation headers (IPv6 client addresses) and the
// pod's virtual conn are all IPv6 end to end.
func TestCallOverIPv6(t *testing.T) {
	w := startWorld(t, devworld.Config{Regions: []devworld.RegionSpec{
		{Name: "eu-central", Location: geo.Point{Lat: 50.11, Lon: 8.68}, Cluster: 1, POP: 1, POPName: "fra6", POPIP: netip.MustParseAddr("::1")},
		{Name: "us-east", Location: geo.Point{Lat: 39.04, Lon: -77.49}, Cluster: 2, POP: 2, POPName: "iad", POPIP: netip.MustParseAddr("127.0.0.3")},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := dial(t, ctx, w)
	if !strings.Contains(call.Answer, " ::1 ") {
		t.Fatalf("answer has no IPv6 candidate:\n%s", call.Answer)
	}
	eventually(t, 5*time.Second, "50 echoes", func() bool { return call.Stats().Received >= 50 })
	if v := metricSum(t, w.Registry, "rtcedge_globalrelay_packets_total", map[string]string{"pop": "fra6", "direction": "to_client"}); v < 50 {
		t.Errorf("the IPv6 POP carried %v packets to the client, want ≥ 50", v)
	}
	if err := call.Hangup(ctx); err != nil {
		t.Fatal(err)
	}
}
