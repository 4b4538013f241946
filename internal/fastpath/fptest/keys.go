package fptest

// Hop keyrings for the relays' key-rotation tests with the fast path.

import (
	"bytes"
	"testing"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// HopRing is cluster's keyring of key IDs ids, signing with current: static
// keys, or per-pod keys derived from masters (what the authority file
// gives). Key n is 32 bytes of 0x11*n, so two rings with the same IDs
// agree.
func HopRing(t testing.TB, cluster uint16, derived bool, current uint8, ids ...uint8) *encap.Keyring {
	t.Helper()
	keys := map[uint8][]byte{}
	for _, id := range ids {
		keys[id] = bytes.Repeat([]byte{0x11 * id}, encap.KeyLen)
	}
	var k *encap.Keyring
	var err error
	if derived {
		k, err = (*encap.Keyring)(nil).WithMasters(cluster, current, keys, keys)
	} else {
		k, err = encap.NewKeyring(current, keys)
	}
	if err != nil {
		t.Fatal(err)
	}
	return k
}
