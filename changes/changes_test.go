package changes

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const ws = "workspace"

// tview makes changes in a backing tree as a view does: Before, the
// change, After.
type tview struct {
	t    *testing.T
	s    *Store
	root string
}

func newStore(t *testing.T, opts Options) (*Store, string, Options) {
	t.Helper()
	root := t.TempDir()
	if opts.Dir == "" {
		opts.Dir = filepath.Join(t.TempDir(), "changes", "s1")
	}
	opts.Roots = map[string]string{ws: root}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, root, opts
}

func (v tview) abs(p string) string { return filepath.Join(v.root, p) }

func (v tview) do(p string, f func() error) error {
	v.t.Helper()
	if err := v.s.Before(ws, p); err != nil {
		return err
	}
	err := f()
	v.s.After(ws, p)
	return err
}

func (v tview) write(p, data string) error {
	return v.do(p, func() error {
		fd, err := unix.Open(v.abs(p), unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW, 0o644)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		_, err = unix.Write(fd, []byte(data))
		return err
	})
}

func (v tview) mkdir(p string) error {
	return v.do(p, func() error { return os.Mkdir(v.abs(p), 0o755) })
}
func (v tview) remove(p string) error {
	return v.do(p, func() error { return os.Remove(v.abs(p)) })
}
func (v tview) chmod(p string, m os.FileMode) error {
	return v.do(p, func() error { return unix.Fchmodat(unix.AT_FDCWD, v.abs(p), uint32(m), unix.AT_SYMLINK_NOFOLLOW) })
}
func (v tview) symlink(target, p string) error {
	return v.do(p, func() error { return os.Symlink(target, v.abs(p)) })
}
func (v tview) truncate(p string, n int64) error {
	return v.do(p, func() error {
		fd, err := unix.Open(v.abs(p), unix.O_WRONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Ftruncate(fd, n)
	})
}

// rename records as fsys does: a directory as a move, anything else as
// both names.
func (v tview) rename(from, to string) error {
	st, err := os.Lstat(v.abs(from))
	if err != nil {
		return err
	}
	if st.IsDir() {
		if err := v.s.Before(ws, to); err != nil {
			return err
		}
		if err := v.s.Moved(ws, from, to, false); err != nil {
			return err
		}
	} else {
		if err := v.s.Before(ws, from); err != nil {
			return err
		}
		if err := v.s.Before(ws, to); err != nil {
			return err
		}
	}
	err = os.Rename(v.abs(from), v.abs(to))
	if err == nil && st.IsDir() {
		v.s.Renamed(ws, from, to, false)
	}
	v.s.After(ws, from)
	v.s.After(ws, to)
	return err
}

// tree is what a backing tree holds: type, mode, content or target, and a
// file's mtime.
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel := strings.TrimPrefix(p, root)
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v", st.Mode())
		switch {
		case st.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc += fmt.Sprintf(" %q %d", b, st.ModTime().UnixNano())
		case st.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		}
		out[rel] = desc
		return nil
	})
	return out
}

func sameTree(t *testing.T, want, got map[string]string) {
	t.Helper()
	var diffs []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s missing (want %s)", p, w))
		} else if g != w {
			diffs = append(diffs, fmt.Sprintf("%s = %s, want %s", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s extra (%s)", p, g))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Fatalf("trees differ:\n%s", strings.Join(diffs, "\n"))
	}
}

func seed(t *testing.T, root string) {
	t.Helper()
	must(t, os.WriteFile(filepath.Join(root, "a"), []byte("alpha\n"), 0o640))
	must(t, os.Mkdir(filepath.Join(root, "d"), 0o750))
	must(t, os.WriteFile(filepath.Join(root, "d", "x"), []byte("x\n"), 0o600))
	must(t, os.Symlink("a", filepath.Join(root, "l")))
	old := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	must(t, os.Chtimes(filepath.Join(root, "a"), old, old))
	must(t, os.Chtimes(filepath.Join(root, "d", "x"), old, old))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNothingRecordedBeforeACheckpoint(t *testing.T) {
	s, root, opts := newStore(t, Options{})
	seed(t, root)
	v := tview{t, s, root}
	must(t, v.write("/a", "changed"))
	if s.Armed() || s.Use().Bytes != 0 {
		t.Fatalf("recorded before a checkpoint: %+v", s.Use())
	}
	ents, _ := os.ReadDir(filepath.Join(opts.Dir, "blobs"))
	if len(ents) != 0 {
		t.Fatalf("blobs before a checkpoint: %v", ents)
	}
}

func TestRollbackUndoesEachKindOfChange(t *testing.T) {
	s, root, _ := newStore(t, Options{})
	seed(t, root)
	want := tree(t, root)
	cp, _, err := s.Create("start", time.Now())
	must(t, err)
	v := tview{t, s, root}
	must(t, v.write("/a", "rewritten"))
	must(t, v.chmod("/a", 0o600))
	must(t, v.truncate("/a", 2))
	must(t, v.write("/new", "new file"))
	must(t, v.mkdir("/nd"))
	must(t, v.write("/nd/f", "in a new dir"))
	must(t, v.symlink("new", "/s2"))
	must(t, v.remove("/d/x"))
	must(t, v.remove("/d"))
	must(t, v.remove("/l"))
	must(t, v.symlink("elsewhere", "/l"))
	must(t, v.rename("/a", "/b"))
	must(t, v.rename("/nd", "/nd2"))
	must(t, v.write("/nd2/g", "after the move"))
	res, err := s.Rollback(cp.ID, false)
	must(t, err)
	if len(res.Conflicts) != 0 {
		t.Fatalf("conflicts: %+v", res.Conflicts)
	}
	sameTree(t, want, tree(t, root))
	if l := s.List(); len(l) != 1 || l[0].Changes != 0 {
		t.Fatalf("after rollback: %+v", l)
	}
}

func TestOpenDescriptorsReadRestoredContent(t *testing.T) {
	s, root, _ := newStore(t, Options{})
	seed(t, root)
	f, err := os.OpenFile(filepath.Join(root, "a"), os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	cp, _, err := s.Create("", time.Now())
	must(t, err)
	must(t, s.Before(ws, "/a"))
	_, err = f.WriteAt([]byte("OMEGA-LONGER\n"), 0)
	must(t, err)
	s.Wrote(ws, "/a", int(f.Fd()))
	_, err = s.Rollback(cp.ID, false)
	must(t, err)
	buf := make([]byte, 64)
	n, _ := f.ReadAt(buf, 0)
	if string(buf[:n]) != "alpha\n" {
		t.Fatalf("open descriptor reads %q", buf[:n])
	}
}

func TestSeveralCheckpoints(t *testing.T) {
	s, root, _ := newStore(t, Options{})
	seed(t, root)
	v := tview{t, s, root}
	s0 := tree(t, root)
	c1, _, _ := s.Create("one", time.Now())
	must(t, v.write("/a", "v1"))
	must(t, v.write("/n1", "n1"))
	s1 := tree(t, root)
	c2, _, _ := s.Create("two", time.Now())
	must(t, v.write("/a", "v2"))
	must(t, v.remove("/n1"))
	must(t, v.write("/n2", "n2"))
	if _, _, err := s.Create("two", time.Now()); !errors.Is(err, ErrBadName) {
		t.Fatalf("duplicate name: %v", err)
	}
	l := s.List()
	if len(l) != 2 || l[0].Changes != 2 || l[1].Changes != 3 {
		t.Fatalf("list: %+v", l)
	}
	_, err := s.Rollback("two", false)
	must(t, err)
	sameTree(t, s1, tree(t, root))
	must(t, v.write("/a", "v3"))
	_, err = s.Rollback(c1.ID, false)
	must(t, err)
	sameTree(t, s0, tree(t, root))
	if _, err := s.Rollback(c2.ID, false); !errors.Is(err, ErrUnknownCheckpoint) {
		t.Fatalf("a dropped checkpoint: %v", err)
	}
}

func TestConflictsLeftUnlessForced(t *testing.T) {
	s, root, _ := newStore(t, Options{})
	seed(t, root)
	v := tview{t, s, root}
	cp, _, _ := s.Create("", time.Now())
	must(t, v.write("/a", "session's"))
	must(t, v.write("/new", "session's"))
	// Outside the view:
	time.Sleep(10 * time.Millisecond)
	must(t, os.WriteFile(filepath.Join(root, "a"), []byte("someone else's"), 0o644))
	res, err := s.Rollback(cp.ID, false)
	must(t, err)
	if len(res.Conflicts) != 1 || res.Conflicts[0].Path != "/a" {
		t.Fatalf("conflicts: %+v", res.Conflicts)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "a")); string(b) != "someone else's" {
		t.Fatalf("a conflict was overwritten: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(root, "new")); !os.IsNotExist(err) {
		t.Fatalf("the rest was not restored: %v", err)
	}

	// What a rollback left stays recorded: forced, the same checkpoint
	// restores it.
	must(t, os.WriteFile(filepath.Join(root, "new"), []byte("x"), 0o644))
	os.Remove(filepath.Join(root, "new"))
	if res, err := s.Rollback(cp.ID, true); err != nil || len(res.Conflicts) != 0 {
		t.Fatalf("forced after a conflict: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "a")); string(b) != "alpha\n" {
		t.Fatalf("a path left for a conflict, forced later: %q", b)
	}

	cp, _, _ = s.Create("", time.Now())
	must(t, v.write("/a", "session's again"))
	must(t, os.WriteFile(filepath.Join(root, "a"), []byte("outside again"), 0o644))
	res, err = s.Rollback(cp.ID, true)
	must(t, err)
	if b, _ := os.ReadFile(filepath.Join(root, "a")); len(res.Conflicts) != 0 || string(b) != "alpha\n" {
		t.Fatalf("forced: %q %+v", b, res.Conflicts)
	}
}

func TestSymlinkSwappedIntoAParentIsNotFollowed(t *testing.T) {
	s, root, _ := newStore(t, Options{})
	seed(t, root)
	outside := t.TempDir()
	v := tview{t, s, root}
	cp, _, _ := s.Create("", time.Now())
	must(t, v.write("/d/x", "changed"))
	must(t, v.remove("/d/x"))
	// The directory becomes a symlink to a place outside the tree.
	must(t, os.Remove(filepath.Join(root, "d")))
	must(t, os.Symlink(outside, filepath.Join(root, "d")))
	res, err := s.Rollback(cp.ID, true)
	must(t, err)
	if len(res.Conflicts) != 1 {
		t.Fatalf("conflicts: %+v", res.Conflicts)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("restored through a symlink: %v", ents)
	}
}

func TestRollbackRunAgainEndsInTheSameState(t *testing.T) {
	s, root, opts := newStore(t, Options{})
	seed(t, root)
	v := tview{t, s, root}
	want := tree(t, root)
	cp, _, _ := s.Create("", time.Now())
	must(t, v.write("/a", "one"))
	must(t, v.remove("/d/x"))
	must(t, v.rename("/d", "/e"))
	must(t, v.write("/n", "new"))
	_, _, err := s.Create("", time.Now())
	must(t, err)
	must(t, v.write("/a", "two"))
	must(t, v.write("/e/y", "y"))
	// A crash after the restores and before the logs are dropped: the
	// store's directory as it was before the rollback, the tree after.
	saved := copyDir(t, opts.Dir)
	_, err = s.Rollback(cp.ID, false)
	must(t, err)
	sameTree(t, want, tree(t, root))
	s.Close()
	must(t, os.RemoveAll(opts.Dir))
	must(t, os.Rename(saved, opts.Dir))
	s, err = Open(opts)
	must(t, err)
	defer s.Close()
	res, err := s.Rollback(cp.ID, false)
	must(t, err)
	if len(res.Conflicts) != 0 {
		t.Fatalf("run again: conflicts %+v", res.Conflicts)
	}
	sameTree(t, want, tree(t, root))
}

func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := src + ".saved"
	must(t, filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		to := filepath.Join(dst, strings.TrimPrefix(p, src))
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o600)
	}))
	return dst
}

func TestReopenedStoreRollsBack(t *testing.T) {
	s, root, opts := newStore(t, Options{})
	seed(t, root)
	v := tview{t, s, root}
	want := tree(t, root)
	_, _, err := s.Create("c", time.Now())
	must(t, err)
	must(t, v.write("/a", "changed"))
	must(t, v.write("/n", "new"))
	s.Close()
	s, err = Open(opts)
	must(t, err)
	defer s.Close()
	if !s.Armed() {
		t.Fatal("a reopened store with a checkpoint does not record")
	}
	res, err := s.Rollback("c", false)
	must(t, err)
	if len(res.Conflicts) != 0 || res.Restored != 2 {
		t.Fatalf("%+v", res)
	}
	sameTree(t, want, tree(t, root))
}

func TestLimits(t *testing.T) {
	s, root, _ := newStore(t, Options{MaxBytes: 4096, MaxCheckpoints: 2})
	must(t, os.WriteFile(filepath.Join(root, "big"), make([]byte, 8192), 0o644))
	v := tview{t, s, root}
	c1, _, _ := s.Create("", time.Now())
	if err := v.write("/big", "x"); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("beyond max_bytes: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "big")); len(b) != 8192 {
		t.Fatal("a change refused for ENOSPC was made")
	}
	must(t, v.write("/small", "x"))
	_, d, _ := s.Create("", time.Now())
	if d != nil {
		t.Fatalf("dropped at 2: %+v", d)
	}
	_, d, _ = s.Create("", time.Now())
	if d == nil || d.ID != c1.ID || d.Changes != 1 {
		t.Fatalf("the oldest not dropped: %+v", d)
	}
	if l := s.List(); len(l) != 2 {
		t.Fatalf("kept %d", len(l))
	}
}

func TestDiff(t *testing.T) {
	s, root, _ := newStore(t, Options{})
	seed(t, root)
	v := tview{t, s, root}
	_, _, _ = s.Create("", time.Now())
	must(t, v.write("/a", "alpha\nbeta\n"))
	must(t, v.write("/n", "new\n"))
	must(t, v.remove("/d/x"))
	must(t, v.mkdir("/nd"))
	must(t, v.write("/bin", "\xff\xfe"))
	must(t, v.write("/hidden", "h"))
	got, hidden, err := s.Diff("", true, func(_, p string) bool { return p != "/hidden" })
	must(t, err)
	var lines []string
	for _, c := range got {
		lines = append(lines, c.Change+" "+c.Path)
	}
	want := "modified /a,added /bin,deleted /d/x,added /n,added /nd/"
	if strings.Join(lines, ",") != want || hidden != 1 {
		t.Fatalf("diff: %s (hidden %d)", strings.Join(lines, ","), hidden)
	}
	if !strings.Contains(got[0].Diff, "+beta") || !got[1].Binary {
		t.Fatalf("content: %+v", got[:2])
	}
}

// TestModelRandom makes random changes, checkpoints and rollbacks, and
// checks the tree after each rollback against what it was at that
// checkpoint.
func TestModelRandom(t *testing.T) {
	for seedN := int64(1); seedN <= 30; seedN++ {
		t.Run(fmt.Sprint(seedN), func(t *testing.T) { modelRun(t, seedN) })
	}
}

func modelRun(t *testing.T, seedN int64) {
	rng := rand.New(rand.NewSource(seedN))
	s, root, opts := newStore(t, Options{MaxCheckpoints: 4})
	v := tview{t, s, root}
	names := []string{"/a", "/b", "/d1", "/d1/a", "/d1/b", "/d2", "/d2/a", "/d2/d3", "/d2/d3/a"}
	type cpState struct {
		id   string
		tree map[string]string
	}
	var cps []cpState
	for step := 0; step < 120; step++ {
		p := names[rng.Intn(len(names))]
		n := rng.Intn(20)
		t.Logf("step %d op %d %s", step, n, p)
		switch {
		case n < 5:
			v.write(p, fmt.Sprintf("%d-%d", step, rng.Intn(100)))
		case n < 7:
			v.mkdir(p)
		case n < 9:
			v.remove(p)
		case n < 10:
			v.chmod(p, os.FileMode(0o600+rng.Intn(0o100)))
		case n < 11:
			v.symlink(fmt.Sprint("t", step), p)
		case n < 12:
			v.truncate(p, int64(rng.Intn(3)))
		case n < 14:
			to := names[rng.Intn(len(names))]
			t.Logf("rename %s %s: %v", p, to, v.rename(p, to))
		case n < 16:
			cp, dropped, err := s.Create("", time.Now())
			must(t, err)
			if dropped != nil {
				cps = cps[1:]
			}
			cps = append(cps, cpState{cp.ID, tree(t, root)})
		case n < 18 && len(cps) > 0:
			i := rng.Intn(len(cps))
			res, err := s.Rollback(cps[i].id, false)
			must(t, err)
			if len(res.Conflicts) != 0 {
				t.Fatalf("step %d: conflicts %+v", step, res.Conflicts)
			}
			sameTree(t, cps[i].tree, tree(t, root))
			cps = cps[:i+1]
		case n < 19:
			// Crash and restart.
			s.Close()
			var err error
			s, err = Open(opts)
			must(t, err)
			v.s = s
		}
	}
	s.Close()
}
