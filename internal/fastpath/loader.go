package fastpath

// Loading the programs, attaching them with TCX and the maps both relays
// fill (keys, counters).

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// progs is one loaded copy of the programs and their maps: each relay
// loads its own, so relays in one process (the dev world) share nothing.
type progs struct {
	objs fastpathObjects // static after load; its maps are used under mu held shared

	// mu guards links and closed; map operations hold it shared (use),
	// so Close never frees a map under one.
	mu     sync.RWMutex
	links  []link.Link
	closed bool
}

// load loads the programs and maps. Any refusal by the kernel (no
// CAP_BPF, a verifier or kernel too old) wraps ErrUnavailable.
func (p *progs) load() error {
	spec, err := loadFastpath()
	if err != nil {
		return fmt.Errorf("fastpath: read objects: %w", err)
	}
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("%w: verifier: %v", ErrUnavailable, ve)
		}
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return nil
}

// attach attaches prog at the ingress of the interface ifindex in mode
// (ModeAuto and ModeTC: TCX).
func (p *progs) attach(prog *ebpf.Program, ifindex int, mode Mode) error {
	switch mode {
	case ModeXDP:
		return ErrXDP
	case ModeOff:
		return nil
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return fmt.Errorf("%w: attach TCX to interface %d: %v", ErrUnavailable, ifindex, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = l.Close()
		return net.ErrClosed
	}
	p.links = append(p.links, l)
	return nil
}

// putKeys makes the programs accept every key of ring for cluster: the
// static keys for every pod, and the derived keys of pods.
func (p *progs) putKeys(cluster uint16, ring *encap.Keyring, pods []uint16) error {
	for _, id := range ring.KeyIDs() {
		if k, perPod, ok := ring.PodKey(id, 0); ok && !perPod {
			if err := p.objs.HopKeys.Put(fastpathFpKeyId{Cluster: cluster, KeyId: id, AnyPod: 1}, splitKey(k)); err != nil {
				return fmt.Errorf("fastpath: hop key: %w", err)
			}
			continue
		}
		for _, pod := range pods {
			k, _, _ := ring.PodKey(id, pod)
			if err := p.objs.HopKeys.Put(fastpathFpKeyId{Cluster: cluster, Pod: pod, KeyId: id}, splitKey(k)); err != nil {
				return fmt.Errorf("fastpath: hop key: %w", err)
			}
		}
	}
	return nil
}

// dropKeys forgets every key of cluster not in ring (rotation's last step).
func (p *progs) dropKeys(cluster uint16, ring *encap.Keyring) error {
	held := map[uint8]bool{}
	for _, id := range ring.KeyIDs() {
		held[id] = true
	}
	var k fastpathFpKeyId
	var stale []fastpathFpKeyId
	it := p.objs.HopKeys.Iterate()
	var v fastpathFpKey
	for it.Next(&k, &v) {
		if k.Cluster == cluster && !held[k.KeyId] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("fastpath: hop keys: %w", err)
	}
	for _, k := range stale {
		if err := p.objs.HopKeys.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("fastpath: hop key: %w", err)
		}
	}
	return nil
}

// KeyIDs lists the key IDs the programs accept for cluster, ascending:
// what a rotation left in the kernel.
// It fails with net.ErrClosed after Close.
func (p *progs) KeyIDs(cluster uint16) ([]uint8, error) {
	var ids []uint8
	err := p.use(func() error {
		held := map[uint8]bool{}
		var k fastpathFpKeyId
		var v fastpathFpKey
		it := p.objs.HopKeys.Iterate()
		for it.Next(&k, &v) {
			if k.Cluster == cluster {
				held[k.KeyId] = true
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("fastpath: hop keys: %w", err)
		}
		for id := range held {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return nil
	})
	return ids, err
}

// use runs f on the maps unless Close has freed them (net.ErrClosed).
func (p *progs) use(f func() error) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return net.ErrClosed
	}
	return f()
}

// Stats sums the programs' counters over CPUs, indexed by Reason.
func (p *progs) Stats() (out [NumReasons]Count, err error) {
	err = p.use(func() error {
		out, err = p.stats()
		return err
	})
	return out, err
}

func (p *progs) stats() ([NumReasons]Count, error) {
	var out [NumReasons]Count
	var per []fastpathFpCount
	for r := range uint32(NumReasons) {
		if err := p.objs.FpStats.Lookup(r, &per); err != nil {
			return out, fmt.Errorf("fastpath: counters: %w", err)
		}
		for _, c := range per {
			out[r].Packets += c.Packets
			out[r].Bytes += c.Bytes
		}
	}
	return out, nil
}

// Close detaches the programs and frees them and their maps. Idempotent.
func (p *progs) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	p.links = nil
	errs = append(errs, p.objs.Close())
	return errors.Join(errs...)
}

// Monotonic returns the clock the programs stamp flows with
// (bpf_ktime_get_ns: CLOCK_MONOTONIC), in nanoseconds.
func Monotonic() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
