package globalrelay

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/token"
)

// fakeClusterRelay joins the global pool as a cluster relay of cluster
// announces (what clusterrelay.Node gossips): real memberlist, no relay.
func fakeClusterRelay(t *testing.T, name string, cluster uint16, draining bool, seed string) *membership.Pool {
	t.Helper()
	p, err := membership.New(membership.Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), WAN: true,
		AllowInsecure: true, Fast: true, Logger: quiet}, membership.Meta{
		Role: membership.RoleClusterRelay, Cluster: cluster, Data: netip.MustParseAddrPort("127.0.0.1:9"),
		API: "http://127.0.0.1:9", Capacity: 10, Draining: draining})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if seed != "" {
		if _, err := p.Join([]string{seed}); err != nil {
			t.Fatal(err)
		}
	}
	return p
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
	n, err := NewNode(NodeConfig{POP: 1, PublicAddr: public, InternalAddr: "127.0.0.1", Workers: 1, Clusters: []uint16{1, 2},
		Token: keys, Gossip: node.Gossip{Bind: "127.0.0.1:0", Join: []string{seed}, Insecure: true, Fast: true, Name: "gr"}},
		Sockets{Metrics: metrics}, node.Env{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	run := func() func() {
		go func() { done <- n.Run(context.Background()) }()
		return func() {
			n.Close()
			if err := <-done; err != nil {
				t.Errorf("replica: %v", err)
			}
		}
	}
	t.Cleanup(func() { n.Close() })
	return n, "http://" + metrics.Addr().String() + "/readyz", run
}

func readyz(t *testing.T, url string) int {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRestartedReplicaNotReadyUntilItKnowsClusterRelays: a replica that
// is not draining is still not ready — /readyz 503 — until gossip has told
// it a live cluster relay of every cluster it serves; a draining relay
// does not count. A replica restarted on the same public address starts
// over: not ready until it has heard of them again.
func TestRestartedReplicaNotReadyUntilItKnowsClusterRelays(t *testing.T) {
	key := make([]byte, token.KeyLen)
	_, _ = rand.Read(key)
	keys := node.TokenKeys{Keys: []string{"1:" + base64.StdEncoding.EncodeToString(key)}}
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
	await(t, "the replica to know cluster 1", func() bool { return first.clusters.live(1) == 1 })
	notReadyFor2 := func(n *Node, url string) {
		t.Helper()
		if err := n.Ready(); !errors.Is(err, ErrNoClusterRelay) || !strings.Contains(err.Error(), "cluster 2") {
			t.Fatalf("Ready with cluster 2's relay draining = %v, want ErrNoClusterRelay for cluster 2", err)
		}
		if n.Relay().Draining() {
			t.Fatal("replica draining")
		}
		if code := readyz(t, url); code != http.StatusServiceUnavailable {
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
	await(t, "the replica to be ready", func() bool { return first.Ready() == nil })
	if code := readyz(t, url); code != http.StatusOK {
		t.Fatalf("/readyz = %d once both clusters have a live relay", code)
	}

	// Cluster 2's relay drains again (no ready pod); the replica crashes
	// and restarts on the same public address: it knows nothing, then
	// cluster 1 only, and is not ready until cluster 2's relay is live.
	setDraining(true)
	await(t, "the seed to see cluster 2's relay draining", func() bool {
		for _, m := range c1.Members() {
			if m.Meta.Cluster == 2 && m.Meta.Draining {
				return true
			}
		}
		return false
	})
	stop()
	restarted, url, run := startReplica(t, public, seed, keys)
	if got := restarted.Relay().PublicAddr().String(); got != public {
		t.Fatalf("restarted on %s, want %s", got, public)
	}
	if err := restarted.Ready(); !errors.Is(err, ErrNoClusterRelay) {
		t.Fatalf("restarted replica ready before it has gossiped: %v", err)
	}
	defer run()()
	await(t, "the restarted replica to know cluster 1", func() bool { return restarted.clusters.live(1) == 1 })
	notReadyFor2(restarted, url)
	setDraining(false)
	await(t, "the restarted replica to be ready", func() bool { return restarted.Ready() == nil })
	if code := readyz(t, url); code != http.StatusOK {
		t.Fatalf("restarted replica's /readyz = %d once ready", code)
	}
}
