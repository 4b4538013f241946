package clusterrelay

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/udpio"
)

// TestNodeReadyAndDrain: a cluster relay node is not ready (and announces
// itself draining in the global pool) until gossip tells it of a ready pod;
// then ready and announced; on stop it announces draining, then leaves.
func TestNodeReadyAndDrain(t *testing.T) {
	seedPod := nodetest.Member(t, "pod-1", false, membership.Meta{Role: membership.RoleTransceiver, Cluster: 4, Pod: 1,
		Data: netip.MustParseAddrPort("127.0.0.1:9"), API: "http://127.0.0.1:9", Capacity: 10, Draining: true}, "")
	watcher := nodetest.Member(t, "signaling", true, membership.Meta{Role: membership.RoleSignaling}, "")
	metrics, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Cluster: 4, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0",
		Common: node.Common{DrainTimeout: 2 * time.Second}, HopKeys: nodetest.HopKeys(t, 4),
		ClusterGossip: nodetest.Gossip("cr", seedPod.LocalAddr().String()), GlobalGossip: nodetest.Gossip("cr", watcher.LocalAddr().String())}
	s, err := OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Metrics = metrics // the test's, in place of metrics_addr's
	// As in production: the data socket on the wildcard address, the
	// address others reach it at advertised.
	s.Data.Close()
	if s.Data, err = udpio.Listen(netip.MustParseAddrPort("0.0.0.0:0")); err != nil {
		t.Fatal(err)
	}
	cfg.DataAdvertise = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), udpio.LocalAddrPort(s.Data).Port()).String()
	n, err := NewNode(cfg, s, node.Env{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if !n.relay.io.EventLoop() {
		t.Error("the node's socket is not on an event loop, its default")
	}
	readyz := "http://" + metrics.Addr().String() + "/readyz"
	stop := nodetest.Run(t, n)
	announced := func(draining bool) func() bool {
		return func() bool {
			for _, m := range watcher.Members() {
				if m.Meta.Role == membership.RoleClusterRelay && m.State == membership.StateAlive && m.Meta.Draining == draining {
					return true
				}
			}
			return false
		}
	}
	nodetest.Await(t, "the node to learn the draining pod", func() bool { return len(n.Directory().PodInfos()) == 1 })
	if err := n.Ready(); !errors.Is(err, ErrNoReadyPod) {
		t.Fatalf("Ready with only a draining pod = %v", err)
	}
	if code := nodetest.Readyz(t, readyz); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d with no ready pod", code)
	}
	nodetest.Await(t, "the node to announce itself draining", announced(true))
	if err := seedPod.UpdateMeta(func(m *membership.Meta) { m.Draining = false }); err != nil {
		t.Fatal(err)
	}
	nodetest.Await(t, "the node to be ready", func() bool { return n.Ready() == nil })
	if code := nodetest.Readyz(t, readyz); code != http.StatusOK {
		t.Fatalf("/readyz = %d with a ready pod", code)
	}
	nodetest.Await(t, "the node to announce itself usable", announced(false))

	// A global relay's probe to the data address gossip announces is
	// answered: probes name that address, which the node gives its relay.
	var data netip.AddrPort
	for _, m := range watcher.Members() {
		if m.Meta.Role == membership.RoleClusterRelay {
			data = m.Meta.Data
		}
	}
	hop, err := cfg.HopKeys.Keyring(4)
	if err != nil {
		t.Fatal(err)
	}
	gr := listen(t)
	if _, err := gr.WriteToUDPAddrPort(hop.SealProbe(make([]byte, encap.ProbeLen), 4, 77, addrOf(gr), data), data); err != nil {
		t.Fatal(err)
	}
	if n, err := hop.OpenProbeAnswer(read(t, gr), addrOf(gr), data); err != nil || n != 77 {
		t.Errorf("probe to the announced data address %v: answer %v, %v", data, n, err)
	}

	go stop()
	nodetest.Await(t, "the stopping node to announce draining", announced(true))
	nodetest.Await(t, "the node to leave the global pool", func() bool {
		for _, m := range watcher.Members() {
			if m.Meta.Role == membership.RoleClusterRelay {
				return m.State == membership.StateLeft
			}
		}
		return true
	})
}
