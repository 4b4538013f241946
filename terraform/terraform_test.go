package terraform

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// module is what the static checks need to know about one Terraform module
// directory: its declarations and the modules it calls.
type module struct {
	dir       string
	bodies    []*hclsyntax.Body
	variables map[string]bool // name -> required (no default)
	outputs   map[string]bool
	locals    map[string]bool
	resources map[string]bool             // "type.name"
	calls     map[string]*hclsyntax.Block // module "name" { ... }
}

// metaArguments are the arguments of a module block that are Terraform's,
// not the called module's variables.
var metaArguments = map[string]bool{
	"source": true, "version": true, "providers": true,
	"count": true, "for_each": true, "depends_on": true,
}

// loadModule parses every .tf file directly in dir. Syntax errors are
// returned as one error naming file and line.
func loadModule(fsys fs.FS, dir string) (*module, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", dir, err)
	}
	m := &module{
		dir:       dir,
		variables: map[string]bool{},
		outputs:   map[string]bool{},
		locals:    map[string]bool{},
		resources: map[string]bool{},
		calls:     map[string]*hclsyntax.Block{},
	}
	p := hclparse.NewParser()
	var diags hcl.Diagnostics
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".tf") {
			continue
		}
		name := path.Join(dir, e.Name())
		src, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		f, d := p.ParseHCL(src, name)
		diags = append(diags, d...)
		if d.HasErrors() {
			continue
		}
		m.bodies = append(m.bodies, f.Body.(*hclsyntax.Body))
	}
	if diags.HasErrors() {
		return nil, fmt.Errorf("parse %s: %w", dir, diags)
	}
	if len(m.bodies) == 0 {
		return nil, fmt.Errorf("module %s: no .tf files", dir)
	}
	for _, b := range m.bodies {
		for _, blk := range b.Blocks {
			switch blk.Type {
			case "variable":
				_, hasDefault := blk.Body.Attributes["default"]
				m.variables[blk.Labels[0]] = !hasDefault
			case "output":
				m.outputs[blk.Labels[0]] = true
			case "locals":
				for name := range blk.Body.Attributes {
					m.locals[name] = true
				}
			case "resource":
				m.resources[blk.Labels[0]+"."+blk.Labels[1]] = true
			case "module":
				m.calls[blk.Labels[0]] = blk
			}
		}
	}
	return m, nil
}

// names are the names a traversal steps through, without its indexes.
func names(tr hcl.Traversal) []string {
	var out []string
	for _, step := range tr {
		switch x := step.(type) {
		case hcl.TraverseRoot:
			out = append(out, x.Name)
		case hcl.TraverseAttr:
			out = append(out, x.Name)
		}
	}
	return out
}

// walkExprs calls fn for every expression in body, nested blocks included.
func walkExprs(body *hclsyntax.Body, fn func(hclsyntax.Expression)) {
	for _, a := range body.Attributes {
		fn(a.Expr)
	}
	for _, b := range body.Blocks {
		walkExprs(b.Body, fn)
	}
}

// checkModule reports every reference in m to something undeclared: var.X,
// local.X, module.X and module.X.Y, plus module calls passing arguments the
// called module does not declare or leaving out its required variables,
// declared variables nobody reads, and moved blocks whose "to" is declared
// nowhere or whose "from" still is. load resolves a called module's directory.
func checkModule(m *module, load func(dir string) (*module, error)) []string {
	var problems []string
	report := func(rng hcl.Range, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: %s", rng.Filename, rng.Start.Line, fmt.Sprintf(format, args...)))
	}

	// Resolve the called modules first; module.X.Y needs their outputs.
	called := map[string]*module{}
	for name, blk := range m.calls {
		src, ok := blk.Body.Attributes["source"]
		if !ok {
			report(blk.Range(), "module %q has no source", name)
			continue
		}
		v, d := src.Expr.Value(nil)
		if d.HasErrors() || v.IsNull() || !v.IsKnown() || v.Type() != cty.String {
			report(src.SrcRange, "module %q: source must be a literal string", name)
			continue
		}
		s := v.AsString()
		if !strings.HasPrefix(s, "./") && !strings.HasPrefix(s, "../") {
			continue // a registry or remote module: nothing to check locally
		}
		child, err := load(path.Clean(path.Join(m.dir, s)))
		if err != nil {
			report(src.SrcRange, "module %q: %v", name, err)
			continue
		}
		called[name] = child

		for arg, a := range blk.Body.Attributes {
			if metaArguments[arg] {
				continue
			}
			if _, ok := child.variables[arg]; !ok {
				report(a.SrcRange, "module %q: argument %q is not a variable of %s", name, arg, child.dir)
			}
		}
		for _, v := range slices.Sorted(maps.Keys(child.variables)) {
			if _, given := blk.Body.Attributes[v]; child.variables[v] && !given {
				report(blk.Range(), "module %q: required variable %q of %s is not set", name, v, child.dir)
			}
		}
	}

	// exists: a resource of m, or module.X.type.name of a called module.
	exists := func(tr hcl.Traversal) bool {
		n := names(tr)
		if len(n) == 4 && n[0] == "module" {
			return called[n[1]] != nil && called[n[1]].resources[n[2]+"."+n[3]]
		}
		return len(n) == 2 && m.resources[n[0]+"."+n[1]]
	}
	used := map[string]bool{}
	for _, blk := range m.blocks("moved", "") {
		for _, end := range []string{"from", "to"} {
			a, ok := blk.Body.Attributes[end]
			if !ok {
				report(blk.Range(), "moved: no %s", end)
				continue
			}
			if tr, d := hcl.AbsTraversalForExpr(a.Expr); d.HasErrors() || exists(tr) != (end == "to") {
				report(a.SrcRange, "moved: %s %s is declared: %v", end, strings.Join(names(tr), "."), !d.HasErrors() && exists(tr))
			}
		}
	}
	visit := func(e hclsyntax.Expression) {
		for _, t := range e.Variables() {
			root := t.RootName()
			attr := func(i int) (string, bool) {
				if len(t) <= i {
					return "", false
				}
				a, ok := t[i].(hcl.TraverseAttr)
				return a.Name, ok
			}
			rng := t.SourceRange()
			switch root {
			case "var":
				if n, ok := attr(1); ok {
					used[n] = true
					if _, declared := m.variables[n]; !declared {
						report(rng, "var.%s is not declared", n)
					}
				}
			case "local":
				if n, ok := attr(1); ok && !m.locals[n] {
					report(rng, "local.%s is not declared", n)
				}
			case "module":
				n, ok := attr(1)
				if !ok {
					continue
				}
				if _, declared := m.calls[n]; !declared {
					report(rng, "module.%s is not a module call here", n)
					continue
				}
				out, ok := attr(2)
				child := called[n]
				if ok && child != nil && !child.outputs[out] {
					report(rng, "module.%s.%s: %s has no output %q", n, out, child.dir, out)
				}
			}
		}
	}
	for _, b := range m.bodies {
		for _, blk := range b.Blocks {
			if blk.Type != "moved" { // addresses, checked above
				walkExprs(blk.Body, visit)
			}
		}
	}
	for _, v := range slices.Sorted(maps.Keys(m.variables)) {
		if !used[v] {
			problems = append(problems, fmt.Sprintf("%s: variable %q is declared but never used", m.dir, v))
		}
	}
	sort.Strings(problems)
	return problems
}

// checkTree loads and checks every directory under root holding .tf files.
func checkTree(fsys fs.FS) (dirs []string, problems []string, err error) {
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".tf") {
			if dir := path.Dir(p); !slices.Contains(dirs, dir) {
				dirs = append(dirs, dir)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	cache := map[string]*module{}
	load := func(dir string) (*module, error) {
		if m, ok := cache[dir]; ok {
			return m, nil
		}
		m, err := loadModule(fsys, dir)
		if err != nil {
			return nil, err
		}
		cache[dir] = m
		return m, nil
	}
	for _, dir := range dirs {
		m, err := load(dir)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		problems = append(problems, checkModule(m, load)...)
	}
	return dirs, problems, nil
}

// TestTerraformTree parses every .tf file in this directory tree and runs
// the static checks; it also pins the layout docs/deploy.md describes.
func TestTerraformTree(t *testing.T) {
	dirs, problems, err := checkTree(os.DirFS("."))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"modules/cloudflare-steering", "modules/region", "modules/pop", "modules/workload", "examples/two-regions"} {
		if !slices.Contains(dirs, want) {
			t.Errorf("module directory %s missing (have %v)", want, dirs)
		}
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestProviderResourceNames keeps the modules on the Cloudflare provider v5
// resource names (v4's cloudflare_record and friends are gone in v5) and on
// the versioned Kubernetes resources.
func TestProviderResourceNames(t *testing.T) {
	allowed := map[string]bool{
		"cloudflare_load_balancer":            true,
		"cloudflare_load_balancer_pool":       true,
		"cloudflare_load_balancer_monitor":    true,
		"cloudflare_dns_record":               true,
		"cloudflare_managed_transforms":       true,
		"kubernetes_namespace_v1":             true,
		"kubernetes_network_policy_v1":        true,
		"kubernetes_secret_v1":                true,
		"kubernetes_config_map_v1":            true,
		"kubernetes_service_v1":               true,
		"kubernetes_deployment_v1":            true,
		"kubernetes_stateful_set_v1":          true,
		"kubernetes_pod_disruption_budget_v1": true,
	}
	fsys := os.DirFS(".")
	dirs, _, err := checkTree(fsys)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, dir := range dirs {
		m, err := loadModule(fsys, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range m.bodies {
			for _, blk := range b.Blocks {
				if blk.Type != "resource" {
					continue
				}
				seen[blk.Labels[0]] = true
				if !allowed[blk.Labels[0]] {
					t.Errorf("%s: resource type %q is not one the modules are meant to use", blk.Range(), blk.Labels[0])
				}
			}
		}
	}
	for _, want := range []string{"cloudflare_load_balancer", "cloudflare_load_balancer_pool", "cloudflare_load_balancer_monitor", "cloudflare_dns_record", "cloudflare_managed_transforms", "kubernetes_stateful_set_v1", "kubernetes_network_policy_v1"} {
		if !seen[want] {
			t.Errorf("no %s resource in the modules", want)
		}
	}
}

// TestChecksCatchBrokenSnippets proves each check fails on a tree broken in
// exactly that way, and passes on the unbroken one.
func TestChecksCatchBrokenSnippets(t *testing.T) {
	child := `
variable "name" { type = string }
variable "size" {
  type    = number
  default = 1
}
output "id" { value = "${var.name}-${var.size}" }
`
	parent := func(body string) fstest.MapFS {
		return fstest.MapFS{
			"modules/child/main.tf": {Data: []byte(child)},
			"examples/app/main.tf":  {Data: []byte(body)},
		}
	}
	tests := []struct {
		name string
		fsys fstest.MapFS
		want string // substring of a reported problem; "" = no problems
	}{
		{
			name: "valid",
			fsys: parent(`
variable "env" { type = string }
locals { n = "a-${var.env}" }
module "c" {
  source = "../../modules/child"
  name   = local.n
}
output "x" { value = module.c.id }
`),
		},
		{
			name: "syntax error",
			fsys: parent(`module "c" {
  source = "../../modules/child"
  name = "a"
`),
			want: "parse examples/app",
		},
		{
			name: "undeclared variable",
			fsys: parent(`output "x" { value = var.missing }`),
			want: "var.missing is not declared",
		},
		{
			name: "undeclared variable in a nested block",
			fsys: parent(`
resource "r" "x" {
  spec {
    inner { v = var.deep }
  }
}`),
			want: "var.deep is not declared",
		},
		{
			name: "undeclared local",
			fsys: parent(`output "x" { value = local.nope }`),
			want: "local.nope is not declared",
		},
		{
			name: "unknown module argument",
			fsys: parent(`
module "c" {
  source = "../../modules/child"
  name   = "a"
  colour = "red"
}`),
			want: `argument "colour" is not a variable of modules/child`,
		},
		{
			name: "missing required variable",
			fsys: parent(`
module "c" {
  source = "../../modules/child"
  size   = 2
}`),
			want: `required variable "name" of modules/child is not set`,
		},
		{
			name: "unknown module output",
			fsys: parent(`
module "c" {
  source = "../../modules/child"
  name   = "a"
}
output "x" { value = module.c.address }`),
			want: `module.c.address: modules/child has no output "address"`,
		},
		{
			name: "unknown module call",
			fsys: parent(`output "x" { value = module.other.id }`),
			want: "module.other is not a module call here",
		},
		{
			name: "missing module directory",
			fsys: parent(`
module "c" {
  source = "../../modules/gone"
  name   = "a"
}`),
			want: `module "c": read module modules/gone`,
		},
		{
			name: "moved to nowhere",
			fsys: parent(`
moved {
  from = r.old
  to   = module.c.r.new
}`),
			want: "moved: to module.c.r.new is declared: false",
		},
		{
			name: "unused variable",
			fsys: parent(`variable "spare" { type = string }`),
			want: `variable "spare" is declared but never used`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, problems, err := checkTree(tt.fsys)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if len(problems) != 0 {
					t.Fatalf("problems in a valid tree:\n%s", strings.Join(problems, "\n"))
				}
				return
			}
			for _, p := range problems {
				if strings.Contains(p, tt.want) {
					return
				}
			}
			t.Fatalf("no problem containing %q; got:\n%s", tt.want, strings.Join(problems, "\n"))
		})
	}
}
