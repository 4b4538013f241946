package sim_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/internal/proctest"
	"github.com/rtcedge/rtcedge/internal/testlog"
	"github.com/rtcedge/rtcedge/netsim"
	"github.com/rtcedge/rtcedge/probe"
	"github.com/rtcedge/rtcedge/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(proctest.Main(m)) }

// Environment knobs; `make sim` sets them all.
const (
	// callsEnv sets the calls per site (default 3; 1 with -short).
	callsEnv = "RTCEDGE_SIM_CALLS"
	// reportEnv names a directory for sim-report.json and sim-report.txt.
	reportEnv = "RTCEDGE_SIM_REPORT_DIR"
	// browserCallsEnv sets Chromium's calls per site and transport
	// (default: as many as callsEnv's).
	browserCallsEnv = "RTCEDGE_SIM_BROWSER_CALLS"
	// phoneEnv, set to 1, gives the sites carriers and phone calls
	// (`make sim` sets it). `make test` runs the simulation without them:
	// with their two more global relays, two SIP fronts and Redis, the
	// world's global gossip pool churned under CI load (two busy loops
	// beside a -race suite, 2026-12-08): every member declared others dead
	// over and over, signaling answered 503 and 502. The next run without
	// them churned too: the loopback gossip timings were too short, and are
	// longer since (docs/simulation.md); the carriers come back once runs
	// with them hold.
	// Phone calls through both relay tiers are in e2e either way.
	phoneEnv = "RTCEDGE_SIM_PHONE"
)

// envCalls reads a call count from the environment, def when unset.
func envCalls(t *testing.T, env string, def int) int {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 50 {
		t.Fatalf("%s=%q: want 1..50", env, v)
	}
	return n
}

// hold is how long each measured call stays up after its first echo: long
// enough for a few dozen echo round trips.
const hold = 600 * time.Millisecond

// switchMsg is what a transceiver logs when it moves a session to the POP
// its checks now arrive through.
const switchMsg = "switching session to another POP"

// TestSimulation runs the two-region, two-site simulation: every call from
// a site must be placed in its near region, on its near POP; setup times and
// echo RTT are measured in units of the simulated round trip and logged,
// never asserted. Each site's carrier places phone calls beside them
// (measurePhone). Then faults on site a's links: the near POP cut before a
// call, a loss burst and a partition mid-call, and the heal.
func TestSimulation(t *testing.T) {
	w := sim.Start(t, sim.Config{SIP: os.Getenv(phoneEnv) == "1"})
	calls := 3
	if testing.Short() {
		calls = 1
	}
	calls = envCalls(t, callsEnv, calls)
	rep := sim.Report{
		NearOneWayMs: ms(w.Config.Near), FarOneWayMs: ms(w.Config.Far),
		SignalingRTTMs: ms(w.SignalingRTT()), MediaRTTMs: ms(w.MediaRTT()),
		GoalMs: ms(w.SignalingRTT() + 3*w.MediaRTT() + 20*time.Millisecond),
	}
	for _, site := range w.Sites {
		if site.Spec.GeoWrong {
			continue // steered by measurement, below
		}
		t.Run("site-"+site.Spec.Name, func(t *testing.T) {
			rep.Sites = append(rep.Sites, measureSite(t, w, site, calls))
		})
	}
	if browserWanted() {
		t.Run("chromium", func(t *testing.T) { rep.Browser = browserCalls(t, w, envCalls(t, browserCallsEnv, calls)) })
	}
	if !testing.Short() {
		site := w.Sites[0]
		t.Run("fault-near-pop-cut-before-call", func(t *testing.T) { rep.Faults = append(rep.Faults, cutBeforeCall(t, w, site)) })
		t.Run("fault-mid-call", func(t *testing.T) { rep.Faults = append(rep.Faults, midCallFaults(t, w, site)...) })
		t.Run("mobile-rebinds", func(t *testing.T) { rep.Faults = append(rep.Faults, mobileRebinds(t, w, w.Sites[1])...) })
		// Steering by measured round trips: the site whose GeoIP lies,
		// against the echo RTT of a right-located site through its own
		// near POP; then a degraded path.
		for _, site := range w.Sites {
			if site.Spec.GeoWrong {
				t.Run("steering-site-"+site.Spec.Name, func(t *testing.T) { rep.Faults = append(rep.Faults, steerLyingSite(t, w, site, w.Sites[1])) })
			}
		}
		t.Run("steering-degraded-path", func(t *testing.T) { rep.Faults = append(rep.Faults, degradePath(t, w, w.Sites[1])) })
	}
	// Phone calls last: no WebRTC figure shares its seconds, or the
	// relays' and pods' tables, with them.
	for _, site := range w.Sites {
		if site.SIP != nil {
			t.Run("phone-site-"+site.Spec.Name, func(t *testing.T) {
				rep.Phone = append(rep.Phone, measurePhone(t, w, site, calls))
			})
		}
	}
	t.Logf("simulation report:\n%s", rep.Text())
	if dir := os.Getenv(reportEnv); dir != "" {
		if err := rep.WriteFiles(dir); err != nil {
			t.Error(err)
		} else {
			t.Logf("report written to %s/sim-report.{json,txt}", dir)
		}
	}
}

// measureSite places calls one after another from site and checks each is
// placed in the site's near region, cluster and POP, through its near link.
func measureSite(t *testing.T, w *sim.World, site *sim.Site, calls int) sim.SiteReport {
	near := w.Regions[site.NearRegion()]
	nearPOP := site.NearPOP()
	out := sim.SiteReport{Site: site.Spec.Name, City: site.Spec.City, Calls: calls,
		Region: near.Spec.Name, Cluster: strconv.Itoa(int(near.Spec.Cluster)), POP: nearPOP.Name}
	var timings []probe.Timings
	var rtts []time.Duration
	for i := range calls {
		before := nearPOP.Link.Stats()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, tm, err := placeCall(ctx, site)
		cancel()
		if err != nil {
			t.Fatalf("call %d from site %s: %v", i, site.Spec.Name, err)
		}
		if r.Region != out.Region || r.Cluster != out.Cluster || r.POP != out.POP {
			t.Errorf("call %d from site %s (%s) placed in %s/%s/%s, want its near %s/%s/%s",
				i, site.Spec.Name, site.Spec.City, r.Region, r.Cluster, r.POP, out.Region, out.Cluster, out.POP)
		}
		if after := nearPOP.Link.Stats(); after.Up.Forwarded == before.Up.Forwarded || after.Down.Forwarded == before.Down.Forwarded {
			t.Errorf("call %d from site %s: nothing went through its near POP link %s", i, site.Spec.Name, nearPOP.Name)
		}
		t.Logf("call %d: signaling %.1f ms, ICE %.1f ms, DTLS %.1f ms, first echo %.1f ms, echo RTT p50 %.1f ms, loss %.1f%%",
			i, r.SignalingMs, r.ICEMs, r.DTLSMs, r.FirstEchoMs, r.RTTP50Ms, 100*r.LossRatio)
		timings = append(timings, tm)
		rtts = append(rtts, time.Duration(r.RTTP50Ms*float64(time.Millisecond)))
	}
	out.Rows = sim.SiteRows(timings, rtts, w.SignalingRTT(), w.MediaRTT())
	return out
}

// placeCall is probe.Once that also returns the raw timings.
func placeCall(ctx context.Context, site *sim.Site) (probe.Report, probe.Timings, error) {
	var tm probe.Timings
	cfg := site.CallConfig()
	r, err := probe.Once(ctx, cfg, hold)
	if err != nil {
		return r, tm, err
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	tm = probe.Timings{Signaling: ms(r.SignalingMs), ICEConnected: ms(r.ICEMs), DTLSConnected: ms(r.DTLSMs), FirstEcho: ms(r.FirstEchoMs)}
	return r, tm, nil
}

// cutBeforeCall places a call while the site's near POP link is cut: the
// client's checks to the near VIP go nowhere and it connects through the
// backup (far) POP from the answer.
func cutBeforeCall(t *testing.T, w *sim.World, site *sim.Site) sim.Scenario {
	near, far := site.NearPOP(), site.POPs[1-site.NearRegion()]
	near.Link.SetPartitioned(true)
	defer near.Link.SetPartitioned(false)
	before := far.Link.Stats()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, _, err := placeCall(ctx, site)
	if err != nil {
		t.Fatalf("call with the near POP cut: %v", err)
	}
	after := far.Link.Stats()
	if after.Down.Forwarded == before.Down.Forwarded {
		t.Errorf("the call with %s cut did not go through the backup POP %s", near.Name, far.Name)
	}
	farRTT := 2 * far.Delay
	res := fmt.Sprintf("connected through backup %s (RTT %.0f ms): signaling %.1f ms, ICE %.1f ms, DTLS %.1f ms (%.2f far RTTs after ICE), first echo %.1f ms, echo RTT p50 %.1f ms",
		far.Name, ms(farRTT), r.SignalingMs, r.ICEMs, r.DTLSMs, (r.DTLSMs-r.ICEMs)/ms(farRTT), r.FirstEchoMs, r.RTTP50Ms)
	t.Log(res)
	return sim.Scenario{Name: "near POP cut before the call", Action: "site " + site.Spec.Name + "'s link to " + near.Name + " partitioned from before the offer", Result: res}
}

// midCallFaults runs one call from site through a loss burst, then a
// partition of its near POP link and the heal.
func midCallFaults(t *testing.T, w *sim.World, site *sim.Site) []sim.Scenario {
	const (
		burstLoss    = 0.3
		burstFor     = 2 * time.Second
		partitionFor = 3 * time.Second
		recoverLimit = 10 * time.Second
	)
	near, backup := site.NearPOP(), site.POPs[1-site.NearRegion()]
	pods := w.Regions[site.NearRegion()].Pods
	switchCount := func() (n int) {
		for _, p := range pods {
			n += p.Count(switchMsg)
		}
		return n
	}
	call, hangup := dialEcho(t, site.CallConfig())
	defer hangup()
	received := func() int { return call.Stats().Received }
	if _, ok := await(5*time.Second, atLeast(received, received()+25)); !ok {
		t.Fatal("the call did not settle into echoing")
	}
	var out []sim.Scenario

	// (1) A loss burst on the near link, both ways.
	s0, l0 := call.Stats(), near.Link.Stats()
	near.Link.SetLoss(burstLoss, burstLoss)
	burst := time.NewTimer(burstFor) // the burst's length is the scenario
	<-burst.C
	near.Link.SetLoss(0, 0)
	endedAt := time.Now()
	s1, l1 := call.Stats(), near.Link.Stats()
	if _, ok := await(5*time.Second, atLeast(received, s1.Received+25)); !ok {
		t.Errorf("the call did not survive %.0f%% loss for %v", 100*burstLoss, burstFor)
	}
	// Stats count a packet lost once it is a second old and unanswered.
	if wait := time.Second + 100*time.Millisecond - time.Since(endedAt); wait > 0 {
		settle := time.NewTimer(wait)
		<-settle.C
	}
	s2 := call.Stats()
	sent := s1.Sent - s0.Sent
	lost := s2.Lost - s0.Lost
	dropUp := l1.Up.Dropped[netsim.DropLoss] - l0.Up.Dropped[netsim.DropLoss]
	dropDown := l1.Down.Dropped[netsim.DropLoss] - l0.Down.Dropped[netsim.DropLoss]
	fwdUp := l1.Up.Forwarded - l0.Up.Forwarded
	fwdDown := l1.Down.Forwarded - l0.Down.Forwarded
	res := fmt.Sprintf("call survived; %d of %d audio packets sent in the burst not echoed (%.0f%%; expected ≈ %.0f%% = 1 − 0.7²); link dropped %d of %d up, %d of %d down; ICE state %s",
		lost, sent, 100*float64(lost)/float64(max(sent, 1)), 100*(1-(1-burstLoss)*(1-burstLoss)),
		dropUp, dropUp+fwdUp, dropDown, dropDown+fwdDown, call.ConnectionState())
	t.Log("loss burst: " + res)
	out = append(out, sim.Scenario{Name: "loss burst",
		Action: fmt.Sprintf("%.0f%% loss each way for %v on site %s's link to %s, mid-call", 100*burstLoss, burstFor, site.Spec.Name, near.Name),
		Result: res})

	// (2) Partition the near link: does the client move to the backup POP?
	switches := switchCount()
	b0 := backup.Link.Stats()
	near.Link.SetPartitioned(true)
	cutAt := time.Now()
	atCut := received()
	_, moved := await(partitionFor, atLeast(received, atCut+5))
	if !moved {
		rest := time.NewTimer(partitionFor - time.Since(cutAt))
		<-rest.C
	}
	b1 := backup.Link.Stats()
	stateCut := call.ConnectionState()
	// (3) Heal and measure how soon echoes come back.
	near.Link.SetPartitioned(false)
	healedAt := time.Now()
	atHeal := received()
	resume, ok := await(recoverLimit, atLeast(received, atHeal+1))
	if !ok {
		t.Errorf("no echo within %v after the partition healed", recoverLimit)
	}
	if _, ok := await(5*time.Second, atLeast(received, atHeal+25)); !ok {
		t.Error("echo did not keep flowing after the heal")
	}
	gap, _ := call.Gaps()
	backupUp := b1.Up.Forwarded - b0.Up.Forwarded
	switched := switchCount() - switches
	var part string
	if moved {
		part = fmt.Sprintf("the client moved to backup %s during the partition (%d datagrams sent there, %d transceiver POP switches)", backup.Name, backupUp, switched)
	} else {
		part = fmt.Sprintf("no move to backup %s: the client sent %d datagrams there during the cut (Pion keeps its nominated pair; it renominates only with renomination enabled), %d transceiver POP switches; audio stopped; peer state %s at the heal",
			backup.Name, backupUp, switched, stateCut)
	}
	t.Log("partition: " + part)
	out = append(out, sim.Scenario{Name: "partition",
		Action: fmt.Sprintf("site %s's link to %s cut both ways for %v, mid-call", site.Spec.Name, near.Name, partitionFor),
		Result: part})
	heal := fmt.Sprintf("first echo %.1f ms after the heal (media RTT %.0f ms); longest echo gap %.0f ms for a cut of %v",
		ms(resume), ms(w.MediaRTT()), ms(gap), healedAt.Sub(cutAt).Round(time.Millisecond))
	t.Log("heal: " + heal)
	out = append(out, sim.Scenario{Name: "heal", Action: "the partition lifted", Result: heal})
	return out
}

// await polls cond every 5 ms for up to limit and reports how long it took.
// The probe's counters have no change notification, so polling is the way
// to see them move; the interval bounds the timing error.
func await(limit time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > limit {
			return time.Since(start), false
		}
		<-tick.C
	}
	return time.Since(start), true
}

func atLeast(get func() int, n int) func() bool { return func() bool { return get() >= n } }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// mobileRebinds is a mobile client at site: its one socket sits behind a
// NAT (netsim.NAT, outside addresses on the site's network) that moves it
// to a new port mid-call, as a carrier NAT does, and then to a new IP, as a
// phone leaving Wi-Fi does. The client is not told; the call must go on
// (the transceiver follows its authenticated checks, docs/network-changes.md).
func mobileRebinds(t *testing.T, w *sim.World, site *sim.Site) []sim.Scenario {
	const recoverLimit = 10 * time.Second
	base := site.NearPOP().VIP().Addr().As4()
	nat, err := netsim.NewNAT(netsim.NATConfig{OutsideIPs: []netip.Addr{
		netip.AddrFrom4([4]byte{127, 0, base[2], 200}), netip.AddrFrom4([4]byte{127, 0, base[2], 201}),
	}, Logger: testlog.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer nat.Close()
	host, err := nat.NewHost()
	if err != nil {
		t.Fatal(err)
	}
	cfg := site.CallConfig()
	cfg.PacketConn = host
	call, hangup := dialEcho(t, cfg)
	defer hangup()
	received := func() int { return call.Stats().Received }
	var out []sim.Scenario
	for _, step := range []struct {
		name string
		kind netsim.RebindKind
	}{
		{"mobile: NAT rebinding", netsim.RebindPort},
		{"mobile: network change", netsim.RebindIP},
	} {
		if _, ok := await(5*time.Second, atLeast(received, received()+50)); !ok {
			t.Fatal("the call did not settle into echoing")
		}
		old := host.Mapping().Outside
		m, err := host.Rebind(step.kind)
		if err != nil {
			t.Fatal(err)
		}
		movedAt := time.Now()
		at := received()
		resume, ok := await(recoverLimit, atLeast(received, at+1))
		if !ok {
			t.Errorf("%s: no echo within %v of moving the client from %v to %v", step.name, recoverLimit, old, m.Outside)
			continue
		}
		if _, ok := await(5*time.Second, atLeast(received, at+50)); !ok {
			t.Errorf("%s: echo did not keep flowing", step.name)
		}
		check := host.Mapping().FirstSTUN
		res := fmt.Sprintf("echo back %.0f ms after the move, %.0f ms after the client's first check from %v (media RTT %.0f ms); ICE state %s",
			ms(resume), ms(movedAt.Add(resume).Sub(check)), m.Outside, ms(w.MediaRTT()), call.ConnectionState())
		t.Logf("%s: %s", step.name, res)
		out = append(out, sim.Scenario{Name: step.name,
			Action: fmt.Sprintf("a site %s client's NAT mapping moved from %v to %v mid-call, the client not told", site.Spec.Name, old, m.Outside),
			Result: res})
	}
	return out
}

// dialEcho places a probe call and waits for its first echo; hangup ends
// it (DELETE, then close).
func dialEcho(t *testing.T, cfg probe.Config) (call *probe.Call, hangup func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	call, err := probe.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	hangup = func() {
		hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer hcancel()
		if err := call.Hangup(hctx); err != nil {
			t.Errorf("hang up: %v", err)
		}
		call.Close()
	}
	if err := call.WaitEcho(ctx); err != nil {
		hangup()
		t.Fatal(err)
	}
	return call, hangup
}
