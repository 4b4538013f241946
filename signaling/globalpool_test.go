package signaling_test

import (
	"crypto/rand"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
	"github.com/rtcedge/rtcedge/signaling"
)

// TestGlobalPoolClaimsNeedProof: members holding the global pool's
// gossip key claim to be cluster 1's relays (with a huge capacity and
// their own session API), POP 2's global relay, and signaling — one
// without any proof, one proving with cluster 2's relay key, one with
// POP 1's key. Signaling, holding the public keys, uses only the honest
// relay of cluster 1 and counts the others as refused.
func TestGlobalPoolClaimsNeedProof(t *testing.T) {
	root := make([]byte, authority.KeyLen)
	if _, err := rand.Read(root); err != nil {
		t.Fatal(err)
	}
	parse := func(specs ...string) *authority.Secrets {
		t.Helper()
		s, err := authority.Parse(specs)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	c1 := parse(authority.Spec(1, 1, authority.ClusterSecret(root, 1)))
	c2 := parse(authority.Spec(2, 1, authority.ClusterSecret(root, 2)))
	p1 := parse(authority.POPSpec(1, 1, authority.POPSecret(root, 1)))
	all := parse(authority.Spec(1, 1, authority.ClusterSecret(root, 1)), authority.Spec(2, 1, authority.ClusterSecret(root, 2)),
		authority.Spec(3, 1, authority.ClusterSecret(root, 3)),
		authority.POPSpec(1, 1, authority.POPSecret(root, 1)), authority.POPSpec(2, 1, authority.POPSecret(root, 2)),
		authority.POPSpec(3, 1, authority.POPSecret(root, 3)))
	keys := append([]string{authority.SignalingSpec(1, authority.SignalingSecret(root))}, all.PublicSpecs()...)

	reg := prometheus.NewRegistry()
	cfg := signaling.Config{ListenAddr: "127.0.0.1:0", AllowAnonymous: true, DrainDelay: time.Millisecond, Catalogue: filepath.Join("..", "geo", "testdata", "catalogue.yaml"),
		Gossip: nodetest.Gossip("signaling", ""), Authority: node.Authority{Keys: keys}}
	s, err := signaling.OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := signaling.NewNode(cfg, s, node.Env{Logger: nodetest.Quiet, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer nodetest.Run(t, n)()
	seed := n.Pool().LocalAddr().String()

	prove := func(sec *authority.Secrets, m membership.Meta) func([]byte) []byte {
		t.Helper()
		p, err := sec.GlobalProve(m)
		if err != nil || p == nil {
			t.Fatalf("GlobalProve(%v): %v", m.Role, err)
		}
		return p
	}
	relay := func(api string, load, capacity int) membership.Meta {
		return membership.Meta{Role: membership.RoleClusterRelay, Region: "eu-central", Cluster: 1,
			Data: netip.MustParseAddrPort("127.0.0.1:7100"), API: api, Load: load, Capacity: capacity}
	}
	rogue := relay("http://127.0.0.1:9999", 0, 90_000)
	pop2 := membership.Meta{Role: membership.RoleGlobalRelay, Region: "us-east", POP: 2, Data: netip.MustParseAddrPort("127.0.0.3:3478")}
	rogues := []struct {
		name  string
		meta  membership.Meta
		prove func([]byte) []byte
	}{
		{"rogue-unproven", rogue, nil},
		{"rogue-cluster-2-key", rogue, prove(c2, membership.Meta{Role: membership.RoleClusterRelay, Cluster: 2})},
		{"rogue-pop-unproven", pop2, nil},
		{"rogue-pop-1-key", pop2, prove(p1, membership.Meta{Role: membership.RoleGlobalRelay, POP: 1})},
		{"rogue-signaling", membership.Meta{Role: membership.RoleSignaling}, prove(p1, membership.Meta{Role: membership.RoleGlobalRelay, POP: 1})},
	}
	for _, r := range rogues {
		nodetest.ProvenMember(t, r.name, true, r.meta, seed, r.prove)
	}
	honestMeta := relay("http://127.0.0.1:8081", 5, 10)
	nodetest.ProvenMember(t, "honest", true, honestMeta, seed, prove(c1, honestMeta))

	h := signaling.GossipHealth{Pool: n.Pool()}
	refused := func() float64 {
		return testmetrics.Take(t, reg)["rtcedge_membership_meta_decode_errors_total,pool=global"]
	}
	nodetest.Await(t, "every member seen", func() bool {
		names := map[string]bool{}
		for _, m := range n.Pool().Members() {
			names[m.Name] = true
		}
		seen := 0
		for _, r := range rogues {
			if names[r.name] {
				seen++
			}
		}
		return names["honest"] && seen+int(refused()) >= len(rogues)
	})
	if apis := h.SessionAPIs(1); !slices.Equal(apis, []string{honestMeta.API}) {
		t.Errorf("cluster 1's session APIs = %v, want only the honest relay's", apis)
	}
	if st, _ := h.Cluster(1); st.Capacity != 10 || st.Load != 5 {
		t.Errorf("cluster 1 = %+v, want the honest relay's load 5 of 10", st)
	}
	if h.POPUp(2) {
		t.Error("POP 2 is up on the word of a member without its key")
	}
	for _, m := range n.Pool().Members() {
		if m.Name != "honest" && m.Name != n.Pool().Name() {
			t.Errorf("member %s (%s) admitted", m.Name, m.Meta.Role)
		}
	}
	if got := refused(); got < float64(len(rogues)) {
		t.Errorf("refusals counted = %v, want ≥ %d", got, len(rogues))
	}
}

// TestAuthorityFileReloads: a running signaling replica re-reads
// authority.file. A cluster relay proving itself under a new cluster
// secret (key ID 2) is ignored until the file lists its public key, then
// used without a restart and without an update of its own; a malformed
// file changes nothing (counted once); a file without the old key drops
// the relay proven by it.
func TestAuthorityFileReloads(t *testing.T) {
	secret := func() []byte { return nodetest.Secret(t) }
	parse := func(specs ...string) *authority.Secrets {
		t.Helper()
		s, err := authority.Parse(specs)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	oldC, newC := parse(authority.Spec(1, 1, secret())), parse(authority.Spec(1, 2, secret()))
	oldPub, newPub := oldC.PublicSpecs()[0], newC.PublicSpecs()[0]
	sig := authority.SignalingSpec(1, secret())
	path, write := nodetest.KeyFile(t)
	write(sig, oldPub)

	reg := prometheus.NewRegistry()
	cfg := signaling.Config{ListenAddr: "127.0.0.1:0", AllowAnonymous: true, DrainDelay: time.Millisecond,
		Catalogue: filepath.Join("..", "geo", "testdata", "catalogue.yaml"),
		Gossip:    nodetest.Gossip("signaling", ""), Authority: node.Authority{File: path}}
	s, err := signaling.OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := signaling.NewNode(cfg, s, node.Env{Logger: nodetest.Quiet, Registerer: reg, KeysReload: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer nodetest.Run(t, n)()
	seed := n.Pool().LocalAddr().String()
	relay := func(name, api string, sec *authority.Secrets) {
		t.Helper()
		m := membership.Meta{Role: membership.RoleClusterRelay, Region: "eu-central", Cluster: 1,
			Data: netip.MustParseAddrPort("127.0.0.1:7100"), API: api, Capacity: 10}
		prove, err := sec.GlobalProve(m)
		if err != nil {
			t.Fatal(err)
		}
		nodetest.ProvenMember(t, name, true, m, seed, prove)
	}
	const oldAPI, newAPI = "http://127.0.0.1:8081", "http://127.0.0.1:8091"
	relay("cr-new", newAPI, newC)
	relay("cr-old", oldAPI, oldC)
	h := signaling.GossipHealth{Pool: n.Pool()}
	metric := func(key string) float64 { return testmetrics.Take(t, reg)[key] }
	reloads := func(result string) float64 {
		return metric("rtcedge_key_reloads_total,keys=authority,result=" + result)
	}
	apis := func(want ...string) func() bool {
		return func() bool { return slices.Equal(h.SessionAPIs(1), want) }
	}
	nodetest.Await(t, "the old relay used and the new one refused", func() bool {
		return apis(oldAPI)() && metric("rtcedge_membership_meta_decode_errors_total,pool=global") >= 1
	})

	write(sig, "relay-pub:1/2:garbage", oldPub)
	nodetest.Await(t, "the malformed file refused", func() bool { return reloads("invalid") == 1 })
	if got := h.SessionAPIs(1); !slices.Equal(got, []string{oldAPI}) {
		t.Fatalf("after a malformed file, cluster 1's APIs = %v, want only the old relay's", got)
	}

	write(sig, newPub, oldPub)
	nodetest.Await(t, "the relay proven under the new key used", apis(newAPI, oldAPI)) // by member name
	write(sig, newPub)
	nodetest.Await(t, "the relay proven under the removed key dropped", apis(newAPI))
	if got := reloads("ok"); got != 2 {
		t.Errorf("applied reloads = %v, want 2", got)
	}
	if got := reloads("invalid"); got != 1 {
		t.Errorf("refused reloads = %v, want 1 (counted once)", got)
	}
}
