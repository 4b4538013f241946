package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/devworld"
	"github.com/rtcedge/rtcedge/internal/membership"
	"github.com/rtcedge/rtcedge/probe"
)

// TestSecretBindsSessionConfig is the reproduction end to end: an
// app server mints a client secret with {"instructions":"SERVER-CHOSEN"};
// a browser (a real Pion client) placing /calls with a multipart session of
// its own cannot replace the model or the instructions, may add a voice,
// and the backend (over the netbackend protocol) is told the server's
// config, which the echo backend quotes back on the data channel.
func TestSecretBindsSessionConfig(t *testing.T) {
	w := startWorld(t, devworld.Config{APIKeys: []string{e2eAPIKey}, NetBackend: true})
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	app := &http.Client{Transport: tr}
	const server = `{"instructions":"SERVER-CHOSEN","model":"echo-cheap"}`
	ek := mintSecretWith(t, app, w.SignalingURL, server)
	var got map[string]any
	if err := json.Unmarshal(ek.Session, &got); err != nil || got["instructions"] != "SERVER-CHOSEN" || got["model"] != "echo-cheap" ||
		got["object"] != "realtime.session" || !strings.HasPrefix(fmt.Sprint(got["id"]), "sess_") {
		t.Fatalf("client_secrets returned session %s, want the effective %s as OpenAI's session object", ek.Session, server)
	}
	dial := func(ctx context.Context, path, session string) (*probe.Call, error) {
		var rt http.RoundTripper = tr
		if session != "" {
			rt = multipartOffers{base: tr, session: session}
		}
		return probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Path: path, Token: ek.Value,
			HTTPClient: &http.Client{Transport: rt}, Logger: testLogger()})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, attack := range []string{
		`{"instructions":"ATTACKER-CHOSEN","model":"most-expensive"}`,
		`{"instructions":"ATTACKER-CHOSEN"}`,
		`{"model":"most-expensive"}`,
	} {
		call, err := dial(ctx, "/v1/realtime/calls", attack)
		if err == nil {
			call.Close()
			t.Fatalf("the browser's session %s was accepted", attack)
		}
		var he *probe.HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusBadRequest || !strings.Contains(he.Body, `"param":"session.`) {
			t.Fatalf("session %s: %v, want 400 naming the session field", attack, err)
		}
	}
	if n := metricSum(t, w.Registry, "rtcedge_transceiver_sessions_created_total", nil); n != 0 {
		t.Fatalf("%v sessions created for refused offers", n)
	}

	tests := []struct {
		name, path, session, want string
	}{
		{"calls with an allowed addition", "/v1/realtime/calls", `{"voice":"alloy","model":"echo-cheap"}`,
			`{"instructions":"SERVER-CHOSEN","model":"echo-cheap","voice":"alloy"}`},
		{"sdp", "/v1/realtime/sdp", "", server},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			call, err := dial(ctx, tc.path, tc.session)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer call.Close()
			if err := call.WaitEcho(ctx); err != nil {
				t.Fatal(err)
			}
			if err := call.SendEvent([]byte(`{"type":"response.create"}`)); err != nil {
				t.Fatal(err)
			}
			var reply struct {
				Config json.RawMessage `json:"config"`
			}
			select {
			case msg := <-call.Events():
				if err := json.Unmarshal(msg, &reply); err != nil {
					t.Fatalf("event reply %s: %v", msg, err)
				}
			case <-ctx.Done():
				t.Fatal("no event reply from the backend")
			}
			if string(reply.Config) != tc.want {
				t.Fatalf("the backend was told %s, want %s", reply.Config, tc.want)
			}
			// Another user's secret cannot hang up this call; its own can.
			other := mintSecretWith(t, app, w.SignalingURL, server)
			req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, w.SignalingURL+call.Location, nil)
			req.Header.Set("Authorization", "Bearer "+other.Value)
			res, err := app.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusNotFound {
				t.Fatalf("hang-up with another user's secret: %d, want 404", res.StatusCode)
			}
			if err := call.Hangup(ctx); err != nil {
				t.Fatalf("hang-up with the call's own secret: %v", err)
			}
		})
	}
}

// TestRogueGossipMemberGetsNoOffers is the gossip reproduction in
// the dev world: members holding the global gossip key (an insider on the
// cluster network) join the global pool as cluster relays of cluster 1 and
// advertise their own session API, one with a plausible capacity, one with
// a huge capacity. Before, 2 of 6 offers reached such a member. Since the
// global pool's metadata is proven per role (docs/operations.md, "The
// global pool"), signaling refuses both outright: neither holds cluster
// 1's relay key, so neither is listed and no offer reaches them.
func TestRogueGossipMemberGetsNoOffers(t *testing.T) {
	w := startWorld(t, devworld.Config{})
	ln, err := net.Listen("tcp", "127.0.0.2:0") // the dev world's APIs live on 127.0.0.1
	if err != nil {
		t.Fatal(err)
	}
	var offers atomic.Int32
	rogueAPI := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		offers.Add(1)
		http.Error(w, "rogue", http.StatusInternalServerError)
	}))
	rogueAPI.Listener.Close()
	rogueAPI.Listener = ln
	rogueAPI.Start()
	defer rogueAPI.Close()
	join := func(name string, meta membership.Meta) {
		p, err := membership.New(membership.Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"),
			WAN: true, SecretKey: w.GossipKey(), Fast: true, Logger: testLogger()}, meta)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		if _, err := p.Join([]string{w.SignalingPool.LocalAddr().String()}); err != nil {
			t.Fatal(err)
		}
	}
	join("rogue-api", membership.Meta{Role: membership.RoleClusterRelay, Region: "eu-central", Cluster: 1,
		API: rogueAPI.URL, Capacity: 500})
	join("rogue-capacity", membership.Meta{Role: membership.RoleClusterRelay, Region: "eu-central", Cluster: 1,
		API: "http://127.0.0.1:1", Capacity: 5_000_000})
	// Signaling has heard of both and refused both (counted).
	eventually(t, 10*time.Second, "signaling to refuse both rogue members", func() bool {
		return metricSum(t, w.Registry, "rtcedge_membership_meta_decode_errors_total", nil) >= 2
	})
	unlisted := func() {
		t.Helper()
		for _, m := range w.SignalingPool.Members() {
			if strings.HasPrefix(m.Name, "rogue-") {
				t.Fatalf("unproven member %s is listed", m.Name)
			}
		}
	}
	unlisted()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 6 {
		call, err := probe.Dial(ctx, probe.Config{SignalingURL: w.SignalingURL, Logger: testLogger()})
		if err != nil {
			t.Fatalf("offer %d: %v", i, err)
		}
		_ = call.Hangup(ctx)
		call.Close()
	}
	if n := offers.Load(); n != 0 {
		t.Fatalf("%d of 6 offers reached the rogue member's session API", n)
	}
	unlisted()
}

// TestSessionAPIsOverTLS: with every session API on TLS (a cluster CA that
// signaling and the fronts verify) and bearer secrets, calls are placed
// and hung up as before, through the production node wiring.
func TestSessionAPIsOverTLS(t *testing.T) {
	w := startWorld(t, devworld.Config{SessionAPITLS: true})
	for _, rg := range w.Regions {
		for _, p := range rg.Pods {
			if !strings.HasPrefix(p.API, "https://") {
				t.Fatalf("pod session API %s is not https", p.API)
			}
		}
		for _, cr := range rg.ClusterRelays {
			if !strings.HasPrefix(cr.Front, "https://") {
				t.Fatalf("cluster front %s is not https", cr.Front)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := dial(t, ctx, w)
	if err := call.WaitEcho(ctx); err != nil {
		t.Fatal(err)
	}
	if err := call.Hangup(ctx); err != nil {
		t.Fatal(err)
	}
}
