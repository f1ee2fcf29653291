package daemon

import (
	"encoding/json"
	"errors"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/conformance"
	"github.com/condfs/condfs/internal/testenv"
)

type fixtures struct {
	Dirs      []string          `json:"dirs"`
	Files     []string          `json:"files"`
	Hardlinks map[string]string `json:"hardlinks"`
	Symlinks  map[string]string `json:"symlinks"`
}

// layout fills a space's backing directory as the corpus README says.
func layout(t *testing.T, dir string, fx fixtures, reqPath, op string) {
	t.Helper()
	mk := func(rel string) string { return filepath.Join(dir, filepath.FromSlash(strings.TrimPrefix(rel, "/"))) }
	for _, d := range fx.Dirs {
		os.MkdirAll(mk(d), 0o755)
	}
	for _, f := range fx.Files {
		os.MkdirAll(filepath.Dir(mk(f)), 0o755)
		os.WriteFile(mk(f), []byte("x"), 0o644)
	}
	for nw, old := range fx.Hardlinks {
		if _, err := os.Stat(mk(old)); err != nil {
			os.MkdirAll(filepath.Dir(mk(old)), 0o755)
			os.WriteFile(mk(old), []byte("x"), 0o644)
		}
		os.MkdirAll(filepath.Dir(mk(nw)), 0o755)
		if err := os.Link(mk(old), mk(nw)); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range fx.Symlinks {
		os.MkdirAll(filepath.Dir(mk(link)), 0o755)
		if err := os.Symlink(target, mk(link)); err != nil {
			t.Fatal(err)
		}
	}
	// Walk the requested path, creating what is missing.
	comps := strings.Split(reqPath, "/")
	lastIdx := -1
	for i := len(comps) - 1; i >= 0; i-- {
		if comps[i] != "" {
			lastIdx = i
			break
		}
	}
	endsDir := strings.HasSuffix(reqPath, "/") || strings.HasSuffix(reqPath, "/.") || strings.HasSuffix(reqPath, "/..") || reqPath == "." || reqPath == ".."
	cur := "/"
	for i, c := range comps {
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			if cur == "/" {
				return
			}
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		if target, ok := fx.Symlinks[next]; ok {
			if strings.HasPrefix(target, "/") {
				return
			}
			resolved := path.Join(cur, target)
			if escapesLexically(cur, target) {
				return
			}
			os.MkdirAll(mk(resolved), 0o755)
			cur = resolved
			continue
		}
		last := i == lastIdx
		switch {
		case !last || endsDir || op == "readdir":
			os.MkdirAll(mk(next), 0o755)
		case op == "create":
		default:
			os.MkdirAll(filepath.Dir(mk(next)), 0o755)
			if _, err := os.Lstat(mk(next)); err != nil {
				os.WriteFile(mk(next), []byte("x"), 0o644)
			}
		}
		cur = next
	}
}

func escapesLexically(dir, target string) bool {
	depth := strings.Count(strings.Trim(dir, "/"), "/") + 1
	if dir == "/" {
		depth = 0
	}
	for _, s := range strings.Split(target, "/") {
		switch s {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}

// checkView checks one path case through the mount; it returns "allow" or
// "deny" and the errno of a refused create.
func checkView(mnt, space, p, op string) (string, error) {
	full := mnt + "/" + space + "/" + p
	plain := !strings.Contains(p, "\x00")
	for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
		if c == "." || c == ".." {
			plain = false
		}
	}
	if strings.Contains(strings.Trim(p, "/"), "//") {
		plain = false
	}
	inListing := func() bool {
		clean := strings.Trim(p, "/")
		dir, name := mnt, space
		if clean != "" {
			dir, name = mnt+"/"+space+"/"+path.Dir(clean), path.Base(clean)
			if path.Dir(clean) == "." {
				dir = mnt + "/" + space
			}
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return false
		}
		for _, e := range ents {
			if e.Name() == name {
				return true
			}
		}
		return false
	}
	switch op {
	case "create":
		f, err := os.OpenFile(full, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return "deny", err
		}
		f.Close()
		return "allow", nil
	case "readdir":
		if _, err := os.ReadDir(full); err != nil {
			if !errors.Is(err, syscall.ENOENT) {
				return "error", err
			}
			if plain && inListing() {
				return "error", errors.New("listing fails but the name is listed")
			}
			return "deny", nil
		}
	default:
		st, err := os.Lstat(full)
		if err != nil {
			if !errors.Is(err, syscall.ENOENT) {
				return "error", err
			}
			if plain && inListing() {
				return "error", errors.New("lstat fails but the name is listed")
			}
			return "deny", nil
		}
		if st.Mode().IsRegular() {
			if _, err := os.ReadFile(full); err != nil {
				return "error", err
			}
		}
	}
	if plain && !inListing() {
		return "error", errors.New("visible but not listed in its parent")
	}
	return "allow", nil
}

// TestConditionsConformance runs the shared conditions cases that need a
// daemon: every path case through a real mount (or path.check when it
// cannot go through one), context cases through session.open, and reload
// cases through real file changes.
func TestConditionsConformance(t *testing.T) {
	testenv.RequireFUSE(t)
	cases, err := conformance.Load("conditions.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	disputed, err := conformance.Disputed()
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range cases {
		kind := c.Str("kind")
		if kind != "path" && kind != "context" && kind != "reload" {
			continue
		}
		if why, ok := disputed[c.ID]; ok {
			t.Logf("disputed case %s: %s", c.ID, why)
			continue
		}
		ran++
		t.Run(c.ID, func(t *testing.T) {
			switch kind {
			case "path":
				runPathCase(t, c)
			case "context":
				runContextCase(t, c)
			case "reload":
				runReloadCase(t, c)
			}
		})
	}
	if ran < 100 {
		t.Fatalf("only %d cases ran", ran)
	}
}

func sessionContext(c conformance.Case) json.RawMessage {
	raw := c.Fields["context"]
	var atoms []string
	if json.Unmarshal(raw, &atoms) == nil && len(atoms) == 0 {
		return json.RawMessage(`{"kind":"none"}`)
	}
	return raw
}

func runPathCase(t *testing.T, c conformance.Case) {
	h := testenv.NewHome(t, c.Str("conditions_toml"), "version: 1\n")
	p, space, op := c.Str("path"), c.Str("space"), c.Str("op")
	want := c.Str("expect")
	if c.Has("expect_view") {
		want = c.Str("expect_view")
	}
	viaMount := string(c.Fields["mount"]) != "false" && !strings.Contains(p, "\x00")
	if viaMount {
		var fx fixtures
		if c.Has("fixtures") {
			c.Decode("fixtures", &fx)
		}
		layout(t, h.Path(space), fx, p, op)
	}
	d := testenv.Start(t, h)
	if !viaMount {
		var res struct {
			Decision string `json:"decision"`
		}
		err := d.Client.Call("path.check", map[string]any{"context": sessionContext(c), "space": space, "path": p}, &res)
		if c.Str("expect") == "refused" {
			var rpcErr *control.Error
			if !(errors.As(err, &rpcErr) && rpcErr.Code == control.CodeInvalidParams) && !(err == nil && res.Decision == "deny") {
				t.Fatalf("NUL path: %v %+v, want deny or -32602", err, res)
			}
			return
		}
		if err != nil || res.Decision != c.Str("expect") {
			t.Fatalf("path.check: %v %s, want %s", err, res.Decision, c.Str("expect"))
		}
		return
	}
	var res struct {
		Atoms []string `json:"atoms"`
	}
	mnt := h.Path("mnt/s")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": sessionContext(c)}, &res)
	if c.Has("expect_atoms") {
		var wantAtoms []string
		c.Decode("expect_atoms", &wantAtoms)
		if !slices.Equal(res.Atoms, wantAtoms) && !(len(res.Atoms) == 0 && len(wantAtoms) == 0) {
			t.Fatalf("atoms %v, want %v", res.Atoms, wantAtoms)
		}
	}
	got, err := checkView(mnt, space, p, op)
	if got != want {
		t.Fatalf("%s %s %q through the mount: %s (%v), want %s", op, space, p, got, err, want)
	}
	if op == "create" && got == "deny" && c.Has("expect_errno") {
		wantErr := map[string]syscall.Errno{"EACCES": syscall.EACCES, "ENOENT": syscall.ENOENT}[c.Str("expect_errno")]
		if !errors.Is(err, wantErr) {
			t.Fatalf("create failed with %v, want %s", err, c.Str("expect_errno"))
		}
	}
	d.Call("session.close", map[string]any{"id": "s"}, nil)
}

func runContextCase(t *testing.T, c conformance.Case) {
	h := testenv.NewHome(t, "", "version: 1\n")
	d := testenv.Start(t, h)
	params := map[string]any{"id": "s", "mount": h.Path("mnt/s")}
	if c.Has("context") {
		params["context"] = c.Fields["context"]
	}
	var res struct {
		Atoms []string `json:"atoms"`
	}
	err := d.Client.Call("session.open", params, &res)
	if c.Has("expect_error") {
		if err == nil {
			t.Fatalf("session.open accepted %s with atoms %v", c.Fields["context"], res.Atoms)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	c.Decode("expect_atoms", &want)
	if !slices.Equal(res.Atoms, want) && !(len(res.Atoms) == 0 && len(want) == 0) {
		t.Fatalf("atoms %v, want %v", res.Atoms, want)
	}
}

func runReloadCase(t *testing.T, c conformance.Case) {
	style := c.Str("reload_style")
	var before *string
	if c.Has("conditions_toml") {
		s := c.Str("conditions_toml")
		before = &s
	}
	h := testenv.NewHome(t, "-", "version: 1\n")
	if style == "configmap" {
		testenv.ConfigmapWrite(t, h, before, 1)
		os.Symlink("..data/conditions.toml", h.Path("config/conditions.toml"))
	} else if before != nil {
		h.Write("config/conditions.toml", *before)
	}
	space, p := c.Str("space"), c.Str("path")
	layout(t, h.Path(space), fixtures{}, p, "lookup")
	d := testenv.Start(t, h)
	mnt := d.Open("s", sessionContext(c))
	if got, err := checkView(mnt, space, p, "lookup"); got != c.Str("expect_before") {
		t.Fatalf("before: %s (%v), want %s", got, err, c.Str("expect_before"))
	}
	st := testenv.ConditionsStatus(d)
	var after *string
	if c.Has("reload_toml") {
		s := c.Str("reload_toml")
		after = &s
	}
	testenv.WriteStyle(t, h, style, after, 2)
	testenv.WaitReload(d, st, c.Str("expect_reload") == "loaded")
	if got, err := checkView(mnt, space, p, "lookup"); got != c.Str("expect") {
		t.Fatalf("after: %s (%v), want %s", got, err, c.Str("expect"))
	}
}
