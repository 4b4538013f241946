package fastpath

// The cluster relay's side: its address, its pods, the global relay
// ingresses it has seen and its keys.

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// Cluster is a cluster relay's fast path: the cluster_relay program and
// its maps. It keeps no per-flow state, like the relay: the directory and
// the keys are all it needs.
type Cluster struct {
	progs
	cluster uint16
}

// NewCluster loads the programs for the relay of cluster whose data
// socket is addr; the error wraps ErrUnavailable when the kernel refuses.
func NewCluster(addr netip.AddrPort, cluster uint16) (*Cluster, error) {
	a, err := addr4(addr)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cluster: cluster}
	if err := c.load(); err != nil {
		return nil, err
	}
	if err := c.objs.CrConf.Put(uint32(0), fastpathCrConfig{Addr: a, Cluster: cluster}); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("fastpath: config: %w", err)
	}
	return c, nil
}

// Program is the program to attach (and to run in tests).
func (c *Cluster) Program() *ebpf.Program { return c.objs.ClusterRelay }

// Attach attaches the program at the ingress of interface ifindex.
func (c *Cluster) Attach(ifindex int, mode Mode) error {
	return c.attach(c.objs.ClusterRelay, ifindex, mode)
}

// setPods is SetPods without the lock against Close.
func (c *Cluster) setPods(pods map[uint16]netip.AddrPort) error {
	byID := map[uint32]fastpathFpAddr4{}
	byAddr := map[fastpathFpAddr4]uint32{}
	for id, a := range pods {
		if k, err := addr4(a); err == nil {
			byID[uint32(id)] = k
			byAddr[k] = uint32(id)
		}
	}
	if err := replace(c.objs.CrPods, byID); err != nil {
		return fmt.Errorf("fastpath: pods: %w", err)
	}
	if err := replace(c.objs.CrPodAt, byAddr); err != nil {
		return fmt.Errorf("fastpath: pods: %w", err)
	}
	return nil
}

// addIngress is AddIngress without the lock against Close.
func (c *Cluster) addIngress(a netip.AddrPort) error {
	k, err := addr4(a)
	if err != nil {
		return err
	}
	if err := c.objs.CrIngresses.Put(k, uint32(1)); err != nil {
		return fmt.Errorf("fastpath: ingress: %w", err)
	}
	return nil
}

// clearIngresses is ClearIngresses without the lock against Close.
func (c *Cluster) clearIngresses() error {
	return replace(c.objs.CrIngresses, map[fastpathFpAddr4]uint32{})
}

// setKeys is SetKeys without the lock against Close.
func (c *Cluster) setKeys(ring *encap.Keyring, pods []uint16) error {
	if err := c.putKeys(c.cluster, ring, pods); err != nil {
		return err
	}
	return c.dropKeys(c.cluster, ring)
}

// replace makes m hold exactly want.
func replace[K comparable, V comparable](m *ebpf.Map, want map[K]V) error {
	var k K
	var v V
	var stale []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if w, ok := want[k]; !ok || w != v {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	for k, v := range want {
		if err := m.Put(k, v); err != nil {
			return err
		}
	}
	return nil
}

// SetPods replaces the pod directory (pod ID → data address). Pods with
// IPv6 addresses are left to user space.
// It fails with net.ErrClosed after Close.
func (c *Cluster) SetPods(pods map[uint16]netip.AddrPort) error {
	return c.use(func() error { return c.setPods(pods) })
}

// AddIngress records a global relay ingress socket that has sent an
// authenticated datagram toward a pod: replies may go to it.
// It fails with net.ErrClosed after Close.
func (c *Cluster) AddIngress(a netip.AddrPort) error {
	return c.use(func() error { return c.addIngress(a) })
}

// ClearIngresses forgets every ingress (the relay's set was cleared).
// It fails with net.ErrClosed after Close.
func (c *Cluster) ClearIngresses() error {
	return c.use(func() error { return c.clearIngresses() })
}

// SetKeys makes the program accept every key of ring; pods lists the pods
// whose derived keys to hold. Keys the ring no longer holds are dropped.
// It fails with net.ErrClosed after Close.
func (c *Cluster) SetKeys(ring *encap.Keyring, pods []uint16) error {
	return c.use(func() error { return c.setKeys(ring, pods) })
}
