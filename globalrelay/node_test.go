package globalrelay

// Tests of Node: readiness (cluster relays known, routes restored),
// drain.

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/routecache"
	"github.com/rtcedge/rtcedge/internal/testredis"
)

// fakeClusterRelay joins the global pool as a cluster relay of cluster
// (what clusterrelay.Node announces): real memberlist, no relay.
func fakeClusterRelay(t *testing.T, name string, cluster uint16, draining bool, seed string) *membership.Pool {
	return nodetest.Member(t, name, true, membership.Meta{Role: membership.RoleClusterRelay, Cluster: cluster,
		Data: netip.MustParseAddrPort("127.0.0.1:9"), API: "http://127.0.0.1:9", Capacity: 10, Draining: draining}, seed)
}

// startReplica builds a replica of POP 1 serving clusters 1 and 2 on
// public, joining seed, with its /readyz on a listener of its own; run
// starts it and returns its stop.
func startReplica(t *testing.T, public, seed string, keys node.TokenKeys) (*Node, string, func() func()) {
	t.Helper()
	metrics, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n, err := newNode(t, Config{POP: 1, PublicAddr: public, InternalAddr: "127.0.0.1", Workers: 1, Clusters: []uint16{1, 2},
		Token: keys, HopKeys: nodetest.HopKeys(t, 1, 2), Gossip: nodetest.Gossip("gr", seed)}, metrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, "http://" + metrics.Addr().String() + "/readyz", func() func() { return nodetest.Run(t, n) }
}

// TestRestartedReplicaNotReadyUntilItKnowsClusterRelays: a replica that
// is not draining is still not ready — /readyz 503 — until gossip has told
// it a live cluster relay of every cluster it serves; a draining relay
// does not count. A replica restarted on the same public address starts
// over: not ready until it has heard of them again.
func TestRestartedReplicaNotReadyUntilItKnowsClusterRelays(t *testing.T) {
	keys := nodetest.Keys(t)
	c1 := fakeClusterRelay(t, "cr-1", 1, false, "")
	seed := c1.LocalAddr().String()
	c2 := fakeClusterRelay(t, "cr-2", 2, true, seed) // draining: knows no ready pod yet

	first, url, run := startReplica(t, "127.0.0.1:0", seed, keys)
	if err := first.Ready(); !errors.Is(err, ErrNoClusterRelay) {
		t.Fatalf("replica ready before it has gossiped: %v", err)
	}
	stop := run()
	public := first.Relay().PublicAddr().String()
	// It learns cluster 1's relay; cluster 2's is draining, so not ready.
	nodetest.Await(t, "the replica to know cluster 1", func() bool { return first.clusters.live(1) == 1 })
	notReadyFor2 := func(n *Node, url string) {
		t.Helper()
		if err := n.Ready(); !errors.Is(err, ErrNoClusterRelay) || !strings.Contains(err.Error(), "cluster 2") {
			t.Fatalf("Ready with cluster 2's relay draining = %v, want ErrNoClusterRelay for cluster 2", err)
		}
		if n.Relay().Draining() {
			t.Fatal("replica draining")
		}
		if code := nodetest.Readyz(t, url); code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz = %d while cluster 2 has no live relay", code)
		}
	}
	notReadyFor2(first, url)
	setDraining := func(d bool) {
		if err := c2.UpdateMeta(func(m *membership.Meta) { m.Draining = d }); err != nil {
			t.Fatal(err)
		}
	}
	setDraining(false)
	nodetest.Await(t, "the replica to be ready", func() bool { return first.Ready() == nil })
	if code := nodetest.Readyz(t, url); code != http.StatusOK {
		t.Fatalf("/readyz = %d once both clusters have a live relay", code)
	}

	// Cluster 2's relay drains again (no ready pod): the running replica
	// stays ready (the gate is passed once; cluster 2 going away must not
	// take cluster 1's calls down with the whole POP). The replica crashes
	// and restarts on the same public address: it knows nothing, then
	// cluster 1 only, and is not ready until cluster 2's relay is live.
	setDraining(true)
	nodetest.Await(t, "the seed to see cluster 2's relay draining", func() bool {
		for _, m := range c1.Members() {
			if m.Meta.Cluster == 2 && m.Meta.Draining {
				return true
			}
		}
		return false
	})
	nodetest.Await(t, "the replica to see cluster 2's relay draining", func() bool { return first.clusters.live(2) == 0 })
	if err := first.Ready(); err != nil {
		t.Fatalf("a ready replica turned not ready when one cluster lost its relays: %v", err)
	}
	first.Close() // a crash: no drain, no goodbye
	stop()
	restarted, url, run := startReplica(t, public, seed, keys)
	if got := restarted.Relay().PublicAddr().String(); got != public {
		t.Fatalf("restarted on %s, want %s", got, public)
	}
	if err := restarted.Ready(); !errors.Is(err, ErrNoClusterRelay) {
		t.Fatalf("restarted replica ready before it has gossiped: %v", err)
	}
	defer run()()
	nodetest.Await(t, "the restarted replica to know cluster 1", func() bool { return restarted.clusters.live(1) == 1 })
	notReadyFor2(restarted, url)
	setDraining(false)
	nodetest.Await(t, "the restarted replica to be ready", func() bool { return restarted.Ready() == nil })
	if code := nodetest.Readyz(t, url); code != http.StatusOK {
		t.Fatalf("restarted replica's /readyz = %d once ready", code)
	}
}

// TestNodeDrainsUntilFlowsEnd: a stopping replica announces draining,
// keeps its flows until they go idle, then leaves the pool and returns —
// well before drain_timeout.
func TestNodeDrainsUntilFlowsEnd(t *testing.T) {
	watcher := fakeClusterRelay(t, "cr-1", 1, false, "")
	hop := nodetest.HopKeys(t, 1)
	n, err := newNode(t, Config{POP: 1, PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1", Workers: 1,
		FlowIdle: 500 * time.Millisecond, ReadyWait: time.Minute, Common: node.Common{DrainTimeout: time.Minute},
		Token: nodetest.Keys(t), HopKeys: hop, Gossip: nodetest.Gossip("gr", watcher.LocalAddr().String())}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !n.Relay().io.EventLoop() {
		t.Error("the node's workers are not on event loops, its default")
	}
	stop := nodetest.Run(t, n)
	nodetest.Await(t, "the replica to be ready", func() bool { return n.Ready() == nil })
	// A cache entry as another replica sealed it.
	client, rt := netip.MustParseAddrPort("192.0.2.1:5000"), routecache.Route{Cluster: 1, Pod: 1}
	keys, err := hop.ClusterKeys()
	if err != nil {
		t.Fatal(err)
	}
	rt.Stored = uint32(time.Now().Unix())
	rt.KeyID, rt.Tag = keys.For(1).SealRoute(client, 1, 1, rt.Token, rt.Stored)
	n.Relay().RestoreFlow(client, rt)
	if n.Relay().Flows() != 1 {
		t.Fatalf("%d flows", n.Relay().Flows())
	}
	start := time.Now()
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	nodetest.Await(t, "the replica to announce draining", func() bool {
		for _, m := range watcher.Members() {
			if m.Meta.Role == membership.RoleGlobalRelay && m.Meta.Draining {
				return true
			}
		}
		return false
	})
	if err := n.Ready(); err == nil {
		t.Error("ready while draining")
	}
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the drain did not end when the flow went idle")
	}
	if n.Relay().Flows() != 0 {
		t.Errorf("stopped with %d flows", n.Relay().Flows())
	}
	t.Logf("drained in %v", time.Since(start))
}

// TestRestartedReplicaLoadsRoutesBeforeReady: a replica started over a
// Redis that holds its POP's flows loads them all in bulk and holds them
// by the time it first reports ready, before any client datagram.
func TestRestartedReplicaLoadsRoutesBeforeReady(t *testing.T) {
	const flows = 500
	redis := testredis.Start(t)
	hop := nodetest.HopKeys(t, 1, 2)
	keys, err := hop.ClusterKeys()
	if err != nil {
		t.Fatal(err)
	}
	writer, err := routecache.Open(redis.URL(), routecache.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go writer.Run(ctx)
	for i := range flows {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 5000)
		r := routecache.Route{Cluster: 1, Pod: 3, Token: [6]byte{0, 0, 0, 0, byte(i >> 8), byte(i)}, Stored: uint32(time.Now().Unix())}
		r.KeyID, r.Tag = keys.For(1).SealRoute(client, r.Cluster, r.Pod, r.Token, r.Stored)
		writer.Store(client, r)
	}
	if err := writer.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	writer.Close()

	c1 := fakeClusterRelay(t, "cr-1", 1, false, "")
	fakeClusterRelay(t, "cr-2", 2, false, c1.LocalAddr().String())
	n, err := newNode(t, Config{POP: 1, PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1", Workers: 1, Clusters: []uint16{1, 2},
		HopKeys: hop, RedisURL: redis.URL(), Token: nodetest.Keys(t), Gossip: nodetest.Gossip("gr", c1.LocalAddr().String())},
		nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if err := n.Ready(); !errors.Is(err, ErrRestoring) {
		t.Fatalf("Ready before the load = %v, want ErrRestoring", err)
	}
	nodetest.Run(t, n) // Cleanup closes it (a graceful stop would wait for the flows to go idle)
	nodetest.Await(t, "the replica to be ready", func() bool { return n.Ready() == nil })
	if got := n.Relay().Flows(); got != flows {
		t.Errorf("ready with %d flows, want the %d from Redis", got, flows)
	}
}

// TestNodeTCPIngressDrains: with tcp_addr set the node accepts TCP; on
// SIGTERM (ctx end) its listener closes at once, so new clients are
// refused and try their next candidate, while the drain waits for the open
// connection before the node stops.
func TestNodeTCPIngressDrains(t *testing.T) {
	c1 := fakeClusterRelay(t, "cr-1", 1, false, "")
	metrics, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{POP: 1, PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1", TCPAddr: "127.0.0.1:0", Workers: 1,
		TCP:   TCPConfig{HandshakeTimeout: time.Minute},
		Token: nodetest.Keys(t), HopKeys: nodetest.HopKeys(t, 1), Gossip: nodetest.Gossip("gr", c1.LocalAddr().String())}
	cfg.DrainTimeout = time.Minute
	n, err := newNode(t, cfg, metrics)
	if err != nil {
		t.Fatal(err)
	}
	stop := nodetest.Run(t, n)
	addr := n.TCP().Addr()
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nodetest.Await(t, "the connection to be open at the node", func() bool { return n.TCPConns() == 1 })
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	nodetest.Await(t, "the listener to close", func() bool {
		nc, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(addr))
		if err == nil {
			nc.Close()
		}
		return err != nil
	})
	// The absence of an event: without the wait, the node stops within
	// about a second (its gossip leave); give it three.
	select {
	case <-stopped:
		t.Fatal("the node stopped with a TCP connection still open")
	case <-time.After(3 * time.Second):
	}
	c.Close()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the node did not stop after its last TCP connection closed")
	}
}

// newNode builds a node on the sockets cfg names, with metrics (when not
// nil) for its metrics listener.
func newNode(t testing.TB, cfg Config, metrics net.Listener) (*Node, error) {
	t.Helper()
	s, err := OpenSockets(cfg)
	if err != nil {
		return nil, err
	}
	if metrics != nil {
		s.Metrics = metrics
	}
	return NewNode(cfg, s, node.Env{Logger: quiet})
}
