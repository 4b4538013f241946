package terraform

import (
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"

	"github.com/rtcedge/rtcedge/cloudflare"
)

// loadTree loads every module of this directory tree by directory.
func loadTree(t *testing.T) map[string]*module {
	t.Helper()
	fsys := os.DirFS(".")
	dirs, _, err := checkTree(fsys)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*module{}
	for _, dir := range dirs {
		m, err := loadModule(fsys, dir)
		if err != nil {
			t.Fatal(err)
		}
		out[dir] = m
	}
	return out
}

// blocks returns the top-level blocks of a module of a type and first label
// ("" = any).
func (m *module) blocks(typ, label string) []*hclsyntax.Block {
	var out []*hclsyntax.Block
	for _, b := range m.bodies {
		for _, blk := range b.Blocks {
			if blk.Type == typ && (label == "" || (len(blk.Labels) > 0 && blk.Labels[0] == label)) {
				out = append(out, blk)
			}
		}
	}
	return out
}

// source is the text of a module's .tf files, concatenated.
func source(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tf") {
			data, err := os.ReadFile(path.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			b.Write(data)
		}
	}
	return b.String()
}

var (
	quoted          = regexp.MustCompile(`"([^"]*)"`)
	regionCodeLists = regexp.MustCompile(`contains\(\[([^\]]*)\], code\)`)
	claimedCodes    = regexp.MustCompile(`cloudflare_regions\s*=\s*\[([^\]]*)\]`)
)

func strs(list string) []string {
	var out []string
	for _, m := range quoted.FindAllStringSubmatch(list, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestCloudflareRegionCodes keeps the steering module's validations on the
// documented enumeration the sync uses, and every literal code in the tree
// inside it (no "SAM").
func TestCloudflareRegionCodes(t *testing.T) {
	want := slices.Sorted(slices.Values(cloudflare.RegionCodes))
	src := source(t, "modules/cloudflare-steering")
	lists := regionCodeLists.FindAllStringSubmatch(src, -1)
	if len(lists) < 2 {
		t.Fatalf("found %d region-code validations in the steering module, want those of regions and check_regions", len(lists))
	}
	for _, l := range lists {
		if got := slices.Sorted(slices.Values(strs(l[1]))); !slices.Equal(got, want) {
			t.Errorf("validation list %v, want cloudflare.RegionCodes %v", got, want)
		}
	}
	for dir := range loadTree(t) {
		for _, m := range claimedCodes.FindAllStringSubmatch(source(t, dir), -1) {
			for _, code := range strs(m[1]) {
				if !cloudflare.ValidRegionCode(code) {
					t.Errorf("%s: cloudflare_regions holds %q, not a Cloudflare region code", dir, code)
				}
			}
		}
	}
}

// attr returns a block's attribute or fails.
func attr(t *testing.T, blk *hclsyntax.Block, name string) *hclsyntax.Attribute {
	t.Helper()
	a, ok := blk.Body.Attributes[name]
	if !ok {
		t.Fatalf("%s: %s %v has no %s", blk.Range(), blk.Type, blk.Labels, name)
	}
	return a
}

func refersTo(e hclsyntax.Expression, root, name string) bool {
	for _, tr := range e.Variables() {
		if tr.RootName() != root || len(tr) < 2 {
			continue
		}
		if a, ok := tr[1].(hcl.TraverseAttr); ok && (name == "" || a.Name == name) {
			return true
		}
	}
	return false
}

// inputs is what a module's variables hold when it is planned with args
// (evaluated in ctx) over its defaults: an argument or required variable the
// test cannot evaluate (it names a resource or a local) is an unknown of the
// variable's type that is not null, as Terraform plans it.
func inputs(t *testing.T, m *module, args hclsyntax.Attributes, ctx *hcl.EvalContext) *hcl.EvalContext {
	t.Helper()
	vars := map[string]cty.Value{}
	for _, v := range m.blocks("variable", "") {
		vars[v.Labels[0]] = cty.DynamicVal
		if ty, _, d := typeexpr.TypeConstraintWithDefaults(attr(t, v, "type").Expr); !d.HasErrors() && ty != cty.DynamicPseudoType {
			vars[v.Labels[0]] = cty.UnknownVal(ty).RefineNotNull()
		}
		a, ok := args[v.Labels[0]]
		if !ok {
			if a, ok = v.Body.Attributes["default"]; !ok {
				continue
			}
		}
		if val, d := a.Expr.Value(ctx); !d.HasErrors() {
			vars[v.Labels[0]] = val
		}
	}
	return &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)},
		Functions: map[string]function.Function{"tostring": stdlib.MakeToFunc(cty.String)},
	}
}

// instance is one module's resources as planned: a module directory with
// the inputs of one call (or its defaults).
type instance struct {
	*module
	ctx *hcl.EvalContext
}

// roles returns the calls of modules/workload in dir by role name, each
// with the module's inputs for that call; dir's own inputs are its defaults
// and baseInputs (the POP's with its SIP front on), its locals evaluated.
func roles(t *testing.T, tree map[string]*module, dir string) (own instance, byName map[string]instance) {
	t.Helper()
	ctx, _ := evalModule(t, tree[dir], baseInputs[dir])
	own = instance{tree[dir], ctx}
	byName = map[string]instance{}
	for _, call := range tree[dir].calls {
		if v, _ := attr(t, call, "source").Expr.Value(nil); v.AsString() == "../workload" {
			in := instance{tree["modules/workload"], inputs(t, tree["modules/workload"], call.Body.Attributes, own.ctx)}
			byName[in.ctx.Variables["var"].GetAttr("name").AsString()] = in
		}
	}
	return own, byName
}

// planned returns the resources of a type the instance creates: those
// without a count, or with one that comes to more than zero.
func (in instance) planned(t *testing.T, typ string) []*hclsyntax.Block {
	t.Helper()
	var out []*hclsyntax.Block
	for _, b := range in.blocks("resource", typ) {
		if c, ok := b.Body.Attributes["count"]; ok {
			n, d := c.Expr.Value(in.ctx)
			if d.HasErrors() || !n.IsKnown() {
				t.Fatalf("%s: count %v %v", c.SrcRange, n, d)
			}
			if n.AsBigFloat().Sign() == 0 {
				continue
			}
		}
		out = append(out, b)
	}
	return out
}

// workloads are the Deployments and StatefulSets the instance creates.
func (in instance) workloads(t *testing.T) []*hclsyntax.Block {
	return append(in.planned(t, "kubernetes_deployment_v1"), in.planned(t, "kubernetes_stateful_set_v1")...)
}

// TestSteeringModuleMatchesTheAPI pins what the steering module must send
// for the API and for signaling: pools with check_regions, the visitor
// location managed transform, country pools from the catalogue's overrides,
// and relay records from plan-time addresses.
func TestSteeringModuleMatchesTheAPI(t *testing.T) {
	tree := loadTree(t)
	st := tree["modules/cloudflare-steering"]
	pools := st.blocks("resource", "cloudflare_load_balancer_pool")
	if len(pools) != 1 || !refersTo(attr(t, pools[0], "check_regions").Expr, "local", "check_regions") {
		t.Error("the pool resource must set check_regions (null probes from every data centre: Enterprise only)")
	}
	mt := st.blocks("resource", "cloudflare_managed_transforms")
	if len(mt) != 1 {
		t.Fatal("no cloudflare_managed_transforms resource: CF-IPLatitude/CF-IPLongitude never arrive without it")
	}
	v, d := attr(t, mt[0], "managed_request_headers").Expr.Value(nil)
	if d.HasErrors() || !v.CanIterateElements() || v.LengthInt() != 1 {
		t.Fatalf("managed_request_headers: %v %v", v, d)
	}
	h := v.Index(cty.NumberIntVal(0))
	if h.GetAttr("id").AsString() != "add_visitor_location_headers" || !h.GetAttr("enabled").True() {
		t.Errorf("managed_request_headers = %#v, want add_visitor_location_headers enabled", h)
	}
	if _, ok := mt[0].Body.Attributes["managed_response_headers"]; !ok {
		t.Error("managed_response_headers is required by the API")
	}
	lb := st.blocks("resource", "cloudflare_load_balancer")
	if len(lb) != 1 || !refersTo(attr(t, lb[0], "country_pools").Expr, "local", "override_ids") {
		t.Error("country_pools must include the catalogue's overrides (local.override_ids)")
	}

	ex := tree["examples/two-regions"]
	call := ex.calls["steering"]
	if call == nil {
		t.Fatal("example has no steering module call")
	}
	if rr := attr(t, call, "relay_records"); refersTo(rr.Expr, "module", "") {
		t.Errorf("%s: relay_records must come from the reserved addresses, not a module output (unknown at plan time)", rr.SrcRange)
	}
	if co := attr(t, call, "country_overrides"); !refersTo(co.Expr, "local", "steering_countries") {
		t.Error("the example's country_overrides must be the catalogue's steering.countries")
	}
	if !strings.Contains(source(t, "examples/two-regions"), "steering       = { countries = local.steering_countries }") {
		t.Error("the example's catalogue must carry the same steering countries")
	}
}

// TestOriginFirewalling: the example takes Cloudflare's ranges from the
// provider's data source for signaling's trusted proxies and the network
// policies, and every region module call restricts signaling's HTTP port.
func TestOriginFirewalling(t *testing.T) {
	ex := loadTree(t)["examples/two-regions"]
	if len(ex.blocks("data", "cloudflare_ip_ranges")) != 1 {
		t.Fatal(`no data "cloudflare_ip_ranges" in the example`)
	}
	src := source(t, "examples/two-regions")
	for _, want := range []string{"data.cloudflare_ip_ranges.cloudflare.ipv4_cidrs", "data.cloudflare_ip_ranges.cloudflare.ipv6_cidrs", "trusted_proxies   = local.cloudflare_ranges"} {
		if !strings.Contains(src, want) {
			t.Errorf("example lacks %s", want)
		}
	}
	for name, call := range ex.calls {
		if !strings.HasPrefix(name, "region_") {
			continue
		}
		np := attr(t, call, "network_policy")
		if !refersTo(np.Expr, "local", "cloudflare_ranges") {
			t.Errorf("%s: network_policy.signaling_http_cidrs must be Cloudflare's ranges", name)
		}
	}
}

// port records a port number or name as a string, if it is known.
func port(v cty.Value, out map[string]bool) {
	if !v.IsKnown() || v.IsNull() {
		return
	}
	switch v.Type() {
	case cty.String:
		out[v.AsString()] = true
	case cty.Number:
		out[v.AsBigFloat().String()] = true
	}
}

// portsOf collects the port numbers of blocks named typ (container "port"
// blocks, or network policy "ports" blocks) under body, as ctx plans them.
func portsOf(body *hclsyntax.Body, typ, attrName string, ctx *hcl.EvalContext, out map[string]bool) {
	for _, b := range body.Blocks {
		if b.Type == typ {
			if a, ok := b.Body.Attributes[attrName]; ok {
				if v, d := a.Expr.Value(ctx); !d.HasErrors() {
					port(v, out)
				}
			}
		}
		portsOf(b.Body, typ, attrName, ctx, out) // also into dynamic blocks' content
	}
}

// TestNetworkPoliciesCoverEveryPort: in each module with workloads, every
// container port (each role's, at the module's defaults) is admitted by some
// NetworkPolicy rule, so turning
// the policies on never cuts a tier off silently, and every rule that is
// open to all sources is one the module means to be open.
func TestNetworkPoliciesCoverEveryPort(t *testing.T) {
	tree := loadTree(t)
	for _, dir := range []string{"modules/region", "modules/pop"} {
		own, byName := roles(t, tree, dir)
		policies := own.blocks("resource", "kubernetes_network_policy_v1")
		if len(policies) == 0 {
			t.Errorf("%s: no NetworkPolicies", dir)
			continue
		}
		containerPorts, admitted := map[string]bool{}, map[string]bool{}
		for _, w := range own.workloads(t) {
			portsOf(w.Body, "port", "container_port", own.ctx, containerPorts)
		}
		for _, r := range byName {
			for _, p := range r.ctx.Variables["var"].GetAttr("ports").AsValueSlice() {
				port(p.GetAttr("port"), containerPorts)
			}
		}
		for _, p := range policies {
			portsOf(p.Body, "ports", "port", own.ctx, admitted)
		}
		for port := range containerPorts {
			if !admitted[port] {
				t.Errorf("%s: container port %s is admitted by no NetworkPolicy", dir, port)
			}
		}
		// Rules without a source admit everyone: only the media port of
		// the global relays and a dynamic-source HTTP rule may be.
		for _, p := range policies {
			hclsyntax.VisitAll(p.Body, func(n hclsyntax.Node) hcl.Diagnostics {
				blk, ok := n.(*hclsyntax.Block)
				if !ok || blk.Type != "ingress" {
					return nil
				}
				hasFrom := false
				for _, b := range blk.Body.Blocks {
					hasFrom = hasFrom || b.Type == "from" || (b.Type == "dynamic" && b.Labels[0] == "from")
				}
				if !hasFrom && p.Labels[1] != "globalrelay" {
					t.Errorf("%s: %s has an ingress rule open to every source", blk.Range(), p.Labels[1])
				}
				return nil
			})
		}
	}
}

// TestImageScheme: the modules run the image `make image` builds, named
// <repository>:<version> in both places.
func TestImageScheme(t *testing.T) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^IMAGE\s*\?=\s*\$\(IMAGE_REPO\):\$\(VERSION\)$`).Match(mk) {
		t.Error("Makefile: IMAGE is not $(IMAGE_REPO):$(VERSION)")
	}
	repo := regexp.MustCompile(`(?m)^IMAGE_REPO\s*\?=\s*(\S+)$`).FindSubmatch(mk)
	if repo == nil {
		t.Fatal("Makefile: no IMAGE_REPO default")
	}
	tree := loadTree(t)
	ex := tree["examples/two-regions"]
	src := source(t, "examples/two-regions")
	if !strings.Contains(src, `image = "${var.image_repository}:${var.image_version}"`) {
		t.Error(`example: local.image is not "${var.image_repository}:${var.image_version}"`)
	}
	for _, v := range ex.blocks("variable", "image_repository") {
		def, d := attr(t, v, "default").Expr.Value(nil)
		if d.HasErrors() || path.Base(def.AsString()) != string(repo[1]) {
			t.Errorf("image_repository default %v does not end in make image's repository %q", def, repo[1])
		}
	}
	for name, call := range ex.calls {
		if a, ok := call.Body.Attributes["image"]; ok && !refersTo(a.Expr, "local", "image") {
			t.Errorf("module %s: image is not local.image", name)
		}
	}
}

// TestDataPlaneRolesGetHopKeys: the relays and pods refuse to start without
// inter-tier MAC keys (docs/wire.md), so every data-plane workload the
// modules deploy must be given $RTCEDGE_HOP_KEYS from its Secret; and each
// gossip pool has its own key.
func TestDataPlaneRolesGetHopKeys(t *testing.T) {
	got := map[string][]string{}     // role -> its secret keys (environment)
	mounted := map[string][]string{} // role -> the secret keys mounted as files
	issuer := map[string]bool{}      // role -> has a key issuer
	for _, dir := range []string{"modules/pop", "modules/region"} {
		_, byName := roles(t, loadTree(t), dir)
		for name, r := range byName {
			for _, k := range r.ctx.Variables["var"].GetAttr("secret_keys").AsValueSlice() {
				got[name] = append(got[name], k.AsString())
			}
			if vs := r.ctx.Variables["var"].GetAttr("volumes"); vs.IsKnown() && !vs.IsNull() && vs.CanIterateElements() {
				for _, v := range vs.AsValueSlice() {
					if v.IsKnown() && v.Type().IsObjectType() && v.Type().HasAttribute("secret_key") && v.GetAttr("secret_key").IsKnown() && !v.GetAttr("secret_key").IsNull() {
						mounted[name] = append(mounted[name], v.GetAttr("secret_key").AsString())
					}
				}
			}
			ki := r.ctx.Variables["var"].GetAttr("key_issuer")
			issuer[name] = !ki.IsNull()
			// The relays reload their authority file on change; the key
			// issuer must read a Secret key of its own, or a rotation's
			// "current for pods" step would make relays seal toward pods
			// not yet rolled under a key they lack.
			if issuer[name] && ki.GetAttr("secret_key").AsString() == "RTCEDGE_AUTHORITY_KEYS" {
				t.Errorf("%s's key issuer reads the relays' RTCEDGE_AUTHORITY_KEYS", name)
			}
		}
	}
	// Relays derive every pod's keys from the cluster authority secret,
	// read from a mounted file they re-read on change (a rotation without
	// a restart), not from the environment (both would list every key
	// twice); a transceiver gets only its own keys, from its init
	// container, and neither the secret nor shared token or hop keys.
	for _, role := range []string{"globalrelay", "clusterrelay"} {
		if !slices.Contains(mounted[role], "RTCEDGE_AUTHORITY_KEYS") || slices.Contains(got[role], "RTCEDGE_AUTHORITY_KEYS") {
			t.Errorf("%s: want RTCEDGE_AUTHORITY_KEYS mounted (%q), not in the environment (%q)", role, mounted[role], got[role])
		}
	}
	for _, k := range []string{"RTCEDGE_AUTHORITY_KEYS", "RTCEDGE_TOKEN_KEYS", "RTCEDGE_HOP_KEYS"} {
		if slices.Contains(got["transceiver"], k) {
			t.Errorf("transceivers get %s: a pod must hold only its own keys", k)
		}
	}
	// Signaling proves itself in the global pool with its own secret,
	// never a cluster's.
	// (Its volumes name the catalogue's ConfigMap, unknown before apply:
	// read the module block.)
	region := source(t, "modules/region")
	_, sigBlock, _ := strings.Cut(region, `module "signaling" {`)
	sigBlock, _, _ = strings.Cut(sigBlock, "\n}\n")
	if !strings.Contains(sigBlock, `secret_key = "RTCEDGE_SIGNALING_AUTHORITY_KEYS"`) || strings.Contains(sigBlock, `"RTCEDGE_AUTHORITY_KEYS"`) ||
		slices.Contains(got["signaling"], "RTCEDGE_AUTHORITY_KEYS") {
		t.Errorf("signaling: want its own RTCEDGE_SIGNALING_AUTHORITY_KEYS mounted and no cluster secret (environment %q)", got["signaling"])
	}
	if !issuer["transceiver"] {
		t.Error("transceivers have no key issuer: they would start without keys")
	}
	// A pool's key per pool: a transceiver (the most exposed code) never
	// holds the global pool's key.
	if slices.Contains(got["transceiver"], "RTCEDGE_GLOBAL_GOSSIP_KEY") || slices.Contains(got["transceiver"], "RTCEDGE_GOSSIP_KEY") ||
		!slices.Contains(got["transceiver"], "RTCEDGE_CLUSTER_GOSSIP_KEY") {
		t.Errorf("modules/region: transceivers must get the cluster pool's key only: %q", got["transceiver"])
	}
	if !strings.Contains(region, `key       = "$${RTCEDGE_CLUSTER_GOSSIP_KEY}"`) || !strings.Contains(region, `key       = "$${RTCEDGE_GLOBAL_GOSSIP_KEY}"`) {
		t.Error("modules/region: the role configs must name each pool's own gossip key")
	}
}

// TestPOPServiceKeepsClients: the POP's UDP Service keeps the client's
// source address (externalTrafficPolicy Local: flows are keyed by it) and
// keeps every port of one client IP on one replica (sessionAffinity
// ClientIP: a NAT rebinding to a new port stays where its audio is known,
// docs/network-changes.md).
func TestPOPServiceKeepsClients(t *testing.T) {
	pop := loadTree(t)["modules/pop"]
	var vip *hclsyntax.Block
	for _, b := range pop.blocks("resource", "kubernetes_service_v1") {
		if len(b.Labels) > 1 && b.Labels[1] == "vip" {
			vip = b
		}
	}
	if vip == nil {
		t.Fatal(`no resource "kubernetes_service_v1" "vip" in modules/pop`)
	}
	var spec *hclsyntax.Body
	for _, b := range vip.Body.Blocks {
		if b.Type == "spec" {
			spec = b.Body
		}
	}
	if spec == nil {
		t.Fatal("the vip Service has no spec")
	}
	for name, want := range map[string]string{"external_traffic_policy": "Local", "session_affinity": "ClientIP", "type": "LoadBalancer"} {
		a, ok := spec.Attributes[name]
		if !ok {
			t.Errorf("vip Service: no %s", name)
			continue
		}
		if v, d := a.Expr.Value(nil); d.HasErrors() || v.Type() != cty.String || v.AsString() != want {
			t.Errorf("vip Service: %s is not %q", name, want)
		}
	}
}

// TestRuntimeSizedToRequests: the containers sized for the data plane (the
// global relay, the transceiver) set GOMAXPROCS from their CPU request:
// without a CPU limit the Go runtime, and the relay's workers (one per
// CPU), would follow the node's cores instead.
func TestRuntimeSizedToRequests(t *testing.T) {
	tree := loadTree(t)
	for _, want := range []struct{ module, container string }{{"modules/pop", "globalrelay"}, {"modules/region", "transceiver"}} {
		_, byName := roles(t, tree, want.module)
		r := byName[want.container]
		if r.module == nil {
			t.Errorf("%s: no role %s", want.module, want.container)
			continue
		}
		is := func(b *hclsyntax.Body, name, want string) bool {
			a, ok := b.Attributes[name]
			if !ok {
				return false
			}
			v, d := a.Expr.Value(r.ctx)
			return !d.HasErrors() && v.IsKnown() && v.Type() == cty.String && v.AsString() == want
		}
		found := false
		// walk visits the blocks the plan creates: a dynamic block's
		// content when its for_each is not empty.
		var walk func(b *hclsyntax.Body, inContainer bool)
		walk = func(b *hclsyntax.Body, inContainer bool) {
			for _, blk := range b.Blocks {
				typ, body := blk.Type, blk.Body
				if typ == "dynamic" {
					v, d := attr(t, blk, "for_each").Expr.Value(r.ctx)
					if d.HasErrors() || !v.IsKnown() || v.LengthInt() == 0 || len(body.Blocks) == 0 {
						continue
					}
					typ, body = blk.Labels[0], body.Blocks[0].Body // content
				}
				in := inContainer || (typ == "container" && is(body, "name", want.container))
				if in && typ == "env" && is(body, "name", "GOMAXPROCS") {
					hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
						rf, ok := n.(*hclsyntax.Block)
						found = found || (ok && rf.Type == "resource_field_ref" && is(rf.Body, "resource", "requests.cpu"))
						return nil
					})
				}
				walk(body, in)
			}
		}
		for _, w := range r.workloads(t) {
			walk(w.Body, false)
		}
		if !found {
			t.Errorf("%s: container %s sets no GOMAXPROCS from requests.cpu", want.module, want.container)
		}
	}
}

// TestEveryWorkloadHasADisruptionBudget: every rtcedge Deployment and
// StatefulSet has a PodDisruptionBudget selecting its pods by the same
// labels, so a node upgrade or the autoscaler never evicts all replicas of a
// role at once.
func TestEveryWorkloadHasADisruptionBudget(t *testing.T) {
	tree := loadTree(t)
	selector := func(b *hclsyntax.Body) string {
		for _, spec := range b.Blocks {
			if spec.Type != "spec" {
				continue
			}
			for _, sel := range spec.Body.Blocks {
				if sel.Type == "selector" {
					if a, ok := sel.Body.Attributes["match_labels"]; ok {
						if ste, ok := a.Expr.(*hclsyntax.ScopeTraversalExpr); ok {
							return strings.Join(names(ste.Traversal), ".")
						}
					}
				}
			}
		}
		return ""
	}
	// Each instance (the module, each of its roles) selects its own pods.
	for _, mod := range []string{"modules/pop", "modules/region"} {
		own, byName := roles(t, tree, mod)
		byName[mod] = own
		workloads := 0
		for name, in := range byName {
			budgets := map[string]bool{}
			for _, b := range in.planned(t, "kubernetes_pod_disruption_budget_v1") {
				budgets[selector(b.Body)] = true
			}
			for _, b := range in.workloads(t) {
				if b.Labels[1] == "redis" {
					continue // a single replica: a budget would block every drain
				}
				workloads++
				if sel := selector(b.Body); !budgets[sel] {
					t.Errorf("%s: %s of %s (selector %s) has no PodDisruptionBudget", mod, b.Labels[0], name, sel)
				}
			}
		}
		if workloads < len(byName)-1 {
			t.Errorf("%s: %d workloads for %d roles", mod, workloads, len(byName)-1)
		}
	}
}

// TestWorkloadKindsShareOnePodTemplate: the workload module's Deployment and
// StatefulSet carry the same pod template, written twice only because HCL
// cannot share a block between two resource types.
func TestWorkloadKindsShareOnePodTemplate(t *testing.T) {
	var templates []string
	for _, kind := range []string{"kubernetes_deployment_v1", "kubernetes_stateful_set_v1"} {
		for _, w := range loadTree(t)["modules/workload"].blocks("resource", kind) {
			hclsyntax.VisitAll(w.Body, func(n hclsyntax.Node) hcl.Diagnostics {
				if blk, ok := n.(*hclsyntax.Block); ok && blk.Type == "template" {
					src, err := os.ReadFile(blk.Range().Filename)
					if err != nil {
						t.Fatal(err)
					}
					templates = append(templates, string(src[blk.Range().Start.Byte:blk.Range().End.Byte]))
				}
				return nil
			})
		}
	}
	if len(templates) != 2 || templates[0] != templates[1] {
		t.Errorf("modules/workload: %d pod templates, want the Deployment's and the StatefulSet's, the same", len(templates))
	}
}
