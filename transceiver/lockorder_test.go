package transceiver

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBindingRequestHandlerLeavesThePeerConnection: the ICE binding
// request handler runs on the ICE agent's task loop, and Pion holds a
// PeerConnection's lock while it waits for that loop (LocalDescription
// gathers the agent's candidates under it). A handler that takes the lock
// (RemoteDescription did) therefore deadlocks against any such call: the
// session, and the pod's Close that waits for it, stuck for good (seen in
// CI: startMedia's LocalDescription against a check's RemoteDescription).
// So nothing the handler reaches in this package or podnet may touch a session's
// PeerConnection. The calls are followed by name through every function
// and method of the package (over-approximating: a name shared by two
// types is followed into both).
func TestBindingRequestHandlerLeavesThePeerConnection(t *testing.T) {
	fset := token.NewFileSet()
	funcs := map[string][]*ast.FuncDecl{}
	imports := map[*ast.FuncDecl]map[string]bool{} // the package names a function's file imports: their calls are not followed
	for _, dir := range []string{".", "podnet"} {  // the session layer and the packet layer it calls
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			pkgs := map[string]bool{}
			for _, im := range f.Imports {
				parts := strings.Split(strings.Trim(im.Path.Value, `"`), "/")
				name := parts[len(parts)-1]
				if len(parts) > 1 && len(name) > 1 && name[0] == 'v' && strings.Trim(name[1:], "0123456789") == "" {
					name = parts[len(parts)-2]
				}
				if im.Name != nil {
					name = im.Name.Name
				}
				pkgs[name] = true
			}
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
					funcs[fd.Name.Name] = append(funcs[fd.Name.Name], fd)
					imports[fd] = pkgs
				}
			}
		}
	}
	if len(funcs["onBindingRequest"]) != 1 {
		t.Fatalf("%d functions named onBindingRequest, want the session's one", len(funcs["onBindingRequest"]))
	}
	seen := map[string]bool{}
	queue := []string{"onBindingRequest"}
	var path = map[string]string{"onBindingRequest": ""}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		for _, fd := range funcs[name] {
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					if x.Sel.Name == "pc" {
						if id, ok := x.X.(*ast.Ident); ok && (id.Name == "s" || id.Name == "sess") {
							t.Errorf("%s (reached from onBindingRequest%s) touches the PeerConnection at %s", name, path[name], fset.Position(x.Pos()))
						}
					}
				case *ast.CallExpr:
					var callee string
					switch f := x.Fun.(type) {
					case *ast.Ident:
						callee = f.Name
					case *ast.SelectorExpr:
						if id, ok := f.X.(*ast.Ident); !ok || !imports[fd][id.Name] {
							callee = f.Sel.Name
						}
					}
					if _, ok := funcs[callee]; ok && !seen[callee] {
						if _, known := path[callee]; !known {
							path[callee] = path[name] + " → " + callee
						}
						queue = append(queue, callee)
					}
				}
				return true
			})
		}
	}
	if !seen["Probe"] {
		t.Error("the walk did not reach Probe: it no longer follows the handler's calls")
	}
}

// TestSidebandOfferUnderSendMu: a sideband's queue is bounded in bytes by
// a check and an add (offer) that only session.sendMu keeps from racing,
// and sendMu is also what keeps the events in one order. So every call
// of offer is in a function that takes sendMu or whose doc comment says
// it is held ("sendMu held").
func TestSidebandOfferUnderSendMu(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "sideband.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil || fd.Name.Name == "offer" {
			continue
		}
		locks, offers := false, []token.Pos{}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "sendMu" && sel.Sel.Name == "Lock" {
					locks = true
				}
				if sel.Sel.Name == "offer" {
					offers = append(offers, sel.Pos())
				}
			}
			return true
		})
		held := fd.Doc != nil && strings.Contains(fd.Doc.Text(), "sendMu held")
		for _, p := range offers {
			calls++
			if !locks && !held {
				t.Errorf("%s calls offer at %s without session.sendMu", fd.Name.Name, fset.Position(p))
			}
		}
	}
	if calls == 0 {
		t.Error("no call of offer found: the walk no longer finds them")
	}
}
