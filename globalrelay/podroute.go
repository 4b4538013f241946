// Route-cache entries a pod sealed for a phone call's media address
// (docs/wire.md §6): the carrier's first RTP datagram misses the flow
// table and looks its address up; the entry the pod wrote verifies under
// the hop key of the pod it names, so a pod can route to itself only.

package globalrelay

import (
	"net/netip"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/routecache"
)

// verifyEntry checks a route-cache entry's MAC: a relay's under the
// cluster's route key, or, marked encap.PodSealed, the named pod's under
// that pod's hop key.
func (r *Relay) verifyEntry(client netip.AddrPort, e routecache.Route) error {
	keys := r.hopKeys.Load().For(e.Cluster)
	if e.KeyID&encap.PodSealed != 0 {
		// Counted as every cache entry: flows_restored_total{source="cache"}
		// or cache_rejected_total.
		return keys.VerifyPodRoute(client, e.Cluster, e.Pod, e.Token, e.Stored, e.KeyID, e.Tag)
	}
	return keys.VerifyRoute(client, e.Cluster, e.Pod, e.Token, e.Stored, e.KeyID, e.Tag)
}
