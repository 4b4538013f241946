package steer

import (
	"net/netip"
	"testing"
	"time"
	"unsafe"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTable(t testing.TB, cfg Config) (*Table, *clock) {
	t.Helper()
	nextPod = 0
	c := &clock{t: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)}
	cfg.Now = c.now
	tb, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tb, c
}

func key(s string) Key { return KeyFor(netip.MustParseAddr(s), true, 48.86, 2.35) }

// nextPod is the pod add takes the next sample from: the pods of a
// cluster of Window take calls in turn, as a front's placement spreads
// them.
var nextPod uint16

// add records samples, each from the next pod of the cluster.
func add(t testing.TB, tb *Table, k Key, pop uint16, ms ...float64) {
	t.Helper()
	for _, v := range ms {
		addFrom(t, tb, PodReporter(1, 1+nextPod%Window), k, pop, v)
		nextPod++
	}
}

func TestKeyPrefixesAndText(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"198.51.100.77", "198.51.100.0/24@48,2"},
		{"::ffff:198.51.100.77", "198.51.100.0/24@48,2"},
		{"2001:db8:1234:5678::1", "2001:db8:1234::/48@48,2"},
	} {
		k := key(tc.addr)
		if k.String() != tc.want {
			t.Errorf("%s: key %q, want %q", tc.addr, k, tc.want)
		}
		back, err := ParseKey(k.String())
		if err != nil || back != k {
			t.Errorf("%s: ParseKey(%q) = %v, %v", tc.addr, k, back, err)
		}
	}
	unlocated := KeyFor(netip.MustParseAddr("198.51.100.1"), false, 0, 0)
	if unlocated.String() != "198.51.100.0/24@-" || unlocated == key("198.51.100.1") {
		t.Errorf("unlocated key %q", unlocated)
	}
	for _, bad := range []string{"", "198.51.100.0/24", "198.51.100.1/24@-", "198.51.0.0/16@-", "198.51.100.0/24@91,0", "x@-", "2001:db8::/64@-"} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

// TestMedianAndDecay: the median of the fresh samples counts; samples
// older than MaxAge drop out one by one, and a pair with none left is
// unmeasured.
func TestMedianAndDecay(t *testing.T) {
	tb, clk := newTable(t, Config{MaxAge: time.Minute})
	k := key("198.51.100.1")
	add(t, tb, k, 1, 20, 200, 22) // one outlier does not move a median
	if st := tb.Lookup(k, 1); st.Fresh != 3 || st.Median != 22*time.Millisecond {
		t.Fatalf("stat %+v, want 3 samples, median 22 ms", st)
	}
	clk.advance(40 * time.Second)
	add(t, tb, k, 1, 100, 100)
	if st := tb.Lookup(k, 1); st.Fresh != 5 || st.Median != 100*time.Millisecond {
		t.Fatalf("stat %+v, want 5 samples, median 100 ms", st)
	}
	clk.advance(30 * time.Second) // the first three are now 70 s old
	if st := tb.Lookup(k, 1); st.Fresh != 2 || st.Median != 100*time.Millisecond {
		t.Fatalf("after decay %+v, want the 2 newer samples", st)
	}
	clk.advance(time.Minute)
	if st := tb.Lookup(k, 1); st.Fresh != 0 {
		t.Fatalf("after MaxAge %+v, want nothing", st)
	}
	// The window: only the newest Window samples count.
	add(t, tb, k, 2, 50, 50, 50, 50, 50, 50, 50, 50, 10, 10, 10, 10, 10)
	if st := tb.Lookup(k, 2); st.Fresh != Window || st.Median != 10*time.Millisecond {
		t.Fatalf("window %+v, want %d samples, median 10 ms", st, Window)
	}
}

// TestChooseByMeasure: distance until a POP has MinSamples, then the
// lowest median; the backup is the candidate still lacking samples.
func TestChooseByMeasure(t *testing.T) {
	tb, _ := newTable(t, Config{ExploreEvery: -1})
	k := key("198.51.100.1")
	cands := []uint16{1, 2, 3} // nearest first
	if c := tb.Choose(k, cands); c.Reason != ByDistance || c.First != 0 || c.Backup != 1 {
		t.Fatalf("empty table: %+v, want distance 0/1", c)
	}
	add(t, tb, k, 1, 160, 161)
	add(t, tb, k, 2, 20, 21)
	if c := tb.Choose(k, cands); c.Reason != ByDistance {
		t.Fatalf("two samples each: %+v, want distance", c)
	}
	add(t, tb, k, 1, 162)
	add(t, tb, k, 2, 22)
	c := tb.Choose(k, cands)
	if c.Reason != ByMeasure || cands[c.First] != 2 || cands[c.Backup] != 3 || c.Median != 21*time.Millisecond {
		t.Fatalf("measured: %+v, want POP 2 first (21 ms), unmeasured POP 3 as backup", c)
	}
	add(t, tb, k, 3, 90, 90, 90)
	if c := tb.Choose(k, cands); cands[c.First] != 2 || cands[c.Backup] != 3 {
		t.Fatalf("all measured: %+v, want 2 then the second-best 3", c)
	}
	// Another prefix, another location: nothing known.
	if c := tb.Choose(key("198.51.101.1"), cands); c.Reason != ByDistance {
		t.Fatalf("other prefix: %+v", c)
	}
	if c := tb.Choose(KeyFor(netip.MustParseAddr("198.51.100.1"), true, 40.7, -74), cands); c.Reason != ByDistance {
		t.Fatalf("same prefix elsewhere: %+v", c)
	}
	// Only the POPs signaling passes count: a measured POP that is not
	// ready (left out of cands) is never chosen.
	if c := tb.Choose(k, []uint16{1, 3}); c.First != 1 {
		t.Fatalf("POP 2 not ready: %+v, want POP 3 (index 1)", c)
	}
}

// TestDegradedPathIsLeftAndRecoveredFound: a POP whose round trip grows
// loses its place after half a window of new samples through it, and,
// measured as the backup, wins back once it recovers.
func TestDegradedPathIsLeftAndRecoveredFound(t *testing.T) {
	tb, clk := newTable(t, Config{ExploreEvery: -1})
	k := key("198.51.100.1")
	cands := []uint16{1, 2}
	add(t, tb, k, 1, 20, 20, 20, 20, 20, 20, 20, 20)
	add(t, tb, k, 2, 60, 60, 60)
	calls := 0
	for ; calls < 20; calls++ {
		c := tb.Choose(k, cands)
		if cands[c.First] == 2 {
			break
		}
		clk.advance(5 * time.Second)
		add(t, tb, k, 1, 200) // the pod measures both POPs of each call
		add(t, tb, k, 2, 60)
	}
	if calls != Window/2 {
		t.Fatalf("left the degraded POP after %d calls, want %d", calls, Window/2)
	}
	for calls = 0; calls < 20; calls++ {
		c := tb.Choose(k, cands)
		if cands[c.First] == 1 {
			break
		}
		if cands[c.Backup] != 1 {
			t.Fatalf("the degraded POP is not the backup: %+v", c)
		}
		clk.advance(5 * time.Second)
		add(t, tb, k, 1, 20)
		add(t, tb, k, 2, 60)
	}
	if calls > Window/2+1 {
		t.Fatalf("recovered POP chosen again after %d calls", calls)
	}
}

// TestExploration: with ExploreEvery, one measured choice in that many
// puts the unmeasured candidate first; without one, never.
func TestExploration(t *testing.T) {
	tb, _ := newTable(t, Config{ExploreEvery: 10})
	k := key("198.51.100.1")
	cands := []uint16{1, 2}
	add(t, tb, k, 1, 20, 20, 20)
	explored := 0
	for range 100 {
		if c := tb.Choose(k, cands); c.Reason == ByExplore {
			if cands[c.First] != 2 || cands[c.Backup] != 1 {
				t.Fatalf("explore %+v", c)
			}
			explored++
		}
	}
	if explored != 10 {
		t.Fatalf("%d explorations in 100 choices, want 10", explored)
	}
	add(t, tb, k, 2, 50, 50, 50)
	for range 100 {
		if c := tb.Choose(k, cands); c.Reason != ByMeasure || cands[c.First] != 1 {
			t.Fatalf("all measured: %+v", c)
		}
	}
}

// TestBounded: the table never holds more than MaxEntries pairs; when
// full the stalest of a few goes, and every remaining pair is still found
// (deletion keeps the probe chains whole).
func TestBounded(t *testing.T) {
	const max = 1000
	tb, clk := newTable(t, Config{MaxEntries: max})
	if got := unsafe.Sizeof(entry{}); got != SlotBytes {
		t.Fatalf("entry is %d bytes, want %d", got, SlotBytes)
	}
	if perPair := float64(len(tb.slots)*SlotBytes) / max; perPair > 100 {
		t.Fatalf("%.1f bytes per pair, want ≤ 100", perPair)
	}
	keys := map[Key]bool{}
	for i := range 5000 {
		k := KeyFor(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}), false, 0, 0)
		add(t, tb, k, uint16(1+i%3), 30)
		keys[k] = true
		if i%100 == 0 {
			clk.advance(time.Second)
		}
	}
	if tb.Len() != max || tb.Evicted() != 4000 {
		t.Fatalf("len %d evicted %d, want %d and 4000", tb.Len(), tb.Evicted(), max)
	}
	found := 0
	for i := range 5000 {
		k := KeyFor(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}), false, 0, 0)
		if tb.Lookup(k, uint16(1+i%3)).Fresh == 1 {
			found++
		}
	}
	if found != max {
		t.Fatalf("%d pairs found, want %d", found, max)
	}
	// The newest survive: the last ones added are all there.
	for i := 4990; i < 5000; i++ {
		k := KeyFor(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}), false, 0, 0)
		if tb.Lookup(k, uint16(1+i%3)).Fresh != 1 {
			t.Fatalf("pair %d, among the newest, was evicted", i)
		}
	}
}

// BenchmarkChoose is the per-offer cost of consulting the table: four
// candidates, all measured, in a table of 100k pairs.
func BenchmarkChoose(b *testing.B) {
	tb, _ := newTable(b, Config{MaxEntries: 100_000, ExploreEvery: -1})
	for i := range 25_000 {
		k := KeyFor(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}), true, 48, 2)
		for pop := uint16(1); pop <= 4; pop++ {
			add(b, tb, k, pop, 20, 30, 40)
		}
	}
	k := KeyFor(netip.AddrFrom4([4]byte{10, 0, 7, 1}), true, 48, 2)
	cands := []uint16{1, 2, 3, 4}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if c := tb.Choose(k, cands); c.Reason != ByMeasure {
			b.Fatal(c)
		}
	}
}

func BenchmarkAdd(b *testing.B) {
	tb, _ := newTable(b, Config{MaxEntries: 100_000})
	s := Sample{Key: key("198.51.100.1"), POP: 1, RTT: 20 * time.Millisecond}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Key = KeyFor(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), 1}), false, 0, 0)
		if err := tb.Add(s, PodReporter(1, uint16(i))); err != nil {
			b.Fatal(err)
		}
	}
}

// addFrom records samples that one reporter sent.
func addFrom(t testing.TB, tb *Table, from Reporter, k Key, pop uint16, ms ...float64) {
	t.Helper()
	for _, v := range ms {
		if err := tb.Add(Sample{Key: k, POP: pop, RTT: time.Duration(v * float64(time.Millisecond))}, from); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOneReporterCannotOwnAPrefix: a compromised pod (one reporter)
// floods a prefix with samples that make the far POP look near and the
// near one far. Alone it makes nothing measured; beside three honest
// pods each medians stays within what the honest ones measured, so the
// near POP keeps the calls.
func TestOneReporterCannotOwnAPrefix(t *testing.T) {
	tb, _ := newTable(t, Config{ExploreEvery: -1})
	k := key("198.51.100.1")
	cands := []uint16{1, 2} // 1 is near: 20 ms; 2 is far: 160 ms
	attacker := PodReporter(1, 99)
	flood := func() {
		for range 3 * Window {
			addFrom(t, tb, attacker, k, 2, 1)
			addFrom(t, tb, attacker, k, 1, 6000)
		}
	}
	flood()
	if c := tb.Choose(k, cands); c.Reason != ByDistance {
		t.Fatalf("one reporter's flood alone: %+v, want distance (nothing measured)", c)
	}
	for pod := uint16(1); pod <= 3; pod++ {
		addFrom(t, tb, PodReporter(2, pod), k, 1, 20)
		addFrom(t, tb, PodReporter(2, pod), k, 2, 160)
	}
	flood()
	c := tb.Choose(k, cands)
	if c.Reason != ByMeasure || cands[c.First] != 1 {
		t.Fatalf("three honest pods and a flood: %+v, want POP 1 measured first", c)
	}
	if st := tb.Lookup(k, 1); st.Median != 20*time.Millisecond || st.Fresh != 4 {
		t.Errorf("near POP: %+v, want the honest 20 ms from 4 reporters", st)
	}
	if st := tb.Lookup(k, 2); st.Median != 160*time.Millisecond || st.Fresh != 4 {
		t.Errorf("far POP: %+v, want the honest 160 ms from 4 reporters", st)
	}
}
