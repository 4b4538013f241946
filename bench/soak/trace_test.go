//go:build soak

package soak

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/globalrelay"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/probe"
)

// Gap attribution: the soak records what the calls' path did (every
// global relay's re-picks of a flow's cluster relay, each pod's relay set,
// the global pool's cluster relays as signaling sees them, the pods'
// unknown_relay drops) and, for each media gap, prints the fault that
// preceded it and what happened on the path during it.

// gapMin is the shortest gap the report explains: a frame interval plus
// a little jitter is no gap.
const gapMin = 250 * time.Millisecond

// traced is one recorded event.
type traced struct {
	at     time.Time
	client netip.AddrPort // a re-pick's flow; invalid for path-wide events
	what   string
}

// tracer collects events; its methods are safe for concurrent use.
type tracer struct {
	mu     sync.Mutex
	events []traced
	names  map[netip.AddrPort]string // relay data address → node name
	faults []faultRun
}

// faultRun is one injected fault as it ran.
type faultRun struct {
	start, end time.Time
	name       string
}

func newTracer() *tracer { return &tracer{names: map[netip.AddrPort]string{}} }

func (t *tracer) add(at time.Time, client netip.AddrPort, what string) {
	t.mu.Lock()
	t.events = append(t.events, traced{at: at, client: client, what: what})
	t.mu.Unlock()
}

// name returns a relay's node name, or its address.
func (t *tracer) name(a netip.AddrPort) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n, ok := t.names[a]; ok {
		return n
	}
	return a.String()
}

func (t *tracer) names2(as []netip.AddrPort) string {
	var s []string
	for _, a := range as {
		s = append(s, t.name(a))
	}
	return "{" + strings.Join(s, " ") + "}"
}

// learn records the names of region 0's cluster relays; the caller owns
// the world (no fault runs concurrently).
func (t *tracer) learn(w *devworld.World) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cr := range w.Regions[0].ClusterRelays {
		name := cr.ClusterPool.Name()
		if i := strings.LastIndex(name, "/"); i >= 0 {
			name = name[i+1:]
		}
		t.names[cr.Relay.Addr()] = name
	}
}

// onRepick is devworld.Config.OnRepick.
func (t *tracer) onRepick(node string, ev globalrelay.RepickEvent) {
	if ev.Reason == "new" {
		return
	}
	if i := strings.LastIndex(node, "/"); i >= 0 {
		node = node[i+1:]
	}
	t.add(ev.At, netip.AddrPortFrom(ev.Client.Addr().Unmap(), ev.Client.Port()),
		fmt.Sprintf("%s: %s → %s (%s, back-off ×%d, avoiding %s)", node, t.name(ev.From), t.name(ev.To), ev.Reason, 1<<ev.Strikes, t.names2(ev.Avoided)))
}

// sample watches the pods' relay sets, the global pool's view of region
// 0's cluster relays (signaling's member, which never restarts) and the
// pods' unknown_relay drops until ctx ends, recording changes.
func (t *tracer) sample(ctx context.Context, w *devworld.World) {
	pods := w.Regions[0].Pods // pods never restart in the soak
	cluster := w.Regions[0].Spec.Cluster
	last := map[string]string{}
	lastDrops := map[string]float64{}
	note := func(key, now string) {
		if last[key] != now {
			last[key] = now
			t.add(time.Now(), netip.AddrPort{}, key+" "+now)
		}
	}
	go t.watchStalls(ctx)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		for _, p := range pods {
			note(fmt.Sprintf("pod-%d relay set", p.ID), t.names2(p.Relays.Addrs()))
		}
		var alive, draining []netip.AddrPort
		for _, m := range w.SignalingPool.Members() {
			if m.Meta.Role != membership.RoleClusterRelay || m.Meta.Cluster != cluster || m.State != membership.StateAlive {
				continue
			}
			if m.Meta.Draining {
				draining = append(draining, m.Meta.Data)
			} else {
				alive = append(alive, m.Meta.Data)
			}
		}
		slices.SortFunc(alive, netip.AddrPort.Compare)
		slices.SortFunc(draining, netip.AddrPort.Compare)
		note("global gossip: cluster relays", t.names2(alive)+" draining "+t.names2(draining))
		if n%10 == 0 { // gathering every metric of the world is not free
			for key, v := range drops(w.Registry, w.Regions[0].Spec.Name) {
				if d := v - lastDrops[key]; d > 0 {
					t.add(time.Now(), netip.AddrPort{}, fmt.Sprintf("%s: %.0f dropped in the last 0.5 s", key, d))
				}
				lastDrops[key] = v
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// stallAfter is how late a 10 ms tick must be to count as a stall of the
// soak's own process (every node, every call and Pion run in it).
const stallAfter = 150 * time.Millisecond

// watchStalls records each time the process went without running a
// goroutine for stallAfter or more (starved of CPU, or stopped for GC):
// every call's media stops at once then, whatever the path does.
func (t *tracer) watchStalls(ctx context.Context) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			now := time.Now()
			if d := now.Sub(last); d >= stallAfter {
				t.add(last, netip.AddrPort{}, fmt.Sprintf("the soak process ran nothing for %v (CPU starvation or GC)", d.Round(time.Millisecond)))
			}
			last = now
		}
	}
}

// drops returns the dropped-packet counters of region's nodes (pods,
// cluster relays, its POP's replicas), by "node reason".
func drops(g prometheus.Gatherer, region string) map[string]float64 {
	out := map[string]float64{}
	mfs, err := g.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if !strings.HasSuffix(mf.GetName(), "_dropped_packets_total") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var node, reason string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "node":
					node = l.GetValue()
				case "reason":
					reason = l.GetValue()
				}
			}
			if v := m.GetCounter().GetValue(); v > 0 && strings.HasPrefix(node, region+"/") {
				out[strings.TrimPrefix(node, region+"/")+" "+reason] = v
			}
		}
	}
	return out
}

// watchCalls records each change of a call's ICE connection state and
// selected candidate pair, as events of that call's flow.
func (t *tracer) watchCalls(ctx context.Context, cs []*probe.Call, clients []netip.AddrPort) {
	last := make([]string, len(cs))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		for i, c := range cs {
			_, remote, _ := c.SelectedPair()
			now := fmt.Sprintf("client: %s, pair to %v", c.ConnectionState(), remote)
			if now != last[i] {
				last[i] = now
				t.add(time.Now(), clients[i], now)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// gapSummary is the gaps one kind of fault (or none: outside the faults)
// was followed by.
type gapSummary struct {
	n   int
	max time.Duration
}

// explain describes every gap of call i (client address client) longer
// than gapMin: the fault before it, whether it is outside the faults, how
// many calls had a gap at the same moment (all of them: the process, not
// a path), and the path's events from a second before it to its end. It
// adds each gap to sum, by fault ("" outside the faults).
func (t *tracer) explain(b *strings.Builder, i int, client netip.AddrPort, all [][]probe.Gap, origin time.Time, sum map[string]*gapSummary) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, g := range all[i] {
		shared := 0
		for _, other := range all {
			for _, o := range other {
				if o.Start.Before(g.End) && g.Start.Before(o.End) {
					shared++
					break
				}
			}
		}
		// The fault the gap belongs to began before the gap ended (the
		// gap starts at the last echo before it).
		var f *faultRun
		for k := range t.faults {
			if t.faults[k].start.Before(g.End) {
				f = &t.faults[k]
			}
		}
		where := "before any fault"
		quiet := true
		if f != nil {
			where = fmt.Sprintf("%+.2f s from %q (at %.1f s)", g.Start.Sub(f.start).Seconds(), f.name, f.start.Sub(origin).Seconds())
			quiet = g.Start.After(f.end.Add(settle))
		}
		mark, key := "", ""
		if quiet {
			mark = " OUTSIDE THE FAULTS"
		} else {
			key = f.name
		}
		d := g.End.Sub(g.Start)
		if sum[key] == nil {
			sum[key] = &gapSummary{}
		}
		sum[key].n++
		sum[key].max = max(sum[key].max, d)
		fmt.Fprintf(b, "call %d (%v): %v gap at %.2f s (%d of %d calls at once), %s%s\n", i, client, d.Round(time.Millisecond), g.Start.Sub(origin).Seconds(), shared, len(all), where, mark)
		for _, e := range t.events {
			if e.at.Before(g.Start.Add(-time.Second)) || e.at.After(g.End) || (e.client.IsValid() && e.client != client) {
				continue
			}
			fmt.Fprintf(b, "    %+7.2f s  %s\n", e.at.Sub(g.Start).Seconds(), e.what)
		}
	}
}
