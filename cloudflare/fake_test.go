package cloudflare

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeCloudflare is a loopback stand-in for the parts of Cloudflare's v4 API
// that sync uses, following the documented behaviour: the envelope
// {"success","errors","messages","result"} (plus "result_info" on lists),
// Bearer token auth, account-scoped monitors and pools, zone-scoped load
// balancers, server-side defaults, validation of references, PUT replacing
// a whole object and PATCH merging into it, and refusing to delete a pool a
// load balancer still uses. It rejects what the API rejects for the fields
// sync writes: region codes outside the documented enumeration (in
// region_pools and check_regions), malformed country and POP keys, a pool
// without check_regions on a non-Enterprise account (null means every data
// centre), and managed-transform PATCHes that omit a list, name an unknown
// transform or enable one that conflicts with an enabled one. The zone's
// managed transforms start disabled, as on a new zone.
type fakeCloudflare struct {
	srv     *httptest.Server
	token   string
	account string
	zone    string

	mu sync.Mutex
	// enterprise lets pools omit check_regions (probe from everywhere);
	// guarded by mu.
	enterprise bool
	transforms map[string]map[string]bool // "request"/"response" -> id -> enabled
	monitors   map[string]map[string]any
	pools      map[string]map[string]any
	lbs        map[string]map[string]any
	nextID     int
	writes     []string            // "METHOD path" of every successful write
	patched    map[string][]string // kind -> top-level keys of its last PATCH body
	failures   map[string]apiFault // "METHOD kind" -> injected failure, used once
}

// apiFault is an injected error response.
type apiFault struct {
	status  int
	code    int
	message string
}

func newFakeCloudflare(t *testing.T, token, account, zone string) *fakeCloudflare {
	t.Helper()
	f := &fakeCloudflare{
		token: token, account: account, zone: zone,
		monitors: map[string]map[string]any{},
		pools:    map[string]map[string]any{},
		lbs:      map[string]map[string]any{},
		failures: map[string]apiFault{},
		patched:  map[string][]string{},
		transforms: map[string]map[string]bool{
			"request":  {"add_visitor_location_headers": false, "remove_visitor_ip_headers": false, "add_true_client_ip_headers": false, "add_client_certificate_headers": false},
			"response": {"add_security_headers": false, "remove_x-powered-by_header": false},
		},
	}
	mux := http.NewServeMux()
	const acct = "/client/v4/accounts/{account}/load_balancers/"
	const zone_ = "/client/v4/zones/{zone}/load_balancers"
	mux.HandleFunc("GET "+acct+"monitors", f.list("monitor"))
	mux.HandleFunc("POST "+acct+"monitors", f.create("monitor"))
	mux.HandleFunc(acct+"monitors/{id}", f.item("monitor"))
	mux.HandleFunc("GET "+acct+"pools", f.list("pool"))
	mux.HandleFunc("POST "+acct+"pools", f.create("pool"))
	mux.HandleFunc(acct+"pools/{id}", f.item("pool"))
	mux.HandleFunc("GET "+zone_, f.list("lb"))
	mux.HandleFunc("POST "+zone_, f.create("lb"))
	mux.HandleFunc(zone_+"/{id}", f.item("lb"))
	mux.HandleFunc("GET /client/v4/zones/{zone}/managed_headers", f.handler("lb", "transforms", f.listTransforms))
	mux.HandleFunc("PATCH /client/v4/zones/{zone}/managed_headers", f.handler("lb", "transforms", f.editTransforms))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErrors(w, http.StatusNotFound, apiFault{code: 7000, message: "No route for that URI"})
	})
	f.srv = httptest.NewServer(f.auth(mux))
	t.Cleanup(f.srv.Close)
	return f
}

// baseURL is the API root as cloudflare-go expects it.
func (f *fakeCloudflare) baseURL() string { return f.srv.URL + "/client/v4/" }

// failNext makes the next "METHOD kind" request (kind: monitor, pool, lb)
// fail with the given status, error code and message.
func (f *fakeCloudflare) failNext(method, kind string, fault apiFault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures[method+" "+kind] = fault
}

func (f *fakeCloudflare) writeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.writes)
}

func (f *fakeCloudflare) writesSince(n int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.writes[n:])
}

// edit changes a stored object out of band, as a person in the dashboard
// would; find selects it.
func (f *fakeCloudflare) edit(t *testing.T, kind string, find func(map[string]any) bool, change func(map[string]any)) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, obj := range f.store(kind) {
		if find(obj) {
			change(obj)
			return
		}
	}
	t.Fatalf("no %s matches", kind)
}

// put stores an object directly (objects made by someone else).
func (f *fakeCloudflare) put(kind string, obj map[string]any) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID()
	obj["id"] = id
	f.store(kind)[id] = obj
	return id
}

// snapshot returns deep copies of the stored objects of a kind, by ID.
func (f *fakeCloudflare) snapshot(kind string) map[string]map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]map[string]any{}
	for id, obj := range f.store(kind) {
		out[id] = deepCopy(obj)
	}
	return out
}

func (f *fakeCloudflare) store(kind string) map[string]map[string]any {
	switch kind {
	case "monitor":
		return f.monitors
	case "pool":
		return f.pools
	default:
		return f.lbs
	}
}

func (f *fakeCloudflare) newID() string {
	f.nextID++
	return fmt.Sprintf("%032x", f.nextID)
}

func (f *fakeCloudflare) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+f.token {
			writeErrors(w, http.StatusForbidden, apiFault{code: 10000, message: "Authentication error"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// scope checks the account or zone in the path, as the API routes by it.
func (f *fakeCloudflare) scope(w http.ResponseWriter, r *http.Request, kind string) bool {
	if kind == "lb" {
		if r.PathValue("zone") != f.zone {
			writeErrors(w, http.StatusNotFound, apiFault{code: 7003, message: "Could not route to " + r.URL.Path + ", perhaps your object identifier is invalid?"})
			return false
		}
		return true
	}
	if r.PathValue("account") != f.account {
		writeErrors(w, http.StatusNotFound, apiFault{code: 7003, message: "Could not route to " + r.URL.Path + ", perhaps your object identifier is invalid?"})
		return false
	}
	return true
}

// injected reports and consumes an injected failure; f.mu must be held.
func (f *fakeCloudflare) injected(w http.ResponseWriter, method, kind string) bool {
	fault, ok := f.failures[method+" "+kind]
	if !ok {
		return false
	}
	delete(f.failures, method+" "+kind)
	writeErrors(w, fault.status, fault)
	return true
}

// handler does what every endpoint does first: route by the account or zone
// of scopeKind, read the JSON body of a write, take f.mu and play an
// injected failure of (method, kind); serve runs with f.mu held.
func (f *fakeCloudflare) handler(scopeKind, kind string, serve func(w http.ResponseWriter, r *http.Request, body map[string]any)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !f.scope(w, r, scopeKind) {
			return
		}
		var body map[string]any
		if r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch {
			var ok bool
			if body, ok = decodeBody(w, r); !ok {
				return
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.injected(w, r.Method, kind) {
			return
		}
		serve(w, r, body)
	}
}

func (f *fakeCloudflare) list(kind string) http.HandlerFunc {
	return f.handler(kind, kind, func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		store := f.store(kind)
		result := make([]map[string]any, 0, len(store))
		for _, id := range slices.Sorted(maps.Keys(store)) {
			result = append(result, store[id])
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"success": true, "errors": []any{}, "messages": []any{}, "result": result,
			"result_info": map[string]any{"page": 1, "per_page": len(result), "count": len(result), "total_count": len(result)},
		})
	})
}

func (f *fakeCloudflare) create(kind string) http.HandlerFunc {
	return f.handler(kind, kind, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		obj, fault := f.validate(kind, "", body)
		if fault != nil {
			writeErrors(w, fault.status, *fault)
			return
		}
		now := time.Now().UTC().Format(time.RFC3339Nano)
		obj["id"] = f.newID()
		obj["created_on"], obj["modified_on"] = now, now
		f.store(kind)[obj["id"].(string)] = obj
		f.writes = append(f.writes, r.Method+" "+r.URL.Path)
		writeResult(w, http.StatusOK, obj)
	})
}

func (f *fakeCloudflare) item(kind string) http.HandlerFunc {
	return f.handler(kind, kind, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		id := r.PathValue("id")
		store := f.store(kind)
		old, ok := store[id]
		if !ok {
			writeErrors(w, http.StatusNotFound, apiFault{code: 1000, message: kind + " not found"})
			return
		}
		switch r.Method {
		case http.MethodGet:
			writeResult(w, http.StatusOK, old)
		case http.MethodPut, http.MethodPatch:
			if r.Method == http.MethodPatch {
				f.patched[kind] = slices.Sorted(maps.Keys(body))
				merged := deepCopy(old)
				maps.Copy(merged, body)
				body = merged
			}
			obj, fault := f.validate(kind, id, body)
			if fault != nil {
				writeErrors(w, fault.status, *fault)
				return
			}
			obj["id"], obj["created_on"] = id, old["created_on"]
			obj["modified_on"] = time.Now().UTC().Format(time.RFC3339Nano)
			store[id] = obj
			f.writes = append(f.writes, r.Method+" "+r.URL.Path)
			writeResult(w, http.StatusOK, obj)
		case http.MethodDelete:
			if kind == "pool" {
				for _, lb := range f.lbs {
					if slices.Contains(stringList(lb["default_pools"]), id) || lb["fallback_pool"] == id {
						writeErrors(w, http.StatusBadRequest, apiFault{code: 1002, message: "pool is in use by load balancer " + lb["id"].(string)})
						return
					}
				}
			}
			if kind == "monitor" {
				for _, p := range f.pools {
					if p["monitor"] == id {
						writeErrors(w, http.StatusBadRequest, apiFault{code: 1002, message: "monitor is in use by pool " + p["id"].(string)})
						return
					}
				}
			}
			delete(store, id)
			f.writes = append(f.writes, r.Method+" "+r.URL.Path)
			writeResult(w, http.StatusOK, map[string]any{"id": id})
		default:
			writeErrors(w, http.StatusMethodNotAllowed, apiFault{code: 7001, message: "Method not allowed"})
		}
	})
}

var (
	fakePoolName   = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	fakeCountryKey = regexp.MustCompile(`^[A-Z]{2}$`)
	fakePOPKey     = regexp.MustCompile(`^[A-Z]{3}$`)
)

// transformList renders one kind of managed transforms as the API does;
// f.mu must be held.
func (f *fakeCloudflare) transformList(kind string) []map[string]any {
	out := []map[string]any{}
	for _, id := range slices.Sorted(maps.Keys(f.transforms[kind])) {
		conflicts := fakeTransformConflicts[id]
		has := false
		for _, c := range conflicts {
			has = has || f.transforms[kind][c]
		}
		out = append(out, map[string]any{"id": id, "enabled": f.transforms[kind][id], "has_conflict": has, "conflicts_with": conflicts})
	}
	return out
}

// fakeTransformConflicts: the pairs the API refuses to enable together.
var fakeTransformConflicts = map[string][]string{
	"add_true_client_ip_headers": {"remove_visitor_ip_headers"},
	"remove_visitor_ip_headers":  {"add_true_client_ip_headers"},
}

func (f *fakeCloudflare) listTransforms(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
	writeResult(w, http.StatusOK, map[string]any{
		"managed_request_headers": f.transformList("request"), "managed_response_headers": f.transformList("response"),
	})
}

// editTransforms applies a PATCH: both lists are required, each entry
// changes only the transform it names.
func (f *fakeCloudflare) editTransforms(w http.ResponseWriter, r *http.Request, body map[string]any) {
	bad := func(format string, args ...any) {
		writeErrors(w, http.StatusBadRequest, apiFault{code: 20021, message: fmt.Sprintf(format, args...)})
	}
	next := map[string]map[string]bool{}
	for kind, key := range map[string]string{"request": "managed_request_headers", "response": "managed_response_headers"} {
		next[kind] = maps.Clone(f.transforms[kind])
		list, ok := body[key].([]any)
		if !ok {
			bad("%s is required", key)
			return
		}
		for _, e := range list {
			m, _ := e.(map[string]any)
			id, _ := m["id"].(string)
			enabled, isBool := m["enabled"].(bool)
			if _, known := next[kind][id]; !known || !isBool {
				bad("%s: unknown managed transform %q or missing enabled", key, id)
				return
			}
			next[kind][id] = enabled
		}
	}
	for kind, states := range next {
		for id, on := range states {
			for _, c := range fakeTransformConflicts[id] {
				if on && states[c] {
					bad("managed transform %s conflicts with %s", id, c)
					return
				}
			}
		}
		f.transforms[kind] = states
	}
	f.writes = append(f.writes, r.Method+" "+r.URL.Path)
	f.listTransforms(w, r, nil)
}

// validate applies the API's defaults to a create or full-replace body and
// checks what the API checks; f.mu must be held. id is "" on create.
func (f *fakeCloudflare) validate(kind, id string, body map[string]any) (map[string]any, *apiFault) {
	bad := func(format string, args ...any) *apiFault {
		return &apiFault{status: http.StatusBadRequest, code: 1002, message: fmt.Sprintf(format, args...)}
	}
	obj := deepCopy(body)
	delete(obj, "id")
	def := func(k string, v any) {
		if _, ok := obj[k]; !ok || obj[k] == nil {
			obj[k] = v
		}
	}
	switch kind {
	case "monitor":
		def("type", "http")
		def("method", "GET")
		def("path", "/")
		def("interval", 60.0)
		def("timeout", 5.0)
		def("retries", 2.0)
		def("port", 0.0)
		def("description", "")
		def("expected_body", "")
		def("header", map[string]any{})
		def("allow_insecure", false)
		def("follow_redirects", false)
		def("consecutive_up", 0.0)
		def("consecutive_down", 0.0)
		switch obj["type"] {
		case "http", "https":
			if s, _ := obj["expected_codes"].(string); s == "" {
				return nil, bad("expected_codes is required for HTTP and HTTPS monitors")
			}
		case "tcp", "udp_icmp", "icmp_ping", "smtp":
		default:
			return nil, bad("invalid monitor type %v", obj["type"])
		}
	case "pool":
		name, _ := obj["name"].(string)
		if !fakePoolName.MatchString(name) {
			return nil, bad("pool name %q: only alphanumerics, hyphens and underscores", name)
		}
		for pid, p := range f.pools {
			if pid != id && p["name"] == name {
				return nil, bad("a pool named %q already exists", name)
			}
		}
		origins, _ := obj["origins"].([]any)
		if len(origins) == 0 {
			return nil, bad("origins: at least one origin is required")
		}
		for i, o := range origins {
			om, _ := o.(map[string]any)
			if s, _ := om["address"].(string); s == "" {
				return nil, bad("origins[%d].address is required", i)
			}
			if _, ok := om["enabled"]; !ok {
				om["enabled"] = true
			}
			if _, ok := om["weight"]; !ok {
				om["weight"] = 1.0
			}
		}
		if m, _ := obj["monitor"].(string); m != "" {
			if _, ok := f.monitors[m]; !ok {
				return nil, bad("monitor %s does not exist", m)
			}
		}
		_, hasLat := obj["latitude"]
		_, hasLon := obj["longitude"]
		if hasLat != hasLon {
			return nil, bad("latitude and longitude must be set together")
		}
		switch regions := obj["check_regions"].(type) {
		case nil:
			if !f.enterprise {
				return nil, bad("check_regions: null runs health checks from every Cloudflare region, which requires an Enterprise plan; list the regions")
			}
		case []any:
			if len(regions) == 0 {
				return nil, bad("check_regions: give at least one region, or null")
			}
			for _, r := range regions {
				code, _ := r.(string)
				if code == "ALL_REGIONS" && !f.enterprise {
					return nil, bad("check_regions: ALL_REGIONS requires an Enterprise plan")
				}
				if code != "ALL_REGIONS" && !ValidRegionCode(code) {
					return nil, bad("check_regions: invalid region %q", r)
				}
			}
		default:
			return nil, bad("check_regions must be a list")
		}
		def("description", "")
		def("enabled", true)
		def("minimum_origins", 1.0)
		def("monitor", "")
		def("networks", []any{"cloudflare"})
		def("notification_email", "")
		def("origin_steering", map[string]any{"policy": "random"})
	case "lb":
		name, _ := obj["name"].(string)
		if name == "" {
			return nil, bad("name is required")
		}
		for lid, lb := range f.lbs {
			if lid != id && strings.EqualFold(lb["name"].(string), name) {
				return nil, bad("a load balancer named %q already exists", name)
			}
		}
		defaults := stringList(obj["default_pools"])
		if len(defaults) == 0 {
			return nil, bad("default_pools is required")
		}
		refs := append(slices.Clone(defaults), fmt.Sprint(obj["fallback_pool"]))
		keyOK := map[string]func(string) bool{
			"region_pools":  ValidRegionCode,
			"country_pools": fakeCountryKey.MatchString,
			"pop_pools":     fakePOPKey.MatchString,
		}
		for _, key := range []string{"region_pools", "country_pools", "pop_pools"} {
			m, _ := obj[key].(map[string]any)
			for k, v := range m {
				if !keyOK[key](k) {
					return nil, bad("%s: invalid key %q", key, k)
				}
				refs = append(refs, stringList(v)...)
			}
		}
		for _, ref := range refs {
			if _, ok := f.pools[ref]; !ok {
				return nil, bad("pool %s does not exist", ref)
			}
		}
		def("description", "")
		def("enabled", true)
		def("proxied", false)
		def("ttl", 30.0)
		def("steering_policy", "off")
		def("session_affinity", "none")
		def("region_pools", map[string]any{})
		def("country_pools", map[string]any{})
		def("pop_pools", map[string]any{})
		def("rules", []any{})
		def("adaptive_routing", map[string]any{"failover_across_pools": false})
		def("location_strategy", map[string]any{"mode": "pop", "prefer_ecs": "proximity"})
		def("random_steering", map[string]any{"default_weight": 1.0})
		def("session_affinity_ttl", 0.0)
		obj["zone_name"] = "example.com"
	}
	return obj, nil
}

func decodeBody(w http.ResponseWriter, r *http.Request) (map[string]any, bool) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		writeErrors(w, http.StatusUnsupportedMediaType, apiFault{code: 6003, message: "Invalid request headers: Content-Type " + ct})
		return nil, false
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeErrors(w, http.StatusBadRequest, apiFault{code: 6007, message: "Malformed JSON in request body: " + err.Error()})
		return nil, false
	}
	return body, true
}

func writeResult(w http.ResponseWriter, status int, result any) {
	writeJSON(w, status, map[string]any{"success": true, "errors": []any{}, "messages": []any{}, "result": result})
}

func writeErrors(w http.ResponseWriter, status int, faults ...apiFault) {
	errs := make([]map[string]any, 0, len(faults))
	for _, f := range faults {
		errs = append(errs, map[string]any{"code": f.code, "message": f.message})
	}
	writeJSON(w, status, map[string]any{"success": false, "errors": errs, "messages": []any{}, "result": nil})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func stringList(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, s := range l {
		out = append(out, fmt.Sprint(s))
	}
	return out
}

func deepCopy(m map[string]any) map[string]any {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}
