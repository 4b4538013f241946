package encap

import "encoding/binary"

// Keys handed to the in-kernel fast path (internal/fastpath), which seals
// and verifies headers of flows user space has authenticated. It gets only
// the keys a relay already uses per datagram: a static hop key, or the
// derived key of one pod, never a master.

// SealKey returns the key ID Seal uses and the key it seals a header naming
// pod with (the pod's derived key under a derived ID).
func (k *Keyring) SealKey(pod uint16) (id uint8, key [KeyLen]byte) {
	key, _, _ = k.PodKey(k.current, pod)
	return k.current, key
}

// PodKey returns the key that verifies a header naming pod under key ID
// id; ok reports whether the keyring holds one. perPod reports whether the
// key is the pod's own (derived) rather than the ID's static key, which
// serves every pod.
func (k *Keyring) PodKey(id uint8, pod uint16) (key [KeyLen]byte, perPod, ok bool) {
	if k == nil || id > MaxKeyID {
		return key, false, false
	}
	var h hopKey
	switch {
	case k.isDerived(id):
		h, perPod = k.derived.hop[id].derive(k.derived.cluster, pod), true
	case k.keys[id] != nil:
		h = *k.keys[id]
	default:
		return key, false, false
	}
	binary.LittleEndian.PutUint64(key[:8], h.k0)
	binary.LittleEndian.PutUint64(key[8:], h.k1)
	return key, perPod, true
}

// KeyIDs lists the key IDs the keyring holds, static and derived, ascending.
func (k *Keyring) KeyIDs() []uint8 {
	var ids []uint8
	for id := range uint8(MaxKeyID + 1) {
		if k != nil && (k.keys[id] != nil || k.isDerived(id)) {
			ids = append(ids, id)
		}
	}
	return ids
}
