package encap

import (
	"encoding/binary"
	"net/netip"
)

// Relay probes (docs/wire.md section 5). Before a global relay makes a
// cluster relay suspect for every flow, it asks the relay itself: a probe
// from the global relay's ingress socket, answered in place by the
// cluster relay. Both are sealed with the cluster's relay key (the
// route-cache key of a derived key ID, which pods do not hold; the hop
// key of a static one), so no caller, Internet host or pod can forge a
// probe or its answer; the answer is as long as the probe and goes only
// to the address the probe's tag names, so the exchange amplifies
// nothing.
//
// Layout (24 bytes, big-endian):
//
//	0      ProbeMagic 0x5C
//	1      ProbeVersion<<4 | flags (bit 0 answer; bits 1–3 reserved, 0)
//	2      key ID of the relay key the tag is made with
//	3      reserved = 0
//	4..5   cluster ID
//	6..7   reserved = 0
//	8..15  nonce, random per probe, echoed by the answer
//	16..23 tag = SipHash-2-4(relay key, bytes 0..15 ‖ ingress IP (16) ‖
//	       ingress port ‖ relay IP (16) ‖ relay port)
//
// The ingress is the global relay socket the probe comes from and its
// answer goes to, the relay the cluster relay's advertised data address:
// a probe verifies only at the relay it was sent to and only from the
// socket that sent it, and an answer only at that socket and only as that
// relay's. The flags byte is covered, so a probe is never a valid answer
// or the reverse. 0x5C lies outside every range of RFC 7983 and differs
// from Magic and BundleMagic; the tag input starts with it, so it never
// equals a header's (0x5E), a route entry's ('R') or a derivation's
// ('P').
const (
	// ProbeMagic is the first byte of a relay probe and of its answer.
	ProbeMagic = 0x5C
	// ProbeVersion is the probe version this package writes and accepts.
	ProbeVersion = 1
	// ProbeLen is the length of a probe and of its answer.
	ProbeLen = 24

	probeAnswer   = 1 << 0
	probeSigned   = 16
	probeInputLen = probeSigned + 2*(16+2)
)

// IsProbe reports whether b starts like a relay probe or answer.
func IsProbe(b []byte) bool { return len(b) > 0 && b[0] == ProbeMagic }

// ProbeCluster returns the cluster a probe or answer names (0 when b is
// too short); nothing in it is authenticated before the tag verifies.
func ProbeCluster(b []byte) uint16 {
	if len(b) < 6 {
		return 0
	}
	return binary.BigEndian.Uint16(b[4:6])
}

// probeTag computes the tag of the probe or answer pkt (ProbeLen bytes)
// under key, between ingress and relay.
func (key *hopKey) probeTag(pkt []byte, ingress, relay netip.AddrPort) uint64 {
	var in [probeInputLen]byte
	copy(in[:probeSigned], pkt[:probeSigned])
	off := probeSigned
	for _, ap := range [2]netip.AddrPort{ingress, relay} {
		ip := ap.Addr().Unmap().As16()
		copy(in[off:], ip[:])
		binary.BigEndian.PutUint16(in[off+16:], ap.Port())
		off += 18
	}
	return sipHash24(key.k0, key.k1, in[:])
}

// SealProbe writes into b (at least ProbeLen bytes) a probe for cluster
// with nonce, from the global relay socket ingress to the cluster relay
// at relay, sealed under the keyring's current key, and returns it
// (b[:ProbeLen]). It does not allocate.
func (k *Keyring) SealProbe(b []byte, cluster uint16, nonce uint64, ingress, relay netip.AddrPort) []byte {
	pkt := b[:ProbeLen]
	clear(pkt)
	pkt[0], pkt[1], pkt[offKeyID] = ProbeMagic, ProbeVersion<<4, k.current
	binary.BigEndian.PutUint16(pkt[4:6], cluster)
	binary.BigEndian.PutUint64(pkt[8:16], nonce)
	binary.BigEndian.PutUint64(pkt[16:24], k.relayKey(k.current).probeTag(pkt, ingress, relay))
	return pkt
}

// checkProbe validates pkt's layout (answer: the answer flag it must
// carry) and tag between ingress and relay, and returns its relay key.
func (k *Keyring) checkProbe(pkt []byte, answer bool, ingress, relay netip.AddrPort) (*hopKey, error) {
	switch {
	case len(pkt) != ProbeLen:
		return nil, ErrShort
	case pkt[0] != ProbeMagic:
		return nil, ErrMagic
	case pkt[1]>>4 != ProbeVersion:
		return nil, ErrVersion
	}
	want := byte(0)
	if answer {
		want = probeAnswer
	}
	if pkt[1]&0x0f != want || pkt[3] != 0 || pkt[6] != 0 || pkt[7] != 0 {
		return nil, ErrReservedFlag
	}
	id := pkt[offKeyID]
	if k == nil || id > MaxKeyID || k.relayKey(id) == nil {
		return nil, ErrUnknownKey
	}
	if k.isDerived(id) && ProbeCluster(pkt) != k.derived.cluster {
		return nil, ErrUnknownKey
	}
	key := k.relayKey(id)
	if !tagEqual(key.probeTag(pkt, ingress, relay), binary.BigEndian.Uint64(pkt[16:24])) {
		return nil, ErrMAC
	}
	return key, nil
}

// AnswerProbe is the cluster relay's side: it verifies the probe pkt,
// received from ingress by the relay whose advertised address is relay,
// and turns it in place into its answer (same length, same nonce and key
// ID, the answer flag set, a new tag). A probe that does not verify is
// left as it was and an error returned (ErrShort, ErrMagic, ErrVersion,
// ErrReservedFlag, ErrUnknownKey, ErrMAC). It does not allocate.
func (k *Keyring) AnswerProbe(pkt []byte, ingress, relay netip.AddrPort) error {
	key, err := k.checkProbe(pkt, false, ingress, relay)
	if err != nil {
		return err
	}
	pkt[1] |= probeAnswer
	binary.BigEndian.PutUint64(pkt[16:24], key.probeTag(pkt, ingress, relay))
	return nil
}

// OpenProbeAnswer is the global relay's side: it verifies an answer that
// came from the cluster relay at relay to the socket ingress and returns
// the nonce it echoes. Errors are AnswerProbe's. It does not allocate.
func (k *Keyring) OpenProbeAnswer(pkt []byte, ingress, relay netip.AddrPort) (nonce uint64, err error) {
	if _, err := k.checkProbe(pkt, true, ingress, relay); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(pkt[8:16]), nil
}
