package podnet

// The Follower's lock order, checked on the source: Follower.mu is held
// across calls into the socket and the mux (lookup, conn, LastSeen,
// inject), which take Socket.mu, popMux.mu, popConn.mu and the TCP side's
// lock. So no function may call into a Follower while it holds one of
// those: that would close a cycle.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"strings"
	"testing"
)

// TestFollowerLockOrder: every function of the package that can reach a
// method of Follower taking its mu (nudge, through muxConn.arrived) takes
// no lock of its own. Calls are followed by name through the package
// (over-approximating: a name shared by two types is followed into
// both), from the callers back, so a new caller that locks anything and
// then hands a datagram on to the follower fails here.
func TestFollowerLockOrder(t *testing.T) {
	fset := token.NewFileSet()
	funcs := map[string][]*ast.FuncDecl{}
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				funcs[fd.Name.Name] = append(funcs[fd.Name.Name], fd)
			}
		}
	}
	// The Follower's methods that take mu, found rather than listed.
	var targets []string
	for name, fds := range funcs {
		for _, fd := range fds {
			if receiver(fd) == "Follower" && locks(fd) {
				targets = append(targets, name)
			}
		}
	}
	if len(targets) < 4 {
		t.Fatalf("found Follower methods taking mu: %v; the test no longer finds them", targets)
	}
	// Every function that calls, transitively, one of them.
	callers := map[string]string{} // name → the target it reaches
	for _, name := range targets {
		callers[name] = name
	}
	for changed := true; changed; {
		changed = false
		for name, fds := range funcs {
			if callers[name] != "" {
				continue
			}
			for _, fd := range fds {
				if receiver(fd) == "Follower" {
					continue // inside the follower, mu is the lock taken first
				}
				if to := callsAny(fd, callers); to != "" {
					callers[name] = callers[to]
					changed = true
				}
			}
		}
	}
	if callers["arrived"] == "" || callers["handle"] == "" {
		t.Fatalf("the readers' call to the follower (handle → arrived → nudge) is not found: %v", callers)
	}
	for name := range callers {
		for _, fd := range funcs[name] {
			if receiver(fd) == "Follower" {
				continue
			}
			for _, at := range callsUnderLock(fd, callers) {
				t.Errorf("%s calls %s with a lock held (%s): it reaches Follower.%s, which takes Follower.mu and calls into the mux under it, a lock cycle",
					name, at.name, fset.Position(at.pos), callers[at.name])
			}
		}
	}
}

// receiver returns the type name of fd's receiver, "" for a function.
func receiver(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// locks reports whether fd calls Lock or RLock on anything.
func locks(fd *ast.FuncDecl) bool {
	found := false
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			if s, ok := c.Fun.(*ast.SelectorExpr); ok && (s.Sel.Name == "Lock" || s.Sel.Name == "RLock") {
				found = true
			}
		}
		return !found
	})
	return found
}

// call is a call of a function by name.
type call struct {
	name string
	pos  token.Pos
}

// callsUnderLock returns the calls in fd of names, made while a lock fd
// took is held: from X.Lock() or X.RLock() to the next X.Unlock() or
// X.RUnlock() in the text, or to the end with a deferred one (a textual
// over-approximation of the branches).
func callsUnderLock(fd *ast.FuncDecl, names map[string]string) []call {
	type span struct{ from, to token.Pos }
	var held []span
	open := map[string]token.Pos{} // the locked expression → where
	deferred := map[*ast.CallExpr]bool{}
	var calls []call
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		if d, ok := n.(*ast.DeferStmt); ok {
			deferred[d.Call] = true
		}
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		switch f := c.Fun.(type) {
		case *ast.Ident:
			calls = append(calls, call{f.Name, c.Pos()})
		case *ast.SelectorExpr:
			x := types.ExprString(f.X)
			switch f.Sel.Name {
			case "Lock", "RLock":
				open[x] = c.Pos()
			case "Unlock", "RUnlock":
				if from, ok := open[x]; ok && !deferred[c] {
					held = append(held, span{from, c.Pos()})
					delete(open, x)
				}
			default:
				calls = append(calls, call{f.Sel.Name, c.Pos()})
			}
		}
		return true
	})
	for _, from := range open {
		held = append(held, span{from, fd.End()})
	}
	var out []call
	for _, c := range calls {
		if names[c.name] == "" {
			continue
		}
		for _, h := range held {
			if c.pos > h.from && c.pos < h.to {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// callsAny returns a name of names that fd calls (as a function or a
// method), "" if none.
func callsAny(fd *ast.FuncDecl, names map[string]string) string {
	to := ""
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return to == ""
		}
		var name string
		switch f := c.Fun.(type) {
		case *ast.Ident:
			name = f.Name
		case *ast.SelectorExpr:
			name = f.Sel.Name
		}
		if names[name] != "" {
			to = name
		}
		return to == ""
	})
	return to
}
