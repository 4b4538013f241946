package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// awaitTimeout bounds every wait for gossip to converge; it only protects
// against hangs, the waits themselves end on Subscribe signals.
const awaitTimeout = 10 * time.Second

func testConfig(name string) Config {
	return Config{
		Name:          name,
		Bind:          netip.MustParseAddrPort("127.0.0.1:0"),
		AllowInsecure: true,
		Fast:          true,
		Logger:        slog.New(slog.DiscardHandler),
	}
}

func newTestPoolCfg(t *testing.T, cfg Config, meta Meta) *Pool {
	t.Helper()
	p, err := New(cfg, meta)
	if err != nil {
		t.Fatalf("New(%s): %v", cfg.Name, err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close(%s): %v", cfg.Name, err)
		}
	})
	return p
}

func newTestPool(t *testing.T, name string, meta Meta) *Pool {
	t.Helper()
	return newTestPoolCfg(t, testConfig(name), meta)
}

// await waits, on p's Subscribe channel, until cond holds for p.Members.
// It returns how long that took.
func await(t *testing.T, p *Pool, what string, cond func([]Member) bool) time.Duration {
	t.Helper()
	start := time.Now()
	ch := p.Subscribe()
	deadline := time.NewTimer(awaitTimeout)
	defer deadline.Stop()
	for {
		ms := p.Members()
		if cond(ms) {
			return time.Since(start)
		}
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatalf("%s: %s: pool closed while waiting", p.Name(), what)
			}
		case <-deadline.C:
			t.Fatalf("%s: %s: not seen within %v; members: %+v", p.Name(), what, awaitTimeout, ms)
		}
	}
}

func find(ms []Member, name string) (Member, bool) {
	for _, m := range ms {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// hasMember returns a condition: name is listed and match accepts it.
func hasMember(name string, match func(Member) bool) func([]Member) bool {
	return func(ms []Member) bool {
		m, ok := find(ms, name)
		return ok && match(m)
	}
}

func inState(s State) func(Member) bool { return func(m Member) bool { return m.State == s } }

// startTrio creates three pools with distinct meta and joins b and c to a.
func startTrio(t *testing.T) []*Pool {
	t.Helper()
	ps := make([]*Pool, 3)
	for i := range ps {
		meta := Meta{Role: RoleTransceiver, Region: "test", Cluster: 1, Pod: uint16(i + 1),
			Data: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(40000+i)), Capacity: 10}
		ps[i] = newTestPool(t, fmt.Sprintf("node-%d", i), meta)
	}
	for _, p := range ps[1:] {
		if n, err := p.Join([]string{ps[0].LocalAddr().String()}); err != nil || n != 1 {
			t.Fatalf("%s Join = %d, %v", p.Name(), n, err)
		}
	}
	for _, p := range ps {
		await(t, p, "three alive members", func(ms []Member) bool {
			alive := 0
			for _, m := range ms {
				if m.State == StateAlive {
					alive++
				}
			}
			return alive == 3
		})
	}
	return ps
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"empty name", func(c *Config) { c.Name = "" }},
		{"no bind address", func(c *Config) { c.Bind = netip.AddrPort{} }},
		{"short key", func(c *Config) { c.SecretKey = make([]byte, 8) }},
		{"no key, insecure not allowed", func(c *Config) { c.AllowInsecure = false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig("v")
			tt.edit(&cfg)
			p, err := New(cfg, Meta{})
			if !errors.Is(err, ErrInvalidConfig) {
				if p != nil {
					p.Close()
				}
				t.Fatalf("New = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestLocalAddrAndSelf(t *testing.T) {
	p := newTestPool(t, "solo", realisticMeta())
	if a := p.LocalAddr(); a.Addr() != netip.MustParseAddr("127.0.0.1") || a.Port() == 0 {
		t.Fatalf("LocalAddr = %v, want 127.0.0.1 with a chosen port", a)
	}
	ms := p.Members()
	if len(ms) != 1 || ms[0].Name != "solo" || ms[0].Addr != p.LocalAddr() || ms[0].Meta != realisticMeta() || ms[0].State != StateAlive {
		t.Fatalf("Members of a lone pool = %+v", ms)
	}
}

func TestJoinAndMetaPropagation(t *testing.T) {
	ps := startTrio(t)
	a, b, c := ps[0], ps[1], ps[2]

	for _, p := range ps {
		for i, q := range ps {
			m, ok := find(p.Members(), q.Name())
			if !ok || m.Addr != q.LocalAddr() || m.Meta.Pod != uint16(i+1) {
				t.Fatalf("%s sees %s as %+v (listed %v)", p.Name(), q.Name(), m, ok)
			}
		}
	}

	updates := []struct {
		name  string
		edit  func(*Meta)
		match func(Member) bool
	}{
		{"load", func(m *Meta) { m.Load = 7 }, func(m Member) bool { return m.Meta.Load == 7 }},
		{"draining", func(m *Meta) { m.Draining = true }, func(m Member) bool { return m.Meta.Draining && m.Meta.Load == 7 }},
		{"api", func(m *Meta) { m.API = "http://127.0.0.1:9/v1" }, func(m Member) bool { return m.Meta.API == "http://127.0.0.1:9/v1" }},
	}
	for _, u := range updates {
		t.Run(u.name, func(t *testing.T) {
			if err := c.UpdateMeta(u.edit); err != nil {
				t.Fatalf("UpdateMeta: %v", err)
			}
			if !u.match(Member{Meta: c.LocalMeta()}) {
				t.Fatalf("LocalMeta not updated: %+v", c.LocalMeta())
			}
			for _, p := range []*Pool{a, b, c} {
				d := await(t, p, "update "+u.name, hasMember(c.Name(), u.match))
				t.Logf("%s saw %s update after %v", p.Name(), u.name, d)
			}
		})
	}
}

func TestHardKillDetectedDead(t *testing.T) {
	ps := startTrio(t)
	a, b, c := ps[0], ps[1], ps[2]

	// Shutdown without Leave is what a crash looks like to the others.
	start := time.Now()
	if err := c.ml.Shutdown(); err != nil {
		t.Fatal(err)
	}
	var worst time.Duration
	for _, p := range []*Pool{a, b} {
		await(t, p, "hard-killed member dead", hasMember(c.Name(), inState(StateDead)))
		d := time.Since(start)
		worst = max(worst, d)
		t.Logf("%s saw %s dead after %v", p.Name(), c.Name(), d)
		if n := p.deaths.Load(); n != 1 {
			t.Errorf("%s counted %d deaths, want 1", p.Name(), n)
		}
	}
	t.Logf("dead-member detection: %v (FastDetectionBound %v)", worst, FastDetectionBound)
	if worst > FastDetectionBound {
		t.Logf("note: detection exceeded FastDetectionBound; machine may be loaded")
	}
}

func TestGracefulLeave(t *testing.T) {
	ps := startTrio(t)
	a, b, c := ps[0], ps[1], ps[2]
	start := time.Now()
	if err := c.Leave(time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := c.Leave(time.Second); err != nil {
		t.Fatalf("second Leave: %v", err)
	}
	for _, p := range []*Pool{a, b} {
		await(t, p, "left member", hasMember(c.Name(), inState(StateLeft)))
		t.Logf("%s saw %s leave after %v", p.Name(), c.Name(), time.Since(start))
	}
	if err := c.UpdateMeta(func(m *Meta) { m.Load++ }); !errors.Is(err, ErrLeft) {
		t.Fatalf("UpdateMeta after Leave = %v, want ErrLeft", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close after Leave must not turn "left" into "dead" elsewhere.
	if m, _ := find(a.Members(), c.Name()); m.State != StateLeft {
		t.Fatalf("after Close: %+v", m)
	}
}

func TestEncryptedPoolRefusesOtherKey(t *testing.T) {
	key := []byte("0123456789abcdef")
	tests := []struct {
		name string
		key  []byte
		ok   bool
	}{
		{"same key joins", key, true},
		{"other key refused", []byte("fedcba9876543210"), false},
		{"no key refused", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfgA := testConfig("secure-a")
			cfgA.SecretKey, cfgA.AllowInsecure = key, false
			a := newTestPoolCfg(t, cfgA, Meta{Role: RoleGlobalRelay})
			cfgB := testConfig("secure-b")
			cfgB.SecretKey = tt.key
			b := newTestPoolCfg(t, cfgB, Meta{Role: RoleGlobalRelay})

			n, err := b.Join([]string{a.LocalAddr().String()})
			if tt.ok {
				if err != nil || n != 1 {
					t.Fatalf("Join = %d, %v", n, err)
				}
				await(t, a, "keyed member", hasMember("secure-b", inState(StateAlive)))
				return
			}
			if err == nil {
				t.Fatalf("Join with %s succeeded (%d)", tt.name, n)
			}
			if ms := a.Members(); len(ms) != 1 {
				t.Fatalf("encrypted pool admitted a member: %+v", ms)
			}
			if ms := b.Members(); len(ms) != 1 {
				t.Fatalf("refused node learned members: %+v", ms)
			}
		})
	}
}

// garbageMeta is a memberlist.Delegate that advertises undecodable meta, as
// a node of an incompatible build would.
type garbageMeta struct{}

func (garbageMeta) NodeMeta(int) []byte                 { return []byte{0xff, 1, 2, 3} }
func (garbageMeta) NotifyMsg([]byte)                    {}
func (garbageMeta) GetBroadcasts(int, int) [][]byte     { return nil }
func (garbageMeta) LocalState(bool) []byte              { return nil }
func (garbageMeta) MergeRemoteState(buf []byte, _ bool) {}

func TestUndecodableMetaSkippedAndCounted(t *testing.T) {
	p := newTestPool(t, "good", Meta{Role: RoleClusterRelay})
	cfg := testConfig("bad")
	mc := cfg.memberlistConfig()
	mc.Delegate = garbageMeta{}
	mc.LogOutput = nil
	mc.Logger = slog.NewLogLogger(slog.DiscardHandler, slog.LevelDebug)
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer ml.Shutdown()
	sub := p.Subscribe() // every observation signals, decodable or not
	if _, err := ml.Join([]string{p.LocalAddr().String()}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(awaitTimeout)
	for p.badMeta.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("bad meta never counted")
		}
		select {
		case <-sub:
		case <-time.After(time.Until(deadline)):
		}
	}
	if _, ok := find(p.Members(), "bad"); ok {
		t.Fatalf("member with undecodable meta listed: %+v", p.Members())
	}
}

func TestCollector(t *testing.T) {
	ps := startTrio(t)
	if err := ps[2].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	await(t, ps[0], "left", hasMember(ps[2].Name(), inState(StateLeft)))

	reg := prometheus.NewRegistry()
	if err := reg.Register(ps[0].Collector("cluster")); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	want := map[string]float64{
		"rtcedge_membership_members{pool=cluster,role=transceiver,state=alive}": 2,
		"rtcedge_membership_members{pool=cluster,role=transceiver,state=left}":  1,
		"rtcedge_membership_members{pool=cluster,role=transceiver,state=dead}":  0,
		"rtcedge_membership_members{pool=cluster,role=globalrelay,state=alive}": 0,
		"rtcedge_membership_members{pool=cluster,role=other,state=suspect}":     0,
		"rtcedge_membership_meta_decode_errors_total{pool=cluster}":             0,
		"rtcedge_membership_deaths_total{pool=cluster}":                         0,
	}
	for k, v := range want {
		g, ok := got[k]
		if !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if n := len(got); n != (len(Roles)+1)*len(States)+2 {
		t.Errorf("%d series, want every role×state plus the two counters: %v", n, got)
	}
}

func TestClosedPool(t *testing.T) {
	p := newTestPool(t, "closing", Meta{})
	sub := p.Subscribe()
	for range 2 {
		if err := p.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	if _, ok := <-sub; ok {
		t.Fatal("subscription not closed by Close")
	}
	if _, ok := <-p.Subscribe(); ok {
		t.Fatal("Subscribe after Close returned an open channel")
	}
	if err := p.UpdateMeta(func(m *Meta) { m.Load++ }); !errors.Is(err, ErrClosed) {
		t.Fatalf("UpdateMeta after Close = %v", err)
	}
	if err := p.Leave(time.Second); !errors.Is(err, ErrClosed) {
		t.Fatalf("Leave after Close = %v", err)
	}
	if _, err := p.Join([]string{"127.0.0.1:1"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Join after Close = %v", err)
	}
}

// TestWatch: fn sees the members at once and again after a change; Watch
// returns when its context ends.
func TestWatch(t *testing.T) {
	p := newTestPool(t, "watcher", Meta{Role: RoleClusterRelay})
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan []Member, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Watch(ctx, func(ms []Member) { calls <- ms })
	}()
	select {
	case ms := <-calls:
		if len(ms) != 1 {
			t.Fatalf("first call saw %d members, want 1 (self)", len(ms))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no first call")
	}
	if err := p.UpdateMeta(func(m *Meta) { m.Load = 7 }); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for seen := false; !seen; {
		select {
		case ms := <-calls:
			seen = len(ms) == 1 && ms[0].Meta.Load == 7
		case <-deadline:
			t.Fatal("the meta change did not reach the watcher")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return when its context ended")
	}
}
