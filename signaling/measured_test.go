package signaling_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/internal/node/nodetest"
	"github.com/rtcedge/rtcedge/internal/steer"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/signaling"
)

const probeKey = "probe-key-0123456789abcdef"

// probeKeys are three probes' keys: three reporters.
var probeKeys = []signaling.APIKey{{Key: probeKey, Probe: true}, {Key: probeKey + "-2", Probe: true}, {Key: probeKey + "-3", Probe: true}}

// replica starts a signaling node over cat with gossip, joining seed,
// with the authority keys given.
func replica(t *testing.T, name string, cat *geo.Catalogue, seed string, keys []string) *signaling.Node {
	t.Helper()
	cfg := signaling.Config{ListenAddr: "127.0.0.1:0", CatalogueData: cat, GeoIPData: geo.DevGeoIPDB,
		InternalProxies: []string{"127.0.0.0/8"}, AllowAnonymous: true, DrainDelay: time.Millisecond,
		Keys:   []signaling.APIKey{{Key: probeKey, Probe: true}},
		Gossip: nodetest.Gossip(name, seed), Authority: node.Authority{Keys: keys}}
	cfg.Steering.ExploreEvery = -1
	s, err := signaling.OpenSockets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := signaling.NewNode(cfg, s, node.Env{Logger: nodetest.Quiet})
	if err != nil {
		t.Fatal(err)
	}
	nodetest.Run(t, n)
	return n
}

// offerFrom posts an offer to the node as from client (through an
// internal proxy) and returns the placement headers; the call is hung up.
func offerFrom(t *testing.T, n *signaling.Node, client string) http.Header {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, n.URL()+"/v1/realtime/sdp", strings.NewReader(testsdp.Offer(t)))
	req.Header.Set("Content-Type", "application/sdp")
	req.Header.Set("X-Forwarded-For", client)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("offer from %s: %d %s", client, res.StatusCode, body)
	}
	del, _ := http.NewRequest(http.MethodDelete, n.URL()+res.Header.Get("Location"), nil)
	del.Header.Set("X-Forwarded-For", client)
	if res, err := http.DefaultClient.Do(del); err == nil {
		res.Body.Close()
	}
	return res.Header
}

func placedAt(h http.Header) string {
	return h.Get(signaling.HeaderPOP) + "/" + h.Get(signaling.HeaderCluster) + "/" + h.Get(signaling.HeaderSteering)
}

// TestMeasuredSteeringAcrossReplicas: two signaling replicas in one
// gossip pool, with the deployment authority. Round trips a probe posts
// to one replica reach the other (the replica passes them on over gossip,
// signed with the signaling key), and round trips pods measured, sent
// over gossip stamped and signed as cluster 1's relay passes them on,
// reach both. Each reporter counts once per POP: one probe key alone does
// not steer, with two pods beside it the prefix is measured at both
// replicas.
func TestMeasuredSteeringAcrossReplicas(t *testing.T) {
	w := newWorld(t, worldConfig{}) // real pods for the three clusters
	root := nodetest.Secret(t)
	clusters := parseSecrets(t, authority.Spec(1, 1, authority.ClusterSecret(root, 1)), authority.Spec(2, 1, authority.ClusterSecret(root, 2)),
		authority.Spec(3, 1, authority.ClusterSecret(root, 3)))
	sigSpec := authority.SignalingSpec(1, authority.SignalingSecret(root))
	keys := append([]string{sigSpec}, clusters.PublicSpecs()...)
	a := replica(t, "sig-a", w.cat, "", keys)
	b := replica(t, "sig-b", w.cat, a.Pool().LocalAddr().String(), keys)
	// The member that sends the pods' samples: any member can carry them,
	// what signaling believes is the relay key's signature.
	sigMeta := membership.Meta{Role: membership.RoleSignaling}
	prove, err := parseSecrets(t, sigSpec).GlobalProve(sigMeta)
	if err != nil {
		t.Fatal(err)
	}
	relay := nodetest.ProvenMember(t, "relay", true, sigMeta, a.Pool().LocalAddr().String(), prove)
	signer := steerSigner(t, clusters, 1)
	nodetest.Await(t, "the pool to converge", func() bool {
		return len(a.Pool().Members()) == 3 && len(b.Pool().Members()) == 3 && len(relay.Members()) == 3
	})
	view := func(n *signaling.Node, client string) signaling.SteeringView {
		req, _ := http.NewRequest(http.MethodGet, n.URL()+"/v1/steering", nil)
		req.Header.Set("Authorization", "Bearer "+probeKey)
		req.Header.Set("X-Forwarded-For", client)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var v signaling.SteeringView
		if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	samplesOf := func(n *signaling.Node, client, pop string) int {
		for _, p := range view(n, client).POPs {
			if p.POP == pop {
				return p.Samples
			}
		}
		return 0
	}
	// fromPods sends, as a cluster relay does, samples of pods 1..n of
	// cluster 1 for client's key: each pod's the same rtts.
	fromPods := func(client string, pods int, rtts ...steer.RTT) {
		k, err := steer.ParseKey(view(a, client).Key)
		if err != nil {
			t.Fatal(err)
		}
		var samples []steer.Sample
		for _, x := range rtts {
			samples = append(samples, steer.Sample{Key: k, POP: x.POP, RTT: x.RTT})
		}
		for pod := range uint16(pods) {
			msg, _ := steer.AppendMessage(nil, signer, time.Now(), steer.SourcePod, steer.PodReporter(1, 1+pod), samples)
			for _, n := range []*signaling.Node{a, b} {
				if err := relay.Send(n.Pool().Name(), msg); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	// A Frankfurt caller goes to fra by distance at both.
	for _, n := range []*signaling.Node{a, b} {
		if got := placedAt(offerFrom(t, n, ipFrankfurt)); got != "fra/1/distance" {
			t.Fatalf("before any sample: placed %s, want fra/1/distance", got)
		}
	}
	// A probe in the same prefix measures iad far better (its network
	// peers in Ashburn), three times: posted to a, b holds it too, as one
	// reporter's, which steers nothing alone.
	post := `{"samples":[{"pop":"fra","rtt_ms":150},{"pop":"iad","rtt_ms":20}]}`
	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, a.URL()+"/v1/steering/samples", strings.NewReader(post))
		req.Header.Set("Authorization", "Bearer "+probeKey)
		req.Header.Set("X-Forwarded-For", ipFrankfurt)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Fatalf("samples: %d", res.StatusCode)
		}
	}
	nodetest.Await(t, "b to hold the probe's sample", func() bool { return samplesOf(b, ipFrankfurt, "iad") == 1 })
	for _, n := range []*signaling.Node{a, b} {
		if got := placedAt(offerFrom(t, n, ipFrankfurt)); got != "fra/1/distance" {
			t.Errorf("%s placed %s on one probe key's samples, want fra/1/distance", n.Pool().Name(), got)
		}
	}
	// Two pods measure the same: three reporters, measured at both.
	fromPods(ipFrankfurt, 2, steer.RTT{POP: 1, RTT: 150 * time.Millisecond}, steer.RTT{POP: 2, RTT: 22 * time.Millisecond})
	for _, n := range []*signaling.Node{a, b} {
		nodetest.Await(t, "the pods' samples", func() bool { return samplesOf(n, ipFrankfurt, "iad") == 3 })
		if got := placedAt(offerFrom(t, n, ipFrankfurt)); got != "iad/2/measured" {
			t.Errorf("%s placed %s, want iad/2/measured", n.Pool().Name(), got)
		}
	}
	// Another address of the same /24 shares the measurement; another
	// prefix does not.
	if got := placedAt(offerFrom(t, b, "192.0.2.99")); got != "iad/2/measured" {
		t.Errorf("same /24: %s", got)
	}
	if got := placedAt(offerFrom(t, b, ipAshburn)); got != "iad/2/distance" {
		t.Errorf("other prefix: %s", got)
	}
	// Anything but a probe's key may not post samples.
	req, _ := http.NewRequest(http.MethodPost, a.URL()+"/v1/steering/samples", strings.NewReader(post))
	req.Header.Set("X-Forwarded-For", ipFrankfurt)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusForbidden {
		t.Errorf("anonymous samples: %v %v", res.StatusCode, err)
	} else {
		res.Body.Close()
	}

	// Three pods' samples for Singapore callers: sin is slow tonight, fra
	// is best.
	fromPods(ipSingapore, 3, steer.RTT{POP: 3, RTT: 300 * time.Millisecond}, steer.RTT{POP: 1, RTT: 90 * time.Millisecond})
	for _, n := range []*signaling.Node{a, b} {
		nodetest.Await(t, "the pods' samples", func() bool { return samplesOf(n, ipSingapore, "fra") == 3 })
		if got := placedAt(offerFrom(t, n, ipSingapore)); got != "fra/1/measured" {
			t.Errorf("%s placed Singapore at %s, want fra/1/measured", n.Pool().Name(), got)
		}
	}
}

// TestSteeringPinsAndReadiness: a measured POP that is not up is never
// chosen (the next best measured one is); an operator's pin wins over
// measurement and distance, for its prefix only.
func TestSteeringPinsAndReadiness(t *testing.T) {
	var down atomic.Uint32
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) {
		c.Keys = probeKeys
		c.Steering.Pins = []signaling.SteeringPin{{Prefix: "192.0.2.0/24", POPs: []string{"sin", "iad"}}}
		c.POPUp = func(pop uint16) bool { return uint32(pop) != down.Load() }
	}})
	for _, k := range probeKeys { // three reporters
		rec := w.do(t, http.MethodPost, "/v1/steering/samples", ipAshburn, "application/json",
			`{"samples":[{"pop":"iad","rtt_ms":150},{"pop":"fra","rtt_ms":90},{"pop":"sin","rtt_ms":20}]}`,
			http.Header{"Authorization": {"Bearer " + k.Key}})
		if rec.Code != http.StatusAccepted {
			t.Fatalf("samples: %d %s", rec.Code, rec.Body)
		}
	}
	place := func(ip string) (placement, string) {
		rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", ip, "application/sdp", testsdp.Offer(t), nil)
		res, body := recorded(rec)
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("offer from %s: %d %s", ip, res.StatusCode, body)
		}
		w.hangup(t, rec, nil)
		return placementOf(res.Header), res.Header.Get(signaling.HeaderSteering)
	}
	if p, why := place(ipAshburn); p != (placement{"ap-southeast", "3", "sin", "fra"}) || why != "measured" {
		t.Errorf("measured: %+v %s, want sin (20 ms) with fra (90 ms) as backup, cluster 3", p, why)
	}
	down.Store(3) // sin's relays gone
	if p, why := place(ipAshburn); p.pop != "fra" || why != "measured" {
		t.Errorf("sin down: %+v %s, want fra, the best measured POP that is up", p, why)
	}
	down.Store(0)
	if p, why := place(ipFrankfurt); p != (placement{"ap-southeast", "3", "sin", "iad"}) || why != "override" {
		t.Errorf("pinned prefix: %+v %s, want the pin's sin then iad", p, why)
	}
	down.Store(3)
	if p, why := place(ipFrankfurt); p != (placement{"us-east", "2", "iad", "sin"}) || why != "override" {
		t.Errorf("pinned prefix, sin down: %+v %s, want the pin's iad with sin still as backup", p, why)
	}
}

// TestSteeringConfigKeys: the steering section and a probe key load from
// a config file as documented (docs/steering.md), and a bad value fails
// validation.
func TestSteeringConfigKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "signaling.yaml")
	yaml := `listen_addr: 127.0.0.1:0
catalogue: ../geo/testdata/catalogue.yaml
keys: [{key: probe-key-0123456789abcdef, probe: true}]
steering:
  min_samples: 2
  max_age: 5m
  candidates: 3
  explore_every: -1
  max_entries: 1000
  pins: [{prefix: 198.51.100.0/24, pops: [fra]}]
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg signaling.Config
	if err := config.Load(path, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st := cfg.Steering
	if !cfg.Keys[0].Probe || st.MinSamples != 2 || st.MaxAge != 5*time.Minute || st.Candidates != 3 || st.ExploreEvery != -1 ||
		st.MaxEntries != 1000 || len(st.Pins) != 1 || st.Pins[0].POPs[0] != "fra" {
		t.Fatalf("loaded %+v", cfg)
	}
	cfg.Steering.MinSamples = steer.Window + 1
	if err := cfg.Validate(); err == nil {
		t.Error("min_samples over the window validated")
	}
}
