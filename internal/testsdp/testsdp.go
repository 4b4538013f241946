// Package testsdp holds SDP helpers shared by tests of several packages:
// a real offer from a Pion client, and reading candidates out of an answer.
// Only tests import it.
package testsdp

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"
)

// Offer returns a complete offer from a real Pion client: Opus audio and
// the oai-events data channel, as a browser sends, plus one media section
// of each extra kind (a video section, to see it rejected).
func Offer(t testing.TB, extra ...webrtc.RTPCodecType) string {
	t.Helper()
	se := webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	pc, err := webrtc.NewAPI(webrtc.WithSettingEngine(se)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for _, k := range append([]webrtc.RTPCodecType{webrtc.RTPCodecTypeAudio}, extra...) {
		if _, err := pc.AddTransceiverFromKind(k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pc.CreateDataChannel("oai-events", nil); err != nil {
		t.Fatal(err)
	}
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gathered:
	case <-time.After(10 * time.Second):
		t.Fatal("offer: ICE gathering did not complete")
	}
	return pc.LocalDescription().SDP
}

// CandidatePriorities maps every candidate address in an SDP to its
// priority.
func CandidatePriorities(t testing.TB, sdp string) map[netip.AddrPort]uint64 {
	t.Helper()
	out := map[netip.AddrPort]uint64{}
	for _, l := range strings.Split(sdp, "\r\n") {
		if !strings.HasPrefix(l, "a=candidate:") {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 8 {
			t.Fatalf("short candidate line %q", l)
		}
		prio, err1 := strconv.ParseUint(f[3], 10, 32)
		ap, err2 := netip.ParseAddrPort(f[4] + ":" + f[5])
		if err1 != nil || err2 != nil {
			t.Fatalf("bad candidate line %q", l)
		}
		out[ap] = prio
	}
	return out
}
