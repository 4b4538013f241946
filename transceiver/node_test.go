package transceiver_test

import (
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/backend/netbackend"
	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/transceiver"
)

// TestNodeReady: a pod is ready only with a cluster relay known from
// gossip and its network backend reachable; a drain makes it not ready.
func TestNodeReady(t *testing.T) {
	backend, err := netbackend.NewNode(netbackend.NodeConfig{Listen: "127.0.0.1:0"}, nil, nil, node.Env{Logger: nodetest.Quiet})
	if err != nil {
		t.Fatal(err)
	}
	stopBackend := nodetest.Run(t, backend)
	seed := nodetest.Member(t, "seed", false, membership.Meta{Role: membership.RoleTransceiver, Cluster: 9, Pod: 2,
		Data: netip.MustParseAddrPort("127.0.0.1:9")}, "")
	cfg := transceiver.Config{Cluster: 9, Pod: 1, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0",
		Token: nodetest.Keys(t), HopKeys: nodetest.HopKeys(t, 9), Gossip: nodetest.Gossip("pod-1", seed.LocalAddr().String())}
	socks, err := transceiver.OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := transceiver.NewNode(cfg, socks, netbackend.ForAddr(backend.Addr(), nodetest.Quiet), node.Env{Logger: nodetest.Quiet})
	if err != nil {
		t.Fatal(err)
	}
	nodetest.Run(t, n)
	nodetest.Await(t, "the pod to join the cluster pool", func() bool { return len(n.Pool().Members()) == 2 })
	if err := n.Ready(); !errors.Is(err, transceiver.ErrNoRelay) {
		t.Fatalf("Ready with no cluster relay = %v", err)
	}
	nodetest.Member(t, "cr-1", false, membership.Meta{Role: membership.RoleClusterRelay, Cluster: 9,
		Data: netip.MustParseAddrPort("127.0.0.1:10")}, seed.LocalAddr().String())
	nodetest.Await(t, "the pod to be ready", func() bool { return n.Ready() == nil })
	stopBackend()
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "backend") {
		t.Fatalf("Ready with the backend down = %v", err)
	}
	<-n.Transceiver().Drain()
	if err := n.Ready(); !errors.Is(err, transceiver.ErrDraining) {
		t.Fatalf("Ready while draining = %v", err)
	}
}

// TestNodeConfigNeedsKeys: a pod without routing-token keys is refused
// before it opens anything.
func TestNodeConfigNeedsKeys(t *testing.T) {
	_, err := transceiver.NewNode(transceiver.Config{Cluster: 9, Pod: 1, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", HopKeys: nodetest.HopKeys(t, 9),
		Gossip: nodetest.Gossip("pod-1", "")}, transceiver.Sockets{}, nil, node.Env{Logger: nodetest.Quiet})
	if err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("NewNode without keys = %v", err)
	}
}

// TestPodKeysFile: a pod configured with pod_keys (through its
// environment, as the key issuer's init container leaves it) takes its
// pod ID, token and hop keys from the file, and refuses keys issued for
// another pod.
func TestPodKeysFile(t *testing.T) {
	root := make([]byte, authority.KeyLen)
	sec, err := authority.Parse([]string{authority.Spec(9, 1, authority.ClusterSecret(root, 9))})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := sec.Pod(9, 4)
	path := filepath.Join(t.TempDir(), "pod.yaml")
	if err := k.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	t.Setenv(transceiver.EnvPodKeys, path)
	cfg := transceiver.Config{Cluster: 9, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", Gossip: nodetest.Gossip("pod", "")}
	if err := cfg.ApplyEnv(); err != nil {
		t.Fatal(err)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil || cfg.Pod != 4 || cfg.Keys == nil || cfg.Hop == nil || cfg.PodKeys == nil {
		t.Fatalf("config from pod keys: pod %d, keys %v, hop %v: %v", cfg.Pod, cfg.Keys != nil, cfg.Hop != nil, err)
	}
	if tok, err := cfg.Keys.Mint(9, 4); err != nil {
		t.Fatal(err)
	} else if relay, _ := sec.TokenKeyring(nil); relay != nil {
		if _, err := relay.Verify([]byte(tok)); err != nil {
			t.Errorf("the pod's token does not verify at a relay: %v", err)
		}
	}
	other := transceiver.Config{Cluster: 9, Pod: 5, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", Gossip: nodetest.Gossip("pod", "")}
	if err := other.ApplyEnv(); err != nil {
		t.Fatal(err)
	}
	other.Defaults()
	if err := other.Validate(); err == nil || !strings.Contains(err.Error(), "pod_keys") {
		t.Errorf("pod 5 with pod 4's keys: %v", err)
	}
}
