package clusterrelay

// The relay's side of the in-kernel fast path (internal/fastpath,
// docs/fastpath.md). The relay keeps no per-flow state, so the kernel
// needs only what the relay decides with: its address and cluster, the
// pod directory, the global relay ingresses it has seen and the hop keys.
// They are pushed into the kernel as they change; the kernel forwards what
// verifies and passes the rest up to decide. Its counters are added to the
// relay's own every second, so packets_total counts both paths.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/fastpath"
	"github.com/rtcedge/rtcedge/internal/metric"
)

// kernelPath is the relay's fast path while it is attached.
type kernelPath struct {
	fp *fastpath.Cluster

	// mu serializes the pushes of keys and directory (the gossip watcher
	// and the key reload are two goroutines): each reads the keyring
	// under it, so the last push writes the last keyring. Unserialized, a
	// directory push that read the keyring before a rotation could put the
	// retired key back, or drop the new one, after the rotation's push.
	mu sync.Mutex

	// counted is what the relay's metrics already hold of the kernel's
	// counters; owned by syncCounters.
	counted [fastpath.NumReasons]fastpath.Count
}

// errLoopback: auto leaves a relay on loopback in user space, where the
// kernel would forward nothing (local destinations are not routed).
var errLoopback = errors.New("the relay's address is on a loopback interface")

// startFastPath attaches the fast path as mode says. ModeAuto falls back to
// user space, with one log line and the fast_path_unavailable metric, when
// the kernel or the setup refuses; the other modes fail New instead.
func (r *Relay) startFastPath(mode fastpath.Mode) error {
	k, err := fastpath.Start(mode, r.attachFastPath, func(err error) {
		r.m.fastUnavailable.Inc()
		r.log.Info("fast path unavailable, forwarding in user space", "err", err)
	})
	if err != nil {
		return fmt.Errorf("clusterrelay: fast_path %s: %w", mode, err)
	}
	if k != nil {
		r.kernel = k
		r.m.fastActive.Set(1)
	}
	return nil
}

// followedPods is a pod directory the kernel can follow: *Pods, and
// *Directory (the node's, which embeds one).
type followedPods interface {
	follow(f func(map[uint16]netip.AddrPort))
	all() map[uint16]netip.AddrPort
}

func (r *Relay) attachFastPath(mode fastpath.Mode) (*kernelPath, error) {
	pods, ok := r.cfg.Pods.(followedPods)
	if !ok {
		return nil, errors.New("the pod directory cannot be followed")
	}
	addr := r.addr
	if addr.Addr().IsUnspecified() {
		addr = r.advertised
	}
	ifi, err := fastpath.InterfaceOf(addr.Addr())
	if err != nil {
		return nil, err
	}
	if ifi.Loopback && mode == fastpath.ModeAuto {
		return nil, errLoopback
	}
	if err := ifi.CheckForwarding(); err != nil {
		return nil, err
	}
	fp, err := fastpath.NewCluster(addr, r.cfg.Cluster)
	if err != nil {
		return nil, err
	}
	k := &kernelPath{fp: fp}
	r.ingresses.onAdd = func(a netip.AddrPort, cleared bool) {
		if cleared {
			_ = fp.ClearIngresses()
		}
		_ = fp.AddIngress(a) // IPv6 ingresses stay in user space
	}
	pods.follow(func(m map[uint16]netip.AddrPort) {
		if err := k.pushPods(r, m); err != nil {
			r.log.Warn("fast path: pod directory", "err", err)
		}
	})
	if err := fp.Attach(ifi.Index, mode); err != nil {
		_ = fp.Close()
		return nil, err
	}
	return k, nil
}

// pushPods gives the kernel the directory and the keys of its pods. Pods
// leave the kernel as they leave the directory.
func (k *kernelPath) pushPods(r *Relay, pods map[uint16]netip.AddrPort) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.fp.SetKeys(r.keys.Load(), podIDs(pods)); err != nil {
		return err
	}
	return k.fp.SetPods(pods)
}

func podIDs(pods map[uint16]netip.AddrPort) []uint16 {
	ids := make([]uint16, 0, len(pods))
	for id := range pods {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// setKernelKeys gives the kernel the relay's keyring after a rotation
// (SetHopKeys stored it first: read under mu, it is the newest).
func (r *Relay) setKernelKeys() {
	k := r.kernel
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	pods := r.cfg.Pods.(followedPods).all()
	if err := k.fp.SetKeys(r.keys.Load(), podIDs(pods)); err != nil {
		r.log.Warn("fast path: hop keys", "err", err)
	}
}

// runKernel adds the kernel's counters to the relay's metrics every
// second until ctx ends, and once more then.
func (r *Relay) runKernel(ctx context.Context) {
	if r.kernel == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		r.syncCounters()
		select {
		case <-ctx.Done():
			r.syncCounters()
			return
		case <-t.C:
		}
	}
}

// frameOverhead is what the kernel counts of a datagram beyond its UDP
// payload: the Ethernet, IPv4 and UDP headers.
const frameOverhead = 14 + 20 + 8

func (r *Relay) syncCounters() {
	k := r.kernel
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
		payload := float64(db - dp*frameOverhead)
		switch fastpath.Reason(i) {
		case fastpath.ForwardPod:
			r.m.toPod.Add(float64(dp))
			r.m.toPodBytes.Add(payload)
		case fastpath.ForwardClient:
			r.m.toClient.Add(float64(dp))
			r.m.toClientBytes.Add(payload)
		}
	}
}

// fastMetrics are the fast path's own metrics.
type fastMetrics struct {
	fastActive      prometheus.Gauge
	fastUnavailable prometheus.Counter
	fastPackets     [fastpath.NumReasons]prometheus.Counter
}

func newFastMetrics() (fastMetrics, []prometheus.Collector) {
	active := metric.Gauge("rtcedge_clusterrelay_fast_path_active", "1 while the in-kernel fast path is attached (fast_path), else 0.")
	unavailable := metric.Counter("rtcedge_clusterrelay_fast_path_unavailable_total", "Starts where fast_path auto found the kernel fast path unavailable and stayed in user space (the log says why).")
	packets := metric.CounterVec("rtcedge_clusterrelay_fast_path_packets_total", "Datagrams the in-kernel fast path saw, by verdict: forward_* it forwarded (also in packets_total), every other reason it passed up to user space unchanged.", "verdict")
	m := fastMetrics{fastActive: active, fastUnavailable: unavailable}
	for i, l := range fastpath.Reasons {
		m.fastPackets[i] = packets.WithLabelValues(l)
	}
	return m, []prometheus.Collector{active, unavailable, packets}
}
