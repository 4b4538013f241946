package signaling_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/geo"
	"github.com/rtcedge/rtcedge/internal/sessionapi"
	"github.com/rtcedge/rtcedge/internal/testsdp"
	"github.com/rtcedge/rtcedge/signaling"
)

// multipartOffer is an OpenAI-style /calls body: an sdp field and, unless
// empty, a session field.
func multipartOffer(t *testing.T, offer, session string) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("sdp", offer)
	if session != "" {
		_ = mw.WriteField("session", session)
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), buf.String()
}

// errorParam decodes an error body's param (nil for null) and checks the
// field is present.
func errorParam(t *testing.T, body []byte) *string {
	t.Helper()
	var e struct {
		Error map[string]*string `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	p, ok := e.Error["param"]
	if !ok {
		t.Fatalf("error body %s has no param", body)
	}
	return p
}

// TestSignalingSecretBindsSession is the reproduction: a server
// mints a secret with {"instructions":"SERVER-CHOSEN"}; the pod's backend
// must get that config for /sdp and for multipart /calls, a browser can
// never replace the model or the instructions, may add only the fields on
// the allow-list, and cannot read the server's config out of the secret.
func TestSignalingSecretBindsSession(t *testing.T) {
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) {
		c.APIKeys, c.AllowAnonymous = []string{testAPIKey}, false
	}})
	offer := testsdp.Offer(t)
	const server = `{"instructions":"SERVER-CHOSEN","model":"cheap","audio":{"output":{"voice":"server-voice"}}}`
	cs := w.mint(t, `{"session": `+server+`}`)
	// The effective session comes back in canonical form.
	if want := `{"audio":{"output":{"voice":"server-voice"}},"instructions":"SERVER-CHOSEN","model":"cheap","type":"realtime"}`; string(configOf(t, cs)) != want {
		t.Fatalf("client_secrets session %s, want %s", cs.Session, want)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(cs.Value, "ek_"))
	if bytes.Contains(raw, []byte("SERVER-CHOSEN")) || strings.Contains(cs.Value, "SERVER") {
		t.Fatal("the secret shows the server's instructions to whoever holds it")
	}

	tests := []struct {
		name      string
		session   string // multipart session field; "-" means /v1/realtime/sdp
		status    int
		param     string // of a 400
		wantGiven string // config the backend gets
	}{
		{"sdp endpoint", "-", http.StatusCreated, "", `{"audio":{"output":{"voice":"server-voice"}},"instructions":"SERVER-CHOSEN","model":"cheap"}`},
		{"calls without session", "", http.StatusCreated, "", `{"audio":{"output":{"voice":"server-voice"}},"instructions":"SERVER-CHOSEN","model":"cheap"}`},
		{"attacker instructions", `{"instructions":"ATTACKER-CHOSEN"}`, http.StatusBadRequest, "session.instructions", ""},
		{"attacker model", `{"model":"most-expensive"}`, http.StatusBadRequest, "session.model", ""},
		{"attacker tools", `{"tools":[{"type":"function","name":"x"}]}`, http.StatusBadRequest, "session.tools", ""},
		{"repeating the server's model", `{"model":"cheap","type":"realtime"}`, http.StatusCreated, "",
			`{"audio":{"output":{"voice":"server-voice"}},"instructions":"SERVER-CHOSEN","model":"cheap","type":"realtime"}`},
		{"allowed additions, server keys win", `{"audio":{"output":{"voice":"client-voice","speed":1.2},"input":{"format":"pcm"}},"temperature":0.7}`, http.StatusCreated, "",
			`{"audio":{"input":{"format":"pcm"},"output":{"speed":1.2,"voice":"server-voice"}},"instructions":"SERVER-CHOSEN","model":"cheap","temperature":0.7}`},
		{"session not an object", `["x"]`, http.StatusBadRequest, "session", ""},
		{"numbers kept as written", `{"max_output_tokens":9007199254740993}`, http.StatusCreated, "",
			`{"audio":{"output":{"voice":"server-voice"}},"instructions":"SERVER-CHOSEN","max_output_tokens":9007199254740993,"model":"cheap"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var rec = w.do(t, http.MethodPost, "/v1/realtime/sdp", ipAshburn, "application/sdp", offer, bearer(cs.Value))
			if tc.session != "-" {
				ct, body := multipartOffer(t, offer, tc.session)
				rec = w.do(t, http.MethodPost, "/v1/realtime/calls", ipAshburn, ct, body, bearer(cs.Value))
			}
			res, body := recorded(rec)
			if res.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, tc.status, body)
			}
			if tc.status != http.StatusCreated {
				if p := errorParam(t, body); p == nil || *p != tc.param {
					t.Fatalf("param %v, want %q (%s)", p, tc.param, body)
				}
				return
			}
			defer w.hangup(t, rec, bearer(cs.Value))
			if got := w.backend.last(); got != tc.wantGiven {
				t.Fatalf("backend got config %s\nwant %s", got, tc.wantGiven)
			}
		})
	}

	// An API key speaks for the server: its session goes through as sent.
	ct, body := multipartOffer(t, offer, `{"model":"most-expensive"}`)
	rec := w.do(t, http.MethodPost, "/v1/realtime/calls", ipAshburn, ct, body, bearer(testAPIKey))
	if rec.Code != http.StatusCreated || w.backend.last() != `{"model":"most-expensive"}` {
		t.Fatalf("API key call: %d %s, backend got %s", rec.Code, rec.Body, w.backend.last())
	}
	w.hangup(t, rec, bearer(testAPIKey))
}

// TestSignalingKeyQuota: an app backend minting with its API key is
// limited by the key's own quota, not by its address: 1,000 secrets in a
// minute from one address, and a sustained 50/s, get no 429, while failed
// authentications from that address are refused by the per-address limit.
func TestSignalingKeyQuota(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	const keyB = "sk-test-backend-b-0123456789"
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) {
		c.AllowAnonymous = false
		c.Keys = []signaling.APIKey{
			{Key: testAPIKey, Tenant: "app", RatePerSecond: 20, RateBurst: 20},
			{Key: keyB, Tenant: "other", RatePerSecond: 50, RateBurst: 50},
		}
		c.RatePerSecond, c.RateBurst = 5, 20 // per address, the defaults
		c.Now = clk.now
	}})
	mint := func(key string) int {
		return w.do(t, http.MethodPost, "/v1/realtime/client_secrets", ipAshburn, "", "", bearer(key)).Code
	}
	for i := range 1000 { // 1,000 in 60 s
		if code := mint(testAPIKey); code != http.StatusOK {
			t.Fatalf("secret %d of 1000 in a minute: %d", i, code)
		}
		clk.advance(60 * time.Millisecond)
	}
	for i := range 500 { // 50/s for 10 s
		if code := mint(keyB); code != http.StatusOK {
			t.Fatalf("secret %d at 50/s: %d", i, code)
		}
		clk.advance(20 * time.Millisecond)
	}
	// The key's quota is enforced, and is its own.
	for range 20 {
		mint(testAPIKey)
	}
	if code := mint(testAPIKey); code != http.StatusTooManyRequests {
		t.Fatalf("past the key's burst: %d, want 429", code)
	}
	if code := mint(keyB); code != http.StatusOK {
		t.Fatalf("another key at the same address: %d, want 200", code)
	}
	// Guessing keys from that address runs out of the address's budget;
	// the valid key at the same address does not care.
	codes := map[int]int{}
	for range 21 {
		codes[mint("sk-test-guessed-key-00000000")]++
	}
	if codes[http.StatusUnauthorized] != 20 || codes[http.StatusTooManyRequests] != 1 {
		t.Fatalf("21 guesses: %v, want 20 × 401 then 429", codes)
	}
	if code := mint(keyB); code != http.StatusOK {
		t.Fatalf("valid key after the guesses: %d", code)
	}
	// Users behind one CGNAT address, each with their own client secret,
	// do not share the address's budget (20): 100 of them are all served
	// (their offers are bad, which is checked after the limit: 400, not
	// 429).
	secrets := make([]string, 100)
	for i := range secrets {
		res, data := recorded(w.do(t, http.MethodPost, "/v1/realtime/client_secrets", "127.0.0.1", "", "", bearer(keyB)))
		var cs signaling.ClientSecret
		if res.StatusCode != http.StatusOK || json.Unmarshal(data, &cs) != nil {
			t.Fatalf("mint %d: %d %s", i, res.StatusCode, data)
		}
		secrets[i] = cs.Value
		clk.advance(20 * time.Millisecond)
	}
	for i, sec := range secrets {
		if code := w.do(t, http.MethodPost, "/v1/realtime/sdp", ipAshburn, "application/sdp", "v=0", bearer(sec)).Code; code != http.StatusBadRequest {
			t.Fatalf("CGNAT user %d: %d, want 400 (served, not rate-limited)", i, code)
		}
	}
	if v := metricValue(t, w, "rtcedge_signaling_rate_limited_total", map[string]string{"limit": "address"}); v != 1 {
		t.Errorf("address refusals %v, want 1", v)
	}
}

// TestSignalingHangupCapability: a call is hung up only by the secret
// that placed it (also after it expired) or an API key of its tenant;
// another user's secret, a key of another tenant, an expired secret of
// someone else, and a bare session ID get 404 and the call goes on.
func TestSignalingHangupCapability(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	const (
		keyA2 = "sk-test-tenant-a-second-key"
		keyB  = "sk-test-tenant-b-0123456789"
	)
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) {
		c.AllowAnonymous = false
		c.Keys = []signaling.APIKey{{Key: testAPIKey, Tenant: "a"}, {Key: keyA2, Tenant: "a"}, {Key: keyB, Tenant: "b"}}
		c.Now = clk.now
	}})
	offer := testsdp.Offer(t)
	mint := func(key string) string {
		res, data := recorded(w.do(t, http.MethodPost, "/v1/realtime/client_secrets", "127.0.0.1", "", "", bearer(key)))
		var cs signaling.ClientSecret
		if res.StatusCode != http.StatusOK || json.Unmarshal(data, &cs) != nil {
			t.Fatalf("mint: %d %s", res.StatusCode, data)
		}
		return cs.Value
	}
	mine, theirs, ofB := mint(testAPIKey), mint(testAPIKey), mint(keyB)
	old := mint(testAPIKey) // expires in 10 minutes; used 11 h later
	place := func(cred string) string {
		rec := w.do(t, http.MethodPost, "/v1/realtime/calls", ipAshburn, "application/sdp", offer, bearer(cred))
		if rec.Code != http.StatusCreated {
			t.Fatalf("place: %d %s", rec.Code, rec.Body)
		}
		loc := rec.Header().Get("Location")
		if !strings.HasPrefix(loc, "/v1/realtime/calls/") {
			t.Fatalf("Location %q, want /v1/realtime/calls/{id}", loc)
		}
		return loc
	}
	hangup := func(method, loc, cred string) int {
		path := loc
		if method == http.MethodPost {
			path += "/hangup"
		}
		return w.do(t, method, path, "127.0.0.1", "", "", bearer(cred)).Code
	}
	live := func() float64 { return float64(w.pods[2].tr.Sessions()) }

	call := place(mine)
	byOld := place(testAPIKey)
	clk.advance(11 * time.Hour)
	bare := call[:strings.LastIndexByte(call, '.')]
	// The hang-up tag is characters 16 to 32 of the capability (the
	// secret ID before it, the sideband tag after it).
	hangTag := strings.LastIndexByte(call, '.') + 1 + 30
	swap := "AA"
	if call[hangTag:hangTag+2] == swap {
		swap = "BB"
	}
	tampered := call[:hangTag] + swap + call[hangTag+2:]
	for _, tc := range []struct {
		name, method, loc, cred string
	}{
		{"another user's secret", http.MethodDelete, call, theirs},
		{"a key of another tenant", http.MethodDelete, call, keyB},
		{"a secret of another tenant", http.MethodPost, call, ofB},
		{"someone's secret expired 11 h ago", http.MethodDelete, call, old},
		{"a secret minted by the tenant, on a key's call", http.MethodPost, byOld, mine},
		{"the bare session ID", http.MethodDelete, bare, mine},
		{"the bare session ID with the tenant's key", http.MethodDelete, bare, testAPIKey},
		{"a tampered tag", http.MethodDelete, tampered, mine},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code := hangup(tc.method, tc.loc, tc.cred); code != http.StatusNotFound {
				t.Fatalf("%s %s: %d, want 404", tc.method, tc.loc, code)
			}
		})
	}
	if n := live(); n != 2 {
		t.Fatalf("%v live sessions after refused hang-ups, want 2", n)
	}
	// The creator's own secret, long expired, still hangs up its call
	// (POST .../hangup, OpenAI's form); the tenant's other key ends the
	// key's call (DELETE of the call URL).
	if code := hangup(http.MethodPost, call, mine); code != http.StatusNoContent {
		t.Fatalf("creator's hang-up: %d", code)
	}
	if code := hangup(http.MethodDelete, byOld, keyA2); code != http.StatusNoContent {
		t.Fatalf("tenant key's hang-up: %d", code)
	}
	if n := live(); n != 0 {
		t.Fatalf("%v live sessions after the hang-ups, want 0", n)
	}
	// /v1/realtime/sdp keeps its session URL, and DELETE of it works.
	rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", ipAshburn, "application/sdp", offer, bearer(testAPIKey))
	if loc := rec.Header().Get("Location"); rec.Code != http.StatusCreated || !strings.HasPrefix(loc, "/v1/realtime/sessions/") {
		t.Fatalf("/sdp: %d Location %q", rec.Code, loc)
	}
	w.hangup(t, rec, bearer(keyA2))
}

// TestSignalingNeedsKeys: without API keys signaling refuses to start
// unless anonymous access is asked for.
func TestSignalingNeedsKeys(t *testing.T) {
	var cfg signaling.Config
	newWorld(t, worldConfig{api: map[uint16]string{1: "http://127.0.0.1:1", 2: "http://127.0.0.1:1", 3: "http://127.0.0.1:1"},
		tweak: func(c *signaling.Config) { cfg = *c }})
	for _, tc := range []struct {
		name      string
		keys      []string
		anonymous bool
		ok        bool
	}{
		{"no keys", nil, false, false},
		{"no keys, anonymous", nil, true, true},
		{"keys", []string{testAPIKey}, false, true},
		{"keys and anonymous", []string{testAPIKey}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.APIKeys, c.AllowAnonymous, c.Registerer = tc.keys, tc.anonymous, nil
			_, err := signaling.New(c)
			if (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok = %v", err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "allow_anonymous") {
				t.Fatalf("error %q does not say how to allow anonymous access", err)
			}
		})
	}
}

// TestSignalingSessionAPISecret: with per-cluster secrets on the pods,
// signaling presents them; a signaling without them places no call (every
// cluster refuses it) and the pods create nothing.
func TestSignalingSessionAPISecret(t *testing.T) {
	const secret = "session-api-secret-of-every-test-cluster"
	for _, tc := range []struct {
		name   string
		tweak  func(*signaling.Config)
		status int
	}{
		{"with the secrets", nil, http.StatusCreated},
		{"without them", func(c *signaling.Config) { c.SessionAPISecrets = nil }, http.StatusServiceUnavailable},
		{"with wrong ones", func(c *signaling.Config) {
			c.SessionAPISecrets = map[uint16]string{1: "wrong", 2: "wrong", 3: "wrong"}
		}, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, worldConfig{apiSecret: secret, tweak: tc.tweak})
			rec := w.do(t, http.MethodPost, "/v1/realtime/calls", ipAshburn, "application/sdp", testsdp.Offer(t), nil)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if rec.Code == http.StatusCreated {
				w.hangup(t, rec, nil)
				return
			}
			for id, p := range w.pods {
				if n := p.created(t); n != 0 {
					t.Errorf("pod of cluster %d created %v sessions for an unauthenticated caller", id, n)
				}
			}
		})
	}
}

// TestSignalingIgnoresRogueEndpoints is the gossip reproduction at the
// signaling end: a member advertising its own session API for a cluster
// gets no offer unless the catalogue allows its address (the cluster's
// session_api host or session_api_nets).
func TestSignalingIgnoresRogueEndpoints(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.2:0") // not the catalogue's 127.0.0.1
	if err != nil {
		t.Fatal(err)
	}
	var offers atomic.Int32
	rogue := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		offers.Add(1)
		http.Error(w, "rogue", http.StatusTeapot)
	}))
	rogue.Listener.Close()
	rogue.Listener = ln
	rogue.Start()
	defer rogue.Close()
	for _, tc := range []struct {
		name   string
		nets   []netip.Prefix
		offers int32
	}{
		{"not allowed", nil, 0},
		{"allowed by session_api_nets", []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			offers.Store(0)
			var w *world
			w = newWorld(t, worldConfig{tweak: func(c *signaling.Config) {
				c.SessionAPIs = func(cluster uint16) []string { return []string{rogue.URL} }
				for i := range c.CatalogueData.Regions {
					c.CatalogueData.Regions[i].Clusters[0].SessionAPINets = tc.nets
				}
			}})
			rec := w.do(t, http.MethodPost, "/v1/realtime/calls", ipAshburn, "application/sdp", testsdp.Offer(t), nil)
			if tc.offers == 0 {
				if rec.Code != http.StatusCreated {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				w.hangup(t, rec, nil)
			}
			if got := offers.Load(); got < tc.offers || (tc.offers == 0 && got != 0) {
				t.Fatalf("rogue endpoint got %d offers, want %d", got, tc.offers)
			}
			if tc.offers == 0 {
				if v := metricValue(t, w, "rtcedge_signaling_refused_endpoints_total", nil); v == 0 {
					t.Error("refused endpoints not counted")
				}
			}
		})
	}
}

// TestNodeConfigNeedsKeys: the role config refuses to start signaling
// without API keys unless allow_anonymous is set, and parses the proxy
// lists (with the "cloudflare" entry).
func TestNodeConfigNeedsKeys(t *testing.T) {
	t.Setenv(signaling.EnvAPIKeys, "")
	for _, tc := range []struct {
		name string
		cfg  signaling.Config
		want string
	}{
		{"no keys", signaling.Config{}, "allow_anonymous"},
		{"anonymous", signaling.Config{AllowAnonymous: true}, ""},
		{"api keys", signaling.Config{APIKeys: []string{testAPIKey}}, ""},
		{"tenant keys", signaling.Config{Keys: []signaling.APIKey{{Key: testAPIKey, Tenant: "a"}}}, ""},
		{"proxy lists", signaling.Config{AllowAnonymous: true, CloudflareRanges: []string{"cloudflare"}, InternalProxies: []string{"10.0.0.0/8"}}, ""},
		{"bad proxy", signaling.Config{AllowAnonymous: true, InternalProxies: []string{"ingress"}}, "internal_proxies"},
		{"negative key rate", signaling.Config{AllowAnonymous: true, KeyRatePerSecond: -1}, "key_rate_per_second"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.ListenAddr, c.CatalogueData = "127.0.0.1:0", &geo.Catalogue{}
			c.Defaults()
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestSignalingIngressTrust is the proxy reproduction at the HTTP front:
// with the ingress listed as an internal proxy and Cloudflare's ranges as
// Cloudflare, a client reaching the ingress directly with forged CF-*
// headers is located (and rate-limited) by its own address, while the same
// headers through a Cloudflare hop are believed.
func TestSignalingIngressTrust(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	w := newWorld(t, worldConfig{
		proxies:  geo.CloudflareRanges(),
		internal: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		tweak: func(c *signaling.Config) {
			c.RatePerSecond, c.RateBurst, c.Now = 1, 2, clk.now
		},
	})
	offer := testsdp.Offer(t)
	forged := func(xff string) http.Header {
		return http.Header{"X-Forwarded-For": {xff}, "Cf-Connecting-Ip": {ipSingapore},
			"Cf-Iplatitude": {"1.35"}, "Cf-Iplongitude": {"103.82"}}
	}
	// Straight to the ingress: the ingress appends the attacker's address.
	rec := w.do(t, http.MethodPost, "/v1/realtime/sdp", "10.0.0.1", "application/sdp", offer, forged(ipAshburn))
	res, body := recorded(rec)
	checkPlaced(t, res, body, inAshburn)
	w.hangup(t, rec, nil)
	// Through Cloudflare (an edge address) and the ingress: believed.
	rec = w.do(t, http.MethodPost, "/v1/realtime/sdp", "10.0.0.1", "application/sdp", offer, forged(ipAshburn+", 172.64.1.1"))
	res, body = recorded(rec)
	checkPlaced(t, res, body, inSingapore)
	w.hangup(t, rec, nil)
	// The forged CF-Connecting-IP does not move the attacker's rate-limit
	// key either: its own address's budget (2) runs out however it varies.
	codes := map[int]int{}
	for i := range 3 {
		h := forged(ipAshburn)
		h.Set("Cf-Connecting-Ip", "203.0.113."+strconv.Itoa(100+i))
		codes[w.do(t, http.MethodPost, "/v1/realtime/sdp", "10.0.0.1", "application/sdp", "v=0", h).Code]++
	}
	if codes[http.StatusTooManyRequests] == 0 {
		t.Fatalf("forged CF-Connecting-IPs escaped the attacker's budget: %v", codes)
	}
}

// TestSignalingAnonymousFlood is the flood goal at the HTTP front, with
// the table scaled down (20,000 entries, flooded from 20,000 IPv6 /64s
// while it is full): honest clients of other prefixes arriving during the
// flood still get their first request served (a 400 for a bad offer, not a
// 429), at least 99 % of them.
func TestSignalingAnonymousFlood(t *testing.T) {
	const table = 20_000
	w := newWorld(t, worldConfig{api: map[uint16]string{1: "http://127.0.0.1:1", 2: "http://127.0.0.1:1", 3: "http://127.0.0.1:1"},
		tweak: func(c *signaling.Config) { c.RatePerSecond, c.RateBurst, c.MaxLimiters = 5, 20, table }})
	attacker := func(i int) string {
		return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, byte(i >> 16), byte(i >> 8), byte(i), 15: 1}).String()
	}
	for i := range table {
		w.do(t, http.MethodPost, "/v1/realtime/sdp", attacker(i), "application/sdp", "v=0", nil)
	}
	served, honest := 0, 0
	for i := range 500 {
		w.do(t, http.MethodPost, "/v1/realtime/sdp", attacker(i), "application/sdp", "v=0", nil) // the flood goes on
		ip := netip.AddrFrom4([4]byte{byte(11 + i%200), byte(i >> 2), byte(i), 9}).String()
		if i%2 == 1 {
			ip = netip.AddrFrom16([16]byte{0x2a, 0x02, byte(i >> 8), byte(i), 7, 15: 3}).String()
		}
		honest++
		if w.do(t, http.MethodPost, "/v1/realtime/sdp", ip, "application/sdp", "v=0", nil).Code == http.StatusBadRequest {
			served++
		}
	}
	if served*100 < honest*99 {
		t.Fatalf("%d of %d honest first requests served during the flood, want >= 99 %%", served, honest)
	}
}

// TestCallerPolicyPerCredential: the pod is told, per call, which session
// fields the caller may set and whether sealed fields win silently: a
// client secret carries its minting key's policy (sealed at minting), an
// API key's call its own, and the configured default covers the rest.
// With sealed fields winning, a /calls session's refused fields are
// dropped instead of failing the offer.
func TestCallerPolicyPerCredential(t *testing.T) {
	const agentKey = "sk-agents-sdk-app-0123456789"
	yes := true
	w := newWorld(t, worldConfig{tweak: func(c *signaling.Config) {
		c.APIKeys, c.AllowAnonymous = []string{testAPIKey}, false
		c.Keys = []signaling.APIKey{{Key: agentKey, ClientSessionFields: []string{"voice", "audio"}, SealedFieldsWin: &yes}}
	}})
	offer := testsdp.Offer(t)
	mintWith := func(key string) signaling.ClientSecret {
		res, data := recorded(w.do(t, http.MethodPost, "/v1/realtime/client_secrets", "127.0.0.1", "application/json",
			`{"session":{"instructions":"SEALED"}}`, bearer(key)))
		if res.StatusCode != http.StatusOK {
			t.Fatalf("mint: %d %s", res.StatusCode, data)
		}
		var cs signaling.ClientSecret
		if err := json.Unmarshal(data, &cs); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	agentSecret, plainSecret := mintWith(agentKey), mintWith(testAPIKey)
	tests := []struct {
		name, token, session string
		fields               []string
		sealedWins           bool
		config               string
	}{
		{"secret of a key with its own policy", agentSecret.Value, `{"instructions":"mine","model":"x","voice":"ash"}`,
			[]string{"voice", "audio"}, true, `{"instructions":"SEALED","voice":"ash"}`},
		{"secret of a key with the default", plainSecret.Value, `{"voice":"ash"}`,
			sessionapi.DefaultClientSessionFields, false, `{"instructions":"SEALED","voice":"ash"}`},
		{"the key itself", agentKey, "", []string{"voice", "audio"}, true, ""},
		{"the default key itself", testAPIKey, "", sessionapi.DefaultClientSessionFields, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ct, body := multipartOffer(t, offer, tc.session)
			rec := w.do(t, http.MethodPost, "/v1/realtime/calls", ipAshburn, ct, body, bearer(tc.token))
			res, data := recorded(rec)
			if res.StatusCode != http.StatusCreated {
				t.Fatalf("status %d: %s", res.StatusCode, data)
			}
			defer w.hangup(t, rec, bearer(tc.token))
			info := w.backend.lastInfo()
			if !slices.Equal(info.ClientSessionFields, tc.fields) || info.SealedWins != tc.sealedWins {
				t.Errorf("the pod was told fields %v, sealed wins %v; want %v, %v", info.ClientSessionFields, info.SealedWins, tc.fields, tc.sealedWins)
			}
			if string(info.Config) != tc.config {
				t.Errorf("config %s, want %s", info.Config, tc.config)
			}
		})
	}
	// Without the option, the same session fails the offer.
	ct, body := multipartOffer(t, offer, `{"instructions":"mine"}`)
	if res, data := recorded(w.do(t, http.MethodPost, "/v1/realtime/calls", ipAshburn, ct, body, bearer(plainSecret.Value))); res.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d: %s", res.StatusCode, data)
	}
}
