package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/testredis"
)

// TestGlobalRelayRestart restarts the POP's global relay mid-call (a new
// replica on the same public address, empty flow table) and measures how
// long the echo stops, with the flow shared through real Redis, through the
// dev world's in-process store, and with no shared cache at all (then the
// flow comes back with the client's next consent check).
func TestGlobalRelayRestart(t *testing.T) {
	tests := []struct {
		name   string
		cfg    func(t *testing.T) devworld.Config
		source string // how the new replica must have recovered the flow
	}{
		{"redis", func(t *testing.T) devworld.Config {
			return devworld.Config{RedisURL: testredis.Start(t).URL(), WorkersPerPOP: 1}
		}, "cache"},
		{"in-process store", func(*testing.T) devworld.Config { return devworld.Config{WorkersPerPOP: 1} }, "cache"},
		{"no cache", func(*testing.T) devworld.Config { return devworld.Config{NoRouteCache: true, WorkersPerPOP: 1} }, "stun"},
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
			t.Logf("%s: global relay restarted; echo resumed within %v, longest media gap %v", tt.name, time.Since(start), gap)

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
// datagrams to the other, which finds the flow in Redis on the first one,
// and the return path follows the new replica.
func TestFlowMovesBetweenReplicas(t *testing.T) {
	redis := testredis.Start(t)
	w := startWorld(t, devworld.Config{RedisURL: redis.URL(), WorkersPerPOP: 1})
	second, err := w.AddPOPReplica(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := dial(t, ctx, w)
	eventually(t, 5*time.Second, "25 echoes", func() bool { return call.Stats().Received >= 25 })

	rg := w.Regions[0]
	carrier, other := rg.POPReplicas[0], second
	if second.Relay.Flows() > 0 && carrier.Relay.Flows() == 0 {
		carrier, other = second, rg.POPReplicas[0]
	}
	before := call.Stats().Received
	carrier.Kill()
	eventually(t, 10*time.Second, "echo to resume through the other replica", func() bool {
		return call.Stats().Received >= before+50
	})
	gap, _ := call.Gaps()
	t.Logf("flow moved to the other replica: longest media gap %v", gap)
	if other.Relay.Flows() == 0 {
		t.Error("the surviving replica has no flow")
	}
}

// TestRedisDiesMidCall: with Redis gone, calls go on and new calls connect;
// the relays count the failed writes and never wait for Redis.
func TestRedisDiesMidCall(t *testing.T) {
	redis := testredis.Start(t)
	w := startWorld(t, devworld.Config{RedisURL: redis.URL()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := dial(t, ctx, w)
	redis.Kill()
	before := call.Stats().Received
	eventually(t, 5*time.Second, "the call to keep echoing", func() bool { return call.Stats().Received >= before+50 })
	second := dial(t, ctx, w)
	eventually(t, 5*time.Second, "a new call to echo", func() bool { return second.Stats().Received >= 25 })
	eventually(t, 5*time.Second, "failed cache writes to be counted", func() bool {
		return metricSum(t, w.Registry, "rtcedge_routecache_writes_total", map[string]string{"result": "error"}) > 0
	})
	t.Logf("loss while Redis was down: %.2f%%", 100*call.Stats().LossRatio())
}
