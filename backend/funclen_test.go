package backend_test

// A readability bound the code of backend/ and transceiver/ is held to.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a non-test function may be: past it, cut it
// into named steps.
const maxFuncLines = 100

// TestNoLongFunctions walks backend/ and transceiver/ and fails on a
// non-test function longer than maxFuncLines. The other packages are not
// walked yet: widen the roots once they are all under the bound (bench/
// and the dev world excepted).
func TestNoLongFunctions(t *testing.T) {
	fset := token.NewFileSet()
	seen := 0
	for _, root := range []string{".", "../transceiver"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				seen++
				if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
					t.Errorf("%s: %s is %d lines (at most %d)", fset.Position(fd.Pos()), fd.Name.Name, n, maxFuncLines)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if seen < 500 {
		t.Errorf("walked %d functions: the walk no longer reaches the packages", seen)
	}
}
