package globalrelay

// The client path: every datagram of a client and every datagram toward
// one, parse → decide → write. fromClient reads a datagram on a public
// socket, finds or opens its flow (a verified routing token, the SSRC of a
// caller whose NAT rebound, or a route-cache lookup in the background) and
// writes the header in front of it toward the flow's cluster relay, chosen
// in failover.go from directory.go; toClient verifies a reply from a cluster relay,
// checks it against the client's flow (restoring a lost one from its
// header) and strips the header for the public socket. The table they
// read is flows.go; the TCP ingress joins them in tcp.go.

import (
	"net/netip"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/stunmsg"
	"github.com/rtcedge/rtcedge/internal/token"
)

// fromClient handles a datagram on the public socket. The datagram is at
// buf[encap.MaxLen:][:n]; the header is written into the headroom before it.
// from is already unmapped (udpio does it for every datagram).
func (r *Relay) fromClient(buf []byte, n int, from netip.AddrPort, ingress netip.AddrPort) ([]byte, netip.AddrPort, bool) {
	pkt := buf[encap.MaxLen : encap.MaxLen+n]
	if n == 0 {
		r.m.drops.Inc(dropEmpty)
		return nil, netip.AddrPort{}, false
	}
	f := r.flows.get(from)
	now := r.now.Load()
	// The STUN message is parsed once: Username checks the framing and
	// the type and walks the attributes in one pass. Anything that is not
	// a Binding Request is forwarded opaquely if it belongs to a flow.
	var user []byte
	var stunErr error = stunmsg.ErrNotSTUN
	class := stunmsg.DemuxClass(pkt)
	if class == stunmsg.ClassSTUN {
		user, stunErr = stunmsg.Username(pkt)
	}
	if stunErr != stunmsg.ErrNotSTUN && stunErr != stunmsg.ErrNotBindingRequest {
		tok, ok := r.verify(user, stunErr)
		if !ok {
			return nil, netip.AddrPort{}, false
		}
		if f == nil || f.cluster != tok.Cluster || f.pod != tok.Pod {
			if f = r.openFlow(from, tok, f, now); f == nil {
				return nil, netip.AddrPort{}, false
			}
		}
	} else if f == nil {
		if !r.sourceOK(from) {
			r.m.drops.Inc(dropBadSource)
			return nil, netip.AddrPort{}, false
		}
		if class == stunmsg.ClassRTP {
			// A caller whose NAT rebound: its audio names the SSRC of
			// a flow gone silent (ssrc.go).
			f = r.followSSRC(pkt, from, now)
		}
	}
	if f == nil {
		// Maybe another replica (or this one before a restart) has it:
		// look it up in the background; this datagram is lost either way.
		// Only DTLS and RTP/RTCP can belong to a call; scans and junk must
		// not spend the lookup budget a restart needs.
		if r.cfg.Cache != nil && n >= 12 {
			if class == stunmsg.ClassDTLS || class == stunmsg.ClassRTP {
				r.cfg.Cache.Lookup(from, nil)
			}
		}
		r.m.drops.Inc(dropUnknownFlow)
		return nil, netip.AddrPort{}, false
	}
	keys := r.hopKeys.Load().For(f.cluster)
	if keys == nil {
		r.m.drops.Inc(dropNoHopKey)
		return nil, netip.AddrPort{}, false
	}
	if r.cfg.Cache != nil && now-f.lastStored.Load() >= int64(r.cfg.CacheRefresh) {
		// New flows, and live ones every CacheRefresh: the entry must
		// outlive its TTL for as long as the call runs.
		f.lastStored.Store(now)
		rt := routecache.Route{Cluster: f.cluster, Pod: f.pod, Token: f.tok.nonce, Stored: uint32(now / int64(time.Second))}
		rt.KeyID, rt.Tag = keys.SealRoute(from, f.cluster, f.pod, f.tok.nonce, rt.Stored)
		r.cfg.Cache.Store(from, rt)
	}
	out, hl, relay, ok := r.encapsulate(buf, n, f, from, ingress, now)
	if !ok {
		return nil, netip.AddrPort{}, false
	}
	if class == stunmsg.ClassRTP {
		r.noteSSRC(f, from, pkt, now)
	}
	if stunErr == nil {
		watchCheck(f, now) // a verified Binding Request: the pod must answer it
	}
	keys.Seal(out, hl)
	return out, relay, true
}

// verify checks the routing token of a Binding Request, given its
// USERNAME and the error Username returned for it.
func (r *Relay) verify(user []byte, err error) (token.Token, bool) {
	if err == nil {
		user, err = stunmsg.ServerUfrag(user)
	}
	if err != nil {
		r.m.stunDrops.Inc(stunmsg.ReasonOf(err))
		return token.Token{}, false
	}
	tok, err := r.tokKeys.Load().Verify(user)
	if err != nil {
		r.m.tokenDrops.Inc(token.ReasonOf(err))
		return token.Token{}, false
	}
	return tok, true
}

// openFlow creates the flow of a verified token for a client address, in
// place of old (the address's current flow for another cluster or pod, or
// nil). It returns nil, counted, when the source is unusable, the token is
// too old, old is still live (a check must not move a live call), the
// replica drains, or the table or the token's share is full.
func (r *Relay) openFlow(from netip.AddrPort, tok token.Token, old *flow, now int64) *flow {
	switch {
	case !r.sourceOK(from):
		r.m.drops.Inc(dropBadSource)
		return nil
	case r.hopKeys.Load().For(tok.Cluster) == nil:
		// A flow we could not seal for: refuse it before it exists.
		r.m.drops.Inc(dropNoHopKey)
		return nil
	case tok.Expired(time.Unix(0, now), r.cfg.TokenLifetime):
		r.m.drops.Inc(dropTokenExpired)
		return nil
	case old != nil && (now-old.lastSeen.Load() < int64(r.cfg.FlowQuiet) || now-old.created < int64(r.cfg.FlowQuiet)):
		r.m.drops.Inc(dropFlowBusy)
		return nil
	case r.draining.Load():
		r.m.drops.Inc(dropDraining)
		return nil
	}
	nf, _ := r.storeFlow(from, tokenKey{tok.Cluster, tok.Pod, tok.Nonce}, now, true)
	if nf == nil {
		return nil
	}
	r.m.flowsCreated.Inc()
	if old != nil {
		r.m.takeovers.Inc()
	}
	return nf
}

// storeFlow makes a flow of token tk for a client address — replacing the
// address's flow, or only where it has none — and counts a refusal for a
// full table or a token at its cap. The flow is nil unless it was stored.
func (r *Relay) storeFlow(from netip.AddrPort, tk tokenKey, now int64, replace bool) (*flow, putResult) {
	nf := &flow{cluster: tk.cluster, pod: tk.pod, tok: tk, created: now}
	nf.lastSeen.Store(now)
	res := r.flows.store(from, nf, replace)
	switch res {
	case putStored:
		return nf, res
	case putFull:
		r.m.drops.Inc(dropTableFull)
	case putTokenCap:
		r.m.drops.Inc(dropTokenReuse)
	}
	return nil, res
}

// followSSRC opens a flow for an unknown address from the SSRC of its RTP
// datagram, when that SSRC belongs to a flow silent for followSilence. It
// returns nil (counted as ssrc_* drops where the SSRC was known) otherwise.
func (r *Relay) followSSRC(pkt []byte, from netip.AddrPort, now int64) *flow {
	ssrc, ok := rtpSSRC(pkt)
	if !ok {
		return nil
	}
	e, ok := r.ssrcs.get(ssrc)
	if !ok || e.addr == from {
		return nil
	}
	old := r.flows.get(e.addr)
	switch {
	case old != e.f:
		return nil // that flow is gone; the sweep drops the entry
	case now-old.lastSeen.Load() < int64(followSilence):
		r.m.drops.Inc(dropSSRCLive)
		return nil
	case (token.Token{Nonce: old.tok.nonce}).Expired(time.Unix(0, now), r.cfg.TokenLifetime):
		r.m.drops.Inc(dropTokenExpired)
		return nil
	case r.draining.Load():
		r.m.drops.Inc(dropDraining)
		return nil
	}
	nf, res := r.storeFlow(from, old.tok, now, false)
	switch res {
	case putExists:
		return r.flows.get(from) // another worker made it just now
	case putStored:
		r.m.ssrcFollows.Inc()
	}
	return nf
}

// noteSSRC records the SSRC of an RTP datagram a flow forwards. The index
// is written only when the flow's SSRC changes (its first audio), and a
// flow holds one entry, its latest SSRC: the previous one is dropped, so
// the index never outgrows the flow table, whatever SSRCs a caller sends.
func (r *Relay) noteSSRC(f *flow, from netip.AddrPort, pkt []byte, now int64) {
	ssrc, ok := rtpSSRC(pkt)
	if !ok {
		return
	}
	tagged := uint64(ssrc) | 1<<32
	if f.ssrc.Load() == tagged {
		return
	}
	if prev := f.ssrc.Swap(tagged); prev != 0 {
		r.ssrcs.forget(uint32(prev), f)
	}
	r.ssrcs.note(ssrc, from, f, r.flows, now)
	if f.ssrc.Load() != tagged {
		// Another datagram of the flow changed its SSRC meanwhile (it
		// came through another worker) and may have forgotten its
		// previous entry before this one was written: drop it, so the
		// flow keeps one entry whatever the interleaving.
		r.ssrcs.forget(ssrc, f)
	}
}

// encapsulate picks the flow's cluster relay and writes the header (with
// a zero tag) in front of the datagram at buf[encap.MaxLen:][:n]; the
// caller seals it.
func (r *Relay) encapsulate(buf []byte, n int, f *flow, from, ingress netip.AddrPort, now int64) ([]byte, int, netip.AddrPort, bool) {
	relay, ok := r.relayFor(f, from, now)
	if !ok {
		r.m.drops.Inc(dropNoClusterRelay)
		return nil, 0, netip.AddrPort{}, false
	}
	f.lastSeen.Store(now)
	if f.unconfirmed.Load() {
		f.unconfirmed.Store(false) // the client spoke: replies may go to it
	}
	h := encap.Header{Cluster: f.cluster, Pod: f.pod, POP: r.cfg.POP, Token: f.tok.nonce, Client: from, Ingress: ingress}
	hl := h.Len()
	if _, err := h.Put(buf[encap.MaxLen-hl : encap.MaxLen]); err != nil {
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return nil, 0, netip.AddrPort{}, false
	}
	r.m.toCluster.Inc()
	r.m.toClusterBytes.Add(float64(n))
	return buf[encap.MaxLen-hl : encap.MaxLen+n], hl, relay, true
}

// toClient handles a datagram on an internal socket: a reply on its way to
// a client. It leaves from the public socket without its header. Nothing
// about it is believed before its MAC verifies under the header's
// cluster's hop keys.
func (r *Relay) toClient(buf []byte, n int, from netip.AddrPort) ([]byte, netip.AddrPort, bool) {
	pkt := buf[:n]
	if encap.IsProbe(pkt) {
		r.probeAnswer(pkt, from) // relayprobe.go
		return nil, netip.AddrPort{}, false
	}
	h, hl, err := encap.Decode(pkt)
	if err == nil {
		err = r.hopKeys.Load().For(h.Cluster).Verify(pkt, hl)
	}
	switch {
	case err != nil:
		r.m.encapDrops.Inc(encap.ReasonOf(err))
		return nil, netip.AddrPort{}, false
	case !h.ToClient:
		r.m.drops.Inc(dropWrongDirection)
		return nil, netip.AddrPort{}, false
	case h.POP != r.cfg.POP:
		r.m.drops.Inc(dropWrongPOP)
		return nil, netip.AddrPort{}, false
	case hl == n:
		r.m.drops.Inc(dropEmpty)
		return nil, netip.AddrPort{}, false
	}
	// Only a cluster relay of the header's own cluster may send toward
	// clients: anyone else reaching this socket could inject into calls.
	if c, ok := r.cfg.Directory.ClusterOf(from); !ok || c != h.Cluster {
		r.m.drops.Inc(dropNotFromCluster)
		return nil, netip.AddrPort{}, false
	}
	if h.TCP {
		r.tcpToClient(&h, pkt[hl:], from) // written into the client's connection
		return nil, netip.AddrPort{}, false
	}
	f := r.flows.get(h.Client)
	if f == nil {
		// A restarted replica learns the flow back from the first reply;
		// it counts against the token the header names. But a
		// compromised pod can name any client and token: the flow sends
		// nothing until its client sends on it (encapsulate), lives
		// unconfirmedTTL without that, and restores are rate-limited,
		// so a pod can neither spray the Internet from our address nor
		// fill the table. The client's next datagram finds the flow,
		// which is the restore's point.
		if !r.sourceOK(h.Client) {
			r.m.drops.Inc(dropBadSource)
			return nil, netip.AddrPort{}, false
		}
		if !r.restoreBudget() {
			r.m.drops.Inc(dropRestoreLimit)
			return nil, netip.AddrPort{}, false
		}
		nf, res := r.storeFlow(h.Client, tokenKey{h.Cluster, h.Pod, h.Token}, r.now.Load(), false)
		switch res {
		case putFull, putTokenCap:
			return nil, netip.AddrPort{}, false
		case putExists:
			if f = r.flows.get(h.Client); f == nil || f.cluster != h.Cluster || f.pod != h.Pod {
				r.m.drops.Inc(dropFlowMismatch)
				return nil, netip.AddrPort{}, false
			}
		case putStored:
			r.m.flowsRestoredReturn.Inc()
			// The next client datagram confirms it and writes it to
			// the cache (lastStored is zero).
			nf.unconfirmed.Store(true)
			r.watchReply(nf, from, r.now.Load())
			return nil, netip.AddrPort{}, false
		}
	} else if f.cluster != h.Cluster || f.pod != h.Pod {
		r.m.drops.Inc(dropFlowMismatch)
		return nil, netip.AddrPort{}, false
	}
	r.watchReply(f, from, r.now.Load())
	if f.unconfirmed.Load() {
		r.m.drops.Inc(dropUnconfirmed)
		return nil, netip.AddrPort{}, false
	}
	r.m.toClient.Inc()
	r.m.toClientBytes.Add(float64(n - hl))
	return pkt[hl:], h.Client, true
}

// unconfirmedTTL is how long a flow restored from the return path lives
// without a datagram from its client.
const unconfirmedTTL = 2 * time.Second

// restoreBudget reports whether another return-path restore fits in this
// second's budget: an eighth of MaxFlows a second, so that with
// unconfirmedTTL unconfirmed flows hold at most a quarter of the table.
// The second and its count are one word, changed by compare-and-swap:
// two atomics reset by whoever saw the second change let a late reset
// wipe what others had counted.
func (r *Relay) restoreBudget() bool {
	sec := uint64(r.now.Load()/int64(time.Second)) << 32
	limit := uint64(max(r.cfg.MaxFlows/8, 1))
	for {
		old := r.restores.Load()
		cur, n := old&^(1<<32-1), old&(1<<32-1)
		if cur < sec { // a worker that read the clock late counts in the newer second
			cur, n = sec, 0
		}
		if n >= limit {
			return false
		}
		if r.restores.CompareAndSwap(old, cur|(n+1)) {
			return true
		}
	}
}

// sourceOK reports whether a client address may have a flow: it is checked
// before any flow is created or restored.
func (r *Relay) sourceOK(a netip.AddrPort) bool {
	if a.Port() == 0 {
		return false
	}
	for _, o := range r.own {
		if a == o {
			return false
		}
	}
	ip := a.Addr()
	for _, o := range r.ownIPs {
		if ip == o {
			return false
		}
	}
	return r.cfg.AllowSource(ip)
}

// defaultAllowSource is the source filter derived from the relay's own
// public address: global unicast (netip's definition: not loopback,
// multicast, link-local, unspecified or broadcast; private ranges are
// global unicast), plus loopback when the relay itself is on loopback, as
// in the dev world and tests.
func defaultAllowSource(public netip.Addr) func(netip.Addr) bool {
	loopback := public.Unmap().IsLoopback()
	return func(a netip.Addr) bool { return a.IsGlobalUnicast() || (loopback && a.IsLoopback()) }
}

// RestoreFlow recreates a flow the route cache found for a client, unless
// the client has a flow by now. It is the cache's OnFound callback. The
// entry must carry a valid MAC under its cluster's hop keys (a process
// that can write to the cache cannot point flows elsewhere), the address
// must be usable, and the flow counts against its token's cap like any
// other.
func (r *Relay) RestoreFlow(client netip.AddrPort, route routecache.Route) {
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	if route.Cluster == 0 {
		return
	}
	if err := r.verifyEntry(client, route); err != nil {
		r.m.cacheRejected.Inc()
		return
	}
	// A live flow's entry is rewritten every CacheRefresh: an older one is
	// a dead flow's, or replayed by someone who can write to the cache.
	// A few seconds "ahead" are clock skew between replicas. The clock is
	// read afresh: the bulk load of the cache comes before Run advances
	// the coarse one.
	age := r.cfg.Now().Unix() - int64(route.Stored)
	if age > int64(3*r.cfg.CacheRefresh/time.Second) || age < -5 {
		r.m.cacheRejected.Inc()
		return
	}
	if !r.sourceOK(client) {
		r.m.cacheRejected.Inc()
		return
	}
	now := r.now.Load()
	nf := &flow{cluster: route.Cluster, pod: route.Pod, tok: tokenKey{route.Cluster, route.Pod, route.Token}, created: now}
	nf.lastSeen.Store(now)
	// The entry is as old as its writer made it: the flow rewrites it a
	// CacheRefresh after that, not after this restore (it would expire
	// meanwhile).
	nf.lastStored.Store(int64(route.Stored) * int64(time.Second))
	switch r.flows.putIfAbsent(client, nf) {
	case putStored:
		r.m.flowsRestoredCache.Inc()
	case putFull:
		r.m.drops.Inc(dropTableFull)
	case putTokenCap:
		r.m.cacheRejected.Inc()
	}
}
