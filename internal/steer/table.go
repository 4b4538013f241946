// Package steer holds the round trips measured between callers' networks
// and the POPs, and chooses POPs by them (docs/steering.md). A Table is
// owned by one signaling replica; every replica fills its own from the
// same samples (the pods' and the probes', fanned out over the global
// gossip pool), so they choose alike. Every sample is attributed to a
// Reporter, and a reporter holds at most one sample per (key, POP): one
// compromised pod or probe key cannot make a POP measured alone, nor own
// a median beside honest reporters. The pods' reports to their cluster
// relay, and the tickets that bind them to the calls the pod was given,
// are in report.go.
package steer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Window is how many samples a Table keeps per (key, POP): the newest of
// each of up to Window reporters, of which those younger than
// Config.MaxAge count.
const Window = 8

// Reporter names who measured a sample: a pod, as the cluster relay that
// checked its report stamped it (PodReporter), or a probe's API key
// (ProbeReporter). The table keeps one sample per reporter and pair.
type Reporter uint32

// PodReporter is the reporter of pod of cluster (cluster ≥ 1).
func PodReporter(cluster, pod uint16) Reporter { return Reporter(cluster)<<16 | Reporter(pod) }

// ProbeReporter is the reporter of the probe API key key: a 16-bit hash
// of it, in cluster 0 (no pod's).
func ProbeReporter(key string) Reporter {
	h := uint32(2166136261) // FNV-1a
	for i := range len(key) {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return Reporter(h>>16 ^ h&0xffff)
}

// IsPod reports whether r is a pod's (its cluster is not 0).
func (r Reporter) IsPod() bool { return r>>16 != 0 }

// Cluster is r's cluster: 0 for a probe's.
func (r Reporter) Cluster() uint16 { return uint16(r >> 16) }

// MaxRTT is the largest round trip a sample may carry (the 100 µs unit
// in 16 bits).
const MaxRTT = 6553 * time.Millisecond

// rttUnit is the resolution a sample is stored with.
const rttUnit = 100 * time.Microsecond

// Config tunes a Table. The zero value of each field takes its default.
type Config struct {
	// MinSamples is how many fresh samples a POP needs before its median
	// counts (default 3). Each is a distinct reporter's: with 3 or more,
	// one reporter cannot move the median outside the range the others
	// measured.
	MinSamples int `yaml:"min_samples"`
	// MaxAge is how long a sample counts (default 10 min, at most 12 h).
	MaxAge time.Duration `yaml:"max_age"`
	// Candidates is how many POPs, nearest by distance first, a choice
	// weighs (default 4): the table is consulted for each.
	Candidates int `yaml:"candidates"`
	// ExploreEvery: one in this many measured choices puts a candidate
	// without enough fresh samples first, so that it gets measured even
	// when clients never reach a backup (default 50; -1 never).
	ExploreEvery int `yaml:"explore_every"`
	// MaxEntries bounds the (key, POP) pairs held (default 200000, about
	// 14 MB); when full, the stalest of a few is replaced.
	MaxEntries int `yaml:"max_entries"`
	// Now is the clock; default time.Now.
	Now func() time.Time `yaml:"-"`
}

// Defaults fills c's unset fields.
func (c *Config) Defaults() {
	set := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	set(&c.MinSamples, 3)
	set(&c.Candidates, 4)
	set(&c.ExploreEvery, 50)
	set(&c.MaxEntries, 200_000)
	if c.MaxAge == 0 {
		c.MaxAge = 10 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate checks c after Defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.MinSamples < 1 || c.MinSamples > Window {
		errs = append(errs, fmt.Errorf("steering min_samples %d: want 1..%d", c.MinSamples, Window))
	}
	if c.MaxAge < time.Second || c.MaxAge > 12*time.Hour {
		errs = append(errs, fmt.Errorf("steering max_age %v: want 1s..12h", c.MaxAge))
	}
	if c.Candidates < 1 || c.Candidates > maxCandidates {
		errs = append(errs, fmt.Errorf("steering candidates %d: want 1..%d", c.Candidates, maxCandidates))
	}
	if c.ExploreEvery < -1 {
		errs = append(errs, fmt.Errorf("steering explore_every %d: want -1 (never) or more", c.ExploreEvery))
	}
	if c.MaxEntries < 1 || c.MaxEntries > 1<<26 {
		errs = append(errs, fmt.Errorf("steering max_entries %d: want 1..%d", c.MaxEntries, 1<<26))
	}
	return errors.Join(errs...)
}

// maxCandidates bounds Config.Candidates (the per-offer work).
const maxCandidates = 8

// entry is one (key, POP) pair's samples, one per reporter: 76 bytes.
type entry struct {
	key  Key    // 20 bytes
	pop  uint16 // 0: the slot is free
	n    uint8  // samples held, ≤ Window
	_    uint8
	rtt  [Window]uint16
	at   [Window]uint16 // table seconds, mod 2^16, of each sample
	from [Window]uint16 // the reporter's tag (Table.tag) of each sample
	last uint32         // table seconds of the newest sample
}

// Table is the measured round trips of callers' networks through POPs:
// per (key, POP) the newest Window samples in a fixed array of slots
// (open addressing, linear probing), so its memory is bounded by
// MaxEntries from the start. It is safe for concurrent use: one mutex,
// held for an Add or the few lookups of a Choose.
type Table struct {
	// Static after New.
	cfg   Config
	epoch time.Time
	seed  uint64

	mu sync.Mutex
	// Guarded by mu.
	slots []entry
	used  int
	hand  int // eviction clock

	// Counters, added to by any caller without mu.
	choices atomic.Uint64 // measured choices, for ExploreEvery
	evicted atomic.Uint64
}

// New is an empty table; cfg gets its defaults and must then be valid.
func New(cfg Config) (*Table, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := cfg.MaxEntries + cfg.MaxEntries/7 + 1 // at most 7/8 full
	return &Table{cfg: cfg, epoch: cfg.Now(), seed: rand.Uint64() | 1, slots: make([]entry, n)}, nil
}

// Config is the table's config with defaults.
func (t *Table) Config() Config { return t.cfg }

// Len is the number of (key, POP) pairs held.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used
}

// Evicted counts pairs replaced because the table was full.
func (t *Table) Evicted() uint64 { return t.evicted.Load() }

// SlotBytes is the memory of one slot; the table holds MaxEntries·8/7 of
// them.
const SlotBytes = 76

func (t *Table) secs(now time.Time) uint32 {
	d := now.Sub(t.epoch)
	if d < 0 {
		return 0
	}
	return uint32(d / time.Second)
}

func (t *Table) hash(k Key, pop uint16) uint64 {
	h := t.seed
	mix := func(v uint64) {
		hi, lo := bits.Mul64(h^v, 0x9e3779b97f4a7c15)
		h = hi ^ lo
	}
	mix(binary.LittleEndian.Uint64(k.addr[0:8]))
	mix(binary.LittleEndian.Uint64(k.addr[8:16]))
	mix(uint64(k.bits) | uint64(uint8(k.lat))<<16 | uint64(uint16(k.lon))<<24 | uint64(pop)<<40)
	return h
}

func (t *Table) home(k Key, pop uint16) int {
	hi, _ := bits.Mul64(t.hash(k, pop), uint64(len(t.slots)))
	return int(hi)
}

// find is the slot of (k, pop), or -1. Call with mu held.
func (t *Table) find(k Key, pop uint16) int {
	for i := t.home(k, pop); ; i++ {
		if i == len(t.slots) {
			i = 0
		}
		e := &t.slots[i]
		if e.pop == 0 {
			return -1
		}
		if e.pop == pop && e.key == k {
			return i
		}
	}
}

// tag is the 16 bits of a reporter a slot keeps, hashed with the table's
// seed: two reporters that share a tag (1 in 65,536, unpredictable to
// either) count as one.
func (t *Table) tag(r Reporter) uint16 {
	hi, lo := bits.Mul64(uint64(r)^t.seed, 0x9e3779b97f4a7c15)
	return uint16((hi ^ lo) >> 48)
}

// Add records one sample that from measured: it replaces from's earlier
// sample of the pair, else takes a free place, else the stalest one. A
// sample out of range is refused.
func (t *Table) Add(s Sample, from Reporter) error {
	if err := s.check(); err != nil {
		return err
	}
	now := t.secs(t.cfg.Now())
	rtt := uint16(max(1, s.RTT/rttUnit))
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.find(s.Key, s.POP)
	if i < 0 {
		if t.used >= t.cfg.MaxEntries {
			t.evict(now)
		}
		i = t.home(s.Key, s.POP)
		for t.slots[i].pop != 0 {
			if i++; i == len(t.slots) {
				i = 0
			}
		}
		t.slots[i] = entry{key: s.Key, pop: s.POP}
		t.used++
	}
	e, tag := &t.slots[i], t.tag(from)
	j := -1
	for x := range int(e.n) {
		if e.from[x] == tag {
			j = x
			break
		}
	}
	if j < 0 && e.n < Window {
		j = int(e.n)
		e.n++
	}
	if j < 0 {
		j = 0
		for x := 1; x < Window; x++ {
			if uint16(now)-e.at[x] > uint16(now)-e.at[j] {
				j = x
			}
		}
	}
	e.rtt[j], e.at[j], e.from[j] = rtt, uint16(now), tag
	e.last = now
	return nil
}

// evictScan is how many slots evict looks at for the stalest.
const evictScan = 8

// evict removes the stalest pair among the next few occupied slots from
// the clock hand. Call with mu held and the table full.
func (t *Table) evict(now uint32) {
	victim, oldest, seen := -1, uint32(0), 0
	for j := 0; seen < evictScan && j < len(t.slots); j++ {
		i := (t.hand + j) % len(t.slots)
		if t.slots[i].pop == 0 {
			continue
		}
		seen++
		if age := now - t.slots[i].last; victim < 0 || age > oldest {
			victim, oldest = i, age
		}
	}
	t.hand = (victim + 1) % len(t.slots)
	t.remove(victim)
	t.evicted.Add(1)
}

// remove frees slot i, shifting back the entries after it that probed
// past it (linear probing's deletion without tombstones).
func (t *Table) remove(i int) {
	n := len(t.slots)
	j := i
	for {
		j = (j + 1) % n
		e := &t.slots[j]
		if e.pop == 0 {
			break
		}
		h := t.home(e.key, e.pop)
		// e stays if its home lies cyclically in (i, j].
		if (i <= j && i < h && h <= j) || (i > j && (i < h || h <= j)) {
			continue
		}
		t.slots[i] = *e
		i = j
	}
	t.slots[i] = entry{}
	t.used--
}

// Stat is what the table knows of one (key, POP) pair.
type Stat struct {
	Median time.Duration // of the fresh samples; 0 without any
	Fresh  int           // samples younger than MaxAge
}

// stat reads slot i's fresh samples. Call with mu held.
func (t *Table) stat(i int, now uint32) Stat {
	if i < 0 {
		return Stat{}
	}
	e := &t.slots[i]
	if now-e.last > uint32(t.cfg.MaxAge/time.Second) {
		return Stat{}
	}
	var v [Window]uint16
	n := 0
	maxAge := uint16(t.cfg.MaxAge / time.Second)
	for j := range int(e.n) {
		if uint16(now)-e.at[j] <= maxAge {
			// Insertion sort as we go: at most Window values.
			x, k := e.rtt[j], n
			for ; k > 0 && v[k-1] > x; k-- {
				v[k] = v[k-1]
			}
			v[k] = x
			n++
		}
	}
	if n == 0 {
		return Stat{}
	}
	med := uint32(v[n/2])
	if n%2 == 0 {
		med = (uint32(v[n/2-1]) + med) / 2
	}
	return Stat{Median: time.Duration(med) * rttUnit, Fresh: n}
}

// Lookup is the table's view of (k, pop).
func (t *Table) Lookup(k Key, pop uint16) Stat {
	now := t.secs(t.cfg.Now())
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stat(t.find(k, pop), now)
}

// Reason says why a choice put its first POP first.
type Reason uint8

// Reasons of a Choice.
const (
	ByDistance Reason = iota // no candidate has enough fresh samples
	ByMeasure                // the lowest measured median
	ByExplore                // a candidate without enough samples, tried on purpose
)

// String is the reason as the steering header and metric name it.
func (r Reason) String() string {
	switch r {
	case ByMeasure:
		return "measured"
	case ByExplore:
		return "explore"
	default:
		return "distance"
	}
}

// Choice is the outcome of Choose: indexes into its candidates.
type Choice struct {
	First, Backup int // Backup is -1 with a single candidate
	Reason        Reason
	// Median is the first POP's measured median (ByMeasure only).
	Median time.Duration
}

// Choose orders the POPs for a caller with key k. cands are the POPs
// that may take the call (up, allowed), nearest first; the first
// Config.Candidates of them are weighed. The first POP is the one with
// the lowest median among those with MinSamples fresh samples, or the
// nearest when none has (ByDistance). The backup is the nearest candidate
// still lacking samples (so the pod measures it: passive exploration),
// else the second-lowest median, else the next nearest. One measured
// choice in ExploreEvery swaps them when the backup lacks samples
// (ByExplore). cands must not be empty.
func (t *Table) Choose(k Key, cands []uint16) Choice {
	n := min(len(cands), t.cfg.Candidates)
	if n <= 1 || !k.Valid() {
		return distance(len(cands))
	}
	var st [maxCandidates]Stat
	now := t.secs(t.cfg.Now())
	t.mu.Lock()
	for i := range n {
		st[i] = t.stat(t.find(k, cands[i]), now)
	}
	t.mu.Unlock()
	best, second, unmeasured := -1, -1, -1
	for i := range n {
		switch {
		case st[i].Fresh < t.cfg.MinSamples:
			if unmeasured < 0 {
				unmeasured = i
			}
		case best < 0 || st[i].Median < st[best].Median:
			best, second = i, best
		case second < 0 || st[i].Median < st[second].Median:
			second = i
		}
	}
	if best < 0 {
		return distance(len(cands))
	}
	c := Choice{First: best, Backup: second, Reason: ByMeasure, Median: st[best].Median}
	if unmeasured >= 0 {
		c.Backup = unmeasured
		if every := t.cfg.ExploreEvery; every > 0 && t.choices.Add(1)%uint64(every) == 0 {
			return Choice{First: unmeasured, Backup: best, Reason: ByExplore}
		}
	}
	if c.Backup < 0 {
		c.Backup = 0
		if best == 0 {
			c.Backup = 1
		}
	}
	return c
}

func distance(n int) Choice {
	if n > 1 {
		return Choice{First: 0, Backup: 1}
	}
	return Choice{First: 0, Backup: -1}
}
