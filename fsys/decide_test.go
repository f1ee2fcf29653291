package fsys

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestOnlyDecisionConsultsRules: decide.go is the one place where the
// package asks the rules anything, so "how is X decided?" is answered by
// reading one file. Every method of acl.Config that decides is looked for
// in the package's other (non-test) files.
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
