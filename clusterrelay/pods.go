package clusterrelay

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// PodDirectory answers the cluster relay's two questions about pods. Lookups
// are on the packet path: they must be cheap and must not allocate.
type PodDirectory interface {
	// PodAddr returns the data address of a live pod of this cluster.
	PodAddr(pod uint16) (netip.AddrPort, bool)
	// PodAt returns the pod ID whose data address is addr, if any.
	PodAt(addr netip.AddrPort) (uint16, bool)
}

// Pods is a PodDirectory that a membership watcher (or a test) replaces
// whole with Set. Readers see an immutable snapshot; no lock on the path.
type Pods struct {
	// Replaced whole by Set, read lock-free on the packet path.
	snap atomic.Pointer[podSnapshot]

	mu       sync.Mutex                        // serialises Set and follow
	watchers []func(map[uint16]netip.AddrPort) // guarded by mu
}

type podSnapshot struct {
	byID   map[uint16]netip.AddrPort
	byAddr map[netip.AddrPort]uint16
}

// NewPods returns a directory holding pods (pod ID → data address).
func NewPods(pods map[uint16]netip.AddrPort) *Pods {
	p := &Pods{}
	p.Set(pods)
	return p
}

// Set replaces the directory's content. The map is copied.
func (p *Pods) Set(pods map[uint16]netip.AddrPort) {
	s := &podSnapshot{byID: make(map[uint16]netip.AddrPort, len(pods)), byAddr: make(map[netip.AddrPort]uint16, len(pods))}
	for id, a := range pods {
		s.byID[id] = a
		s.byAddr[a] = id
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.snap.Store(s)
	for _, f := range p.watchers {
		f(s.byID)
	}
}

// follow calls f with the directory now and after every Set (the fast
// path's copy in the kernel). f must not keep or change the map.
func (p *Pods) follow(f func(map[uint16]netip.AddrPort)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.watchers = append(p.watchers, f)
	f(p.snap.Load().byID)
}

// all returns the directory (not to be changed).
func (p *Pods) all() map[uint16]netip.AddrPort { return p.snap.Load().byID }

// PodAddr implements PodDirectory.
func (p *Pods) PodAddr(pod uint16) (netip.AddrPort, bool) {
	a, ok := p.snap.Load().byID[pod]
	return a, ok
}

// PodAt implements PodDirectory.
func (p *Pods) PodAt(addr netip.AddrPort) (uint16, bool) {
	id, ok := p.snap.Load().byAddr[addr]
	return id, ok
}

// Len returns the number of pods known.
func (p *Pods) Len() int { return len(p.snap.Load().byID) }
