package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testredis"
	"github.com/rtcedge/rtcedge/probe"
)

// TestGlobalRelayRestart restarts the POP's global relay mid-call (a new
// replica on the same public address, empty flow table), at production
// gossip timings, and measures how long the echo stops, with the flow
// shared through real Redis, through the dev world's in-process store, and
// with no shared cache at all (then the flow comes back with the client's
// next consent check, every 2 s from a Pion client). The gap includes the
// new replica's start-up, as a crash-restart behind a load balancer would.
func TestGlobalRelayRestart(t *testing.T) {
	tests := []struct {
		name   string
		cfg    func(t *testing.T) devworld.Config
		source string        // how the new replica must have recovered the flow
		maxGap time.Duration // bound on the longest media gap
	}{
		{"redis", func(t *testing.T) devworld.Config {
			return devworld.Config{RedisURL: testredis.Start(t).URL(), WorkersPerPOP: 1, ProductionGossip: true}
		}, "cache", 500 * time.Millisecond},
		{"in-process store", func(*testing.T) devworld.Config {
			return devworld.Config{WorkersPerPOP: 1, ProductionGossip: true}
		}, "cache", 500 * time.Millisecond},
		{"no cache", func(*testing.T) devworld.Config {
			return devworld.Config{NoRouteCache: true, WorkersPerPOP: 1, ProductionGossip: true}
		}, "stun", 4 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := startWorld(t, tt.cfg(t))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			call := dial(t, ctx, w)
			eventually(t, 5*time.Second, "25 echoes", func() bool { return call.Stats().Received >= 25 })

			start := time.Now()
			if err := w.RestartPOP(0); err != nil {
				t.Fatalf("restart POP: %v", err)
			}
			before := call.Stats().Received
			eventually(t, 15*time.Second, "echo to resume through the new replica", func() bool {
				return call.Stats().Received >= before+50
			})
			gap, _ := call.Gaps()
			t.Logf("%s: global relay restarted; echo resumed within %v, longest media gap %v",
				tt.name, time.Since(start).Round(time.Millisecond), gap.Round(time.Millisecond))
			if gap >= tt.maxGap {
				t.Errorf("media gap %v after the restart, want < %v", gap, tt.maxGap)
			}

			created := metricSum(t, w.Registry, "rtcedge_globalrelay_flows_created_total", map[string]string{"pop": "fra", "gen": "2"})
			restored := metricSum(t, w.Registry, "rtcedge_globalrelay_flows_restored_total", map[string]string{"pop": "fra", "gen": "2", "source": "cache"})
			switch tt.source {
			case "cache":
				if restored < 1 {
					t.Errorf("the new replica restored %v flows from the cache, want ≥ 1 (created %v from checks)", restored, created)
				}
			case "stun":
				if created < 1 {
					t.Errorf("the new replica created no flow from the client's consent check")
				}
			}
			if call.ConnectionState().String() != "connected" {
				t.Errorf("call state after the restart: %v", call.ConnectionState())
			}
		})
	}
}

// TestFlowMovesBetweenReplicas: two global relay replicas share the POP's
// address; the one carrying the call dies, the kernel sends the client's
// datagrams to the other, which has never seen the flow, finds it in Redis
// on the first datagram (a media packet, not a STUN check), and the return
// path follows the new replica. Without the cache lookup the flow would
// wait for the next consent check, and the restore counter would stay 0.
func TestFlowMovesBetweenReplicas(t *testing.T) {
	redis := testredis.Start(t)
	w := startWorld(t, devworld.Config{RedisURL: redis.URL(), WorkersPerPOP: 1, ProductionGossip: true})
	second, err := w.AddPOPReplica(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := dialFiltered(t, ctx, w, loopbackOnly) // one client address: the flow lives on one replica
	eventually(t, 5*time.Second, "25 echoes", func() bool { return call.Stats().Received >= 25 })

	rg := w.Regions[0]
	carrier, other := rg.POPReplicas[0], second
	if second.Relay.Flows() > 0 && carrier.Relay.Flows() == 0 {
		carrier, other = second, rg.POPReplicas[0]
	}
	if n := other.Relay.Flows(); n != 0 {
		t.Fatalf("the replica that is to take over already holds %d flows: the test would not need the cache", n)
	}
	restored := func() float64 {
		return metricSum(t, w.Registry, "rtcedge_globalrelay_flows_restored_total", map[string]string{"pop": "fra", "gen": "2", "source": "cache"})
	}
	if second != other {
		restored = func() float64 {
			return metricSum(t, w.Registry, "rtcedge_globalrelay_flows_restored_total", map[string]string{"pop": "fra", "gen": "1", "source": "cache"})
		}
	}
	before := call.Stats().Received
	carrier.Kill()
	eventually(t, 10*time.Second, "echo to resume through the other replica", func() bool {
		return call.Stats().Received >= before+50
	})
	gap, _ := call.Gaps()
	t.Logf("flow moved to the other replica: longest media gap %v", gap.Round(time.Millisecond))
	if n := restored(); n < 1 {
		t.Errorf("the surviving replica restored %v flows from Redis, want ≥ 1", n)
	}
	if gap >= 500*time.Millisecond {
		t.Errorf("media gap %v when the flow moved between replicas, want < 500 ms", gap)
	}
	if other.Relay.Flows() == 0 {
		t.Error("the surviving replica has no flow")
	}
}

// TestRedisDiesMidCall: with Redis gone, calls go on and new calls connect;
// the relays count the failed writes and never wait for Redis. The loss is
// measured over the outage only (from the kill to the end), on the call
// that was running and on one set up during the outage, at production
// gossip timings.
func TestRedisDiesMidCall(t *testing.T) {
	redis := testredis.Start(t)
	w := startWorld(t, devworld.Config{RedisURL: redis.URL(), ProductionGossip: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := dial(t, ctx, w)
	eventually(t, 5*time.Second, "25 echoes", func() bool { return call.Stats().Received >= 25 })
	atKill := call.Stats()
	redis.Kill()
	second := dial(t, ctx, w)
	secondStart := second.Stats()
	eventually(t, 5*time.Second, "failed cache writes to be counted", func() bool {
		return metricSum(t, w.Registry, "rtcedge_routecache_writes_total", map[string]string{"result": "error"}) > 0
	})
	// 8 s of audio from both calls (≈ 800 packets) through the outage.
	before := call.Stats().Received
	eventually(t, 15*time.Second, "8 s of echoes on the running call", func() bool { return call.Stats().Received >= before+400 })
	// Lost counts packets older than a second that never came back; the
	// same second is left out at both ends of the window.
	lost, sent := 0, 0
	for _, c := range []struct{ from, to probe.AudioStats }{{atKill, call.Stats()}, {secondStart, second.Stats()}} {
		lost += c.to.Lost - c.from.Lost
		sent += c.to.Sent - c.from.Sent
	}
	ratio := float64(lost) / float64(max(sent, 1))
	t.Logf("Redis down: %d of %d packets lost on two calls (%.2f %%)", lost, sent, 100*ratio)
	if ratio >= 0.005 {
		t.Errorf("loss while Redis was down %.2f %%, want < 0.5 %%", 100*ratio)
	}
}
