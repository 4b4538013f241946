package pace

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// TestQueueCallsOutWithoutItsLock: a backend holds its own lock while it
// writes to the queue (the Realtime connector's omu around WriteRaw and
// BeginItem, which take q.mu), so the queue must never call back out (the
// backend's Encoder, the session's Output) while it holds q.mu: that would
// be q.mu → the backend's lock against the backend's lock → q.mu, a
// deadlock. The walk follows each method of queue.go statement by
// statement (a block that returns leaves the lock as it found it) and
// fails on a call of EncodeFrame or of q.out while q.mu is held.
func TestQueueCallsOutWithoutItsLock(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "queue.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	var walk func(list []ast.Stmt, held bool) bool
	isMu := func(call *ast.CallExpr, method string) bool {
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != method {
			return false
		}
		inner, ok := sel.X.(*ast.SelectorExpr)
		return ok && inner.Sel.Name == "mu"
	}
	check := func(n ast.Node, held bool) {
		ast.Inspect(n, func(n ast.Node) bool {
			if _, ok := n.(*ast.FuncLit); ok {
				return false
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			out := false
			if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "out" {
				out = true
			}
			if sel.Sel.Name == "EncodeFrame" || out {
				checked++
				if held {
					t.Errorf("%s: calls %s with q.mu held", fset.Position(call.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
	ends := func(list []ast.Stmt) bool {
		if len(list) == 0 {
			return false
		}
		switch list[len(list)-1].(type) {
		case *ast.ReturnStmt, *ast.BranchStmt:
			return true
		}
		return false
	}
	walk = func(list []ast.Stmt, held bool) bool {
		for _, st := range list {
			switch s := st.(type) {
			case *ast.ExprStmt:
				if call, ok := s.X.(*ast.CallExpr); ok && isMu(call, "Lock") {
					held = true
					continue
				}
				if call, ok := s.X.(*ast.CallExpr); ok && isMu(call, "Unlock") {
					held = false
					continue
				}
				check(s, held)
			case *ast.DeferStmt:
				// A deferred Unlock keeps the lock to the end.
			case *ast.IfStmt:
				if s.Init != nil {
					check(s.Init, held)
				}
				check(s.Cond, held)
				after := walk(s.Body.List, held)
				if ends(s.Body.List) {
					after = held
				}
				if s.Else != nil {
					var el []ast.Stmt
					if b, ok := s.Else.(*ast.BlockStmt); ok {
						el = b.List
					} else {
						el = []ast.Stmt{s.Else}
					}
					walk(el, held)
				}
				held = after
			case *ast.ForStmt:
				held = walk(s.Body.List, held)
			case *ast.RangeStmt:
				check(s.X, held)
				held = walk(s.Body.List, held)
			case *ast.BlockStmt:
				held = walk(s.List, held)
			case *ast.SwitchStmt, *ast.TypeSwitchStmt, *ast.SelectStmt:
				ast.Inspect(s, func(n ast.Node) bool {
					switch c := n.(type) {
					case *ast.CaseClause:
						walk(c.Body, held)
						return false
					case *ast.CommClause:
						walk(c.Body, held)
						return false
					}
					return true
				})
			default:
				check(s, held)
			}
		}
		return held
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
			walk(fd.Body.List, false)
		}
	}
	if checked < 4 {
		t.Errorf("the walk saw %d calls out of the queue, want the EncodeFrame and q.out calls of send and EndResponse", checked)
	}
}
