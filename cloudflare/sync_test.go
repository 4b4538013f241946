package cloudflare

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/cloudflare/cloudflare-go/v6/option"
	"go.uber.org/goleak"

	"github.com/rtcedge/rtcedge/geo"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testToken   = "test-token-0123456789"
	testAccount = "023e105f4ecef8ad9ca31a8372d0c353"
	testZone    = "023e105f4ecef8ad9ca31a8372d0c354"
)

// env is one test's fake Cloudflare, catalogue and config.
type env struct {
	t   *testing.T
	f   *fakeCloudflare
	cat *geo.Catalogue
	cfg *Config
}

func newEnv(t *testing.T) *env {
	t.Helper()
	cat, err := geo.LoadCatalogue("../geo/testdata/catalogue.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig("testdata/sync.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, f: newFakeCloudflare(t, testToken, testAccount, testZone), cat: cat, cfg: cfg}
}

// sync runs one sync against the fake with the given token.
func (e *env) syncWith(token string, dryRun bool) (Plan, error) {
	e.t.Helper()
	s, err := New(e.cfg, e.cat, token, dryRun,
		option.WithBaseURL(e.f.baseURL()),
		option.WithHTTPClient(e.f.srv.Client()),
		// Retries back off for seconds; the tests want the first answer.
		option.WithMaxRetries(0),
	)
	if err != nil {
		e.t.Fatal(err)
	}
	return s.Sync(context.Background())
}

func (e *env) sync(dryRun bool) Plan {
	e.t.Helper()
	plan, err := e.syncWith(testToken, dryRun)
	if err != nil {
		e.t.Fatalf("sync: %v", err)
	}
	return plan
}

func verbs(p Plan) []string {
	var out []string
	for _, a := range p {
		out = append(out, a.Verb+" "+a.Object)
	}
	return out
}

func byName(objs map[string]map[string]any, name string) map[string]any {
	for _, o := range objs {
		if o["name"] == name {
			return o
		}
	}
	return nil
}

func TestFirstSyncCreatesEverythingSecondIsNoop(t *testing.T) {
	e := newEnv(t)
	plan := e.sync(false)
	wantPlan := []string{
		"create monitor /readyz for rt.example.com",
		"create pool rtcedge-ap-southeast",
		"create pool rtcedge-eu-central",
		"create pool rtcedge-us-east",
		"create load balancer rt.example.com",
		"update managed transform add_visitor_location_headers",
	}
	if got := verbs(plan); !slices.Equal(got, wantPlan) {
		t.Fatalf("plan:\n%v\nwant:\n%v", got, wantPlan)
	}
	if n := e.f.writeCount(); n != 6 {
		t.Fatalf("%d writes, want 6: %v", n, e.f.writesSince(0))
	}

	monitors := e.f.snapshot("monitor")
	if len(monitors) != 1 {
		t.Fatalf("%d monitors", len(monitors))
	}
	var monitorID string
	for id, m := range monitors {
		monitorID = id
		if m["type"] != "https" || m["method"] != "GET" || m["path"] != "/readyz" || m["expected_codes"] != "200" {
			t.Errorf("monitor = %v", m)
		}
		if h, _ := m["header"].(map[string]any); len(stringList(h["Host"])) != 1 || stringList(h["Host"])[0] != "rt.example.com" {
			t.Errorf("monitor header = %v", m["header"])
		}
	}

	pools := e.f.snapshot("pool")
	eu := byName(pools, "rtcedge-eu-central")
	if eu == nil || eu["monitor"] != monitorID || eu["latitude"] != 50.11 || eu["longitude"] != 8.68 {
		t.Fatalf("eu pool = %v", eu)
	}
	var addrs []string
	for _, o := range eu["origins"].([]any) {
		addrs = append(addrs, o.(map[string]any)["address"].(string))
	}
	if !slices.Equal(addrs, []string{"198.51.100.10", "198.51.100.11"}) {
		t.Errorf("eu origins = %v", addrs)
	}
	if !strings.HasPrefix(eu["description"].(string), "rtcedge-sync:rtcedge ") {
		t.Errorf("eu pool not tagged: %q", eu["description"])
	}

	lbs := e.f.snapshot("lb")
	if len(lbs) != 1 {
		t.Fatalf("%d load balancers", len(lbs))
	}
	us := byName(pools, "rtcedge-us-east")["id"].(string)
	ap := byName(pools, "rtcedge-ap-southeast")["id"].(string)
	for _, lb := range lbs {
		if lb["name"] != "rt.example.com" || lb["steering_policy"] != "geo" || lb["proxied"] != true || lb["fallback_pool"] != eu["id"] {
			t.Errorf("lb = %v", lb)
		}
		if got := stringList(lb["default_pools"]); !slices.Equal(got, []string{eu["id"].(string), us, ap}) {
			t.Errorf("default_pools = %v", got)
		}
		rp := lb["region_pools"].(map[string]any)
		if got := stringList(rp["ENAM"]); !slices.Equal(got, []string{us, eu["id"].(string), ap}) {
			t.Errorf("region_pools[ENAM] = %v (own region first, then failover order)", got)
		}
		if got := stringList(lb["country_pools"].(map[string]any)["CA"]); len(got) == 0 || got[0] != us {
			t.Errorf("country_pools[CA] = %v", got)
		}
	}

	before := e.f.writeCount()
	if plan := e.sync(false); len(plan) != 0 {
		t.Errorf("second sync planned %v", verbs(plan))
	}
	if w := e.f.writesSince(before); len(w) != 0 {
		t.Errorf("second sync wrote %v", w)
	}
}

func TestSyncCorrectsDrift(t *testing.T) {
	isPool := func(name string) func(map[string]any) bool {
		return func(o map[string]any) bool { return o["name"] == name }
	}
	all := func(map[string]any) bool { return true }
	tests := []struct {
		name      string
		kind      string
		find      func(map[string]any) bool
		change    func(map[string]any)
		wantWrite string // path suffix of the one PATCH expected
		wantDiff  string // substring of the plan's change lines
	}{
		{
			name: "origin address changed",
			kind: "pool", find: isPool("rtcedge-us-east"),
			change: func(o map[string]any) {
				o["origins"].([]any)[0].(map[string]any)["address"] = "192.0.2.99"
			},
			wantWrite: "/load_balancers/pools/",
			wantDiff:  "us-east-1=192.0.2.99",
		},
		{
			name: "origin disabled",
			kind: "pool", find: isPool("rtcedge-eu-central"),
			change: func(o map[string]any) {
				o["origins"].([]any)[1].(map[string]any)["enabled"] = false
			},
			wantWrite: "/load_balancers/pools/",
			wantDiff:  "enabled=false",
		},
		{
			name: "monitor path changed",
			kind: "monitor", find: all,
			change:    func(o map[string]any) { o["path"] = "/" },
			wantWrite: "/load_balancers/monitors/",
			wantDiff:  `path: "/" -> "/readyz"`,
		},
		{
			name: "steering policy changed",
			kind: "lb", find: all,
			change:    func(o map[string]any) { o["steering_policy"] = "random" },
			wantWrite: "/zones/" + testZone + "/load_balancers/",
			wantDiff:  `steering_policy: "random" -> "geo"`,
		},
		{
			name: "region pool removed",
			kind: "lb", find: all,
			change:    func(o map[string]any) { delete(o["region_pools"].(map[string]any), "WEU") },
			wantWrite: "/zones/" + testZone + "/load_balancers/",
			wantDiff:  "region_pools[WEU]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.sync(false)
			e.f.edit(t, tt.kind, tt.find, tt.change)

			before := e.f.writeCount()
			plan := e.sync(false)
			writes := e.f.writesSince(before)
			if len(writes) != 1 || !strings.HasPrefix(writes[0], "PATCH ") || !strings.Contains(writes[0], tt.wantWrite) {
				t.Fatalf("writes = %v, want one PATCH of %s", writes, tt.wantWrite)
			}
			if len(plan) != 1 || plan[0].Verb != "update" || !strings.Contains(plan[0].String(), tt.wantDiff) {
				t.Fatalf("plan = %v, want an update mentioning %q", plan, tt.wantDiff)
			}

			before = e.f.writeCount()
			if plan := e.sync(false); len(plan) != 0 || e.f.writeCount() != before {
				t.Fatalf("sync after the correction planned %v, wrote %v", verbs(plan), e.f.writesSince(before))
			}
		})
	}
}

func TestSyncReportsAPIErrors(t *testing.T) {
	tests := []struct {
		name     string
		token    string
		fail     func(f *fakeCloudflare)
		want     []string // substrings of the error
		status   int
		wantPlan int // actions done before the failure
	}{
		{
			name:   "bad token",
			token:  "wrong",
			want:   []string{"list monitors", "HTTP 403", "[10000] Authentication error"},
			status: http.StatusForbidden,
		},
		{
			name:  "pool creation refused",
			token: testToken,
			fail: func(f *fakeCloudflare) {
				f.failNext(http.MethodPost, "pool", apiFault{status: http.StatusBadRequest, code: 1002, message: "origin address is not allowed"})
			},
			want:     []string{"create pool rtcedge-ap-southeast", "HTTP 400", "[1002] origin address is not allowed"},
			status:   http.StatusBadRequest,
			wantPlan: 2,
		},
		{
			name:  "load balancer quota",
			token: testToken,
			fail: func(f *fakeCloudflare) {
				f.failNext(http.MethodPost, "lb", apiFault{status: http.StatusForbidden, code: 1004, message: "load balancer quota exceeded"})
			},
			want:     []string{"create load balancer rt.example.com", "HTTP 403", "[1004] load balancer quota exceeded"},
			status:   http.StatusForbidden,
			wantPlan: 5,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			if tt.fail != nil {
				tt.fail(e.f)
			}
			plan, err := e.syncWith(tt.token, false)
			if err == nil {
				t.Fatal("sync succeeded")
			}
			t.Logf("reported: %v", err)
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.Status != tt.status {
				t.Errorf("error %v: want an *APIError with status %d", err, tt.status)
			}
			if len(plan) != tt.wantPlan {
				t.Errorf("plan before the error = %v, want %d actions", verbs(plan), tt.wantPlan)
			}
		})
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	e := newEnv(t)
	plan := e.sync(true)
	if len(plan) != 6 {
		t.Fatalf("dry-run plan on an empty account = %v, want 5 creates and the transform", verbs(plan))
	}
	if n := e.f.writeCount(); n != 0 {
		t.Fatalf("dry run wrote %v", e.f.writesSince(0))
	}
	var out bytes.Buffer
	if err := plan.WritePlan(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "create load balancer rt.example.com") {
		t.Errorf("printed plan:\n%s", out.String())
	}

	e.sync(false)
	e.f.edit(t, "pool", func(o map[string]any) bool { return o["name"] == "rtcedge-eu-central" }, func(o map[string]any) { o["minimum_origins"] = 2.0 })
	before := e.f.writeCount()
	plan = e.sync(true)
	if got := verbs(plan); !slices.Equal(got, []string{"update pool rtcedge-eu-central"}) || !strings.Contains(plan[0].String(), "minimum_origins: 2 -> 1") {
		t.Fatalf("dry-run plan after drift = %v", plan)
	}
	if w := e.f.writesSince(before); len(w) != 0 {
		t.Fatalf("dry run wrote %v", w)
	}
	if p := byName(e.f.snapshot("pool"), "rtcedge-eu-central"); p["minimum_origins"] != 2.0 {
		t.Errorf("dry run corrected the drift: %v", p["minimum_origins"])
	}

	var none bytes.Buffer
	if err := (Plan{}).WritePlan(&none); err != nil || !strings.Contains(none.String(), "no changes") {
		t.Errorf("empty plan printed %q, %v", none.String(), err)
	}
}

func TestNeverTouchesForeignObjects(t *testing.T) {
	tests := []struct {
		name string
		seed func(f *fakeCloudflare)
		want string
	}{
		{
			name: "pool of the same name made by hand",
			seed: func(f *fakeCloudflare) {
				f.put("pool", map[string]any{"name": "rtcedge-eu-central", "description": "hand-made", "origins": []any{map[string]any{"name": "a", "address": "192.0.2.1"}}})
			},
			want: "pool rtcedge-eu-central",
		},
		{
			name: "load balancer on the hostname made by Terraform",
			seed: func(f *fakeCloudflare) {
				pool := f.put("pool", map[string]any{"name": "tf-pool", "description": "rtcedge-managed:terraform pool", "origins": []any{map[string]any{"name": "a", "address": "192.0.2.1"}}})
				f.put("lb", map[string]any{"name": "rt.example.com", "description": "rtcedge-managed:terraform lb", "default_pools": []any{pool}, "fallback_pool": pool})
			},
			want: "load balancer rt.example.com",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			tt.seed(e.f)
			foreignPools, foreignLBs := e.f.snapshot("pool"), e.f.snapshot("lb")
			_, err := e.syncWith(testToken, false)
			if !errors.Is(err, ErrNotOwned) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrNotOwned naming %q", err, tt.want)
			}
			for _, w := range e.f.writesSince(0) {
				for id := range foreignPools {
					if strings.Contains(w, id) {
						t.Errorf("wrote a foreign pool: %s", w)
					}
				}
				for id := range foreignLBs {
					if strings.Contains(w, id) {
						t.Errorf("wrote a foreign load balancer: %s", w)
					}
				}
			}
		})
	}
}

func TestStaleOwnedPoolsAreDeletedOthersKept(t *testing.T) {
	e := newEnv(t)
	e.sync(false)
	foreign := e.f.put("pool", map[string]any{"name": "rtcedge-legacy", "description": "hand-made", "origins": []any{map[string]any{"name": "a", "address": "192.0.2.1"}}})

	// ap-southeast leaves: its cluster goes from the catalogue.
	cat, err := geo.ParseCatalogue([]byte(`
default_region: eu-central
regions:
  - name: eu-central
    location: {lat: 50.11, lon: 8.68}
    clusters: [{id: 1, name: eu-central-1, session_api: "http://127.0.0.1:8081"}]
    pops: [{id: 1, name: fra, vip: "127.0.0.2:3478"}]
  - name: us-east
    location: {lat: 39.04, lon: -77.49}
    clusters: [{id: 2, name: us-east-1, session_api: "http://127.0.0.1:8082"}]
  - name: ap-southeast
    location: {lat: 1.35, lon: 103.82}
    pops: [{id: 3, name: sin, vip: "127.0.0.4:3478"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	e.cat = cat
	delete(e.cfg.Regions, "ap-southeast")
	e.cfg.RegionOrder = []string{"eu-central", "us-east"}

	plan := e.sync(false)
	// The remaining pools stop probing from ap-southeast's Cloudflare
	// regions (check_regions follow the regions in use).
	want := []string{"update pool rtcedge-eu-central", "update pool rtcedge-us-east", "update load balancer rt.example.com", "delete pool rtcedge-ap-southeast"}
	if got := verbs(plan); !slices.Equal(got, want) {
		t.Fatalf("plan = %v, want %v", got, want)
	}
	pools := e.f.snapshot("pool")
	if byName(pools, "rtcedge-ap-southeast") != nil {
		t.Error("stale owned pool still there")
	}
	if _, ok := pools[foreign]; !ok {
		t.Error("foreign pool with our prefix was deleted")
	}
	if plan := e.sync(false); len(plan) != 0 {
		t.Errorf("sync after the removal planned %v", verbs(plan))
	}
}

func TestProximitySteering(t *testing.T) {
	e := newEnv(t)
	e.sync(false)
	e.cfg.SteeringPolicy = SteeringProximity
	plan := e.sync(false)
	if len(plan) != 1 || !strings.Contains(plan[0].String(), `steering_policy: "geo" -> "proximity"`) {
		t.Fatalf("plan = %v", plan)
	}
	for _, lb := range e.f.snapshot("lb") {
		if lb["steering_policy"] != "proximity" || len(lb["region_pools"].(map[string]any)) != 0 || len(lb["country_pools"].(map[string]any)) != 0 {
			t.Errorf("lb after switching to proximity = %v", lb)
		}
	}
	ap := byName(e.f.snapshot("pool"), "rtcedge-ap-southeast")
	if ap["latitude"] != 1.35 || ap["longitude"] != 103.82 {
		t.Errorf("ap pool location = %v,%v", ap["latitude"], ap["longitude"])
	}
	if plan := e.sync(false); len(plan) != 0 {
		t.Errorf("second proximity sync planned %v", verbs(plan))
	}
}

func TestConfigErrors(t *testing.T) {
	cat, err := geo.LoadCatalogue("../geo/testdata/catalogue.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := `
account_id: a
zone_id: z
hostname: rt.example.com
regions:
  eu-central: {origins: [198.51.100.10], cloudflare_regions: [WEU]}
  us-east: {origins: [198.51.100.20], cloudflare_regions: [ENAM]}
  ap-southeast: {origins: [198.51.100.30]}
`
	tests := []struct {
		name string
		yaml string
		want string // "" = valid
	}{
		{name: "valid", yaml: base},
		{name: "unknown key", yaml: base + "colour: red\n", want: "field colour not found"},
		{name: "empty", yaml: "", want: "empty document"},
		{name: "missing ids", yaml: "hostname: rt.example.com\nregions: {}\n", want: "account_id is required"},
		{name: "bad steering", yaml: base + "steering_policy: random\n", want: `steering_policy "random"`},
		{name: "region not in catalogue", yaml: base + "  mars: {origins: [198.51.100.40]}\n", want: `region "mars" is not in the catalogue`},
		{name: "catalogue region missing", yaml: strings.Replace(base, "  ap-southeast: {origins: [198.51.100.30]}\n", "", 1), want: `region "ap-southeast" of the catalogue has no entry`},
		{name: "no origins", yaml: strings.Replace(base, "{origins: [198.51.100.30]}", "{origins: []}", 1), want: `region "ap-southeast": no origins`},
		{name: "region claimed twice", yaml: strings.Replace(base, "cloudflare_regions: [ENAM]", "cloudflare_regions: [WEU]", 1), want: `Cloudflare region "WEU" is claimed by both`},
		{name: "bad fallback", yaml: base + "fallback_region: mars\n", want: `fallback region "mars"`},
		{name: "bad pool name", yaml: base + "name_prefix: \"rt edge\"\n", want: "only letters, digits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tt.yaml))
			if err == nil {
				_, err = New(cfg, cat, testToken, true)
			}
			wantConfigErr(t, err, tt.want)
		})
	}
	if _, err := New(&Config{}, cat, "", true); err == nil || !strings.Contains(err.Error(), "no API token") {
		t.Errorf("no token: %v", err)
	}
}

// wantConfigErr fails t unless err is nil for want "", or else an
// ErrInvalidConfig that says want.
func wantConfigErr(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("valid config: %v", err)
		}
		return
	}
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want ErrInvalidConfig containing %q", err, want)
	}
}
