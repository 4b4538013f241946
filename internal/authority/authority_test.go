package authority

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/rtcedge/rtcedge/internal/encap"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/token"
)

// world is one cluster's authority and what a relay of it builds.
type world struct {
	sec   *Secrets
	tok   *token.Keyring
	hop   *encap.Keyring
	check func(membership.Member, []byte) error
}

func newWorld(t testing.TB, cluster uint16) world {
	t.Helper()
	root := make([]byte, KeyLen)
	if _, err := rand.Read(root); err != nil {
		t.Fatal(err)
	}
	sec, err := Parse([]string{Spec(cluster, 2, ClusterSecret(root, cluster))})
	if err != nil {
		t.Fatal(err)
	}
	w := world{sec: sec}
	if w.tok, err = sec.TokenKeyring(nil); err != nil {
		t.Fatal(err)
	}
	if w.hop, err = sec.HopKeyring(cluster, nil); err != nil {
		t.Fatal(err)
	}
	if w.check, err = sec.CheckMember(cluster); err != nil {
		t.Fatal(err)
	}
	return w
}

// podRings builds the keyrings a pod builds from its issued keys, the way
// its config does.
func podRings(t testing.TB, k PodKeys) (*token.Keyring, *encap.Keyring) {
	t.Helper()
	keys := map[uint8][]byte{}
	var cur uint8
	for i, s := range k.Token {
		id, key, err := token.ParseKeySpec(s)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			cur = id
		}
		keys[id] = key
	}
	tok, err := token.NewKeyring(cur, keys)
	if err != nil {
		t.Fatal(err)
	}
	all, err := encap.ParseClusterKeys(k.Hop)
	if err != nil || all.For(k.Cluster) == nil {
		t.Fatalf("pod hop keys: %v", err)
	}
	return tok, all.For(k.Cluster)
}

func issue(t testing.TB, w world, cluster, pod uint16) PodKeys {
	t.Helper()
	k, err := w.sec.Pod(cluster, pod)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestPodSpeaksOnlyForItself: a compromised pod holds only its own
// issued keys. Tokens and hop headers it makes in its own name pass the
// relay; in another pod's name, none does. What the relay seals toward a
// pod only that pod verifies, and route-cache entries verify under no
// pod's keys.
func TestPodSpeaksOnlyForItself(t *testing.T) {
	w := newWorld(t, 3)
	evil, victim := issue(t, w, 3, 11), issue(t, w, 3, 5)
	evilTok, evilHop := podRings(t, evil)
	_, victimHop := podRings(t, victim)

	// Tokens.
	own, err := evilTok.Mint(3, 11)
	if err != nil {
		t.Fatal(err)
	}
	if tk, err := w.tok.Verify([]byte(own)); err != nil || tk.Pod != 11 {
		t.Fatalf("the pod's own token: %+v, %v", tk, err)
	}
	forged := 0
	for pod := range uint16(64) {
		for _, cl := range []uint16{3, 4} {
			if pod == 11 && cl == 3 {
				continue
			}
			s, err := evilTok.Mint(cl, pod)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.tok.Verify([]byte(s)); err == nil {
				forged++
			}
		}
	}
	if forged != 0 {
		t.Errorf("%d tokens minted with pod 11's key for other pods verified at the relay", forged)
	}

	// Hop headers, both ways.
	hdr := func(pod uint16, toClient bool) encap.Header {
		return encap.Header{ToClient: toClient, Cluster: 3, Pod: pod, POP: 1,
			Client: netip.MustParseAddrPort("198.51.100.7:5000"), Ingress: netip.MustParseAddrPort("10.1.0.1:7200")}
	}
	sealed := func(k *encap.Keyring, h encap.Header) ([]byte, int) {
		buf := make([]byte, encap.MaxDatagram)
		hl, err := h.Put(buf)
		if err != nil {
			t.Fatal(err)
		}
		n := hl + copy(buf[hl:], "rtp")
		k.Seal(buf[:n], hl)
		return buf[:n], hl
	}
	if pkt, hl := sealed(evilHop, hdr(11, true)); w.hop.Verify(pkt, hl) != nil {
		t.Fatal("the pod's own reply header does not verify at the relay")
	}
	accepted := 0
	for pod := range uint16(64) {
		if pod == 11 {
			continue
		}
		if pkt, hl := sealed(evilHop, hdr(pod, true)); w.hop.Verify(pkt, hl) == nil {
			accepted++
		}
	}
	if accepted != 0 {
		t.Errorf("%d headers sealed with pod 11's key for other pods verified at the relay", accepted)
	}
	pkt, hl := sealed(w.hop, hdr(5, false))
	if err := victimHop.Verify(pkt, hl); err != nil {
		t.Errorf("the relay's header toward pod 5 does not verify at pod 5: %v", err)
	}
	if err := evilHop.Verify(pkt, hl); !errors.Is(err, encap.ErrMAC) {
		t.Errorf("pod 11 verifies a header meant for pod 5: %v", err)
	}

	// Route-cache entries: sealed by relays with a key no pod holds.
	client := netip.MustParseAddrPort("198.51.100.7:5000")
	id, tag := w.hop.SealRoute(client, 3, 11, [6]byte{1}, 100)
	if err := w.hop.VerifyRoute(client, 3, 11, [6]byte{1}, 100, id, tag); err != nil {
		t.Fatalf("the relay's own route entry: %v", err)
	}
	eid, etag := evilHop.SealRoute(client, 3, 11, [6]byte{1}, 100)
	if err := w.hop.VerifyRoute(client, 3, 11, [6]byte{1}, 100, eid, etag); err == nil {
		t.Error("a route entry sealed with a pod's keys verified at the relay")
	}

	// Relay probes (docs/wire.md §5), sealed with the same relay-only key:
	// a pod can neither make a cluster relay answer nor answer for one.
	ingress, relay := netip.MustParseAddrPort("10.1.0.1:7200"), netip.MustParseAddrPort("10.2.0.1:7100")
	probe := w.hop.SealProbe(make([]byte, encap.ProbeLen), 3, 42, ingress, relay)
	if err := evilHop.AnswerProbe(append([]byte(nil), probe...), ingress, relay); err == nil {
		t.Error("a pod answered a relay probe")
	}
	fp := evilHop.SealProbe(make([]byte, encap.ProbeLen), 3, 42, ingress, relay)
	if err := w.hop.AnswerProbe(append([]byte(nil), fp...), ingress, relay); err == nil {
		t.Error("a relay answered a probe sealed with a pod's keys")
	}
	if err := evilHop.AnswerProbe(fp, ingress, relay); err != nil { // the pod's own key, as an answer
		t.Fatal(err)
	}
	if _, err := w.hop.OpenProbeAnswer(fp, ingress, relay); err == nil {
		t.Error("a global relay accepted a probe answer sealed with a pod's keys")
	}
	if err := w.hop.AnswerProbe(probe, ingress, relay); err != nil {
		t.Fatalf("the relay's own probe: %v", err)
	}
	if n, err := w.hop.OpenProbeAnswer(probe, ingress, relay); err != nil || n != 42 {
		t.Fatalf("the relay's own answer: %v, %v", n, err)
	}
}

// TestSessionAPICredentialIsPerPod: the front presents each pod its own
// credential; a pod's credential opens no other pod's API.
func TestSessionAPICredentialIsPerPod(t *testing.T) {
	w := newWorld(t, 3)
	victim, evil := issue(t, w, 3, 5), issue(t, w, 3, 11)
	api := httptest.NewServer(sessionapi.RequireAnySecret(victim.SessionAPI, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})))
	defer api.Close()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	call := func(secret string) int {
		req, _ := http.NewRequest(http.MethodGet, api.URL+sessionapi.StatusPath, nil)
		sessionapi.Authorize(req, secret)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := call(w.sec.SessionAPICredential(3, 5)); got != http.StatusNoContent {
		t.Errorf("the front's credential for pod 5: %d", got)
	}
	for _, s := range append(evil.SessionAPI, w.sec.SessionAPICredential(3, 11), "") {
		if got := call(s); got != http.StatusUnauthorized {
			t.Errorf("pod 5's API answered %d to another pod's credential", got)
		}
	}
}

// member builds a cluster-pool member of pod (or a relay) whose metadata
// prove proved, as a pool would gossip it, and the input its check sees.
func member(t testing.TB, name string, gossip netip.AddrPort, m membership.Meta, prove func([]byte) []byte) (membership.Member, []byte) {
	t.Helper()
	raw, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	in := membership.ProofInput(name, raw)
	m.Proof = string(prove(in))
	return membership.Member{Name: name, Addr: gossip, Meta: m, State: membership.StateAlive}, in
}

// TestMembershipProofs: the relay admits a pod only under its own pod ID,
// at its own address, and a relay only with the relay key; a pod admits
// only proven relays.
func TestMembershipProofs(t *testing.T) {
	w := newWorld(t, 3)
	evil := issue(t, w, 3, 11)
	prove, err := evil.Prove()
	if err != nil {
		t.Fatal(err)
	}
	at := netip.MustParseAddrPort("10.0.0.11:7946")
	podMeta := func(pod uint16, ip string) membership.Meta {
		return membership.Meta{Role: membership.RoleTransceiver, Cluster: 3, Pod: pod,
			Data: netip.AddrPortFrom(netip.MustParseAddr(ip), 7000), API: "http://" + ip + ":8081", Capacity: 100}
	}
	relayProve, err := w.sec.RelayProve(3)
	if err != nil {
		t.Fatal(err)
	}
	podCheck, err := evil.CheckMember()
	if err != nil {
		t.Fatal(err)
	}
	relayMeta := membership.Meta{Role: membership.RoleClusterRelay, Cluster: 3, Data: netip.MustParseAddrPort("10.0.0.11:7100")}
	for _, tc := range []struct {
		name    string
		meta    membership.Meta
		prove   func([]byte) []byte
		relayOK bool // the relay admits it
		podOK   bool // a pod admits it
	}{
		{"own pod ID", podMeta(11, "10.0.0.11"), prove, true, true},
		{"unused pod ID", podMeta(40, "10.0.0.11"), prove, false, true},
		{"own ID, data elsewhere", podMeta(11, "10.0.0.99"), prove, false, true},
		{"relay role with a pod's key", relayMeta, prove, false, false},
		{"relay with the relay key", relayMeta, relayProve, true, true},
		{"pod without proof", podMeta(11, "10.0.0.11"), func([]byte) []byte { return nil }, false, true},
	} {
		m, in := member(t, "m", at, tc.meta, tc.prove)
		if err := w.check(m, in); (err == nil) != tc.relayOK {
			t.Errorf("%s: relay's check = %v", tc.name, err)
		}
		if err := podCheck(m, in); (err == nil) != tc.podOK {
			t.Errorf("%s: pod's check = %v", tc.name, err)
		}
	}
	// A proof names its member: replayed under another name it fails.
	m, _ := member(t, "transceiver-11", at, podMeta(11, "10.0.0.11"), prove)
	raw, _ := membership.Meta{Role: m.Meta.Role, Cluster: 3, Pod: 11, Data: m.Meta.Data, API: m.Meta.API, Capacity: 100}.MarshalBinary()
	if err := w.check(m, membership.ProofInput("other", raw)); err == nil {
		t.Error("a proof replayed under another member name passed")
	}
}

// TestPodKeysFile: what the issuer writes, the pod reads back.
func TestPodKeysFile(t *testing.T) {
	w := newWorld(t, 3)
	k := issue(t, w, 3, 7)
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := k.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPodKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Pod != 7 || got.Cluster != 3 || got.Token[0] != k.Token[0] || got.SessionAPI[0] != k.SessionAPI[0] {
		t.Errorf("read back %+v", got)
	}
}

// BenchmarkVerifyDerived: a relay's per-packet header check under a
// derived key, once the pod's key is cached, costs what a static key's
// does and allocates nothing.
func BenchmarkVerifyDerived(b *testing.B) {
	w := newWorld(b, 3)
	_, podHop := podRings(b, issue(b, w, 3, 9))
	h := encap.Header{ToClient: true, Cluster: 3, Pod: 9, POP: 1,
		Client: netip.MustParseAddrPort("198.51.100.7:5000"), Ingress: netip.MustParseAddrPort("10.1.0.1:7200")}
	buf := make([]byte, 200)
	hl, _ := h.Put(buf)
	pkt := buf[:hl+160]
	podHop.Seal(pkt, hl)
	if err := w.hop.Verify(pkt, hl); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := w.hop.Verify(pkt, hl); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDerivedKeysDoNotAllocate: once a pod's key has verified one token
// and one header, verifying and sealing under its derived keys allocates
// nothing (relays' per-packet and per-check paths), and a forged header
// neither allocates nor enters the cache.
func TestDerivedKeysDoNotAllocate(t *testing.T) {
	w := newWorld(t, 3)
	podTok, podHop := podRings(t, issue(t, w, 3, 9))
	s, err := podTok.Mint(3, 9)
	if err != nil {
		t.Fatal(err)
	}
	ufrag := []byte(s)
	h := encap.Header{ToClient: true, Cluster: 3, Pod: 9, POP: 1,
		Client: netip.MustParseAddrPort("198.51.100.7:5000"), Ingress: netip.MustParseAddrPort("10.1.0.1:7200")}
	buf := make([]byte, 200)
	hl, _ := h.Put(buf)
	pkt := buf[:hl+100]
	podHop.Seal(pkt, hl)
	if _, err := w.tok.Verify(ufrag); err != nil {
		t.Fatal(err)
	}
	if err := w.hop.Verify(pkt, hl); err != nil {
		t.Fatal(err)
	}
	forged := append([]byte(nil), pkt...)
	forged[7] = 10 // names pod 10, sealed with pod 9's key
	for what, f := range map[string]func(){
		"token verify":  func() { _, _ = w.tok.Verify(ufrag) },
		"header verify": func() { _ = w.hop.Verify(pkt, hl) },
		"header seal":   func() { w.hop.Seal(pkt, hl) },
		"forged header": func() { _ = w.hop.Verify(forged, hl) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %.0f allocs", what, n)
		}
	}
}

// TestMigrationFromSharedKeys: during the migration (docs/operations.md)
// a relay holds the shared keys (ID 1) and the authority (ID 2) in one
// keyring: it verifies tokens and headers of pods on either, and seals
// with the authority's ID, which a migrating pod (its own keys first, the
// shared ones appended) verifies.
func TestMigrationFromSharedKeys(t *testing.T) {
	w := newWorld(t, 3) // authority under key ID 2
	sharedTok := make([]byte, token.KeyLen)
	sharedHop := make([]byte, encap.KeyLen)
	_, _ = rand.Read(sharedTok)
	_, _ = rand.Read(sharedHop)
	legacyTok, err := token.NewKeyring(1, map[uint8][]byte{1: sharedTok})
	if err != nil {
		t.Fatal(err)
	}
	legacyHop, err := encap.NewKeyring(1, map[uint8][]byte{1: sharedHop})
	if err != nil {
		t.Fatal(err)
	}
	relayTok, err := w.sec.TokenKeyring(legacyTok)
	if err != nil {
		t.Fatal(err)
	}
	relayHop, err := w.sec.HopKeyring(3, legacyHop)
	if err != nil {
		t.Fatal(err)
	}
	k := issue(t, w, 3, 4)
	k.Token = append(k.Token, "1:"+base64.StdEncoding.EncodeToString(sharedTok))
	k.Hop = append(k.Hop, "3/1:"+base64.StdEncoding.EncodeToString(sharedHop))
	podTok, podHop := podRings(t, k)
	for name, kr := range map[string]*token.Keyring{"legacy pod": legacyTok, "migrating pod": podTok} {
		s, err := kr.Mint(3, 4)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := relayTok.Verify([]byte(s)); err != nil {
			t.Errorf("%s's token at the migrating relay: %v", name, err)
		}
	}
	h := encap.Header{Cluster: 3, Pod: 4, POP: 1, Client: netip.MustParseAddrPort("198.51.100.7:5000"), Ingress: netip.MustParseAddrPort("10.1.0.1:7200")}
	buf := make([]byte, 200)
	hl, _ := h.Put(buf)
	pkt := buf[:hl+10]
	relayHop.Seal(pkt, hl)
	if pkt[2] != 2 {
		t.Errorf("the relay seals with key ID %d, want the authority's 2", pkt[2])
	}
	if err := podHop.Verify(pkt, hl); err != nil {
		t.Errorf("the migrating pod does not verify the relay's header: %v", err)
	}
	legacyHop.Seal(pkt, hl)
	if err := relayHop.Verify(pkt, hl); err != nil {
		t.Errorf("a legacy pod's header at the migrating relay: %v", err)
	}
}
