// Route-cache entries sealed by a pod (docs/wire.md §6): a phone call's
// carrier sends RTP with no ufrag to route by, so the pod that took the
// call writes the route of the carrier's negotiated address itself, MAC'd
// with its own hop key. A global relay verifies it under the key it
// derives for the pod the entry names: a pod can write routes only in its
// own name.

package encap

import "net/netip"

// PodSealed is set in a route-cache entry's key ID byte when the entry
// was sealed by the pod it names (SealPodRoute), not by a relay.
const PodSealed = 0x80

// podRouteDomain starts the MAC input of a pod-sealed entry: it differs
// from routeDomain ('R'), ProbeMagic and Magic, so no tag is valid in two
// places.
const podRouteDomain = 'S'

func podRouteInput(client netip.AddrPort, cluster, pod uint16, token [6]byte, stored uint32) [33]byte {
	in := routeInput(client, cluster, pod, token, stored)
	in[0] = podRouteDomain
	return in
}

// SealPodRoute returns the key ID byte (PodSealed | the current key ID)
// and tag of a route-cache entry client → (cluster, pod, token) written at
// stored (unix seconds) by pod itself, under its hop key. It is a pod's
// keyring's: one whose keys are the pod's own (static, as its issuer gave
// them); a relay's derived keyring seals in the named pod's name, which
// only tests need.
func (k *Keyring) SealPodRoute(client netip.AddrPort, cluster, pod uint16, token [6]byte, stored uint32) (keyID uint8, tag uint64) {
	in := podRouteInput(client, cluster, pod, token, stored)
	key, ok := k.podHopKey(k.current, pod)
	if !ok {
		return PodSealed | k.current, 0
	}
	return PodSealed | k.current, sipHash24(key.k0, key.k1, in[:])
}

// VerifyPodRoute checks a pod-sealed entry's key ID byte and tag under the
// hop key of the pod it names (derived, for a relay's keyring of the
// entry's cluster; static otherwise): ErrUnknownKey, ErrMAC. It does not
// allocate.
func (k *Keyring) VerifyPodRoute(client netip.AddrPort, cluster, pod uint16, token [6]byte, stored uint32, keyID uint8, tag uint64) error {
	if k == nil || keyID&PodSealed == 0 {
		return ErrUnknownKey
	}
	id := keyID &^ PodSealed
	if id > MaxKeyID || (k.isDerived(id) && cluster != k.derived.cluster) {
		return ErrUnknownKey
	}
	key, ok := k.podHopKey(id, pod)
	if !ok {
		return ErrUnknownKey
	}
	in := podRouteInput(client, cluster, pod, token, stored)
	if !tagEqual(sipHash24(key.k0, key.k1, in[:]), tag) {
		return ErrMAC
	}
	return nil
}

// podHopKey is pod's hop key under key ID id: derived from the master
// when id is derived, else the static key; false: none.
func (k *Keyring) podHopKey(id uint8, pod uint16) (hopKey, bool) {
	switch {
	case id > MaxKeyID:
		return hopKey{}, false
	case k.isDerived(id):
		key, _ := k.derived.podKey(id, pod)
		return key, true
	case k.keys[id] != nil:
		return *k.keys[id], true
	}
	return hopKey{}, false
}
