package signaling_test

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/steer"
	"github.com/rtcedge/rtcedge/internal/testmetrics"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/signaling"
)

// TestSignalingAppliesSteeringOverrides checks that the catalogue's
// per-country preferences win over distance in signaling's choice of
// cluster and POPs, and only for the listed country.
func TestSignalingAppliesSteeringOverrides(t *testing.T) {
	w := newWorld(t, worldConfig{
		proxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		tweak: func(c *signaling.Config) {
			c.CatalogueData.Steering = geo.Steering{Countries: map[string][]string{"SG": {"us-east"}}}
		},
	})
	offer := testsdp.Offer(t)
	fromSingapore := func(country string) http.Header {
		return http.Header{"Cf-Connecting-Ip": {ipSingapore}, "Cf-Iplatitude": {"1.29"}, "Cf-Iplongitude": {"103.85"}, "Cf-Ipcountry": {country}}
	}
	for _, tc := range []struct {
		name, country string
		want          placement
	}{
		{"overridden country", "SG", placement{"us-east", "2", "iad", "sin"}},
		{"other country at the same point", "MY", inSingapore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", "10.1.2.3", "application/sdp", offer, fromSingapore(tc.country))
			res, body := recorded(rec)
			checkPlaced(t, res, body, tc.want)
			w.hangup(t, rec, nil)
		})
	}
}

// steeringReplica is a signaling replica in a gossip pool of its own
// whose authority keys are the file path (reloaded every 10 ms) holds,
// with one probe key, and its metrics. Its pool and the members of
// steeringMember run the WAN timings, not the fast ones: a loaded
// machine then does not make a sender take the replica for dead between
// two sends.
type steeringReplica struct {
	*signaling.Node
	reg *prometheus.Registry
}

func newSteeringReplica(t *testing.T, path string) steeringReplica {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := signaling.Config{ListenAddr: "127.0.0.1:0", AllowAnonymous: true, DrainDelay: time.Millisecond,
		Catalogue: filepath.Join("..", "geo", "testdata", "catalogue.yaml"), Keys: []signaling.APIKey{{Key: probeKey, Probe: true}},
		Gossip: nodetest.Gossip("signaling", ""), Authority: node.Authority{File: path}}
	cfg.Gossip.Fast = false
	s, err := signaling.OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := signaling.NewNode(cfg, s, node.Env{Logger: nodetest.Quiet, Registerer: reg, KeysReload: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodetest.Run(t, n))
	return steeringReplica{n, reg}
}

// view is the replica's fra and iad figures for the caller at ip.
func (r steeringReplica) view(t *testing.T, ip string, lat, lon float64) (fra, iad signaling.SteeringStat) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/steering?ip=%s&lat=%v&lon=%v", r.URL(), ip, lat, lon), nil)
	req.Header.Set("Authorization", "Bearer "+probeKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v signaling.SteeringView
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	for _, p := range v.POPs {
		switch p.POP {
		case "fra":
			fra = p
		case "iad":
			iad = p
		}
	}
	return fra, iad
}

// metric is one of the replica's counters ("name,label=value,…").
func (r steeringReplica) metric(t *testing.T, key string) float64 {
	return testmetrics.Take(t, r.reg)[key]
}

// dropped is the samples messages the replica dropped for reason.
func (r steeringReplica) dropped(t *testing.T, reason steer.Drop) float64 {
	return r.metric(t, "rtcedge_signaling_steering_messages_dropped_total,reason="+reason.String())
}

// steeringMember joins the global pool at seed as name with meta, proven
// by prove (nil: not proven), with the WAN timings.
func steeringMember(t *testing.T, name string, meta membership.Meta, seed string, prove func([]byte) []byte) *membership.Pool {
	t.Helper()
	p, err := membership.New(membership.Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), WAN: true,
		AllowInsecure: true, Logger: nodetest.Quiet, Prove: prove}, meta)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if _, err := p.Join([]string{seed}); err != nil {
		t.Fatal(err)
	}
	return p
}

func parseSecrets(t *testing.T, specs ...string) *authority.Secrets {
	t.Helper()
	s, err := authority.Parse(specs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// relayOf is a global pool member proving itself cluster c's relay with
// sec, joined to seed.
func relayOf(t *testing.T, name string, sec *authority.Secrets, c uint16, seed string) *membership.Pool {
	t.Helper()
	m := membership.Meta{Role: membership.RoleClusterRelay, Region: map[uint16]string{1: "eu-central", 2: "us-east", 3: "ap-southeast"}[c], Cluster: c,
		Data: netip.MustParseAddrPort("127.0.0.1:7100"), API: "http://127.0.0.1:808" + fmt.Sprint(c), Capacity: 10}
	prove, err := sec.GlobalProve(m)
	if err != nil || prove == nil {
		t.Fatalf("GlobalProve: %v", err)
	}
	return steeringMember(t, name, m, seed, prove)
}

func steerSigner(t *testing.T, sec *authority.Secrets, c uint16) *steer.Signer {
	t.Helper()
	a, err := sec.SteerAuthority(c)
	if err != nil {
		t.Fatal(err)
	}
	return a.Signer
}

// TestForgedSteeringSamplesRefused reproduces the attack of issue 34: a
// member holding the global pool's gossip key but no role key (signaling
// refuses it as unproven) sends samples messages in 8 invented pods'
// names and in the names of the 3 honest pods cluster 1's relay reported
// (fra 20 ms, iad 150 ms), claiming fra 900 ms and iad 5 ms. Before
// samples were signed, the 11 forged reporters evicted the honest ones
// and the medians became 900 and 5. Now each variant is dropped whole
// and counted by reason: unsigned, signed with a key of its own under
// cluster 1's key ID (bad_signature) or under another ID (unknown_signer),
// cluster 2's relay key (a compromised relay of another cluster:
// wrong_signer), pods of a cluster nobody holds a key of, the previous
// format, and a relay's genuine message replayed after two minutes
// (stale). 0 forged samples are accepted, the medians stay honest, and
// the honest relay's next sample is still taken.
func TestForgedSteeringSamplesRefused(t *testing.T) {
	root := nodetest.Secret(t)
	cluster := func(c uint16) *authority.Secrets {
		return parseSecrets(t, authority.Spec(c, 1, authority.ClusterSecret(root, c)))
	}
	c1, c2 := cluster(1), cluster(2)
	all := parseSecrets(t, authority.Spec(1, 1, authority.ClusterSecret(root, 1)), authority.Spec(2, 1, authority.ClusterSecret(root, 2)),
		authority.Spec(3, 1, authority.ClusterSecret(root, 3)))
	path, write := nodetest.KeyFile(t)
	write(append([]string{authority.SignalingSpec(1, authority.SignalingSecret(root))}, all.PublicSpecs()...)...)
	n := newSteeringReplica(t, path)
	seed := n.Pool().LocalAddr().String()
	relay := relayOf(t, "cr-1", c1, 1, seed)
	relay2 := relayOf(t, "cr-2", c2, 2, seed) // proven, but of cluster 2
	rogue := steeringMember(t, "rogue", membership.Meta{Role: membership.RoleClusterRelay, Region: "eu-central", Cluster: 1}, seed, nil)
	nodetest.Await(t, "the relays admitted and the rogue refused", func() bool {
		return len(n.Pool().Members()) == 3 && n.metric(t, "rtcedge_membership_meta_decode_errors_total,pool=global") >= 1
	})

	const ip, lat, lon = "198.51.100.7", 50.1, 8.6
	k := steer.KeyFor(netip.MustParseAddr(ip), true, lat, lon)
	samples := func(fra, iad time.Duration) []steer.Sample {
		return []steer.Sample{{Key: k, POP: 1, RTT: fra}, {Key: k, POP: 2, RTT: iad}}
	}
	send := func(p *membership.Pool, msg []byte) {
		t.Helper()
		if err := p.Send(n.Pool().Name(), msg); err != nil {
			t.Fatalf("%s: %v", p.Name(), err)
		}
	}
	accepted := func() float64 {
		return n.metric(t, "rtcedge_signaling_steering_samples_total,result=accepted,source=pod")
	}
	signer1 := steerSigner(t, c1, 1)

	// The relay passes on 3 honest pods' round trips: fra 20 ms, iad 150 ms.
	for pod := uint16(1); pod <= 3; pod++ {
		msg, _ := steer.AppendMessage(nil, signer1, time.Now(), steer.SourcePod, steer.PodReporter(1, pod), samples(20*time.Millisecond, 150*time.Millisecond))
		send(relay, msg)
	}
	nodetest.Await(t, "the honest samples", func() bool { fra, iad := n.view(t, ip, lat, lon); return fra.Samples == 3 && iad.Samples == 3 })

	// The forgeries: 8 invented pods of cluster 1, then the honest 3.
	var forged []steer.Reporter
	for pod := uint16(101); pod <= 108; pod++ {
		forged = append(forged, steer.PodReporter(1, pod))
	}
	for pod := uint16(1); pod <= 3; pod++ {
		forged = append(forged, steer.PodReporter(1, pod))
	}
	_, own, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := samples(900*time.Millisecond, 5*time.Millisecond)
	want := map[steer.Drop]float64{}
	for _, v := range []struct {
		sender *membership.Pool
		sg     *steer.Signer
		why    steer.Drop
	}{
		{rogue, nil, steer.DropUnsigned},
		{rogue, &steer.Signer{ID: signer1.ID, Key: own}, steer.DropSignature},
		{rogue, &steer.Signer{ID: steer.SignerID{Role: steer.SignerRelay, Cluster: 1, KeyID: 9}, Key: own}, steer.DropUnknown},
		{relay2, steerSigner(t, c2, 2), steer.DropWrongRole},
	} {
		for _, r := range forged {
			msg, _ := steer.AppendMessage(nil, v.sg, time.Now(), steer.SourcePod, r, bad)
			send(v.sender, msg)
			want[v.why]++
		}
	}
	// Pods of cluster 7, which signaling holds no key of.
	msg, _ := steer.AppendMessage(nil, &steer.Signer{ID: steer.SignerID{Role: steer.SignerRelay, Cluster: 7, KeyID: 1}, Key: own},
		time.Now(), steer.SourcePod, steer.PodReporter(7, 1), bad)
	send(rogue, msg)
	want[steer.DropUnknown]++
	// The previous format (version 2, no signature).
	v2 := []byte{steer.MsgKind, 2, byte(steer.SourcePod), 0, 1, 0, 101, 1, byte(len(k.String()))}
	v2 = append(append(v2, k.String()...), 0, 1, 0x23, 0x28)
	send(rogue, v2)
	want[steer.DropInvalid]++
	// A relay's genuine message, replayed two minutes later.
	old, _ := steer.AppendMessage(nil, signer1, time.Now().Add(-2*time.Minute), steer.SourcePod, steer.PodReporter(1, 1), bad)
	send(rogue, old)
	want[steer.DropStale]++

	// Await every forged message taken or dropped (2 samples each).
	sent := 0.0
	for _, w := range want {
		sent += w
	}
	nodetest.Await(t, "every forgery taken or dropped", func() bool {
		done := (accepted() - 6) / 2
		for _, d := range steer.Drops {
			done += n.dropped(t, d)
		}
		return done >= sent
	})
	for d, w := range want {
		if got := n.dropped(t, d); got != w {
			t.Errorf("dropped as %s: %v, want %v", d, got, w)
		}
	}
	if got := accepted(); got != 6 {
		t.Errorf("%v pod samples accepted, want the honest 6", got)
	}
	fra, iad := n.view(t, ip, lat, lon)
	if fra.MedianMs != 20 || iad.MedianMs != 150 || fra.Samples != 3 || iad.Samples != 3 {
		t.Errorf("after the forgeries: fra %v ms of %d samples, iad %v ms of %d; want the honest 20 and 150 of 3 each",
			fra.MedianMs, fra.Samples, iad.MedianMs, iad.Samples)
	}
	// The honest relay is still believed.
	before := accepted()
	msg, _ = steer.AppendMessage(nil, signer1, time.Now(), steer.SourcePod, steer.PodReporter(1, 4), samples(22*time.Millisecond, 140*time.Millisecond))
	send(relay, msg)
	nodetest.Await(t, "the honest relay's next samples", func() bool { return accepted() == before+2 })
}

// TestSteeringKeysFollowReload: the verifier is the authority file's in
// use. A cluster relay signing under a new cluster secret (key ID 2) is
// refused (unknown_signer) until the file lists its public key, then
// believed without a restart; once the file drops the key, refused again.
func TestSteeringKeysFollowReload(t *testing.T) {
	sig := authority.SignalingSpec(1, nodetest.Secret(t))
	c1 := parseSecrets(t, authority.Spec(1, 2, nodetest.Secret(t)))
	pub := c1.PublicSpecs()[0]
	other := parseSecrets(t, authority.Spec(2, 1, nodetest.Secret(t))).PublicSpecs()[0]
	path, write := nodetest.KeyFile(t)
	write(sig, other)
	n := newSteeringReplica(t, path)
	relay := steeringMember(t, "cr-1", membership.Meta{Role: membership.RoleClusterRelay}, n.Pool().LocalAddr().String(), nil)
	sg := steerSigner(t, c1, 1)
	k := steer.KeyFor(netip.MustParseAddr("198.51.100.7"), false, 0, 0)
	pod := uint16(0)
	sendOne := func() {
		t.Helper()
		pod++
		msg, _ := steer.AppendMessage(nil, sg, time.Now(), steer.SourcePod, steer.PodReporter(1, pod), []steer.Sample{{Key: k, POP: 1, RTT: 20 * time.Millisecond}})
		if err := relay.Send(n.Pool().Name(), msg); err != nil {
			t.Fatal(err)
		}
	}
	accepted := func() float64 {
		return n.metric(t, "rtcedge_signaling_steering_samples_total,result=accepted,source=pod")
	}
	reloads := func() float64 { return n.metric(t, "rtcedge_key_reloads_total,keys=authority,result=ok") }
	sendOne()
	nodetest.Await(t, "the unknown key refused", func() bool { return n.dropped(t, steer.DropUnknown) == 1 })

	write(sig, other, pub)
	nodetest.Await(t, "the reload", func() bool { return reloads() == 1 })
	sendOne()
	nodetest.Await(t, "the new key believed", func() bool { return accepted() == 1 })

	write(sig, other)
	nodetest.Await(t, "the second reload", func() bool { return reloads() == 2 })
	sendOne()
	nodetest.Await(t, "the removed key refused", func() bool { return n.dropped(t, steer.DropUnknown) == 2 })
	if got := accepted(); got != 1 {
		t.Errorf("accepted %v, want 1", got)
	}
}
