package globalrelay

// The relay's side of the in-kernel fast path (internal/fastpath,
// docs/fastpath.md): what the kernel is told about a flow user space has
// authenticated.

import (
	"net/netip"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
)

// kernelFlow describes f, of client, to the kernel: the header the relay
// would write for it through the worker whose sockets are vip (public)
// and ingress (internal), sealed under the key it would seal with, toward
// relay. It reports false for a flow the kernel must not carry: one still
// unconfirmed (restored from the return path; its replies are held) or of
// a cluster the relay holds no key for.
func (r *Relay) kernelFlow(f *flow, client, vip, ingress, relay netip.AddrPort, refreshAt uint64) (fastpath.GlobalFlow, bool) {
	keys := r.hopKeys.Load().For(f.cluster)
	if keys == nil || f.unconfirmed.Load() {
		return fastpath.GlobalFlow{}, false
	}
	id, key := keys.SealKey(f.pod)
	gf := fastpath.GlobalFlow{
		Client: client, VIP: vip, Relay: relay, Key: key, RefreshAt: refreshAt,
		Header: encap.Header{KeyID: id, Cluster: f.cluster, Pod: f.pod, POP: r.cfg.POP, Token: f.tok.nonce,
			Client: client, Ingress: ingress},
	}
	if s := f.ssrc.Load(); s != 0 {
		gf.SSRC, gf.HasSSRC = uint32(s), true
	}
	return gf, true
}
