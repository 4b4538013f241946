package fastpath

// The global relay's side: its workers, the cluster relays it takes
// replies from, and its flows.

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// Global is a global relay's fast path: the global_relay program and its
// maps. Install, Remove and the Set methods may be called from any
// goroutine; the kernel reads the maps concurrently.
type Global struct {
	progs
}

// NewGlobal loads the programs; the error wraps ErrUnavailable when the
// kernel refuses them.
func NewGlobal() (*Global, error) {
	g := &Global{}
	if err := g.load(); err != nil {
		return nil, err
	}
	return g, nil
}

// Program is the program to attach (and to run in tests).
func (g *Global) Program() *ebpf.Program { return g.objs.GlobalRelay }

// Attach attaches the program at the ingress of interface ifindex.
func (g *Global) Attach(ifindex int, mode Mode) error {
	return g.attach(g.objs.GlobalRelay, ifindex, mode)
}

// addWorker is AddWorker without the lock against Close.
func (g *Global) addWorker(ingress, vip netip.AddrPort, pop uint16) error {
	in, err := addr4(ingress)
	if err != nil {
		return err
	}
	v, err := addr4(vip)
	if err != nil {
		return err
	}
	if err := g.objs.GrWorkers.Put(in, fastpathGrWorker{Vip: v, Pop: pop}); err != nil {
		return fmt.Errorf("fastpath: worker: %w", err)
	}
	return nil
}

// setRelays is SetRelays without the lock against Close.
func (g *Global) setRelays(relays map[netip.AddrPort]uint16) error {
	want := map[fastpathFpAddr4]uint32{}
	for a, c := range relays {
		if k, err := addr4(a); err == nil {
			want[k] = uint32(c)
		}
	}
	if err := replace(g.objs.GrRelays, want); err != nil {
		return fmt.Errorf("fastpath: relays: %w", err)
	}
	return nil
}

// setKeys is SetKeys without the lock against Close.
func (g *Global) setKeys(cluster uint16, ring *encap.Keyring, pods []uint16) error {
	if err := g.putKeys(cluster, ring, pods); err != nil {
		return err
	}
	return g.dropKeys(cluster, ring)
}

// install is Install without the lock against Close.
func (g *Global) install(f GlobalFlow) error {
	k, err := f.key()
	if err != nil {
		return err
	}
	v, err := f.value()
	if err != nil {
		return err
	}
	var old fastpathGrFlow
	if g.objs.GrFlows.Lookup(k, &old) == nil {
		v.LastSeenNs, v.LastReplyNs, v.ReplyRelay = old.LastSeenNs, old.LastReplyNs, old.ReplyRelay
		v.UpPackets, v.UpBytes, v.DownPackets, v.DownBytes = old.UpPackets, old.UpBytes, old.DownPackets, old.DownBytes
	}
	if err := g.objs.GrFlows.Put(k, v); err != nil {
		return fmt.Errorf("fastpath: install flow %v: %w", f.Client, err)
	}
	return nil
}

// remove is Remove without the lock against Close.
func (g *Global) remove(client, vip netip.AddrPort) error {
	k, err := (&GlobalFlow{Client: client, VIP: vip}).key()
	if err != nil {
		return nil // never installed
	}
	if err := g.objs.GrFlows.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("fastpath: remove flow %v: %w", client, err)
	}
	return nil
}

// Flow returns what the kernel counted for an installed flow.
func (g *Global) Flow(client, vip netip.AddrPort) (s FlowStats, ok bool) {
	_ = g.use(func() error {
		s, ok = g.flow(client, vip)
		return nil
	})
	return s, ok
}

func (g *Global) flow(client, vip netip.AddrPort) (FlowStats, bool) {
	k, err := (&GlobalFlow{Client: client, VIP: vip}).key()
	if err != nil {
		return FlowStats{}, false
	}
	var v fastpathGrFlow
	if g.objs.GrFlows.Lookup(k, &v) != nil {
		return FlowStats{}, false
	}
	return v.stats(), true
}

// AddWorker tells the program a worker's internal socket (replies arrive
// there), the VIP its replies leave from and the relay's POP.
// It fails with net.ErrClosed after Close.
func (g *Global) AddWorker(ingress, vip netip.AddrPort, pop uint16) error {
	return g.use(func() error { return g.addWorker(ingress, vip, pop) })
}

// SetRelays replaces the cluster relays replies are taken from (data
// address → cluster). IPv6 relays are left to user space.
// It fails with net.ErrClosed after Close.
func (g *Global) SetRelays(relays map[netip.AddrPort]uint16) error {
	return g.use(func() error { return g.setRelays(relays) })
}

// SetKeys makes replies of cluster verify under every key of ring; pods
// lists the pods whose derived keys to hold (those of installed flows).
// Keys the ring no longer holds are dropped.
// It fails with net.ErrClosed after Close.
func (g *Global) SetKeys(cluster uint16, ring *encap.Keyring, pods []uint16) error {
	return g.use(func() error { return g.setKeys(cluster, ring, pods) })
}

// AddKeys makes replies of cluster naming pods verify under every key of
// ring, keeping the keys the kernel holds already.
// It fails with net.ErrClosed after Close.
func (g *Global) AddKeys(cluster uint16, ring *encap.Keyring, pods []uint16) error {
	return g.use(func() error { return g.putKeys(cluster, ring, pods) })
}

// Install adds or replaces a flow. The counters of a flow already
// installed carry over (increments between the read and the write are
// lost, which only the counters see).
// It fails with net.ErrClosed after Close.
func (g *Global) Install(f GlobalFlow) error {
	return g.use(func() error { return g.install(f) })
}

// Remove takes a flow out of the kernel (expiry, takeover); its datagrams
// go up from the next one on. Removing a flow that is not there is no
// error.
// It fails with net.ErrClosed after Close.
func (g *Global) Remove(client, vip netip.AddrPort) error {
	return g.use(func() error { return g.remove(client, vip) })
}
