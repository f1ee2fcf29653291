package changes

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A Store over a layer's upper directories (Options.Layer) is a staged
// session's checkpoints: rolled back with nothing mounted, the layer is
// again what it was, so the merged tree shows what it showed at the
// checkpoint, whatever kinds of change came after (a copy-up, a whiteout,
// a directory removed and made again, a rename, a new directory tree).
func TestLayerRollbackGivesTheMergedTreeOfItsCheckpoint(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer func() { l.Remove() }()
	st, err := Open(Options{Dir: filepath.Join(state, "checkpoints"), Roots: map[string]string{"workspace": filepath.Join(state, "upper", "workspace")}, Layer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// both makes a change as the view does: every path it changes told
	// to the layer and the store first, the change, then After.
	both := func(p string, f func(full string) error, also ...string) {
		t.Helper()
		for _, q := range append([]string{p}, also...) {
			must(t, l.Before("workspace", q))
			must(t, st.Before("workspace", q))
		}
		must(t, f(filepath.Join(l.Merged("workspace"), p)))
		for _, q := range append([]string{p}, also...) {
			l.After("workspace", q)
			st.After("workspace", q)
		}
	}
	// Changes before the checkpoint: the layer holds some already.
	both("/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("two\n"), 0o644) })
	both("/gone/sub/x", os.Remove)
	both("/made", func(p string) error { return os.Mkdir(p, 0o755) })
	both("/made/m", func(p string) error { return os.WriteFile(p, []byte("m\n"), 0o644) })
	both("/tomove", func(p string) error { return os.Mkdir(p, 0o755) })
	both("/tomove/f", func(p string) error { return os.WriteFile(p, []byte("f\n"), 0o644) })
	at := tree(t, l.Merged("workspace"))
	if _, _, err := st.Create("", time.Now()); err != nil {
		t.Fatal(err)
	}
	// After it, every kind of change, over the layer and over the backing tree.
	both("/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("three\n"), 0o600) })
	both("/keep.txt", func(p string) error { return os.WriteFile(p, []byte("kept no more\n"), 0o644) })
	both("/gone/sub", os.Remove)
	both("/gone/sub", func(p string) error { return os.Mkdir(p, 0o700) })
	both("/gone/sub/y", func(p string) error { return os.WriteFile(p, []byte("y\n"), 0o644) })
	both("/made/m", os.Remove)
	both("/made", os.Remove)
	both("/new", func(p string) error { return os.Mkdir(p, 0o755) })
	both("/new/deep", func(p string) error { return os.Mkdir(p, 0o755) })
	both("/src/a.txt", func(p string) error {
		return os.Rename(p, filepath.Join(l.Merged("workspace"), "/src/b.txt"))
	}, "/src/b.txt")
	both("/ln", func(p string) error { return os.Symlink("keep.txt", p) })
	// A directory of the layer only moves (as the view announces it).
	must(t, l.Moved("workspace", "/tomove", "/moved", false))
	must(t, st.Before("workspace", "/moved"))
	must(t, st.Moved("workspace", "/tomove", "/moved", false))
	must(t, os.Rename(filepath.Join(l.Merged("workspace"), "tomove"), filepath.Join(l.Merged("workspace"), "moved")))
	st.Renamed("workspace", "/tomove", "/moved", false)
	l.Renamed("workspace", "/tomove", "/moved", false)
	both("/moved/f", func(p string) error { return os.WriteFile(p, []byte("changed after the move\n"), 0o644) })

	must(t, l.Close())
	res, err := st.Rollback("1", false)
	if err != nil || len(res.Conflicts) != 0 {
		t.Fatalf("rollback: %v %+v", err, res.Conflicts)
	}
	l = openTestLayer(t, state, backing, false)
	sameTree(t, at, tree(t, l.Merged("workspace")))
	if b, _ := os.ReadFile(backing + "/keep.txt"); string(b) != "keep\n" {
		t.Fatalf("the backing tree changed: %q", b)
	}
	// The layer still holds the changes made before the checkpoint, and
	// only those.
	if got, want := diffLines(t, l), []string{"A workspace/made/", "A workspace/made/m", "A workspace/tomove/", "A workspace/tomove/f", "D workspace/gone/sub/x", "M workspace/src/a.txt"}; !equalStrings(got, want) {
		t.Fatalf("diff after rollback: %v, want %v", got, want)
	}
}

// Drop forgets every checkpoint and what they hold.
func TestLayerCheckpointsDroppedTogether(t *testing.T) {
	s, root, _ := newStore(t, Options{})
	v := tview{t: t, s: s, root: root}
	seed(t, root)
	for i := 0; i < 3; i++ {
		if _, _, err := s.Create("", time.Now()); err != nil {
			t.Fatal(err)
		}
		must(t, v.write("/a", "changed\n"))
	}
	dropped, err := s.Drop()
	if err != nil || len(dropped) != 3 {
		t.Fatalf("drop: %v %v", dropped, err)
	}
	if s.Armed() || len(s.List()) != 0 || s.Use().Bytes != 0 {
		t.Fatalf("after drop: armed %v list %v use %+v", s.Armed(), s.List(), s.Use())
	}
	if _, err := s.Rollback("1", false); err == nil {
		t.Fatal("a dropped checkpoint rolled back")
	}
	if _, _, err := s.Create("", time.Now()); err != nil {
		t.Fatal(err)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
