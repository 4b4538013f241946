package globalrelay

// Tests of the authority file's reload by a running node.

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/token"
)

// TestAuthorityFileReloads: a running global relay given authority.file
// takes a rotated file without a restart. A token minted by a pod under
// a new cluster secret (key ID 2) is dropped as unknown_key, and so it
// stays while the file is malformed (refused once, counted, the old keys
// kept: a token under ID 1 still opens a flow); once the file lists the
// new secret beside the old, the same token is forwarded to the cluster
// relay. Real sockets and gossip throughout.
func TestAuthorityFileReloads(t *testing.T) {
	secret := func() []byte { return nodetest.Secret(t) }
	oldSpec, newSpec := authority.Spec(1, 1, secret()), authority.Spec(1, 2, secret())
	path, write := nodetest.KeyFile(t)
	write(oldSpec)
	podToken := func(spec string) string {
		t.Helper()
		sec, err := authority.Parse([]string{spec})
		if err != nil {
			t.Fatal(err)
		}
		k, err := sec.Pod(1, 3)
		if err != nil {
			t.Fatal(err)
		}
		id, key, err := token.ParseKeySpec(k.Token[0])
		if err != nil {
			t.Fatal(err)
		}
		ring, err := token.NewKeyring(id, map[uint8][]byte{id: key})
		if err != nil {
			t.Fatal(err)
		}
		ufrag, err := ring.Mint(1, 3)
		if err != nil {
			t.Fatal(err)
		}
		return ufrag
	}
	oldUfrag, newUfrag := podToken(oldSpec), podToken(newSpec)

	// The cluster relay: a socket that receives what the POP forwards,
	// announced in the global pool with cluster 1's relay proof.
	cr := listen(t)
	crSec, err := authority.Parse([]string{oldSpec})
	if err != nil {
		t.Fatal(err)
	}
	crMeta := membership.Meta{Role: membership.RoleClusterRelay, Cluster: 1, Data: addrOf(cr), API: "http://127.0.0.1:9", Capacity: 10}
	prove, err := crSec.GlobalProve(crMeta)
	if err != nil {
		t.Fatal(err)
	}
	seed := nodetest.ProvenMember(t, "cr-1@global", true, crMeta, "", prove).LocalAddr().String()

	reg := prometheus.NewRegistry()
	cfg := Config{Common: node.Common{DrainTimeout: time.Second}, POP: 1, PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1", Workers: 1, Clusters: []uint16{1},
		Authority: node.Authority{File: path}, Gossip: nodetest.Gossip("gr", seed)}
	s, err := OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(cfg, s, node.Env{Logger: quiet, Registerer: reg, KeysReload: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer nodetest.Run(t, n)()
	nodetest.Await(t, "the replica to be ready", func() bool { return n.Ready() == nil })

	pub := n.Relay().PublicAddr()
	// check sends a Binding Request with ufrag from a fresh source port
	// (a new flow each time) and waits for either the cluster relay to
	// receive it or the unknown_key drop to count it.
	buf := make([]byte, 2048)
	check := func(ufrag string) (forwarded bool) {
		t.Helper()
		c := listen(t)
		drops := counter(t, reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "token_unknown_key")
		if _, err := c.WriteToUDPAddrPort(bindingRequest(t, ufrag), pub); err != nil {
			t.Fatal(err)
		}
		got := make(chan bool, 1)
		go func() {
			_ = cr.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _, err := cr.ReadFromUDPAddrPort(buf)
			got <- err == nil
		}()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case ok := <-got:
				return ok
			default:
			}
			if counter(t, reg, "rtcedge_globalrelay_dropped_packets_total", "reason", "token_unknown_key") > drops {
				_ = cr.SetReadDeadline(time.Now()) // end the read
				if <-got {
					t.Fatal("a dropped check reached the cluster relay")
				}
				return false
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatal("the check was neither forwarded nor dropped")
		return false
	}
	reloads := func(result string) float64 {
		return counter(t, reg, "rtcedge_key_reloads_total", "result", result)
	}

	if !check(oldUfrag) {
		t.Fatal("a token under the first secret was not forwarded")
	}
	if check(newUfrag) {
		t.Fatal("a token under a secret the relay does not hold was forwarded")
	}
	write("1/2:not-base64-at-all", oldSpec)
	nodetest.Await(t, "the malformed file to be refused", func() bool { return reloads("invalid") == 1 })
	if check(newUfrag) {
		t.Fatal("a malformed file changed the keys")
	}
	if !check(oldUfrag) {
		t.Fatal("a malformed file dropped the keys in use")
	}
	write(newSpec, oldSpec)
	nodetest.Await(t, "the rotated file to be applied", func() bool { return reloads("ok") == 1 })
	if !check(newUfrag) {
		t.Fatal("a token under the new secret was not forwarded after the reload")
	}
	if !check(oldUfrag) {
		t.Fatal("a token under the old secret stopped working while both are listed")
	}
	if got := reloads("invalid"); got != 1 {
		t.Errorf("invalid reloads = %v: a refused file must be counted once", got)
	}
}
