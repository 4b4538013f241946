package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/steer"
)

// TestPodRoundTripsReachSignalingAsTheirPods: in a dev world with the
// deployment authority, one Pion call's round trips, measured by its pod,
// go out in a report tagged with the pod's own key and carrying the ticket
// the front gave the create; the cluster relay believes it (none refused)
// and passes the samples on signed with its cluster's relay key, and
// signaling believes them under that key (none dropped) and files them as
// that pod's. Without the ticket or the tag
// the relay would refuse them (clusterrelay TestSteerReportsOnlyForTheirPodsCalls).
func TestPodRoundTripsReachSignalingAsTheirPods(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c := dialEchoCall(ctx, t, w.SignalingURL, nil)
	defer c.close()
	defer func() { // the way the samples went, when they did not arrive
		if !t.Failed() {
			return
		}
		for _, n := range []string{"rtcedge_transceiver_rtt_samples_total", "rtcedge_clusterrelay_rtt_messages_total", "rtcedge_signaling_steering_samples_total"} {
			for _, r := range []string{"sent", "dropped", "unsent", "forwarded", "refused", "invalid", "accepted"} {
				if v := metricSum(t, w.Registry, n, map[string]string{"result": r}); v != 0 {
					t.Logf("%s{result=%s} %v", n, r, v)
				}
			}
		}
		for _, d := range steer.Drops {
			if v := metricSum(t, w.Registry, "rtcedge_signaling_steering_messages_dropped_total", map[string]string{"reason": d.String()}); v != 0 {
				t.Logf("rtcedge_signaling_steering_messages_dropped_total{reason=%s} %v", d, v)
			}
		}
	}()
	eventually(t, 15*time.Second, "signaling to accept the pod's samples", func() bool {
		return metricSum(t, w.Registry, "rtcedge_signaling_steering_samples_total", map[string]string{"source": "pod", "result": "accepted"}) >= 1
	})
	if n := metricSum(t, w.Registry, "rtcedge_clusterrelay_rtt_messages_total", map[string]string{"result": "refused"}); n != 0 {
		t.Errorf("%v reports refused by the cluster relays", n)
	}
	if n := metricSum(t, w.Registry, "rtcedge_clusterrelay_rtt_messages_total", map[string]string{"result": "invalid"}); n != 0 {
		t.Errorf("%v reports invalid at the cluster relays", n)
	}
	if n := metricSum(t, w.Registry, "rtcedge_signaling_steering_messages_dropped_total", nil); n != 0 {
		t.Errorf("%v samples messages dropped by signaling", n)
	}
}
