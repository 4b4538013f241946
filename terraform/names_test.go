package terraform

// The Kubernetes API server limits names (namespaces, object names, label
// keys and values, port names); an input that breaks a limit must fail
// `plan` through a variable validation, not `apply`. These tests evaluate the
// modules' validation conditions and the names the modules compose from
// their inputs, without Terraform: TestAcceptedNamesFitKubernetes feeds each
// input the longest values its validations accept and checks every composed
// name against the API server's rules below, so a validation that is missing
// or looser than the composition fails it.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	ctyjson "github.com/zclconf/go-cty/cty/json"
	"go.yaml.in/yaml/v3"
)

// The API server's rules (k8s.io/apimachinery/pkg/util/validation), written
// out: DNS-1123 labels and subdomains, DNS-1035 labels (Service names),
// label values, qualified names (label and annotation keys).
var (
	dns1123Label     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	dns1035Label     = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
	labelValue       = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	qualifiedName    = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
)

func isLabel(s string) bool     { return len(s) <= 63 && dns1123Label.MatchString(s) }
func isSubdomain(s string) bool { return len(s) <= 253 && dns1123Subdomain.MatchString(s) }

// isLabelKey: an optional DNS subdomain prefix and '/', then a name of at
// most 63 characters.
func isLabelKey(s string) bool {
	prefix, name, found := strings.Cut(s, "/")
	if !found {
		prefix, name = "", s
	} else if !isSubdomain(prefix) {
		return false
	}
	return len(name) <= 63 && qualifiedName.MatchString(name)
}

// tfFunctions are the Terraform functions the modules' validations and
// name-composing expressions call; an expression calling another fails the
// evaluation, and so the test.
func tfFunctions() map[string]function.Function {
	length := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "value", Type: cty.DynamicPseudoType, AllowMarked: true}},
		Type:   function.StaticReturnType(cty.Number),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			if args[0].Type() == cty.String {
				return cty.NumberIntVal(int64(utf8.RuneCountInString(args[0].AsString()))), nil
			}
			return stdlib.Length(args[0])
		},
	})
	alltrue := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "list", Type: cty.List(cty.Bool)}},
		Type:   function.StaticReturnType(cty.Bool),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			for it := args[0].ElementIterator(); it.Next(); {
				if _, v := it.Element(); v.IsNull() || v.False() {
					return cty.False, nil
				}
			}
			return cty.True, nil
		},
	})
	affix := func(fn func(s, affix string) bool) function.Function {
		return function.New(&function.Spec{
			Params: []function.Parameter{{Name: "str", Type: cty.String}, {Name: "affix", Type: cty.String}},
			Type:   function.StaticReturnType(cty.Bool),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				return cty.BoolVal(fn(args[0].AsString(), args[1].AsString())), nil
			},
		})
	}
	sha := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "str", Type: cty.String}},
		Type:   function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			sum := sha256.Sum256([]byte(args[0].AsString()))
			return cty.StringVal(hex.EncodeToString(sum[:])), nil
		},
	})
	identity := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "value", Type: cty.DynamicPseudoType, AllowNull: true}},
		Type:   func(args []cty.Value) (cty.Type, error) { return args[0].Type(), nil },
		Impl:   func(args []cty.Value, _ cty.Type) (cty.Value, error) { return args[0], nil },
	})
	// cidrhost(prefix, 0) is the prefix's first address (the modules only
	// use it to check a CIDR).
	cidrhost := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "prefix", Type: cty.String}, {Name: "hostnum", Type: cty.Number}},
		Type:   function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			p, err := netip.ParsePrefix(args[0].AsString())
			if err != nil {
				return cty.NilVal, err
			}
			if n, _ := args[1].AsBigFloat().Int64(); n != 0 {
				return cty.NilVal, fmt.Errorf("cidrhost: only host 0 is implemented here")
			}
			return cty.StringVal(p.Masked().Addr().String()), nil
		},
	})
	// yamlencode writes block-style YAML as Terraform's does (map keys as
	// strings), through JSON and yaml.v3.
	yamlencode := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "value", Type: cty.DynamicPseudoType, AllowNull: true}},
		Type:   function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			data, err := ctyjson.Marshal(args[0], args[0].Type())
			if err != nil {
				return cty.NilVal, err
			}
			var v any
			if err := json.Unmarshal(data, &v); err != nil {
				return cty.NilVal, err
			}
			out, err := yaml.Marshal(v)
			return cty.StringVal(string(out)), err
		},
	})
	return map[string]function.Function{
		"alltrue":      alltrue,
		"can":          tryfunc.CanFunc,
		"cidrhost":     cidrhost,
		"coalesce":     stdlib.CoalesceFunc,
		"compact":      stdlib.CompactFunc,
		"flatten":      stdlib.FlattenFunc,
		"concat":       stdlib.ConcatFunc,
		"contains":     stdlib.ContainsFunc,
		"distinct":     stdlib.DistinctFunc,
		"endswith":     affix(strings.HasSuffix),
		"floor":        stdlib.FloorFunc,
		"jsonencode":   stdlib.JSONEncodeFunc,
		"keys":         stdlib.KeysFunc,
		"length":       length,
		"lookup":       stdlib.LookupFunc,
		"merge":        stdlib.MergeFunc,
		"nonsensitive": identity,
		"regex":        stdlib.RegexFunc,
		"sha256":       sha,
		"sort":         stdlib.SortFunc,
		"startswith":   affix(strings.HasPrefix),
		"tostring":     stdlib.MakeToFunc(cty.String),
		"try":          tryfunc.TryFunc,
		"values":       stdlib.ValuesFunc,
		"join":         stdlib.JoinFunc,
		"yamlencode":   yamlencode,
	}
}

// varValues are a module's variables as Terraform sets them from given
// (converted to each variable's type, optional attributes defaulted) over
// their defaults; a required variable not given is an unknown of its type.
func varValues(t *testing.T, m *module, given map[string]cty.Value) cty.Value {
	t.Helper()
	vars := map[string]cty.Value{}
	for _, v := range m.blocks("variable", "") {
		name := v.Labels[0]
		ty, defaults, d := typeexpr.TypeConstraintWithDefaults(attr(t, v, "type").Expr)
		if d.HasErrors() {
			t.Fatalf("%s: variable %s: type: %v", m.dir, name, d)
		}
		val, ok := given[name]
		if !ok {
			if def, has := v.Body.Attributes["default"]; has {
				if val, d = def.Expr.Value(nil); d.HasErrors() {
					t.Fatalf("%s: variable %s: default: %v", m.dir, name, d)
				}
			} else {
				val = cty.UnknownVal(ty)
			}
		}
		if defaults != nil && !val.IsNull() {
			val = defaults.Apply(val)
		}
		conv, err := convert.Convert(val, ty)
		if err != nil {
			t.Fatalf("%s: variable %s = %#v: %v", m.dir, name, val, err)
		}
		vars[name] = conv
	}
	return cty.ObjectVal(vars)
}

// validate evaluates every validation of variable name of m with the
// module's variables set from given: ok when all hold, else the failing
// conditions' error messages. A condition that cannot be evaluated fails
// the test.
func validate(t *testing.T, m *module, name string, given map[string]cty.Value) (ok bool, msgs []string) {
	t.Helper()
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{"var": varValues(t, m, given)}, Functions: tfFunctions()}
	for _, v := range m.blocks("variable", name) {
		for _, b := range v.Body.Blocks {
			if b.Type != "validation" {
				continue
			}
			cond, d := attr(t, b, "condition").Expr.Value(ctx)
			if d.HasErrors() || !cond.IsKnown() || cond.IsNull() {
				t.Fatalf("%s: %s = %v: condition at %s gives %#v: %v", m.dir, name, given[name], b.Range(), cond, d)
			}
			if cond.False() {
				msg, d := attr(t, b, "error_message").Expr.Value(ctx)
				if d.HasErrors() {
					t.Fatalf("%s: %s: error_message: %v", m.dir, name, d)
				}
				msgs = append(msgs, msg.AsString())
			}
		}
	}
	return len(msgs) == 0, msgs
}

// baseInputs are plausible values of each module's required variables.
var baseInputs = map[string]map[string]cty.Value{
	"modules/region": {
		"region":             cty.StringVal("eu-central"),
		"cluster_id":         cty.NumberIntVal(1),
		"image":              cty.StringVal("registry.example.com/rtcedge:v1.2.0"),
		"catalogue_yaml":     cty.StringVal("regions: []\n"),
		"global_gossip_join": cty.ListVal([]cty.Value{cty.StringVal("gossip.example.net:7947")}),
		"trusted_proxies":    cty.ListValEmpty(cty.String),
	},
	"modules/pop": {
		"region":             cty.StringVal("eu-central"),
		"pop_id":             cty.NumberIntVal(1),
		"name":               cty.StringVal("fra"),
		"image":              cty.StringVal("registry.example.com/rtcedge:v1.2.0"),
		"global_gossip_join": cty.ListVal([]cty.Value{cty.StringVal("gossip.example.net:7947")}),
		"sip":                sipInput,
	},
}

// sipInput is a POP's SIP front with one trunk by address and digest, and
// the session API secret of cluster 1.
var sipInput = cty.ObjectVal(map[string]cty.Value{
	"catalogue_yaml":       cty.StringVal("regions: []\n"),
	"load_balancer_ip":     cty.StringVal("192.0.2.20"),
	"session_api_clusters": cty.ListVal([]cty.Value{cty.NumberIntVal(1)}),
	"trunks": cty.ListVal([]cty.Value{cty.ObjectVal(map[string]cty.Value{
		"name":                cty.StringVal("carrier-a"),
		"source_cidrs":        cty.ListVal([]cty.Value{cty.StringVal("203.0.113.0/24")}),
		"digest_user":         cty.StringVal("rtcedge"),
		"digest_password_key": cty.StringVal("CARRIER_A_SIP_PASSWORD"),
	})}),
})

// with returns base with more values set.
func with(base map[string]cty.Value, more map[string]cty.Value) map[string]cty.Value {
	out := map[string]cty.Value{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

func str(s string) cty.Value { return cty.StringVal(s) }

// TestNameValidationsAtTheLimits pins the limits the issue met (a POP name
// over 51 characters, a region over 55, passed plan and failed at apply)
// and their neighbours, each at its boundary.
func TestNameValidationsAtTheLimits(t *testing.T) {
	tree := loadTree(t)
	a := func(n int) string { return strings.Repeat("a", n) }
	ns := map[string]cty.Value{"namespace": str("rtcedge-x")}
	annotations := func(key string) cty.Value { return cty.MapVal(map[string]cty.Value{key: str("v")}) }
	for _, tc := range []struct {
		dir, name string
		value     cty.Value
		more      map[string]cty.Value
		ok        bool
		says      string // in the error message when refused
	}{
		{dir: "modules/pop", name: "name", value: str(a(51)), ok: true},
		{dir: "modules/pop", name: "name", value: str(a(52)), says: "at most 51"},
		{dir: "modules/pop", name: "name", value: str("Fra"), says: "lowercase"},
		{dir: "modules/pop", name: "name", value: str("fra-"), says: "label value"},
		{dir: "modules/pop", name: "name", value: str(a(63)), more: ns, ok: true},
		{dir: "modules/pop", name: "name", value: str(a(64)), more: ns, says: "at most 63"},
		{dir: "modules/pop", name: "region", value: str(a(63)), ok: true},
		{dir: "modules/pop", name: "region", value: str(a(64)), says: "at most 63"},
		{dir: "modules/pop", name: "namespace", value: str(a(63)), ok: true},
		{dir: "modules/pop", name: "namespace", value: str(a(64)), says: "DNS-1123 label"},
		{dir: "modules/pop", name: "secret_name", value: str("rtcedge_secrets"), says: "subdomain"},
		{dir: "modules/pop", name: "service_annotations", value: annotations("example.com/" + a(63)), ok: true},
		{dir: "modules/pop", name: "service_annotations", value: annotations("example.com/" + a(64)), says: "qualified name"},
		{dir: "modules/pop", name: "secrets", value: cty.MapVal(map[string]cty.Value{"A KEY": str("v")}), says: "Secret data key"},
		{dir: "modules/pop", name: "network_policy", value: cty.ObjectVal(map[string]cty.Value{"monitoring_namespace": str("Monitoring")}), says: "DNS-1123 label"},
		{dir: "modules/region", name: "region", value: str(a(55)), ok: true},
		{dir: "modules/region", name: "region", value: str(a(56)), says: "at most 55"},
		{dir: "modules/region", name: "region", value: str("eu_central"), says: "at most 55 lowercase"},
		{dir: "modules/region", name: "region", value: str("eu_central"), more: ns, ok: true},
		{dir: "modules/region", name: "region", value: str(a(63)), more: ns, ok: true},
		{dir: "modules/region", name: "region", value: str(a(64)), more: ns, says: "at most 63"},
		{dir: "modules/region", name: "namespace", value: str("-x"), says: "DNS-1123 label"},
		{dir: "modules/region", name: "geoip_claim_name", value: str("GeoIP"), says: "subdomain"},
		{dir: "modules/region", name: "signaling_service_annotations", value: annotations(a(254) + "/x"), says: "qualified name"},
		{dir: "modules/region", name: "network_policy", value: cty.ObjectVal(map[string]cty.Value{"ingress_namespace": str(a(64))}), says: "DNS-1123 label"},
	} {
		m := tree[tc.dir]
		given := with(with(baseInputs[tc.dir], tc.more), map[string]cty.Value{tc.name: tc.value})
		ok, msgs := validate(t, m, tc.name, given)
		shown := tc.value.GoString()
		if len(shown) > 80 {
			shown = shown[:80] + "…"
		}
		switch {
		case ok != tc.ok:
			t.Errorf("%s: %s = %s (with %v): accepted %v, want %v (%q)", tc.dir, tc.name, shown, tc.more, ok, tc.ok, msgs)
		case !ok && !strings.Contains(strings.Join(msgs, "\n"), tc.says):
			t.Errorf("%s: %s = %s: refused with %q, want a message saying %q", tc.dir, tc.name, shown, msgs, tc.says)
		}
	}
}

// object is one Kubernetes object a module composes: its type, address and
// metadata as planned.
type object struct {
	typ, addr       string
	name, namespace cty.Value
	labels          cty.Value
}

// metadataOf evaluates a resource's metadata block in ctx.
func metadataOf(t *testing.T, blk *hclsyntax.Block, ctx *hcl.EvalContext) object {
	t.Helper()
	o := object{typ: blk.Labels[0], addr: blk.Labels[0] + "." + blk.Labels[1], name: cty.NullVal(cty.String), namespace: cty.NullVal(cty.String), labels: cty.NullVal(cty.Map(cty.String))}
	for _, b := range blk.Body.Blocks {
		if b.Type != "metadata" {
			continue
		}
		for key, dst := range map[string]*cty.Value{"name": &o.name, "namespace": &o.namespace, "labels": &o.labels} {
			if a, ok := b.Body.Attributes[key]; ok {
				v, _ := a.Expr.Value(ctx)
				*dst = v
			}
		}
	}
	return o
}

// compose evaluates the objects an instance of module dir creates with
// given inputs: its locals and its resources' metadata, to a fixed point
// (locals name resources, resources locals), then the same for each call of
// modules/workload with that call's arguments.
func compose(t *testing.T, tree map[string]*module, dir string, given map[string]cty.Value) []object {
	t.Helper()
	m := tree[dir]
	ctx, objs := evalModule(t, m, given)
	for name, call := range m.calls {
		src, _ := attr(t, call, "source").Expr.Value(nil)
		if path.Clean(path.Join(dir, src.AsString())) != "modules/workload" {
			continue
		}
		for _, o := range compose(t, tree, "modules/workload", callArgs(call, ctx)) {
			o.addr = "module." + name + "." + o.addr
			objs = append(objs, o)
		}
	}
	return objs
}

// callArgs evaluates a module call's arguments in ctx; those that fail
// to evaluate are left out (their variables then take their defaults).
func callArgs(call *hclsyntax.Block, ctx *hcl.EvalContext) map[string]cty.Value {
	args := map[string]cty.Value{}
	for arg, a := range call.Body.Attributes {
		if metaArguments[arg] {
			continue
		}
		if v, d := a.Expr.Value(ctx); !d.HasErrors() {
			args[arg] = v
		}
	}
	return args
}

// evalModule evaluates m's locals and its Kubernetes resources' metadata
// with given inputs, to a fixed point (locals name resources, resources
// locals); what cannot be evaluated here stays unknown.
func evalModule(t *testing.T, m *module, given map[string]cty.Value) (*hcl.EvalContext, []object) {
	t.Helper()
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{"var": varValues(t, m, given)}, Functions: tfFunctions()}
	var objs []object
	for range 8 { // deeper than the longest chain of locals
		locals := map[string]cty.Value{}
		for _, b := range m.bodies {
			for _, blk := range b.Blocks {
				if blk.Type != "locals" {
					continue
				}
				for name, a := range blk.Body.Attributes {
					v, d := a.Expr.Value(ctx)
					if d.HasErrors() {
						v = cty.DynamicVal
					}
					locals[name] = v
				}
			}
		}
		ctx.Variables["local"] = cty.ObjectVal(locals)
		objs = objs[:0]
		byType := map[string]map[string]cty.Value{}
		for _, blk := range m.blocks("resource", "") {
			if !strings.HasPrefix(blk.Labels[0], "kubernetes_") {
				continue
			}
			o := metadataOf(t, blk, ctx)
			objs = append(objs, o)
			meta := cty.ObjectVal(map[string]cty.Value{"name": o.name, "namespace": o.namespace})
			v := cty.ObjectVal(map[string]cty.Value{"metadata": cty.TupleVal([]cty.Value{meta})})
			if _, counted := blk.Body.Attributes["count"]; counted {
				v = cty.TupleVal([]cty.Value{v})
			}
			if byType[blk.Labels[0]] == nil {
				byType[blk.Labels[0]] = map[string]cty.Value{}
			}
			byType[blk.Labels[0]][blk.Labels[1]] = v
		}
		for typ, rs := range byType {
			ctx.Variables[typ] = cty.ObjectVal(rs)
		}
	}
	return ctx, objs
}

// misfits reports every name of objs the API server would refuse.
func misfits(objs []object) []string {
	var out []string
	bad := func(o object, format string, args ...any) {
		out = append(out, o.addr+": "+fmt.Sprintf(format, args...))
	}
	known := func(o object, what string, v cty.Value) bool {
		if !v.IsWhollyKnown() {
			bad(o, "%s cannot be evaluated here (%#v): extend tfFunctions or compose", what, v)
			return false
		}
		return true
	}
	for _, o := range objs {
		if known(o, "name", o.name) {
			name := o.name.AsString()
			switch o.typ {
			case "kubernetes_namespace_v1":
				if !isLabel(name) {
					bad(o, "namespace name %q (%d characters) is not a DNS-1123 label of at most 63", name, len(name))
				}
			case "kubernetes_service_v1":
				if len(name) > 63 || !dns1035Label.MatchString(name) {
					bad(o, "Service name %q is not a DNS-1035 label of at most 63", name)
				}
			default:
				if !isSubdomain(name) {
					bad(o, "name %q is not a DNS-1123 subdomain of at most 253", name)
				}
			}
		}
		if !o.namespace.IsNull() && known(o, "namespace", o.namespace) && !isLabel(o.namespace.AsString()) {
			bad(o, "namespace %q (%d characters) is not a DNS-1123 label of at most 63", o.namespace.AsString(), len(o.namespace.AsString()))
		}
		if !o.labels.IsNull() && known(o, "labels", o.labels) {
			for k, v := range o.labels.AsValueMap() {
				if !isLabelKey(k) {
					bad(o, "label key %q is not a qualified name", k)
				}
				if s := v.AsString(); len(s) > 63 || !labelValue.MatchString(s) {
					bad(o, "label %s=%q (%d characters) is not a label value of at most 63", k, s, len(s))
				}
			}
		}
	}
	return out
}

// longestAccepted is, for each shape of string, the longest one (up to 300
// characters) that every validation of variable name accepts.
func longestAccepted(t *testing.T, m *module, name string, base map[string]cty.Value) []string {
	t.Helper()
	shapes := []func(n int) string{
		func(n int) string { return strings.Repeat("a", n) },
		func(n int) string { return strings.Repeat("Z", n) },
		func(n int) string { return strings.Repeat("a_", n/2) + strings.Repeat("a", n%2) },
		func(n int) string { return strings.Repeat("a.", n/2) + strings.Repeat("a", n%2) },
	}
	accepts := func(v string) bool {
		ok, _ := validate(t, m, name, with(base, map[string]cty.Value{name: str(v)}))
		return ok
	}
	var out []string
	for _, shape := range shapes {
		// Length limits make the accepted lengths of a shape a prefix
		// of 1..300: search for its end.
		if !accepts(shape(1)) {
			continue
		}
		lo, hi := 1, 301 // accepts(lo), and hi is past the end or refused
		for hi-lo > 1 {
			if mid := (lo + hi) / 2; accepts(shape(mid)) {
				lo = mid
			} else {
				hi = mid
			}
		}
		out = append(out, shape(lo))
	}
	return out
}

// TestAcceptedNamesFitKubernetes: for every string input of the region and
// POP modules, with the namespace derived and with it set, the longest
// values the validations accept (of several shapes) compose only names the
// API server takes. It fails when a validation is missing or looser than
// the names a module composes from its input.
func TestAcceptedNamesFitKubernetes(t *testing.T) {
	tree := loadTree(t)
	for _, dir := range []string{"modules/region", "modules/pop"} {
		m := tree[dir]
		if probs := misfits(compose(t, tree, dir, baseInputs[dir])); len(probs) > 0 {
			t.Fatalf("%s with its base inputs: %s", dir, strings.Join(probs, "\n"))
		}
		for _, namespaced := range []bool{false, true} {
			base := baseInputs[dir]
			if namespaced {
				base = with(base, map[string]cty.Value{"namespace": str("rtcedge-x")})
			}
			for _, v := range m.blocks("variable", "") {
				name := v.Labels[0]
				if ty, _, _ := typeexpr.TypeConstraintWithDefaults(attr(t, v, "type").Expr); ty != cty.String || (namespaced && name == "namespace") {
					continue
				}
				for _, val := range longestAccepted(t, m, name, base) {
					probs := misfits(compose(t, tree, dir, with(base, map[string]cty.Value{name: str(val)})))
					if len(probs) > 0 {
						t.Errorf("%s: %s = %q (%d characters) passes its validations, but:\n\t%s", dir, name, val, len(val), strings.Join(slices.Compact(probs), "\n\t"))
					}
				}
			}
		}
	}
}

// TestKeyChangeRollsExactlyItsReaders: with the Secret managed by the
// module, changing one key changes the pod template checksum
// (rtcedge.example.com/secret-sha) of exactly the roles that read that key,
// per docs/deploy.md's "Secrets" table; without it (a Secret out of band)
// there is no checksum.
func TestKeyChangeRollsExactlyItsReaders(t *testing.T) {
	readers := map[string][]string{
		"transceiver":  {"RTCEDGE_CLUSTER_GOSSIP_KEY", "RTCEDGE_ISSUER_AUTHORITY_KEYS"},
		"clusterrelay": {"RTCEDGE_CLUSTER_GOSSIP_KEY", "RTCEDGE_GLOBAL_GOSSIP_KEY", "RTCEDGE_AUTHORITY_KEYS"},
		"signaling":    {"RTCEDGE_API_KEYS", "RTCEDGE_CLIENT_SECRET_KEY", "RTCEDGE_GLOBAL_GOSSIP_KEY", "RTCEDGE_SIGNALING_AUTHORITY_KEYS"},
		"globalrelay":  {"RTCEDGE_GLOBAL_GOSSIP_KEY", "RTCEDGE_AUTHORITY_KEYS"},
		"sipfront":     {"RTCEDGE_SESSION_API_SECRET_1", "CARRIER_A_SIP_PASSWORD"},
	}
	var keys []string
	for _, ks := range readers {
		keys = append(keys, ks...)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	hashes := func(changed string) cty.Value {
		m := map[string]cty.Value{}
		for _, k := range keys {
			m[k] = str("old")
			if k == changed {
				m[k] = str("new")
			}
		}
		return cty.MapVal(m)
	}
	tree := loadTree(t)
	seen := map[string]bool{}
	for _, dir := range []string{"modules/region", "modules/pop"} {
		ctx, _ := evalModule(t, tree[dir], baseInputs[dir])
		for name, call := range tree[dir].calls {
			a, ok := call.Body.Attributes["secret_hashes"]
			if !ok || !refersTo(a.Expr, "local", "secret_hashes") {
				t.Errorf("%s: module %s is not given local.secret_hashes: its pods would not roll on a key change", dir, name)
				continue
			}
			args := callArgs(call, ctx)
			role := args["name"].AsString()
			seen[role] = true
			checksum := func(h cty.Value) cty.Value {
				wctx, _ := evalModule(t, tree["modules/workload"], with(args, map[string]cty.Value{"secret_hashes": h}))
				return wctx.Variables["local"].GetAttr("secret_annotation")
			}
			if got := checksum(cty.NullVal(cty.Map(cty.String))); !got.IsWhollyKnown() || got.LengthInt() != 0 {
				t.Errorf("%s: with the Secret out of band the pod template carries %#v, want no checksum", role, got)
			}
			before := checksum(hashes(""))
			if !before.IsWhollyKnown() || before.LengthInt() != 1 {
				t.Fatalf("%s: secret checksum annotation %#v, want one known value", role, before)
			}
			for _, k := range keys {
				rolls := !checksum(hashes(k)).RawEquals(before)
				if want := slices.Contains(readers[role], k); rolls != want {
					t.Errorf("%s: changing %s rolls the pods: %v, want %v", role, k, rolls, want)
				}
			}
		}
	}
	for role := range readers {
		if !seen[role] {
			t.Errorf("no module calls the workload %s", role)
		}
	}
}
