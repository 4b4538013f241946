package e2e

import (
	"context"
	"maps"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/probe"
)

// podOf returns the pod a call's session lives on, from its Location.
func podOf(t *testing.T, c *probe.Call) uint16 {
	t.Helper()
	session, _, _ := strings.Cut(c.Location[strings.LastIndexByte(c.Location, '/')+1:], ".")
	id, err := sessionid.Parse(session)
	if err != nil {
		t.Fatalf("session location %q: %v", c.Location, err)
	}
	return id.Pod
}

// loopbackOnly keeps a client's candidates on loopback (IPv4: Pion
// gathers no ::1 candidate): a host address would be a second client
// address, whose flow the kernel may hash to another global relay replica.
func loopbackOnly(ip net.IP) bool { return ip.IsLoopback() }

func dial(t *testing.T, ctx context.Context, w *devworld.World) *probe.Call {
	t.Helper()
	return dialFiltered(t, ctx, w, nil)
}

// dialFiltered is dial with the client's candidates limited to filter's
// addresses (nil: all).
func dialFiltered(t *testing.T, ctx context.Context, w *devworld.World, filter func(net.IP) bool) *probe.Call {
	t.Helper()
	c, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, IPFilter: filter, Logger: testLogger()})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.WaitEcho(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestClusterRelayFailover kills the cluster relay replica that carries a
// live call, at production gossip timings (the global pool's WAN timings
// would take tens of seconds to declare it dead): the global relay sees the
// flow's replica stop returning traffic and re-picks another replica of the
// cluster, and the echo resumes within a second.
func TestClusterRelayFailover(t *testing.T) {
	w := startWorld(t, devworld.Config{ProductionGossip: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := dial(t, ctx, w)
	rg := w.Regions[0]
	if call.Region != rg.Spec.Name {
		t.Fatalf("call placed in %s, want %s", call.Region, rg.Spec.Name)
	}
	eventually(t, 5*time.Second, "25 echoes", func() bool { return call.Stats().Received >= 25 })

	// Which replica carries it? The one whose to_pod counter moves most
	// (the client's few checks to the backup POP may take the other).
	carrier, most := -1, 0.0
	for i := range rg.ClusterRelays {
		v := metricSum(t, w.Registry, "rtcedge_clusterrelay_packets_total",
			map[string]string{"region": rg.Spec.Name, "replica": strconv.Itoa(i + 1), "direction": "to_pod"})
		if v > most {
			carrier, most = i, v
		}
	}
	if carrier < 0 {
		t.Fatal("no cluster relay replica carried the call")
	}
	other := 1 - carrier
	otherBefore := metricSum(t, w.Registry, "rtcedge_clusterrelay_packets_total",
		map[string]string{"region": rg.Spec.Name, "replica": strconv.Itoa(other + 1), "direction": "to_pod"})
	before := call.Stats().Received
	start := time.Now()
	rg.ClusterRelays[carrier].Kill()

	eventually(t, 10*time.Second, "echo to resume through the other replica", func() bool {
		return call.Stats().Received >= before+50
	})
	resumed := time.Since(start)
	gap, _ := call.Gaps()
	t.Logf("cluster relay replica killed (production gossip timings): echo resumed within %v; longest media gap %v",
		resumed.Round(time.Millisecond), gap.Round(time.Millisecond))
	if gap >= time.Second {
		t.Errorf("media gap %v after losing the call's cluster relay, want < 1 s", gap)
	}
	if n := metricSum(t, w.Registry, "rtcedge_globalrelay_relay_repicks_total", map[string]string{"pop": rg.Spec.POPName}); n < 1 {
		t.Errorf("the POP re-picked %v flows on data-plane evidence, want ≥ 1", n)
	}
	if v := metricSum(t, w.Registry, "rtcedge_clusterrelay_packets_total",
		map[string]string{"region": rg.Spec.Name, "replica": strconv.Itoa(other + 1), "direction": "to_pod"}); v < otherBefore+50 {
		t.Errorf("the surviving replica carried %v packets after the kill, want ≥ 50", v-otherBefore)
	}
	if call.ConnectionState().String() != "connected" {
		t.Errorf("call state after failover: %v", call.ConnectionState())
	}
}

// TestDrainingAndDeadPodsGetNoSessions: a draining pod keeps its call and
// takes no new ones; a dead pod takes none either.
func TestDrainingAndDeadPodsGetNoSessions(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	rg := w.Regions[0]

	// The first call lands on some pod; that pod drains.
	first := dial(t, ctx, w)
	busy := podOf(t, first)
	other := 3 - busy // pods 1 and 2
	drained := rg.Pods[busy-1].Transceiver.Drain()
	awaitPodDraining(t, rg, busy, 5*time.Second)
	for range 3 {
		c := dial(t, ctx, w)
		if p := podOf(t, c); p != other {
			t.Errorf("new call landed on pod %d while pod %d drains", p, busy)
		}
	}
	// The draining pod's call goes on.
	before := first.Stats().Received
	eventually(t, 5*time.Second, "the draining pod's call to keep echoing", func() bool { return first.Stats().Received >= before+25 })
	if err := first.Hangup(ctx); err != nil {
		t.Fatalf("hang up: %v", err)
	}
	select {
	case <-drained:
	case <-ctx.Done():
		t.Fatal("the pod did not finish draining after its last call ended")
	}
	if v := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", map[string]string{"pod": strconv.Itoa(int(busy)), "reason": "ice_failed"}); v != 0 {
		t.Errorf("the draining pod dropped %v calls", v)
	}

	// A dead pod: kill the other one; new calls must go to... nobody in
	// this cluster (the first pod drains), so the other region takes them.
	rg.Pods[other-1].Kill()
	eventually(t, 5*time.Second, "the cluster to forget the dead pod", func() bool {
		for _, p := range rg.ClusterRelays[0].Directory.PodInfos() {
			if p.ID == other {
				return false
			}
		}
		return true
	})
	c := dial(t, ctx, w)
	if c.Region == rg.Spec.Name {
		t.Errorf("call placed in %s with one pod dead and the other draining", c.Region)
	}
}

// TestTransceiverDrainDropsNoCall stops a pod carrying calls gracefully (as
// SIGTERM does), at production gossip timings: the cluster stops placing
// sessions on it, its calls go on echoing until they hang up, and then it
// exits. No call is dropped: every session the pod ended was hung up.
func TestTransceiverDrainDropsNoCall(t *testing.T) {
	w := startWorld(t, devworld.Config{ProductionGossip: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rg := w.Regions[0]
	byPod := map[uint16][]*probe.Call{}
	for range 4 {
		c := dial(t, ctx, w)
		byPod[podOf(t, c)] = append(byPod[podOf(t, c)], c)
	}
	busy := uint16(1)
	if len(byPod[2]) > len(byPod[1]) {
		busy = 2
	}
	calls := byPod[busy]
	if len(calls) == 0 {
		t.Fatalf("no call on either pod of %s: %v", rg.Spec.Name, byPod)
	}
	stopped := rg.Pods[busy-1].Stop()
	awaitPodDraining(t, rg, busy, 10*time.Second)
	for range 4 {
		if p := podOf(t, dial(t, ctx, w)); p == busy {
			t.Errorf("a new call landed on pod %d while it drains", p)
		}
	}
	// Ten more seconds of each of the draining pod's calls.
	before := make([]int, len(calls))
	for i, c := range calls {
		before[i] = c.Stats().Received
	}
	eventually(t, 20*time.Second, "the draining pod's calls to keep echoing", func() bool {
		for i, c := range calls {
			if c.Stats().Received < before[i]+500 {
				return false
			}
		}
		return true
	})
	for _, c := range calls {
		if err := c.Hangup(ctx); err != nil {
			t.Errorf("hang up a call of the draining pod: %v", err)
		}
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("the pod did not exit after its last call ended")
	}
	pod := map[string]string{"region": rg.Spec.Name, "pod": strconv.Itoa(int(busy))}
	hungUp := maps.Clone(pod)
	hungUp["reason"] = "deleted"
	deleted := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", hungUp)
	all := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_ended_total", pod)
	t.Logf("pod %d drained with %d calls: %v ended by hang-up, %v otherwise (calls dropped)", busy, len(calls), deleted, all-deleted)
	if all-deleted != 0 || int(deleted) != len(calls) {
		t.Errorf("the draining pod ended %v sessions, %v of them hung up; want exactly its %d calls, all hung up", all, deleted, len(calls))
	}
}

// awaitPodDraining waits until every cluster relay of rg sees pod draining.
func awaitPodDraining(t *testing.T, rg *devworld.Region, pod uint16, limit time.Duration) {
	t.Helper()
	eventually(t, limit, "the cluster to see the pod draining", func() bool {
		for _, cr := range rg.ClusterRelays {
			for _, p := range cr.Directory.PodInfos() {
				if p.ID == pod && !p.Draining {
					return false
				}
			}
		}
		return true
	})
}
