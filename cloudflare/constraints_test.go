package cloudflare

import (
	"bytes"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/geo"
)

// TestRegionCodesValidated: only the documented enumeration passes config
// validation, with a hint for the old "SAM".
func TestRegionCodesValidated(t *testing.T) {
	cat, err := geo.LoadCatalogue("../geo/testdata/catalogue.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := "account_id: a\nzone_id: z\nhostname: rt.example.com\nregions:\n" +
		"  eu-central: {origins: [198.51.100.10], cloudflare_regions: [WEU]}\n" +
		"  ap-southeast: {origins: [198.51.100.30], cloudflare_regions: [SEAS]}\n"
	us := func(v string) string { return base + "  us-east: {origins: [198.51.100.20], " + v + "}\n" }
	noCodes := "account_id: a\nzone_id: z\nhostname: rt.example.com\nsteering_policy: proximity\nregions:\n" +
		"  eu-central: {origins: [198.51.100.10]}\n  ap-southeast: {origins: [198.51.100.30]}\n  us-east: {origins: [198.51.100.20]}\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"every documented code", us("cloudflare_regions: [WNAM, ENAM, EEU, NSAM, SSAM, OC, ME, NAF, SAF, SAS, NEAS]"), ""},
		{"lower case is upper-cased", us("cloudflare_regions: [enam]"), ""},
		{"SAM is not a code", us("cloudflare_regions: [SAM]"), `"SAM" is not a Cloudflare region code (South America is NSAM (northern) and SSAM (southern)`},
		{"made-up code", us("cloudflare_regions: [EAS]"), `"EAS" is not a Cloudflare region code`},
		{"bad code under proximity too", us("cloudflare_regions: [SAM]") + "steering_policy: proximity\n", `"SAM" is not a Cloudflare region code`},
		{"unknown country", us("countries: [XY]"), `country "XY" is not an ISO 3166-1`},
		{"bad check region", us("cloudflare_regions: [ENAM]") + "check_regions: [ALL_REGIONS]\n", `check_regions: "ALL_REGIONS" is not a Cloudflare region code`},
		// Without any claimed code the default check_regions would be empty.
		{"nothing to probe from", noCodes, "check_regions: no region claims a Cloudflare region code"},
		{"explicit check_regions without claims", noCodes + "check_regions: [WEU]\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			_, err = New(cfg, cat, testToken, true)
			wantConfigErr(t, err, tt.want)
		})
	}
}

// TestPoolsProbeFromRegionsInUse: pools always carry check_regions (the
// fake, like a non-Enterprise account, refuses null), by default the codes
// the config claims, else the configured list; a change is one PATCH.
func TestPoolsProbeFromRegionsInUse(t *testing.T) {
	e := newEnv(t)
	e.sync(false)
	inUse := []string{"EEU", "ENAM", "ME", "NAF", "NEAS", "NSAM", "OC", "SAS", "SEAS", "SSAM", "WEU", "WNAM"}
	for _, p := range e.f.snapshot("pool") {
		if got := stringList(p["check_regions"]); !slices.Equal(got, inUse) {
			t.Errorf("pool %v check_regions = %v, want %v", p["name"], got, inUse)
		}
	}

	e.cfg.CheckRegions = []string{"WEU", "ENAM"}
	before := e.f.writeCount()
	plan := e.sync(false)
	if len(plan) != 3 || !strings.Contains(plan[0].String(), "check_regions:") {
		t.Fatalf("plan = %v, want the three pools updated with a check_regions change", plan)
	}
	for _, w := range e.f.writesSince(before) {
		if !strings.HasPrefix(w, "PATCH ") {
			t.Errorf("write %s, want PATCHes", w)
		}
	}
	for _, p := range e.f.snapshot("pool") {
		if got := stringList(p["check_regions"]); !slices.Equal(got, []string{"ENAM", "WEU"}) {
			t.Errorf("pool %v check_regions = %v", p["name"], got)
		}
	}
	if plan := e.sync(false); len(plan) != 0 {
		t.Errorf("sync after the change planned %v", verbs(plan))
	}
}

// TestUpdatesPreserveUnmanagedFields: fields added by hand that sync does
// not manage survive a correcting update of each object.
func TestUpdatesPreserveUnmanagedFields(t *testing.T) {
	e := newEnv(t)
	e.sync(false)
	pools := e.f.snapshot("pool")
	us := byName(pools, "rtcedge-us-east")["id"].(string)
	all := func(map[string]any) bool { return true }
	isEU := func(o map[string]any) bool { return o["name"] == "rtcedge-eu-central" }

	rules := []any{map[string]any{"name": "canary", "condition": `http.request.uri.path contains "/canary"`, "overrides": map[string]any{"default_pools": []any{us}}}}
	e.f.edit(t, "lb", all, func(o map[string]any) {
		o["pop_pools"] = map[string]any{"LAX": []any{us}}
		o["rules"] = rules
		o["adaptive_routing"] = map[string]any{"failover_across_pools": true}
		o["steering_policy"] = "random" // drift sync corrects
	})
	e.f.edit(t, "pool", isEU, func(o map[string]any) {
		o["notification_email"] = "ops@example.com"
		o["origins"].([]any)[0].(map[string]any)["port"] = 8443.0
		o["minimum_origins"] = 2.0 // drift
	})
	e.f.edit(t, "monitor", all, func(o map[string]any) {
		o["header"].(map[string]any)["X-Probe"] = []any{"cloudflare"}
		o["path"] = "/" // drift
	})

	plan := e.sync(false)
	if got := verbs(plan); len(got) != 3 {
		t.Fatalf("plan = %v, want the monitor, the pool and the load balancer updated", got)
	}
	for _, lb := range e.f.snapshot("lb") {
		if lb["steering_policy"] != "geo" {
			t.Errorf("steering_policy not corrected: %v", lb["steering_policy"])
		}
		if got := stringList(lb["pop_pools"].(map[string]any)["LAX"]); !slices.Equal(got, []string{us}) {
			t.Errorf("pop_pools lost: %v", lb["pop_pools"])
		}
		if r, _ := lb["rules"].([]any); len(r) != 1 {
			t.Errorf("rules lost: %v", lb["rules"])
		}
		if ar, _ := lb["adaptive_routing"].(map[string]any); ar["failover_across_pools"] != true {
			t.Errorf("adaptive_routing lost: %v", lb["adaptive_routing"])
		}
	}
	eu := byName(e.f.snapshot("pool"), "rtcedge-eu-central")
	if eu["minimum_origins"] != 1.0 || eu["notification_email"] != "ops@example.com" {
		t.Errorf("pool after update: minimum_origins %v, notification_email %v", eu["minimum_origins"], eu["notification_email"])
	}
	if port := eu["origins"].([]any)[0].(map[string]any)["port"]; port != 8443.0 {
		t.Errorf("origin port lost: %v", port)
	}
	for _, m := range e.f.snapshot("monitor") {
		h := m["header"].(map[string]any)
		if m["path"] != "/readyz" || len(stringList(h["X-Probe"])) != 1 || stringList(h["Host"])[0] != "rt.example.com" {
			t.Errorf("monitor after update: path %v, header %v", m["path"], h)
		}
	}
	if plan := e.sync(false); len(plan) != 0 {
		t.Errorf("sync after the corrections planned %v", verbs(plan))
	}
}

// TestVisitorLocationHeaders: sync turns the managed transform on, names
// only it in the PATCH, writes nothing when it is on, and leaves the zone
// alone when the config says so.
func TestVisitorLocationHeaders(t *testing.T) {
	e := newEnv(t)
	e.f.mu.Lock()
	e.f.transforms["response"]["add_security_headers"] = true // enabled by hand
	e.f.mu.Unlock()
	e.sync(false)
	e.f.mu.Lock()
	on, other := e.f.transforms["request"]["add_visitor_location_headers"], e.f.transforms["response"]["add_security_headers"]
	e.f.transforms["request"]["add_visitor_location_headers"] = false // switched off in the dashboard
	e.f.mu.Unlock()
	if !on || !other {
		t.Fatalf("after sync: visitor location headers %v, the hand-enabled transform %v; want both on", on, other)
	}
	before := e.f.writeCount()
	plan := e.sync(false)
	if got := verbs(plan); !slices.Equal(got, []string{"update managed transform add_visitor_location_headers"}) {
		t.Fatalf("plan = %v", got)
	}
	if w := e.f.writesSince(before); len(w) != 1 || !strings.HasSuffix(w[0], "/managed_headers") {
		t.Fatalf("writes = %v", w)
	}
	if plan := e.sync(false); len(plan) != 0 {
		t.Errorf("third sync planned %v", verbs(plan))
	}

	off := newEnv(t)
	f := false
	off.cfg.VisitorLocationHeaders = &f
	off.sync(false)
	off.f.mu.Lock()
	defer off.f.mu.Unlock()
	if off.f.transforms["request"]["add_visitor_location_headers"] {
		t.Error("visitor_location_headers: false still enabled the transform")
	}
}

// TestCountryPoolsFromCatalogueSteering: the catalogue's overrides become
// country pools (continents expanded, a country's own entry winning), the
// preferred region first and the rest in failover order.
func TestCountryPoolsFromCatalogueSteering(t *testing.T) {
	e := newEnv(t)
	e.cat.Steering = geo.Steering{
		Countries:  map[string][]string{"ZA": {"eu-central"}, "JP": {"ap-southeast"}, "AR": {"eu-central"}},
		Continents: map[string][]string{"SA": {"us-east"}},
	}
	if err := e.cat.Validate(); err != nil {
		t.Fatal(err)
	}
	e.sync(false)
	ids := map[string]string{}
	for _, p := range e.f.snapshot("pool") {
		ids[strings.TrimPrefix(p["name"].(string), "rtcedge-")] = p["id"].(string)
	}
	pools := func(regions ...string) []string {
		var out []string
		for _, r := range regions {
			out = append(out, ids[r])
		}
		return out
	}
	for _, lb := range e.f.snapshot("lb") {
		cp := lb["country_pools"].(map[string]any)
		for cc, want := range map[string][]string{
			"ZA": pools("eu-central", "us-east", "ap-southeast"),
			"JP": pools("ap-southeast", "eu-central", "us-east"),
			"BR": pools("us-east", "eu-central", "ap-southeast"), // continent SA
			"AR": pools("eu-central", "us-east", "ap-southeast"), // own entry wins
			"CA": pools("us-east", "eu-central", "ap-southeast"), // from the sync config
		} {
			if got := stringList(cp[cc]); !slices.Equal(got, want) {
				t.Errorf("country_pools[%s] = %v, want %v", cc, got, want)
			}
		}
	}

	e.cat.Steering.Countries["CA"] = []string{"eu-central"}
	_, err := New(e.cfg, e.cat, testToken, true)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `country "CA" is steered both`) {
		t.Errorf("double claim: %v", err)
	}
}

// TestFakeRejectsWhatTheAPIRejects checks the fake's constraints directly,
// each with a body the real API refuses.
func TestFakeRejectsWhatTheAPIRejects(t *testing.T) {
	f := newFakeCloudflare(t, testToken, testAccount, testZone)
	monitor := f.put("monitor", map[string]any{"type": "https"})
	pool := f.put("pool", map[string]any{"name": "p", "origins": []any{map[string]any{"name": "a", "address": "192.0.2.1"}}})
	acct := f.baseURL() + "accounts/" + testAccount + "/load_balancers/pools"
	lbs := f.baseURL() + "zones/" + testZone + "/load_balancers"
	mts := f.baseURL() + "zones/" + testZone + "/managed_headers"
	poolBody := func(extra string) string {
		return `{"name":"q","monitor":"` + monitor + `","origins":[{"name":"a","address":"192.0.2.1"}]` + extra + `}`
	}
	lbBody := func(extra string) string {
		return `{"name":"rt.example.com","default_pools":["` + pool + `"],"fallback_pool":"` + pool + `"` + extra + `}`
	}
	tests := []struct {
		name, method, url, body string
		want                    int
	}{
		{"pool without check_regions", http.MethodPost, acct, poolBody(""), http.StatusBadRequest},
		{"pool with null check_regions", http.MethodPost, acct, poolBody(`,"check_regions":null`), http.StatusBadRequest},
		{"pool probing from SAM", http.MethodPost, acct, poolBody(`,"check_regions":["SAM"]`), http.StatusBadRequest},
		{"pool probing from ALL_REGIONS", http.MethodPost, acct, poolBody(`,"check_regions":["ALL_REGIONS"]`), http.StatusBadRequest},
		{"pool with empty check_regions", http.MethodPost, acct, poolBody(`,"check_regions":[]`), http.StatusBadRequest},
		{"pool probing from documented regions", http.MethodPost, acct, poolBody(`,"check_regions":["WEU","SAF"]`), http.StatusOK},
		{"region_pools with SAM", http.MethodPost, lbs, lbBody(`,"region_pools":{"SAM":["` + pool + `"]}`), http.StatusBadRequest},
		{"country_pools with a malformed key", http.MethodPost, lbs, lbBody(`,"country_pools":{"za":["` + pool + `"]}`), http.StatusBadRequest},
		{"pop_pools with a malformed key", http.MethodPost, lbs, lbBody(`,"pop_pools":{"LA":["` + pool + `"]}`), http.StatusBadRequest},
		{"transforms without the response list", http.MethodPatch, mts, `{"managed_request_headers":[{"id":"add_visitor_location_headers","enabled":true}]}`, http.StatusBadRequest},
		{"unknown transform", http.MethodPatch, mts, `{"managed_request_headers":[{"id":"add_everything","enabled":true}],"managed_response_headers":[]}`, http.StatusBadRequest},
		{"conflicting transforms", http.MethodPatch, mts, `{"managed_request_headers":[{"id":"add_true_client_ip_headers","enabled":true},{"id":"remove_visitor_ip_headers","enabled":true}],"managed_response_headers":[]}`, http.StatusBadRequest},
		{"valid transform change", http.MethodPatch, mts, `{"managed_request_headers":[{"id":"add_visitor_location_headers","enabled":true}],"managed_response_headers":[]}`, http.StatusOK},
	}
	client := f.srv.Client()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, tt.url, bytes.NewBufferString(tt.body))
			req.Header.Set("Authorization", "Bearer "+testToken)
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tt.want {
				t.Errorf("status %d, want %d", res.StatusCode, tt.want)
			}
		})
	}
	f.mu.Lock()
	f.enterprise = true
	f.mu.Unlock()
	req, _ := http.NewRequest(http.MethodPost, acct, bytes.NewBufferString(strings.Replace(poolBody(""), `"name":"q"`, `"name":"r"`, 1)))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	if res, err := client.Do(req); err != nil || res.StatusCode != http.StatusOK {
		t.Errorf("Enterprise account, pool without check_regions: %v %v", res, err)
	} else {
		res.Body.Close()
	}
}

// drift returns v changed the way a hand edit might change it.
func drift(v any) any {
	switch v := v.(type) {
	case string:
		return v + "-drift"
	case bool:
		return !v
	case float64:
		return v + 1
	case []any:
		if len(v) == 0 {
			return []any{"drift"}
		}
		return v[:len(v)-1]
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			out[k] = x
		}
		if len(out) == 0 {
			out["drift"] = []any{"drift"}
			return out
		}
		for _, k := range slices.Sorted(maps.Keys(out)) {
			out[k] = drift(out[k])
			break
		}
		return out
	}
	return "drift"
}

// TestDiffCoversEveryWrittenField: every top-level field an update writes
// is one the diff looks at, so drift in any of them is corrected rather
// than left until some other change rewrites it.
func TestDiffCoversEveryWrittenField(t *testing.T) {
	// Learn what each kind's update writes.
	e := newEnv(t)
	e.sync(false)
	all := func(map[string]any) bool { return true }
	e.f.edit(t, "lb", all, func(o map[string]any) { o["steering_policy"] = "random" })
	e.f.edit(t, "pool", func(o map[string]any) bool { return o["name"] == "rtcedge-us-east" }, func(o map[string]any) { o["minimum_origins"] = 2.0 })
	e.f.edit(t, "monitor", all, func(o map[string]any) { o["retries"] = 0.0 })
	e.sync(false)
	e.f.mu.Lock()
	written := maps.Clone(e.f.patched)
	e.f.mu.Unlock()
	objects := map[string]string{"lb": "load balancer", "pool": "pool rtcedge-us-east", "monitor": "monitor"}
	for kind, keys := range written {
		if len(keys) < 5 {
			t.Fatalf("%s update wrote only %v", kind, keys)
		}
		for _, key := range keys {
			t.Run(kind+"/"+key, func(t *testing.T) {
				e := newEnv(t)
				e.sync(false)
				find := all
				if kind == "pool" {
					find = func(o map[string]any) bool { return o["name"] == "rtcedge-us-east" }
				}
				e.f.edit(t, kind, find, func(o map[string]any) { o[key] = drift(o[key]) })
				plan := e.sync(false)
				if len(plan) != 1 || !strings.Contains(plan[0].Object, objects[kind]) || !strings.Contains(plan[0].String(), key) {
					t.Fatalf("drift in %s.%s: plan %v, want an update of the %s naming %s", kind, key, plan, objects[kind], key)
				}
				if plan := e.sync(false); len(plan) != 0 {
					t.Errorf("after the correction: %v", verbs(plan))
				}
			})
		}
	}
}
