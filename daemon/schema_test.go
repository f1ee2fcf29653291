package daemon

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// controlSchema is docs/control.schema.json, as far as these tests read it.
type controlSchema struct {
	Methods map[string]struct {
		Params struct {
			Ref string `json:"$ref"`
		} `json:"params"`
	} `json:"methods"`
	Defs map[string]struct {
		Properties map[string]json.RawMessage `json:"properties"`
	} `json:"$defs"`
}

func loadControlSchema(t *testing.T) controlSchema {
	t.Helper()
	b, err := os.ReadFile("../docs/control.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var s controlSchema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("docs/control.schema.json: %v", err)
	}
	return s
}

// TestControlSchemaParamsAreTheDaemons: the schema names exactly the
// methods of methodTable, and each method's params in the schema are
// exactly the fields its handler decodes (read from the handler's source:
// the struct it decodes params into, or the function it hands params to,
// here or in package runs, or, for tool.decide, the keys
// constraints.DecodeRequest reads). The clients' types are checked against
// the schema in their own tests (clients/*/test*), so the daemon and the
// two clients cannot drift apart.
func TestControlSchemaParamsAreTheDaemons(t *testing.T) {
	schema := loadControlSchema(t)
	var inTable, inSchema []string
	for m := range methodTable {
		inTable = append(inTable, m)
	}
	for m := range schema.Methods {
		inSchema = append(inSchema, m)
	}
	slices.Sort(inTable)
	slices.Sort(inSchema)
	if !slices.Equal(inTable, inSchema) {
		t.Fatalf("methods: the daemon serves %v, docs/control.schema.json names %v", inTable, inSchema)
	}
	fset := token.NewFileSet()
	funcs, types := parseDir(t, fset, ".")
	// The run method is served by package runs: its functions and types
	// too, those of the daemon first where a name is in both.
	runFuncs, runTypes := parseDir(t, fset, "../runs")
	for n, f := range runFuncs {
		if _, ok := funcs[n]; !ok {
			funcs[n] = f
		}
	}
	for n, st := range runTypes {
		if _, ok := types[n]; !ok {
			types[n] = st
		}
	}
	for method, f := range methodTable {
		name := runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()
		name = strings.TrimSuffix(name[strings.LastIndex(name, ".")+1:], "-fm")
		var fields []string
		if method == "tool.decide" {
			fields = requestKeys(t, fset)
		} else {
			fn, ok := funcs[name]
			if !ok {
				t.Fatalf("%s: handler %s not found in daemon's source", method, name)
			}
			fields = paramFields(fn, funcs, types)
		}
		ref := schema.Methods[method].Params.Ref
		def, ok := schema.Defs[strings.TrimPrefix(ref, "#/$defs/")]
		if !ok {
			t.Errorf("%s: params %q is no $def", method, ref)
			continue
		}
		var documented []string
		for k := range def.Properties {
			documented = append(documented, k)
		}
		slices.Sort(fields)
		slices.Sort(documented)
		if !slices.Equal(fields, documented) {
			t.Errorf("%s params: the daemon decodes %v, docs/control.schema.json (%s) has %v", method, fields, ref, documented)
		}
	}
}

// parseDir reads the package's non-test sources: its methods of *Daemon by
// name, and its struct types by name.
func parseDir(t *testing.T, fset *token.FileSet, dir string) (map[string]*ast.FuncDecl, map[string]*ast.StructType) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string]*ast.FuncDecl{}
	types := map[string]*ast.StructType{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil {
					funcs[d.Name.Name] = d
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok {
						if st, ok := ts.Type.(*ast.StructType); ok {
							types[ts.Name.Name] = st
						}
					}
				}
			}
		}
	}
	return funcs, types
}

// paramFields is the json names of the fields of `var p T` in fn, where T
// is a struct literal or a struct type of the package, or else of the
// method fn hands its params to (a call with the argument params); none
// when fn decodes no params.
func paramFields(fn *ast.FuncDecl, funcs map[string]*ast.FuncDecl, types map[string]*ast.StructType) []string {
	fields := []string{}
	var callee *ast.FuncDecl
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok && callee == nil {
			sel, ok := call.Fun.(*ast.SelectorExpr)
			passes := slices.ContainsFunc(call.Args, func(a ast.Expr) bool {
				id, ok := a.(*ast.Ident)
				return ok && id.Name == "params"
			})
			if f := funcs[selName(sel, ok)]; passes && f != nil && f != fn {
				callee = f
			}
		}
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "p" {
			return true
		}
		var st *ast.StructType
		switch ty := vs.Type.(type) {
		case *ast.StructType:
			st = ty
		case *ast.Ident:
			st = types[ty.Name]
		}
		if st == nil {
			return true
		}
		for _, f := range st.Fields.List {
			if f.Tag == nil {
				continue
			}
			tag, _ := strconv.Unquote(f.Tag.Value)
			name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
			if name != "" && name != "-" {
				fields = append(fields, name)
			}
		}
		return false
	})
	if len(fields) == 0 && callee != nil {
		return paramFields(callee, funcs, types)
	}
	return fields
}

func selName(sel *ast.SelectorExpr, ok bool) string {
	if !ok {
		return ""
	}
	return sel.Sel.Name
}

// requestKeys is the keys constraints.DecodeRequest reads: the string
// cases of the switch in (*Request).member.
func requestKeys(t *testing.T, fset *token.FileSet) []string {
	t.Helper()
	f, err := parser.ParseFile(fset, "../constraints/request.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "member" {
			continue
		}
		for _, st := range fn.Body.List {
			sw, ok := st.(*ast.SwitchStmt)
			if !ok {
				continue
			}
			for _, c := range sw.Body.List {
				for _, e := range c.(*ast.CaseClause).List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						k, _ := strconv.Unquote(lit.Value)
						keys = append(keys, k)
					}
				}
			}
		}
	}
	if len(keys) == 0 {
		t.Fatal("constraints/request.go: no switch of keys in (*Request).member")
	}
	return keys
}
