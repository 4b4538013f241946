package backend_test

// A readability bound the whole repo's code is held to.

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

// exempt are the folders (from the repo's root) whose functions may be
// longer: load tools and the dev world read best as one scenario each.
var exempt = map[string]bool{"bench": true, "devworld": true, ".git": true, "testdata": true, "node_modules": true}

// TestNoLongFunctions walks the repo (from its root, one level up) and
// fails on a non-test function longer than maxFuncLines outside exempt.
func TestNoLongFunctions(t *testing.T) {
	fset := token.NewFileSet()
	seen := 0
	for _, root := range []string{".."} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && exempt[d.Name()] {
				return filepath.SkipDir
			}
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
	if seen < 2000 {
		t.Errorf("walked %d functions: the walk no longer reaches the packages", seen)
	}
}
