package encap

import (
	"bytes"
	"net/netip"
	"testing"
)

// A pod seals a route in its own name with its own key (as its issuer
// derived it); a relay holding the cluster's masters verifies it for that
// pod and no other, and never as a relay-sealed entry.
func TestPodRoute(t *testing.T) {
	master, route := bytes.Repeat([]byte{3}, KeyLen), bytes.Repeat([]byte{4}, KeyLen)
	relay, err := (*Keyring)(nil).WithMasters(7, 2, map[uint8][]byte{2: master}, map[uint8][]byte{2: route})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := NewKeyring(2, map[uint8][]byte{2: DerivePodKey(master, 7, 5)})
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort("198.51.100.7:40000")
	tok := [6]byte{1, 2, 3, 4, 5, 6}
	id, tag := pod.SealPodRoute(client, 7, 5, tok, 1000)
	if id != PodSealed|2 {
		t.Fatalf("key ID byte %#x, want %#x", id, PodSealed|2)
	}
	if err := relay.VerifyPodRoute(client, 7, 5, tok, 1000, id, tag); err != nil {
		t.Fatalf("the pod's own entry: %v", err)
	}
	for name, err := range map[string]error{
		"another pod":      relay.VerifyPodRoute(client, 7, 6, tok, 1000, id, tag),
		"another cluster":  relay.VerifyPodRoute(client, 8, 5, tok, 1000, id, tag),
		"another address":  relay.VerifyPodRoute(netip.MustParseAddrPort("198.51.100.7:40001"), 7, 5, tok, 1000, id, tag),
		"another token":    relay.VerifyPodRoute(client, 7, 5, [6]byte{9}, 1000, id, tag),
		"another time":     relay.VerifyPodRoute(client, 7, 5, tok, 1001, id, tag),
		"as relay-sealed":  relay.VerifyRoute(client, 7, 5, tok, 1000, id&^PodSealed, tag),
		"without the mark": relay.VerifyPodRoute(client, 7, 5, tok, 1000, id&^PodSealed, tag),
	} {
		if err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	// A relay's own entry is never a pod's.
	rid, rtag := relay.SealRoute(client, 7, 5, tok, 1000)
	if relay.VerifyPodRoute(client, 7, 5, tok, 1000, rid|PodSealed, rtag) == nil {
		t.Error("a relay-sealed tag verified as pod-sealed")
	}
	if n := testing.AllocsPerRun(100, func() { _ = relay.VerifyPodRoute(client, 7, 5, tok, 1000, id, tag) }); n != 0 {
		t.Errorf("VerifyPodRoute: %v allocations", n)
	}
}
