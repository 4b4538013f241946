package sim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/sim"
)

// Phone calls in the simulation, judged by mechanism.
const (
	// phoneHold is how much audio each phone call must hear back.
	phoneHold = 600 * time.Millisecond
	// audioLimit bounds ACK → audio flowing for every call: 150 media
	// round trips, beyond what load adds on two cores (at load 21 one
	// phone call took 655 ms and a WebRTC call's first echo 1.3 s) and far
	// below what a broken route would take: a pod rewrites an unused route
	// entry every 20 s, and without one no audio flows at all.
	audioLimit = 3 * time.Second
	// toneRatio is how much stronger the tone must be heard than a
	// frequency the carrier never sent.
	toneRatio = 100
)

// measurePhone places calls from site's carrier one after another and
// checks each by what it proves, not by milliseconds a loaded machine adds:
// the pod's route entry for the carrier's media address names a pod of the
// site's near region's cluster (the call was placed there, not across the
// ocean; at most half of the calls elsewhere, as a cluster too slow for a
// moment passes calls on); the answer sends the media to the carrier POP the trunk pins; the
// carrier hears its own tone back from that VIP (through the global relay,
// which opens the flow from the pod's route entry, the cluster relay, the
// pod's PCMU and the echo: without the entry no audio flows and the call
// fails), within audioLimit of the ACK. The floors (no answer before a
// signaling round trip, no audio before a media round trip) only catch a
// measurement that cannot be: the pod's own processing is longer than the
// round trip, so they do not prove the carrier's delay applies. The
// medians, in round trips, are reported against the goal, not asserted.
func measurePhone(t *testing.T, w *sim.World, site *sim.Site, calls int) sim.PhoneReport {
	pop, near := site.SIP.POP, w.Regions[site.NearRegion()]
	out := sim.PhoneReport{Site: site.Spec.Name, City: site.Spec.City, Trunk: site.SIP.Trunk, POP: pop.Name, Calls: calls}
	var results []sim.PhoneResult
	for i := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var route routecache.Route
		var routeErr error
		r, err := sim.PhoneCall(ctx, site, phoneHold, func(r sim.PhoneResult) {
			var ok bool
			if route, ok, routeErr = w.PhoneRoute(ctx, r.Media); routeErr == nil && !ok {
				routeErr = errors.New("no route entry")
			}
		})
		cancel()
		if err != nil {
			t.Fatalf("phone call %d from site %s: %v", i, site.Spec.Name, err)
		}
		switch {
		case routeErr != nil:
			t.Errorf("phone call %d from site %s: the route entry of its media address %v: %v", i, site.Spec.Name, r.Media, routeErr)
		case route.Cluster != near.Spec.Cluster:
			// Within an allowance, as for WebRTC calls (steering_test.go):
			// a cluster that gossip shows unusable for a moment, or that
			// does not answer within cluster_timeout on a loaded machine,
			// passes the call on.
			out.OtherCluster++
			t.Logf("phone call %d from site %s: placed on cluster %d (pod %d), not its near region's %d", i, site.Spec.Name, route.Cluster, route.Pod, near.Spec.Cluster)
		}
		switch {
		case r.VIP != pop.VIP():
			t.Errorf("phone call %d from site %s: the answer sends media to %v, want the trunk's POP %s at %v", i, site.Spec.Name, r.VIP, pop.Name, pop.VIP())
		case r.Heard < int(phoneHold.Seconds()*8000) || r.Tone < toneRatio:
			t.Errorf("phone call %d from site %s: heard %d samples back, the tone %.0f times the other frequency: want %v of the tone", i, site.Spec.Name, r.Heard, r.Tone, phoneHold)
		case r.AckToAudio < w.MediaRTT():
			t.Errorf("phone call %d from site %s: audio back %v after the ACK, less than the media round trip %v", i, site.Spec.Name, r.AckToAudio, w.MediaRTT())
		case r.AckToAudio > audioLimit:
			t.Errorf("phone call %d from site %s: audio flowing %v after the ACK, over %v", i, site.Spec.Name, r.AckToAudio, audioLimit)
		case r.InviteToOK < w.SignalingRTT():
			t.Errorf("phone call %d from site %s: 200 OK %v after the INVITE, less than the signaling round trip %v", i, site.Spec.Name, r.InviteToOK, w.SignalingRTT())
		}
		t.Logf("phone call %d: INVITE → 200 OK %.1f ms, ACK → audio %.1f ms, tone %.0f×", i, ms(r.InviteToOK), ms(r.AckToAudio), r.Tone)
		results = append(results, r)
	}
	if out.OtherCluster > calls/2 {
		t.Errorf("site %s: %d of %d phone calls placed outside its near region's cluster %d", site.Spec.Name, out.OtherCluster, calls, near.Spec.Cluster)
	}
	out.Rows = sim.PhoneRows(results, w.SignalingRTT(), w.MediaRTT())
	return out
}
