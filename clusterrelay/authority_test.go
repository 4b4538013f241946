package clusterrelay

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/sessionid"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
)

// testAuthority returns cluster secrets of clusters from a fresh root.
func testAuthority(t testing.TB, clusters ...uint16) *authority.Secrets {
	t.Helper()
	root := make([]byte, authority.KeyLen)
	if _, err := rand.Read(root); err != nil {
		t.Fatal(err)
	}
	var specs []string
	for _, c := range clusters {
		specs = append(specs, authority.Spec(c, 1, authority.ClusterSecret(root, c)))
	}
	sec, err := authority.Parse(specs)
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

// provedPod is pod's cluster-pool member as gossip carries it: metadata
// proved by prove, gossiping from ip, and the input a check sees.
func provedPod(t testing.TB, name string, ip string, pod uint16, load int, prove func([]byte) []byte) (membership.Member, []byte) {
	t.Helper()
	a := netip.MustParseAddr(ip)
	m := membership.Meta{Role: membership.RoleTransceiver, Cluster: 3, Pod: pod, Data: netip.AddrPortFrom(a, 7000),
		API: "http://" + ip + ":8081", Load: load, Capacity: 100}
	raw, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	in := membership.ProofInput(name, raw)
	m.Proof = string(prove(in))
	return membership.Member{Name: name, Addr: netip.AddrPortFrom(a, 7946), Meta: m, State: membership.StateAlive}, in
}

// TestCompromisedPodGetsFairShare reproduces the attack of issue 26: a
// compromised pod (pod 11, holding only its own issued keys) joins the
// cluster pool under 40 unused pod IDs advertising load 0, and once more
// as a cluster relay, beside 10 honest pods. Without proofs it got most of
// the front's picks; with the authority's check the relay admits only its
// own ID, and its share of 1,100 picks is about 1/11.
func TestCompromisedPodGetsFairShare(t *testing.T) {
	sec := testAuthority(t, 3)
	check, err := sec.CheckMember(3)
	if err != nil {
		t.Fatal(err)
	}
	type claim struct {
		m  membership.Member
		in []byte
	}
	var claims []claim
	for i := uint16(1); i <= 11; i++ { // 10 honest pods, and the attacker's own
		k, err := sec.Pod(3, i)
		if err != nil {
			t.Fatal(err)
		}
		prove, err := k.Prove()
		if err != nil {
			t.Fatal(err)
		}
		m, in := provedPod(t, fmt.Sprintf("transceiver-%d", i), fmt.Sprintf("10.0.0.%d", i), i, 5, prove)
		claims = append(claims, claim{m, in})
	}
	evilKeys, _ := sec.Pod(3, 11)
	evilProve, _ := evilKeys.Prove()
	for j := range uint16(40) {
		m, in := provedPod(t, fmt.Sprintf("evil-%d", j), "10.0.0.11", 100+j, 0, evilProve)
		claims = append(claims, claim{m, in})
	}
	relay := membership.Meta{Role: membership.RoleClusterRelay, Cluster: 3, Data: netip.MustParseAddrPort("10.0.0.11:7100")}
	raw, _ := relay.MarshalBinary()
	in := membership.ProofInput("evil-relay", raw)
	relay.Proof = string(evilProve(in))
	claims = append(claims, claim{membership.Member{Name: "evil-relay", Addr: netip.MustParseAddrPort("10.0.0.11:7946"), Meta: relay}, in})

	share := func(admit func(membership.Member, []byte) error) (float64, int) {
		var members []membership.Member
		for _, c := range claims {
			if admit(c.m, c.in) == nil {
				members = append(members, c.m)
			}
		}
		infos, _ := podInfos(members, 3, map[uint16]string{})
		now := time.Unix(1e9, 0)
		pl := newPlacer(DefaultGossipLag, DefaultPlacementHold, func() time.Time { return now })
		evil := 0
		const picks = 1100
		for range picks {
			p := pl.pick(infos, 1)[0]
			pl.done(p.ID, true)
			if p.Data.Addr() == netip.MustParseAddr("10.0.0.11") {
				evil++
			}
		}
		return float64(evil) / picks, len(infos)
	}
	if got, n := share(func(membership.Member, []byte) error { return nil }); got < 0.5 {
		t.Fatalf("without proofs the attack takes %.0f %% of %d pods' picks; the reproduction expects most", 100*got, n)
	}
	admitted := 0
	for _, c := range claims {
		if check(c.m, c.in) == nil {
			admitted++
		}
	}
	if admitted != 11 {
		t.Errorf("the relay admitted %d of the claims, want the 11 real pods", admitted)
	}
	if got, n := share(check); got > 2.0/11 || n != 11 {
		t.Errorf("with proofs the compromised pod takes %.1f %% of %d pods' picks, want its fair share (1/11)", 100*got, n)
	}
}

// TestFrontRefusesAnswerInAnotherPodsName: a pod that answers an offer
// under another pod's ID is not believed; the front tries the next pod.
func TestFrontRefusesAnswerInAnotherPodsName(t *testing.T) {
	answer := func(pod uint16) *httptest.Server {
		id, _ := sessionid.New(3, pod)
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":%q,"answer":"v=0","cluster":3,"pod":%d}`, id.String(), pod)
		}))
	}
	evil := answer(5) // pod 11 answering as pod 5
	defer evil.Close()
	dir := NewDirectory()
	dir.SetPods([]PodInfo{{ID: 11, API: evil.URL, Capacity: 10}})
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	f := NewFront(FrontConfig{Cluster: 3, Pods: dir, HTTPClient: client, Logger: quiet})
	srv := httptest.NewServer(f.Handler())
	defer srv.Close()
	resp, err := client.Post(srv.URL+sessionapi.SessionsPath, "application/json", strings.NewReader(`{"offer":"v=0","pops":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("an answer in another pod's name got %d through the front, want 503", resp.StatusCode)
	}
}

// TestNodeAdmitsOnlyProvenMembers: a cluster relay node with the
// authority, on real gossip: an honest pod proving its own ID is in the
// directory; a compromised pod's member under an unused ID and its member
// announcing itself a cluster relay are refused (counted), by the relay
// and, for the relay role, by the honest pod, which takes the real relay
// for one.
func TestNodeAdmitsOnlyProvenMembers(t *testing.T) {
	root := make([]byte, authority.KeyLen)
	if _, err := rand.Read(root); err != nil {
		t.Fatal(err)
	}
	spec := authority.Spec(4, 1, authority.ClusterSecret(root, 4))
	sec, err := authority.Parse([]string{spec})
	if err != nil {
		t.Fatal(err)
	}
	join := func(name string, meta membership.Meta, k authority.PodKeys, check bool, seed string) *membership.Pool {
		prove, err := k.Prove()
		if err != nil {
			t.Fatal(err)
		}
		cfg := membership.Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), AllowInsecure: true, Fast: true,
			Logger: quiet, Prove: prove}
		if check {
			if cfg.CheckMember, err = k.CheckMember(); err != nil {
				t.Fatal(err)
			}
		}
		p, err := membership.New(cfg, meta)
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
	honestKeys, _ := sec.Pod(4, 1)
	evilKeys, _ := sec.Pod(4, 2)
	podMeta := func(pod uint16) membership.Meta {
		return membership.Meta{Role: membership.RoleTransceiver, Cluster: 4, Pod: pod,
			Data: netip.MustParseAddrPort("127.0.0.1:9"), API: "http://127.0.0.1:9", Capacity: 10}
	}
	honest := join("transceiver-0", podMeta(1), honestKeys, true, "")
	seed := honest.LocalAddr().String()

	reg := prometheus.NewRegistry()
	cfg := Config{Cluster: 4, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", Authority: node.Authority{Keys: []string{spec}},
		ClusterGossip: nodetest.Gossip("cr", seed), GlobalGossip: nodetest.Gossip("cr", "")}
	s, err := OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(cfg, s, node.Env{Logger: quiet, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	nodetest.Run(t, n)
	nodetest.Await(t, "the relay to admit the honest pod", func() bool { return len(n.Directory().PodInfos()) == 1 })
	nodetest.Await(t, "the honest pod to take the relay for one", func() bool {
		for _, m := range honest.Members() {
			if m.Meta.Role == membership.RoleClusterRelay {
				return true
			}
		}
		return false
	})

	join("evil-40", podMeta(40), evilKeys, false, seed)
	join("evil-relay", membership.Meta{Role: membership.RoleClusterRelay, Cluster: 4, Data: netip.MustParseAddrPort("127.0.0.1:9")}, evilKeys, false, seed)
	refused := func() float64 {
		for k, v := range testmetrics.Take(t, reg) {
			if strings.HasPrefix(k, "rtcedge_membership_meta_decode_errors_total") && strings.Contains(k, "pool=cluster") {
				return v
			}
		}
		return 0
	}
	nodetest.Await(t, "the relay to refuse both evil members", func() bool { return refused() >= 2 })
	nodetest.Await(t, "the honest pod to see the evil pod member", func() bool {
		for _, m := range honest.Members() {
			if m.Name == "evil-40" {
				return true
			}
		}
		return false
	})
	if infos := n.Directory().PodInfos(); len(infos) != 1 || infos[0].ID != 1 {
		t.Errorf("directory %+v, want pod 1 only", infos)
	}
	for _, m := range honest.Members() {
		if m.Name == "evil-relay" {
			t.Errorf("the honest pod admitted %s (%s)", m.Name, m.Meta.Role)
		}
	}
}

// TestAuthorityFileReloads: a running cluster relay re-reads
// authority.file. A pod issued keys under a new cluster secret (key ID 2)
// is refused while the relay holds only the old one, and while the file
// is malformed (refused once, counted); once the file lists the new
// secret, the relay admits the pod without a restart and without an
// update of the pod's own.
func TestAuthorityFileReloads(t *testing.T) {
	secret := func() []byte { return nodetest.Secret(t) }
	oldSpec, newSpec := authority.Spec(4, 1, secret()), authority.Spec(4, 2, secret())
	path, write := nodetest.KeyFile(t)
	write(oldSpec)
	reg := prometheus.NewRegistry()
	cfg := Config{Cluster: 4, DataAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", Authority: node.Authority{File: path},
		ClusterGossip: nodetest.Gossip("cr", ""), GlobalGossip: nodetest.Gossip("cr", "")}
	s, err := OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(cfg, s, node.Env{Logger: quiet, Registerer: reg, KeysReload: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	nodetest.Run(t, n)

	newSec, err := authority.Parse([]string{newSpec})
	if err != nil {
		t.Fatal(err)
	}
	k, err := newSec.Pod(4, 1)
	if err != nil {
		t.Fatal(err)
	}
	prove, err := k.Prove()
	if err != nil {
		t.Fatal(err)
	}
	nodetest.ProvenMember(t, "transceiver-0", false, membership.Meta{Role: membership.RoleTransceiver, Cluster: 4, Pod: 1,
		Data: netip.MustParseAddrPort("127.0.0.1:9"), API: "http://127.0.0.1:9", Capacity: 10}, n.ClusterPool().LocalAddr().String(), prove)
	metric := func(prefix, part string) float64 {
		for k, v := range testmetrics.Take(t, reg) {
			if strings.HasPrefix(k, prefix) && strings.Contains(k, part) {
				return v
			}
		}
		return 0
	}
	nodetest.Await(t, "the pod under the new key refused", func() bool {
		return metric("rtcedge_membership_meta_decode_errors_total", "pool=cluster") >= 1
	})
	write("4/2:garbage", oldSpec)
	nodetest.Await(t, "the malformed file refused", func() bool { return metric("rtcedge_key_reloads_total", "result=invalid") == 1 })
	if infos := n.Directory().PodInfos(); len(infos) != 0 {
		t.Fatalf("a malformed file admitted %+v", infos)
	}
	write(newSpec, oldSpec)
	nodetest.Await(t, "the pod admitted after the reload", func() bool { return len(n.Directory().PodInfos()) == 1 })
	if got := n.auth.Load().sec.SessionAPICredential(4, 1); got != k.SessionAPI[0] {
		t.Error("the front does not present the pod's credential under the new key")
	}
}
