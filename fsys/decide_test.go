package fsys

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/condfs/condfs/acl"
)

// TestOnlyDecisionConsultsRules: decide.go is the one place where the
// package asks the rules anything, so "how is X decided?" is answered by
// reading one file. No other (non-test) file imports acl, and every method
// of acl.Config that decides is looked for in them too (a value reached
// through another package's type would not need the import).
func TestOnlyDecisionConsultsRules(t *testing.T) {
	deciding := map[string]bool{"Visible": true, "HasRules": true, "HasRulesUnder": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if name == "decide.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if imp.Path.Value == `"github.com/condfs/condfs/acl"` {
				t.Errorf("%s imports acl: only decide.go may", name)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && deciding[sel.Sel.Name] {
					t.Errorf("%s: %s consults the rules outside decide.go", fset.Position(call.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}

// TestSpaceOrder: the root lists space(0) .. space(spaceCount-1), which
// must be acl's view spaces in its order.
func TestSpaceOrder(t *testing.T) {
	if len(acl.Spaces) != spaceCount {
		t.Fatalf("acl has %d view spaces, fsys knows %d", len(acl.Spaces), spaceCount)
	}
	for i, sp := range acl.Spaces {
		if space(i) != sp {
			t.Errorf("space %d is %v, acl's is %v", i, space(i), sp)
		}
	}
}
