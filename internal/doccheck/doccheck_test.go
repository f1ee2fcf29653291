package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's top, from this package's directory.
const root = "../.."

// skipDir: directories whose files are not the repository's own prose.
func skipDir(rel string) bool {
	base := filepath.Base(rel)
	return base == ".git" || base == "testdata" || base == "node_modules" || strings.HasPrefix(base, ".") && rel != "."
}

var (
	goFileRe  = regexp.MustCompile(`\b([a-z][a-z0-9_]*\.go)\b`)
	docRe     = regexp.MustCompile(`\b(docs/[A-Za-z0-9_.-]+\.md)\b`)
	bareSpec  = regexp.MustCompile(`(^|[^/\w])spec/[a-z]+\.md`)
	selRe     = regexp.MustCompile(`\(?\*?\b([A-Za-z_][A-Za-z0-9_]*)\)?\.([A-Za-z_][A-Za-z0-9_]*)\b`)
	mdLinkRe  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	goModLine = "module github.com/condfs/condfs"
)

// pkg is what one directory's Go files declare.
type pkg struct {
	files    map[string]bool
	members  map[string]map[string]bool // type -> its methods and fields
	embeds   map[string]bool            // types that embed another
	comments []*ast.Comment
	fset     *token.FileSet
}

func loadPkg(t *testing.T, dir string) *pkg {
	p := &pkg{files: map[string]bool{}, members: map[string]map[string]bool{}, embeds: map[string]bool{}, fset: token.NewFileSet()}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		p.files[e.Name()] = true
		f, err := parser.ParseFile(p.fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, cg := range f.Comments {
			p.comments = append(p.comments, cg.List...)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && len(d.Recv.List) == 1 {
					p.member(recvName(d.Recv.List[0].Type), d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					p.member(ts.Name.Name, "")
					p.typeMembers(ts)
				}
			}
		}
	}
	return p
}

func (p *pkg) member(typ, name string) {
	if p.members[typ] == nil {
		p.members[typ] = map[string]bool{}
	}
	if name != "" {
		p.members[typ][name] = true
	}
}

func (p *pkg) typeMembers(ts *ast.TypeSpec) {
	switch t := ts.Type.(type) {
	case *ast.StructType:
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 {
				p.embeds[ts.Name.Name] = true
			}
			for _, n := range f.Names {
				p.member(ts.Name.Name, n.Name)
			}
		}
	case *ast.InterfaceType:
		for _, m := range t.Methods.List {
			if len(m.Names) == 0 {
				p.embeds[ts.Name.Name] = true
			}
			for _, n := range m.Names {
				p.member(ts.Name.Name, n.Name)
			}
		}
	default:
		// A defined type of another (type space = acl.Space, type x int):
		// its methods may come from elsewhere.
		p.embeds[ts.Name.Name] = true
	}
}

func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// TestCommentsNameWhatExists checks the Go comments of every package.
func TestCommentsNameWhatExists(t *testing.T) {
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.HasPrefix(string(b), goModLine) {
		t.Fatalf("not at the repository's top: %v", err)
	}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if skipDir(rel) {
			return filepath.SkipDir
		}
		if matches, _ := filepath.Glob(filepath.Join(path, "*.go")); len(matches) == 0 {
			return nil
		}
		checkPkg(t, rel, loadPkg(t, path))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func checkPkg(t *testing.T, rel string, p *pkg) {
	// Socket methods (session.open) read like selectors.
	control, err := os.ReadFile(filepath.Join(root, "docs/control.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.comments {
		pos := p.fset.Position(c.Pos())
		where := filepath.Join(rel, filepath.Base(pos.Filename)) + ":" + strconv.Itoa(pos.Line)
		text := c.Text
		for _, m := range goFileRe.FindAllStringSubmatch(text, -1) {
			name := m[1]
			if !p.files[name] && !existsAnywhere(name) {
				t.Errorf("%s: names %s, which is neither in its package nor in the repository", where, name)
			}
		}
		for _, m := range docRe.FindAllStringSubmatch(text, -1) {
			if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
				t.Errorf("%s: names %s, which does not exist", where, m[1])
			}
		}
		if bareSpec.MatchString(text) {
			t.Errorf("%s: names a spec/ file; the repository's own copy is under docs/ (the shared spec is ../shared/spec)", where)
		}
		for _, m := range selRe.FindAllStringSubmatch(text, -1) {
			typ, name := m[1], m[2]
			members, known := p.members[typ]
			if !known || p.embeds[typ] || strings.HasSuffix(name, "go") && strings.HasSuffix(m[0], ".go") {
				continue
			}
			if !members[name] && !strings.Contains(string(control), "`"+typ+"."+name) {
				t.Errorf("%s: names %s.%s, but %s has no method or field %s", where, typ, name, typ, name)
			}
		}
	}
}

// existsAnywhere: a file named without its directory may be another
// package's (sandbox's init.go named from daemon).
func existsAnywhere(name string) bool {
	found := false
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || found {
			return filepath.SkipDir
		}
		if d.IsDir() {
			rel, _ := filepath.Rel(root, path)
			if skipDir(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		found = d.Name() == name
		return nil
	})
	return found
}

// TestDocumentLinksExist checks the relative links of every Markdown file.
func TestDocumentLinksExist(t *testing.T) {
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if skipDir(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range mdLinkRe.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), target)); err != nil {
				t.Errorf("%s: links to %s, which does not exist", rel, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
