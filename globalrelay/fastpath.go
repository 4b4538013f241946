package globalrelay

// The relay's side of the in-kernel fast path (internal/fastpath,
// docs/fastpath.md). User space stays the authority: a flow goes into the
// kernel only after user space forwarded a datagram of it (its token
// verified, or restored and confirmed by its client), and only while it
// needs nothing but forwarding. The kernel passes a flow's datagrams up
// again at least once every kernelRefresh, and whenever it is unsure
// (STUN, a new SSRC, ...); each one passed up goes through fromClient as
// before, which refreshes the route cache and judges the flow's relay,
// and then installs the flow anew if anything changed. A flow leaves the
// kernel when it leaves the table. The kernel's per-flow last-seen and
// last-reply times flow back before every expiry scan and before each
// datagram passed up, and its counters into packets_total/bytes_total.

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/metric"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// kernelRefresh is how long the kernel forwards a flow before it passes
// a datagram up again: the longest user space goes without seeing one of
// a live flow (its relay choice is judged on them).
const kernelRefresh = time.Second

// kernelPath is the relay's fast path while it is attached.
type kernelPath struct {
	fp *fastpath.Global

	mu   sync.Mutex         // guards keys
	keys map[[2]uint16]bool // (cluster, pod) whose keys the kernel holds

	// counted is what the relay's metrics already hold of the kernel's
	// counters; owned by the Run goroutine (syncKernel).
	counted [fastpath.NumReasons]fastpath.Count
}

// testHookBeforeInstall, set by tests only, runs in offer between
// reading the flow's keys and installing it (a rotation just then).
var testHookBeforeInstall atomic.Pointer[func()]

// kernelState is what was installed for a flow: its key's VIP, its
// relay and SSRC, and until when the kernel forwards it. Immutable.
type kernelState struct {
	vip, relay netip.AddrPort
	ssrc       uint64
	until      uint64 // fastpath.Monotonic
	// seen and reply are the kernel's times last folded into the flow.
	seen, reply uint64
}

var errLoopback = errors.New("the relay's sockets are on a loopback interface")

// startFastPath attaches the fast path as mode says; ModeAuto falls back
// to user space with one log line and fast_path_unavailable.
func (r *Relay) startFastPath(mode fastpath.Mode) error {
	k, err := fastpath.Start(mode, r.attachFastPath, func(err error) {
		r.m.fastUnavailable.Inc()
		r.log.Info("fast path unavailable, forwarding in user space", "err", err)
	})
	if err != nil {
		return fmt.Errorf("globalrelay: fast_path %s: %w", mode, err)
	}
	if k != nil {
		r.kernel = k
		r.m.fastActive.Set(1)
	}
	return nil
}

func (r *Relay) attachFastPath(mode fastpath.Mode) (*kernelPath, error) {
	dir, ok := r.cfg.Directory.(*Clusters)
	if !ok {
		return nil, errors.New("the cluster directory cannot be followed")
	}
	ifs := map[int]fastpath.Interface{}
	for _, w := range r.workers {
		for _, a := range []netip.AddrPort{udpio.LocalAddrPort(w.Public), w.ingress} {
			ifi, err := fastpath.InterfaceOf(a.Addr())
			if err != nil {
				return nil, err
			}
			if ifi.Loopback && mode == fastpath.ModeAuto {
				return nil, errLoopback
			}
			if err := ifi.CheckForwarding(); err != nil {
				return nil, err
			}
			ifs[ifi.Index] = ifi
		}
	}
	fp, err := fastpath.NewGlobal()
	if err != nil {
		return nil, err
	}
	k := &kernelPath{fp: fp, keys: map[[2]uint16]bool{}}
	fail := func(err error) (*kernelPath, error) { _ = fp.Close(); return nil, err }
	for _, w := range r.workers {
		if err := fp.AddWorker(w.ingress, udpio.LocalAddrPort(w.Public), r.cfg.POP); err != nil {
			return fail(err)
		}
	}
	dir.follow(func(known map[netip.AddrPort]uint16) {
		if err := fp.SetRelays(known); err != nil {
			r.log.Warn("fast path: cluster relays", "err", err)
		}
	})
	for _, ifi := range ifs {
		if err := fp.Attach(ifi.Index, mode); err != nil {
			return fail(err)
		}
	}
	return k, nil
}

// offer installs the flow of a datagram user space just forwarded from
// client to relay through w, unless the kernel already has it as it is.
func (r *Relay) offer(w *worker, client, relay netip.AddrPort) {
	k := r.kernel
	f := r.flows.get(client)
	if f == nil {
		return
	}
	now := fastpath.Monotonic()
	old := f.kernel.Load()
	vip := udpio.LocalAddrPort(w.Public)
	if old != nil && old.relay == relay && old.vip == vip && old.ssrc == f.ssrc.Load() && now+uint64(kernelRefresh)/2 < old.until {
		return
	}
	until := now + uint64(kernelRefresh)
	hop := r.hopKeys.Load() // kernelFlow reads the keys after this
	gf, ok := r.kernelFlow(f, client, vip, w.ingress, relay, until)
	if !ok || k.podKeys(r, f.cluster, f.pod) != nil {
		return // IPv6 and the like stay in user space
	}
	if h := testHookBeforeInstall.Load(); h != nil {
		(*h)()
	}
	if k.fp.Install(gf) != nil {
		return
	}
	if r.hopKeys.Load() != hop {
		// A rotation since the keys were read: it may have taken the
		// flows out of the kernel before this one went in, sealed with
		// the old key. Out with it; the next datagram installs it anew.
		_ = k.fp.Remove(client, vip)
		return
	}
	st := &kernelState{vip: vip, relay: relay, ssrc: f.ssrc.Load(), until: until}
	if old != nil {
		st.seen, st.reply = old.seen, old.reply
	}
	f.kernel.Store(st)
}

// podKeys makes sure the kernel holds the keys replies of (cluster, pod)
// verify under.
func (k *kernelPath) podKeys(r *Relay, cluster, pod uint16) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys[[2]uint16{cluster, pod}] {
		return nil
	}
	if err := k.fp.AddKeys(cluster, r.hopKeys.Load().For(cluster), []uint16{pod}); err != nil {
		return err
	}
	k.keys[[2]uint16{cluster, pod}] = true
	return nil
}

// forget takes a flow that left the table out of the kernel.
func (r *Relay) forget(client netip.AddrPort, f *flow) {
	if st := f.kernel.Load(); st != nil && r.kernel != nil {
		_ = r.kernel.fp.Remove(client, st.vip)
	}
}

// setKernelKeys is SetHopKeys for the kernel: every flow leaves it (each
// comes back sealed with the new keys on its next datagram) and the keys
// are learnt afresh.
func (r *Relay) setKernelKeys() {
	k := r.kernel
	if k == nil {
		return
	}
	k.mu.Lock()
	k.keys = map[[2]uint16]bool{}
	k.mu.Unlock()
	r.flows.each(func(a netip.AddrPort, f *flow) {
		if st := f.kernel.Swap(nil); st != nil {
			_ = k.fp.Remove(a, st.vip)
		}
	})
	for _, cl := range r.hopKeys.Load().Clusters() {
		_ = k.fp.SetKeys(cl, r.hopKeys.Load().For(cl), nil)
	}
}

// foldKernel brings what the kernel saw of f into it: the client's last
// datagram (for expiry) and the last reply (for the relay's watch).
func (r *Relay) foldKernel(client netip.AddrPort, f *flow) {
	st := f.kernel.Load()
	if st == nil {
		return
	}
	s, ok := r.kernel.fp.Flow(client, st.vip)
	if !ok || (s.LastSeen == st.seen && s.LastReply == st.reply) {
		return
	}
	mono, wall := fastpath.Monotonic(), r.cfg.Now().UnixNano()
	at := func(t uint64) int64 { return wall - int64(mono-min(t, mono)) }
	if s.LastSeen != st.seen && at(s.LastSeen) > f.lastSeen.Load() {
		f.lastSeen.Store(at(s.LastSeen))
	}
	if s.LastReply != st.reply {
		r.watchReply(f, s.ReplyRelay, at(s.LastReply))
	}
	next := *st
	next.seen, next.reply = s.LastSeen, s.LastReply
	f.kernel.CompareAndSwap(st, &next)
}

// syncKernel folds every installed flow and adds the kernel's counters to
// the relay's metrics; the Run goroutine calls it before each expiry scan.
func (r *Relay) syncKernel() {
	k := r.kernel
	if k == nil {
		return
	}
	r.flows.each(func(a netip.AddrPort, f *flow) { r.foldKernel(a, f) })
	s, err := k.fp.Stats()
	if err != nil {
		return
	}
	for i, c := range s {
		dp, db := c.Packets-k.counted[i].Packets, c.Bytes-k.counted[i].Bytes
		if dp == 0 {
			continue
		}
		k.counted[i] = c
		r.m.fastPackets[i].Add(float64(dp))
		switch fastpath.Reason(i) {
		case fastpath.ForwardUp: // counted after the push: headers and the encapsulation
			r.m.toCluster.Add(float64(dp))
			r.m.toClusterBytes.Add(float64(db - dp*(frameOverhead+encap.MinLen)))
		case fastpath.ForwardDown:
			r.m.toClient.Add(float64(dp))
			r.m.toClientBytes.Add(float64(db - dp*frameOverhead))
		}
	}
}

// frameOverhead is what the kernel counts of a datagram beyond its UDP
// payload: the Ethernet, IPv4 and UDP headers.
const frameOverhead = 14 + 20 + 8

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

// fastMetrics are the fast path's own metrics.
type fastMetrics struct {
	fastActive      prometheus.Gauge
	fastUnavailable prometheus.Counter
	fastPackets     [fastpath.NumReasons]prometheus.Counter
}

func newFastMetrics() (fastMetrics, []prometheus.Collector) {
	active := metric.Gauge("rtcedge_globalrelay_fast_path_active", "1 while the in-kernel fast path is attached (fast_path), else 0.")
	unavailable := metric.Counter("rtcedge_globalrelay_fast_path_unavailable_total", "Starts where fast_path auto found the kernel fast path unavailable and stayed in user space (the log says why).")
	packets := metric.CounterVec("rtcedge_globalrelay_fast_path_packets_total", "Datagrams the in-kernel fast path saw, by verdict: forward_* it forwarded (also in packets_total), every other reason it passed up to user space unchanged.", "verdict")
	m := fastMetrics{fastActive: active, fastUnavailable: unavailable}
	for i, l := range fastpath.Reasons {
		m.fastPackets[i] = packets.WithLabelValues(l)
	}
	return m, []prometheus.Collector{active, unavailable, packets}
}
