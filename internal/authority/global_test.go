package authority

import (
	"crypto/rand"
	"net/netip"
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/internal/membership"
)

// TestGlobalPoolProofs: in the global pool a cluster relay speaks only
// for its own cluster, a global relay only for its POP, signaling only
// with its key; a cluster-pool proof does not pass for a global one; a
// proven cluster relay's addresses must be on its gossip address;
// verifiers check with public keys, strict ones refuse scopes they have
// no key of.
func TestGlobalPoolProofs(t *testing.T) {
	root := make([]byte, KeyLen)
	if _, err := rand.Read(root); err != nil {
		t.Fatal(err)
	}
	mustParse := func(specs ...string) *Secrets {
		t.Helper()
		s, err := Parse(specs)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	c1, c2 := Spec(1, 1, ClusterSecret(root, 1)), Spec(2, 1, ClusterSecret(root, 2))
	p1, p2 := POPSpec(1, 1, POPSecret(root, 1)), POPSpec(2, 1, POPSecret(root, 2))
	sig := SignalingSpec(1, SignalingSecret(root))
	issuer := mustParse(c1, c2, p1, p2, sig)
	pubs := issuer.PublicSpecs()
	if len(pubs) != 5 || !strings.HasPrefix(pubs[0], "relay-pub:1/1:") || !strings.HasPrefix(pubs[4], "signaling-pub/1:") {
		t.Fatalf("public specs %q", pubs)
	}
	for _, p := range pubs {
		if strings.Contains(p, strings.SplitN(c1, ":", 2)[1]) {
			t.Fatal("a public spec carries a secret")
		}
	}
	relay1, relay2, pop1 := mustParse(c1), mustParse(c2), mustParse(p1)
	signaling := mustParse(append([]string{sig}, pubs[:4]...)...)
	globalRelay := mustParse(c1, p1)       // serves cluster 1 only
	clusterRelay := mustParse(c1, pubs[4]) // knows signaling's public key

	at := netip.MustParseAddrPort("10.1.0.5:7947")
	crMeta := membership.Meta{Role: membership.RoleClusterRelay, Cluster: 1, Data: netip.MustParseAddrPort("10.1.0.5:7100"),
		API: "http://10.1.0.5:8080", Capacity: 10}
	prove := func(s *Secrets, m membership.Meta) func([]byte) []byte {
		t.Helper()
		p, err := s.GlobalProve(m)
		if err != nil || p == nil {
			t.Fatalf("GlobalProve %s: %v", m.Role, err)
		}
		return p
	}
	clusterPoolProof, err := relay1.RelayProve(1)
	if err != nil {
		t.Fatal(err)
	}
	with := func(m membership.Meta, f func(*membership.Meta)) membership.Meta { f(&m); return m }
	popMeta := membership.Meta{Role: membership.RoleGlobalRelay, POP: 1, Data: netip.MustParseAddrPort("203.0.113.1:3478")}
	sigMeta := membership.Meta{Role: membership.RoleSignaling}
	none := func([]byte) []byte { return nil }
	type verdicts struct{ signaling, globalRelay, clusterRelay bool } // admitted by each
	for _, tc := range []struct {
		name  string
		meta  membership.Meta
		prove func([]byte) []byte
		want  verdicts
	}{
		{"cluster 1 relay", crMeta, prove(relay1, crMeta), verdicts{true, true, true}},
		{"cluster 1 claimed with cluster 2's key", crMeta, prove(relay2, with(crMeta, func(m *membership.Meta) { m.Cluster = 2 })), verdicts{false, false, false}},
		{"cluster 1 claimed without proof", crMeta, none, verdicts{false, false, false}},
		{"cluster-pool proof", crMeta, clusterPoolProof, verdicts{false, false, false}},
		{"data elsewhere", with(crMeta, func(m *membership.Meta) { m.Data = netip.MustParseAddrPort("10.9.9.9:7100") }), nil, verdicts{false, false, false}},
		{"API elsewhere", with(crMeta, func(m *membership.Meta) { m.API = "http://10.9.9.9:8080" }), nil, verdicts{false, false, false}},
		{"cluster 2 relay", with(crMeta, func(m *membership.Meta) { m.Cluster = 2 }), nil, verdicts{true, true, true}},
		{"cluster 3 relay (no key anywhere)", with(crMeta, func(m *membership.Meta) { m.Cluster = 3 }), none, verdicts{false, true, true}},
		{"POP 1 relay", popMeta, prove(pop1, popMeta), verdicts{true, true, true}},
		{"POP 2 claimed with POP 1's key", with(popMeta, func(m *membership.Meta) { m.POP = 2 }), prove(pop1, popMeta), verdicts{false, true, true}},
		{"POP relay claimed with a cluster key", popMeta, prove(relay1, crMeta), verdicts{false, false, true}},
		{"signaling", sigMeta, prove(signaling, sigMeta), verdicts{true, true, true}},
		{"signaling claimed with a POP key", sigMeta, prove(pop1, popMeta), verdicts{false, true, false}},
		{"a transceiver", membership.Meta{Role: membership.RoleTransceiver, Cluster: 1}, none, verdicts{false, false, false}},
	} {
		p := tc.prove
		if p == nil { // the meta's own cluster's key (addresses under test)
			p = prove(issuer, tc.meta)
		}
		m, in := member(t, "m@global", at, tc.meta, p)
		for _, v := range []struct {
			who   string
			check func(membership.Member, []byte) error
			want  bool
		}{
			{"signaling", signaling.GlobalCheck(true), tc.want.signaling},
			{"global relay", globalRelay.GlobalCheck(false), tc.want.globalRelay},
			{"cluster relay", clusterRelay.GlobalCheck(false), tc.want.clusterRelay},
		} {
			if err := v.check(m, in); (err == nil) != v.want {
				t.Errorf("%s: %s's check = %v, want admitted %v", tc.name, v.who, err, v.want)
			}
		}
	}
	// A proof names its member.
	m, _ := member(t, "cr-1@global", at, crMeta, prove(relay1, crMeta))
	raw, _ := crMeta.MarshalBinary()
	if err := signaling.GlobalCheck(true)(m, membership.ProofInput("other@global", raw)); err == nil {
		t.Error("a proof replayed under another member name passed")
	}
}

// TestParseKinds: every spec form parses; malformed heads and keys of the
// wrong length are refused without printing the key.
func TestParseKinds(t *testing.T) {
	root := make([]byte, KeyLen)
	s, err := Parse([]string{POPSpec(7, 2, POPSecret(root, 7)) + "," + SignalingSpec(3, SignalingSecret(root)) + "\n" + Spec(4, 1, ClusterSecret(root, 4))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(s.PublicSpecs()); err != nil {
		t.Fatalf("public specs do not parse back: %v", err)
	}
	for _, bad := range []string{"pop/1:AAAA", "pop:0/1:" + strings.Repeat("A", 44), "relay-pub:1/1:" + strings.Repeat("A", 44) + "AAAA",
		"signaling:1/1:" + strings.Repeat("A", 44), "nope:1/1:" + strings.Repeat("A", 44), "signaling/1:AAAA"} {
		if _, err := Parse([]string{bad}); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
