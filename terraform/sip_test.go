package terraform

// The POP module's SIP front (docs/sip.md, "Deploy"): its rendered config
// is one the binary accepts, its Service keeps carriers where their dialogs
// are, and its NetworkPolicy admits the trunks only.

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/rtcedge/rtcedge/internal/config"
	"github.com/rtcedge/rtcedge/sipfront"
)

// sipConfig renders the POP module's sipfront config with given inputs and
// decodes it as `rtcedge sipfront -config` does (strictly: an unknown key
// fails), then validates it.
func sipConfig(t *testing.T, given map[string]cty.Value) sipfront.NodeConfig {
	t.Helper()
	t.Setenv("RTCEDGE_SESSION_API_SECRET_1", "s3cret")
	t.Setenv("CARRIER_A_SIP_PASSWORD", "pw")
	ctx, _ := evalModule(t, loadTree(t)["modules/pop"], given)
	v := ctx.Variables["local"].GetAttr("sip_config_yaml")
	if !v.IsWhollyKnown() || v.Type() != cty.String {
		t.Fatalf("local.sip_config_yaml cannot be evaluated here: %#v", v)
	}
	data := []byte(v.AsString())
	var cfg sipfront.NodeConfig
	if err := config.Decode(data, &cfg); err != nil {
		t.Fatalf("the rendered config does not decode: %v\n%s", err, data)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the rendered config does not validate: %v\n%s", err, data)
	}
	return cfg
}

// TestSIPFrontConfigIsTheBinarys: the config the POP module renders from
// its sip input decodes strictly into the role's config and validates; a
// trunk's calls are pinned to this POP unless it says otherwise; secrets
// are environment references, never values; TLS listens only with a
// certificate.
func TestSIPFrontConfigIsTheBinarys(t *testing.T) {
	cfg := sipConfig(t, baseInputs["modules/pop"])
	if cfg.SIPUDP != "0.0.0.0:5060" || cfg.SIPTCP != "0.0.0.0:5060" || cfg.SIPTLS != "" {
		t.Errorf("listeners udp %q tcp %q tls %q, want 5060 both and no TLS without a certificate", cfg.SIPUDP, cfg.SIPTCP, cfg.SIPTLS)
	}
	if len(cfg.Trunks) != 1 {
		t.Fatalf("trunks %+v", cfg.Trunks)
	}
	tr := cfg.Trunks[0]
	if tr.POP != "fra" || tr.DigestPasswordEnv != "CARRIER_A_SIP_PASSWORD" || tr.DigestPassword != "" || !slices.Equal(tr.MediaCIDRs, tr.SourceCIDRs) {
		t.Errorf("trunk %+v: want pinned to this POP (fra), the password by its variable only, media_cidrs defaulting to source_cidrs", tr)
	}
	if cfg.SessionAPISecrets[1] != "s3cret" {
		t.Errorf("session_api_secrets %v: want cluster 1's from its variable", cfg.SessionAPISecrets)
	}
	if cfg.MetricsAddr != "0.0.0.0:9090" || cfg.Catalogue != "/etc/rtcedge-catalogue/catalogue.yaml" {
		t.Errorf("metrics_addr %q catalogue %q: the workload probes port 9090, the catalogue is mounted at /etc/rtcedge-catalogue", cfg.MetricsAddr, cfg.Catalogue)
	}

	// A trunk that pins another POP, or none (""), keeps its choice.
	trunks := sipInput.GetAttr("trunks").AsValueSlice()
	obj := trunks[0].AsValueMap()
	obj["pop"] = str("")
	sip := sipInput.AsValueMap()
	sip["trunks"] = cty.ListVal([]cty.Value{cty.ObjectVal(obj)})
	sip["tls_secret_name"] = str("sip-example-com")
	cfg = sipConfig(t, with(baseInputs["modules/pop"], map[string]cty.Value{"sip": cty.ObjectVal(sip)}))
	if cfg.Trunks[0].POP != "" {
		t.Errorf("pop = \"\" became %q: want the POP nearest the carrier", cfg.Trunks[0].POP)
	}
	if cfg.SIPTLS != "0.0.0.0:5061" || cfg.TLSCert != "/etc/rtcedge-sip-tls/tls.crt" || cfg.TLSKey != "/etc/rtcedge-sip-tls/tls.key" {
		t.Errorf("with tls_secret_name: sip_tls %q tls_cert %q tls_key %q", cfg.SIPTLS, cfg.TLSCert, cfg.TLSKey)
	}
}

// TestSIPInputValidations: what the API server or the binary would refuse
// fails plan.
func TestSIPInputValidations(t *testing.T) {
	m := loadTree(t)["modules/pop"]
	trunk := sipInput.GetAttr("trunks").AsValueSlice()[0].AsValueMap()
	withTrunk := func(k string, v cty.Value) cty.Value {
		tr := map[string]cty.Value{}
		for kk, vv := range trunk {
			tr[kk] = vv
		}
		tr[k] = v
		sip := sipInput.AsValueMap()
		sip["trunks"] = cty.ListVal([]cty.Value{cty.ObjectVal(tr)})
		return cty.ObjectVal(sip)
	}
	withSIP := func(k string, v cty.Value) cty.Value {
		sip := sipInput.AsValueMap()
		sip[k] = v
		return cty.ObjectVal(sip)
	}
	for _, tc := range []struct {
		what string
		sip  cty.Value
		says string // "" = accepted
	}{
		{"the base", sipInput, ""},
		{"a CIDR that is not one", withTrunk("source_cidrs", cty.ListVal([]cty.Value{str("203.0.113.0/33")})), "must be CIDRs"},
		{"an IPv6 CIDR", withTrunk("media_cidrs", cty.ListVal([]cty.Value{str("2001:db8::/32")})), ""},
		{"no source CIDR", withTrunk("source_cidrs", cty.ListValEmpty(cty.String)), "needs source_cidrs"},
		{"a digest user without a password", withTrunk("digest_password_key", cty.NullVal(cty.String)), "go together"},
		{"a password key that is no variable name", withTrunk("digest_password_key", str("carrier-a.password")), "environment variable"},
		{"a TLS Secret name", withSIP("tls_secret_name", str("Sip_TLS")), "DNS-1123 subdomains"},
		{"a claim name", withSIP("geoip_claim_name", str(strings.Repeat("a", 254))), "DNS-1123 subdomains"},
		{"an annotation key", withSIP("service_annotations", cty.MapVal(map[string]cty.Value{"example.com/" + strings.Repeat("a", 64): str("v")})), "qualified name"},
		{"a cluster ID", withSIP("session_api_clusters", cty.ListVal([]cty.Value{cty.NumberIntVal(70000)})), "1..65535"},
		{"no replica", withSIP("replicas", cty.NumberIntVal(0)), "at least 1 replica"},
	} {
		ok, msgs := validate(t, m, "sip", with(baseInputs["modules/pop"], map[string]cty.Value{"sip": tc.sip}))
		switch {
		case ok != (tc.says == ""):
			t.Errorf("%s: accepted %v (%q)", tc.what, ok, msgs)
		case !ok && !strings.Contains(strings.Join(msgs, "\n"), tc.says):
			t.Errorf("%s: refused with %q, want a message saying %q", tc.what, msgs, tc.says)
		}
	}
}

// TestSIPServiceAndPolicy: the SIP Service keeps the carrier's address
// (trunks are recognised by it) and all of a carrier's requests on one
// replica (its dialogs live there); the front's NetworkPolicy admits SIP
// from the trunks' CIDRs only and restricts its egress.
func TestSIPServiceAndPolicy(t *testing.T) {
	pop := loadTree(t)["modules/pop"]
	var svc, np *hclsyntax.Block
	for _, b := range pop.blocks("resource", "") {
		switch b.Labels[0] + "." + b.Labels[1] {
		case "kubernetes_service_v1.sip":
			svc = b
		case "kubernetes_network_policy_v1.sipfront":
			np = b
		}
	}
	if svc == nil || np == nil {
		t.Fatal("modules/pop: no kubernetes_service_v1.sip or kubernetes_network_policy_v1.sipfront")
	}
	spec := func(b *hclsyntax.Block) *hclsyntax.Body {
		for _, c := range b.Body.Blocks {
			if c.Type == "spec" {
				return c.Body
			}
		}
		t.Fatalf("%s has no spec", b.Range())
		return nil
	}
	for name, want := range map[string]string{"external_traffic_policy": "Local", "session_affinity": "ClientIP", "type": "LoadBalancer"} {
		if v, d := attr(t, &hclsyntax.Block{Body: spec(svc)}, name).Expr.Value(nil); d.HasErrors() || v.AsString() != want {
			t.Errorf("sip Service: %s is not %q", name, want)
		}
	}
	var sipRule *hclsyntax.Block
	egress := 0
	for _, b := range spec(np).Blocks {
		if b.Type == "egress" || (b.Type == "dynamic" && b.Labels[0] == "egress") {
			egress++
		}
		if b.Type == "ingress" && strings.Contains(string(mustSource(t, b)), `"5060"`) {
			sipRule = b
		}
	}
	if types, d := attr(t, &hclsyntax.Block{Body: spec(np)}, "policy_types").Expr.Value(nil); d.HasErrors() || !types.Type().IsTupleType() || types.LengthInt() != 2 || egress == 0 {
		t.Errorf("sipfront NetworkPolicy: policy_types %#v with %d egress rules, want Ingress and Egress restricted", types, egress)
	}
	if sipRule == nil {
		t.Fatal("sipfront NetworkPolicy: no ingress rule for SIP (5060)")
	}
	from := false
	hclsyntax.VisitAll(sipRule.Body, func(n hclsyntax.Node) hcl.Diagnostics {
		if b, ok := n.(*hclsyntax.Block); ok && b.Type == "dynamic" && b.Labels[0] == "from" {
			from = from || refersTo(attr(t, b, "for_each").Expr, "local", "sip_source_cidrs")
		}
		return nil
	})
	if !from {
		t.Error("sipfront NetworkPolicy: SIP is not admitted from the trunks' source CIDRs (local.sip_source_cidrs)")
	}
}

// mustSource is a block's text.
func mustSource(t *testing.T, b *hclsyntax.Block) []byte {
	t.Helper()
	src, err := os.ReadFile(b.Range().Filename)
	if err != nil {
		t.Fatal(err)
	}
	return src[b.Range().Start.Byte:b.Range().End.Byte]
}

// TestPodsWritePhoneRoutes: a region's pods get the route cache its
// phone calls' route entries go to (route_cache_url → the transceiver's
// redis_url), and the POP's Redis admits transceivers beside its relays:
// without both, a phone call's media opens no flow at the global relay.
func TestPodsWritePhoneRoutes(t *testing.T) {
	tree := loadTree(t)
	const url = "redis://rtcedge-redis.rtcedge-pop-fra.svc:6379/0"
	ctx, _ := evalModule(t, tree["modules/region"], with(baseInputs["modules/region"], map[string]cty.Value{"route_cache_url": str(url)}))
	if got := ctx.Variables["local"].GetAttr("transceiver_config").GetAttr("redis_url"); !got.IsKnown() || got.AsString() != url {
		t.Errorf("transceiver redis_url = %#v, want route_cache_url %q", got, url)
	}
	if ok, _ := validate(t, tree["modules/region"], "route_cache_url", with(baseInputs["modules/region"], map[string]cty.Value{"route_cache_url": str("rtcedge-redis:6379")})); ok {
		t.Error("route_cache_url without a scheme accepted")
	}
	var admitsPods bool
	for _, np := range tree["modules/pop"].blocks("resource", "kubernetes_network_policy_v1") {
		if np.Labels[1] == "redis" {
			admitsPods = strings.Contains(string(mustSource(t, np)), `"app.kubernetes.io/name" = "transceiver"`)
		}
	}
	if !admitsPods {
		t.Error("the POP's Redis NetworkPolicy does not admit transceivers")
	}
}
