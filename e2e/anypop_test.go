package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/probe"
)

// TestAnyPOPRoutesAnySession places calls on both clusters through both
// POPs: the token in the ufrag, not the POP, decides where a flow goes.
// Clients are located by Cloudflare-style headers from a trusted proxy;
// the POP nearest to them is taken down so the other one must carry the
// call to the far cluster.
func TestAnyPOPRoutesAnySession(t *testing.T) {
	for _, tc := range []struct {
		client int // region index the client is in
		viaPOP int // region index of the POP that must carry it
	}{
		{client: 0, viaPOP: 0}, {client: 1, viaPOP: 1}, // near POP
		{client: 0, viaPOP: 1}, {client: 1, viaPOP: 0}, // far POP
	} {
		t.Run(fmt.Sprintf("client-in-%d-via-pop-%d", tc.client, tc.viaPOP), func(t *testing.T) {
			w := startWorld(t, devworld.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
			if tc.viaPOP != tc.client {
				// The client's own POP is down: it must use the backup.
				w.Regions[tc.client].GlobalRelay.Close()
			}
			spec := w.Regions[tc.client].Spec
			h := http.Header{}
			h.Set("CF-IPLatitude", strconv.FormatFloat(spec.Location.Lat, 'f', 2, 64))
			h.Set("CF-IPLongitude", strconv.FormatFloat(spec.Location.Lon, 'f', 2, 64))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			call, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Headers: h, Logger: testLogger()})
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer call.Close()
			if err := call.WaitEcho(ctx); err != nil {
				t.Fatal(err)
			}
			if call.Region != spec.Name {
				t.Errorf("call placed in %s, want the client's region %s", call.Region, spec.Name)
			}
			pop := w.Regions[tc.viaPOP].Spec.POPName
			eventually(t, 5*time.Second, "packets through POP "+pop, func() bool {
				return metricSum(t, w.Registry, "rtcedge_globalrelay_packets_total", map[string]string{"pop": pop, "direction": "to_client"}) >= 25
			})
			if v := metricSum(t, w.Registry, "rtcedge_clusterrelay_packets_total", map[string]string{"region": spec.Name, "direction": "to_pod"}); v < 25 {
				t.Errorf("cluster of %s carried %v packets, want ≥ 25", spec.Name, v)
			}
		})
	}
}
