package changes

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func openTestLayer(t *testing.T, state, backing string, fresh bool) *Layer {
	t.Helper()
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: fresh})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func layerFixture(t *testing.T) (backing, state string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the layer is mounted by overlayfs: needs root")
	}
	base := t.TempDir()
	backing, state = filepath.Join(base, "backing"), filepath.Join(base, "state")
	for _, d := range []string{backing + "/src", backing + "/gone/sub"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(backing+"/src/a.txt", []byte("one\n"), 0o644))
	must(t, os.WriteFile(backing+"/keep.txt", []byte("keep\n"), 0o644))
	must(t, os.WriteFile(backing+"/gone/sub/x", []byte("x"), 0o644))
	return backing, state
}

func diffLines(t *testing.T, l *Layer) []string {
	t.Helper()
	list, hidden, err := l.Diff(false, func(string, string) bool { return true })
	if err != nil || hidden != 0 {
		t.Fatalf("diff: %v hidden %d", err, hidden)
	}
	var out []string
	for _, c := range list {
		out = append(out, strings.ToUpper(c.Change[:1])+" "+c.Space+c.Path)
	}
	sort.Strings(out)
	return out
}

// change makes the session's changes through the merged directory, as the
// view does, telling the layer first.
func change(t *testing.T, l *Layer, p string, f func(full string) error) {
	t.Helper()
	must(t, l.Before("workspace", p))
	must(t, f(filepath.Join(l.Merged("workspace"), p)))
	l.After("workspace", p)
}

func TestLayerKeepsChangesFromBackingUntilCommit(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	change(t, l, "/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("two\n"), 0o644) })
	change(t, l, "/new.txt", func(p string) error { return os.WriteFile(p, []byte("new\n"), 0o600) })
	change(t, l, "/gone/sub/x", os.Remove)
	change(t, l, "/gone/sub", os.Remove)
	change(t, l, "/gone", os.Remove)
	change(t, l, "/ln", func(p string) error { return os.Symlink("keep.txt", p) })
	change(t, l, "/keep.txt", func(p string) error { return os.Chmod(p, 0o600) })

	if b, _ := os.ReadFile(backing + "/src/a.txt"); string(b) != "one\n" {
		t.Fatalf("backing changed before commit: %q", b)
	}
	if _, err := os.Stat(backing + "/new.txt"); err == nil {
		t.Fatal("a staged file reached the backing tree")
	}
	want := []string{"A workspace/ln", "A workspace/new.txt", "D workspace/gone/", "M workspace/keep.txt", "M workspace/src/a.txt"}
	if got := diffLines(t, l); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("diff %v, want %v", got, want)
	}
	res, err := l.Commit(nil, false)
	if err != nil || res.Committed != 5 || len(res.Conflicts) != 0 {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(backing + "/src/a.txt"); string(b) != "two\n" {
		t.Fatalf("commit did not write: %q", b)
	}
	if _, err := os.Lstat(backing + "/gone"); !os.IsNotExist(err) {
		t.Fatalf("deleted directory still in the backing tree: %v", err)
	}
	if fi, err := os.Stat(backing + "/keep.txt"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("chmod not committed: %v %v", fi, err)
	}
	if got := diffLines(t, l); len(got) != 0 {
		t.Fatalf("changes left after commit: %v", got)
	}
}

func TestLayerConflictLeftUnlessForced(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	change(t, l, "/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("session\n"), 0o644) })
	must(t, os.WriteFile(backing+"/src/a.txt", []byte("host wrote\n"), 0o644))
	res, err := l.Commit(nil, false)
	if err != nil || res.Committed != 0 || len(res.Conflicts) != 1 || res.Conflicts[0].Path != "/src/a.txt" {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(backing + "/src/a.txt"); string(b) != "host wrote\n" {
		t.Fatalf("a conflict was overwritten: %q", b)
	}
	res, err = l.Commit(nil, true)
	if err != nil || res.Committed != 1 {
		t.Fatalf("forced commit: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(backing + "/src/a.txt"); string(b) != "session\n" {
		t.Fatalf("force did not write: %q", b)
	}
}

func TestLayerDiscardShowsBackingAgain(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	merged := l.Merged("workspace")
	change(t, l, "/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("two\n"), 0o644) })
	change(t, l, "/gone/sub/x", os.Remove)
	change(t, l, "/gone/sub", os.Remove)
	change(t, l, "/gone", os.Remove)
	change(t, l, "/new", func(p string) error { return os.Mkdir(p, 0o755) })
	sel, err := l.ParseSelectors([]string{"workspace/src"})
	must(t, err)
	if res, err := l.Discard(sel); err != nil || res.Discarded != 1 {
		t.Fatalf("discard src: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(merged + "/src/a.txt"); string(b) != "one\n" {
		t.Fatalf("view after discard: %q", b)
	}
	if got := diffLines(t, l); strings.Join(got, ",") != "A workspace/new/,D workspace/gone/" {
		t.Fatalf("diff after a partial discard: %v", got)
	}
	if _, err := l.Discard(nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(merged + "/gone/sub/x"); err != nil || string(b) != "x" {
		t.Fatalf("a removed directory did not come back: %q %v", b, err)
	}
	if _, err := os.Lstat(merged + "/new"); !os.IsNotExist(err) {
		t.Fatalf("an added directory stayed: %v", err)
	}
	if got := diffLines(t, l); len(got) != 0 {
		t.Fatalf("changes left after discard: %v", got)
	}
}

func TestLayerComesBackAfterClose(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	change(t, l, "/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("two\n"), 0o644) })
	must(t, os.WriteFile(backing+"/src/a.txt", []byte("host\n"), 0o644))
	must(t, l.Close())
	l = openTestLayer(t, state, backing, false)
	defer l.Remove()
	if b, _ := os.ReadFile(l.Merged("workspace") + "/src/a.txt"); string(b) != "two\n" {
		t.Fatalf("the layer did not come back: %q", b)
	}
	// What the backing held when first staged came back too: the host's
	// write since is still a conflict.
	if res, err := l.Commit(nil, false); err != nil || len(res.Conflicts) != 1 {
		t.Fatalf("commit after reopen: %+v %v", res, err)
	}
}

func TestLayerBadSelectorsChangeNothing(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	change(t, l, "/new.txt", func(p string) error { return os.WriteFile(p, []byte("n"), 0o644) })
	for _, bad := range []string{"elsewhere/x", "workspace/../etc", "workspace/a//b", "/workspace/./x"} {
		if _, err := l.ParseSelectors([]string{bad}); err == nil {
			t.Errorf("selector %q accepted", bad)
		}
	}
	sel, err := l.ParseSelectors([]string{"workspace/src"})
	must(t, err)
	if _, err := l.Commit(sel, false); err == nil {
		t.Fatal("a commit of paths with no change answered no error")
	}
	if got := diffLines(t, l); strings.Join(got, ",") != "A workspace/new.txt" {
		t.Fatalf("diff: %v", got)
	}
}

func TestLayerRefusesChangesBeyondMaxBytes(t *testing.T) {
	backing, state := layerFixture(t)
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true, MaxBytes: 100})
	must(t, err)
	defer l.Remove()
	change(t, l, "/big", func(p string) error { return os.WriteFile(p, make([]byte, 200), 0o644) })
	if err := l.Before("workspace", "/more"); err == nil || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("a change beyond max_bytes: %v", err)
	}
	if u := l.Use(); u.Bytes != blockBytes {
		t.Fatalf("use %+v", u)
	}
}

// TestLayerEntriesWithoutBytesCountAgainstMaxBytes: an empty file, a
// directory, a symlink and a whiteout each take an inode of the state
// directory: each counts one block, so max_bytes bounds how many a session
// can make, and a session making empty files without end is refused.
func TestLayerEntriesWithoutBytesCountAgainstMaxBytes(t *testing.T) {
	backing, state := layerFixture(t)
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true, MaxBytes: 8 * blockBytes})
	must(t, err)
	defer l.Remove()
	change(t, l, "/empty", func(p string) error { return os.WriteFile(p, nil, 0o644) })
	change(t, l, "/dir", func(p string) error { return os.Mkdir(p, 0o755) })
	change(t, l, "/ln", func(p string) error { return os.Symlink("empty", p) })
	change(t, l, "/keep.txt", os.Remove) // a whiteout
	if u := l.Use(); u.Bytes != 4*blockBytes {
		t.Fatalf("four entries without content: %+v, want %d bytes", u, 4*blockBytes)
	}
	made := 0
	for i := 0; i < 100; i++ {
		p := "/e" + strconv.Itoa(i)
		if err := l.Before("workspace", p); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("refused with %v, want ENOSPC", err)
			}
			break
		}
		must(t, os.WriteFile(filepath.Join(l.Merged("workspace"), p), nil, 0o644))
		l.After("workspace", p)
		made++
	}
	if made != 4 {
		t.Fatalf("%d more empty files made under max_bytes of 8 blocks, want 4", made)
	}
}

func TestLayerForceNeverReplacesAnotherUsersFile(t *testing.T) {
	backing, state := layerFixture(t)
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true, Owner: 65534})
	must(t, err)
	defer l.Remove()
	change(t, l, "/new.txt", func(p string) error { return os.WriteFile(p, []byte("session"), 0o644) })
	must(t, os.WriteFile(backing+"/new.txt", []byte("root's"), 0o600)) // root's, made since
	res, err := l.Commit(nil, true)
	if err != nil || res.Committed != 0 || len(res.Conflicts) != 1 {
		t.Fatalf("forced commit over another uid's file: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(backing + "/new.txt"); string(b) != "root's" {
		t.Fatalf("another uid's file was replaced: %q", b)
	}
}

// TestLayerCommitInterruptedThenRunAgainEndsTheSame: a commit that stops
// part way (here: a directory of the backing tree refuses the rename into
// it) leaves what it did done; run again, it commits the rest, and the
// backing tree is what one commit makes.
func TestLayerCommitInterruptedThenRunAgainEndsTheSame(t *testing.T) {
	backing, state := layerFixture(t)
	if out, err := exec.Command("chattr", "+i", backing+"/src").CombinedOutput(); err != nil {
		t.Skipf("chattr +i (the backing filesystem must take it): %v %s", err, out)
	}
	defer exec.Command("chattr", "-i", backing+"/src").Run()
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	change(t, l, "/keep.txt", func(p string) error { return os.WriteFile(p, []byte("first\n"), 0o644) })
	change(t, l, "/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("second\n"), 0o644) })
	change(t, l, "/z.txt", func(p string) error { return os.WriteFile(p, []byte("third\n"), 0o644) })
	res, err := l.Commit(nil, false)
	if err == nil || res.Committed != 1 {
		t.Fatalf("interrupted commit: %+v %v", res, err)
	}
	must(t, exec.Command("chattr", "-i", backing+"/src").Run())
	if got := diffLines(t, l); strings.Join(got, ",") != "A workspace/z.txt,M workspace/src/a.txt" {
		t.Fatalf("left to commit: %v", got)
	}
	if res, err = l.Commit(nil, false); err != nil || res.Committed != 2 || len(res.Conflicts) != 0 {
		t.Fatalf("the commit run again: %+v %v", res, err)
	}
	for p, want := range map[string]string{"/keep.txt": "first\n", "/src/a.txt": "second\n", "/z.txt": "third\n"} {
		if b, _ := os.ReadFile(backing + p); string(b) != want {
			t.Errorf("%s = %q, want %q", p, b, want)
		}
	}
	if names, _ := filepath.Glob(backing + "/src/.condfs-staged-*"); len(names) != 0 {
		t.Errorf("temporary files left: %v", names)
	}
}

// TestLayerCommitGivesAFileTheOwnerAndModeOfWhatItCopies: a commit takes a
// file's owner and mode from the file whose content it copies, not from
// what the layer held at that path when the commit listed it. Otherwise a
// session swaps its own file in (a rename through the view) after the
// listing of a copied-up setuid root file at that path, and the commit
// makes a setuid root file of the session's content.
func TestLayerCommitGivesAFileTheOwnerAndModeOfWhatItCopies(t *testing.T) {
	backing, state := layerFixture(t)
	must(t, os.Mkdir(backing+"/bin", 0o777))
	must(t, os.Chmod(backing+"/bin", 0o777))
	must(t, os.WriteFile(backing+"/bin/tool", []byte("root's tool"), 0o755))
	must(t, syscall.Chmod(backing+"/bin/tool", 0o4755))
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	merged := l.Merged("workspace")
	change(t, l, "/bin/tool", func(string) error { return nil })
	change(t, l, "/x", func(p string) error { return os.Rename(merged+"/bin/tool", p) })
	change(t, l, "/evil", func(p string) error {
		if err := os.WriteFile(p, []byte("the session's"), 0o755); err != nil {
			return err
		}
		return os.Chown(p, 65534, 65534)
	})
	list, err := l.list()
	must(t, err)
	var x *staged
	for i := range list {
		if list[i].path == "/x" {
			x = &list[i]
		}
	}
	if x == nil || x.up.UID != 0 || x.up.Mode&0o4000 == 0 {
		t.Fatalf("the copied-up setuid file at /x: %+v", x)
	}
	// The session renames its own file over /x after the listing.
	change(t, l, "/x", func(p string) error { return os.Rename(merged+"/evil", p) })
	must(t, l.commitOne(l.spaces["workspace"], *x))
	var st syscall.Stat_t
	must(t, syscall.Lstat(backing+"/x", &st))
	b, _ := os.ReadFile(backing + "/x")
	if string(b) == "the session's" && (st.Uid != 65534 || st.Mode&0o6000 != 0) {
		t.Fatalf("the session's content committed with uid %d mode %o", st.Uid, st.Mode&0o7777)
	}
}

// TestLayerDirectoryRemovalConflictsWithWhatWasMadeInItSince: a staged
// removal of a directory is a conflict when the backing tree has, below
// it, an entry made or changed since the session removed what was there
// (the directory's own inode and mode stay the same); with force, it still
// never removes what another uid has below it.
func TestLayerDirectoryRemovalConflictsWithWhatWasMadeInItSince(t *testing.T) {
	for _, force := range []bool{false, true} {
		backing, state := layerFixture(t)
		must(t, exec.Command("chown", "-R", "65534:65534", backing+"/gone").Run())
		l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true, Owner: 65534})
		must(t, err)
		change(t, l, "/gone/sub/x", os.Remove)
		change(t, l, "/gone/sub", os.Remove)
		change(t, l, "/gone", os.Remove)
		must(t, os.WriteFile(backing+"/gone/sub/root.txt", []byte("root's, made since"), 0o600))
		res, err := l.Commit(nil, force)
		if err != nil || res.Committed != 0 || len(res.Conflicts) != 1 {
			t.Errorf("force %v: a removal over what was made since: %+v %v", force, res, err)
		}
		if _, err := os.Stat(backing + "/gone/sub/root.txt"); err != nil {
			t.Errorf("force %v: the file made since was removed: %v", force, err)
		}
		l.Remove()
	}
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	change(t, l, "/gone/sub/x", os.Remove)
	change(t, l, "/gone/sub", os.Remove)
	change(t, l, "/gone", os.Remove)
	must(t, os.WriteFile(backing+"/gone/sub/x", []byte("changed since"), 0o644))
	if res, err := l.Commit(nil, false); err != nil || res.Committed != 0 || len(res.Conflicts) != 1 {
		t.Errorf("a removal over a file changed since: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(backing + "/gone/sub/x"); string(b) != "changed since" {
		t.Errorf("the file changed since was removed: %q", b)
	}
}

// TestLayerCommitNeverRemovesAcrossAMount: a filesystem mounted on a
// directory of the backing tree is not in the layer's merged view (the
// session removes the empty directory beneath it); a commit of the removal
// of a directory above it stops at the mount (EXDEV) and leaves what the
// mounted filesystem holds.
func TestLayerCommitNeverRemovesAcrossAMount(t *testing.T) {
	backing, state := layerFixture(t)
	mnt := backing + "/gone/mnt"
	must(t, os.Mkdir(mnt, 0o755))
	must(t, unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"))
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	must(t, os.WriteFile(mnt+"/precious", []byte("keep"), 0o644))
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	// The view's recorder refuses a change at the mountpoint (openat2
	// never crosses a mount)...
	if err := l.Before("workspace", "/gone/mnt"); err == nil {
		t.Fatal("a change at a mountpoint of the backing tree was recorded")
	}
	// ...and were the removal in the layer all the same, the commit stops
	// at the mount.
	for _, p := range []string{"/gone/sub/x", "/gone/sub", "/gone/mnt", "/gone"} {
		must(t, os.Remove(l.Merged("workspace")+p))
	}
	if res, err := l.Commit(nil, false); err == nil && (res.Committed != 0 || len(res.Conflicts) == 0) {
		t.Fatalf("a commit removed a directory holding a mount, answering neither an error nor a conflict: %+v", res)
	}
	if b, err := os.ReadFile(mnt + "/precious"); err != nil || string(b) != "keep" {
		t.Fatalf("a commit removed what a mounted filesystem holds: %q %v", b, err)
	}
	// What a forced commit's removal does: stop at the mount.
	if err := removeBeneath(l.spaces["workspace"].lowerFD, "/gone"); err != unix.EXDEV {
		t.Fatalf("a removal across a mount: %v", err)
	}
	if b, err := os.ReadFile(mnt + "/precious"); err != nil || string(b) != "keep" {
		t.Fatalf("a removal emptied a mounted filesystem: %q %v", b, err)
	}
}

// TestLayerCommitOnlyWhatTheOwnerMayStillDo: a commit writes as the
// daemon, so a change the owner could make when it staged it but not now
// (its directory made read-only since) is a conflict, even with force;
// its own file it may still change in place.
func TestLayerCommitOnlyWhatTheOwnerMayStillDo(t *testing.T) {
	backing, state := layerFixture(t)
	must(t, os.Chmod(backing+"/src", 0o777))
	must(t, os.Chown(backing+"/src/a.txt", 65534, 65534))
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true,
		Owner: 65534, As: &Owner{UID: 65534, GID: 65534}})
	must(t, err)
	defer l.Remove()
	change(t, l, "/src/new.txt", func(p string) error {
		if err := os.WriteFile(p, []byte("staged"), 0o644); err != nil {
			return err
		}
		return os.Chown(p, 65534, 65534)
	})
	change(t, l, "/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("own, changed"), 0o644) })
	must(t, os.Chmod(backing+"/src", 0o755)) // root's, read-only to others now
	for i, force := range []bool{false, true} {
		res, err := l.Commit(nil, force)
		if err != nil || res.Committed != 1-i || len(res.Conflicts) != 1 || res.Conflicts[0].Path != "/src/new.txt" {
			t.Fatalf("force %v: commit into a directory the owner may no longer write: %+v %v", force, res, err)
		}
	}
	if _, err := os.Lstat(backing + "/src/new.txt"); err == nil {
		t.Fatal("a file was made where its owner may not write")
	}
	if b, _ := os.ReadFile(backing + "/src/a.txt"); string(b) != "own, changed" {
		t.Fatalf("the owner's own file: %q", b)
	}
	if fi, err := os.Stat(backing + "/src"); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("the directory's mode set since (the layer's copy has the mode it had): %v %v", fi, err)
	}
}

// TestLayerDiscardNeverPutsBackBeyondMaxBytes: a discard takes the
// session's entries out of the layer and copies nothing into it: a session
// that removed a tree larger than max_bytes and discarded holds nothing
// after, and sees the tree again.
func TestLayerDiscardNeverPutsBackBeyondMaxBytes(t *testing.T) {
	backing, state := layerFixture(t)
	must(t, os.Mkdir(backing+"/big", 0o755))
	for _, n := range []string{"a", "b", "c"} {
		must(t, os.WriteFile(backing+"/big/"+n, make([]byte, 1<<20), 0o644))
	}
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true, MaxBytes: 1 << 20})
	must(t, err)
	defer l.Remove()
	for _, n := range []string{"/big/a", "/big/b", "/big/c", "/big", "/keep.txt"} {
		change(t, l, n, os.Remove)
	}
	if res, err := l.Discard(nil); err != nil || res.Discarded != 2 {
		t.Fatalf("a discard of a removed 3 MiB tree under max_bytes 1 MiB: %+v %v", res, err)
	}
	if u := l.Use(); u.Bytes != 0 {
		t.Fatalf("the layer after the discard: %+v", u)
	}
	if got := diffLines(t, l); len(got) != 0 {
		t.Fatalf("changes after the discard: %v", got)
	}
	for _, p := range []string{"/big/a", "/big/c", "/keep.txt"} {
		if _, err := os.Stat(l.Merged("workspace") + p); err != nil {
			t.Fatalf("%s after the discard: %v", p, err)
		}
	}
}

// TestLayerSelectorsNameAPathAndWhatIsBelowIt: a selector takes its path
// and what is below it, never a sibling sharing its prefix; many
// selectors are looked up as a set (a request may name 100,000).
func TestLayerSelectorsNameAPathAndWhatIsBelowIt(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	change(t, l, "/src/b.txt", func(p string) error { return os.WriteFile(p, []byte("b"), 0o644) })
	change(t, l, "/srcx", func(p string) error { return os.WriteFile(p, []byte("x"), 0o644) })
	change(t, l, "/new.txt", func(p string) error { return os.WriteFile(p, []byte("n"), 0o644) })
	paths := []string{"workspace/src"}
	for i := 0; i < 100000; i++ {
		paths = append(paths, "workspace/none/"+strconv.Itoa(i))
	}
	sel, err := l.ParseSelectors(paths)
	must(t, err)
	res, err := l.Commit(sel, false)
	if err != nil || res.Committed != 1 {
		t.Fatalf("commit of workspace/src: %+v %v", res, err)
	}
	if got := diffLines(t, l); strings.Join(got, ",") != "A workspace/new.txt,A workspace/srcx" {
		t.Fatalf("left after a commit of workspace/src: %v", got)
	}
	sel, err = l.ParseSelectors([]string{"/workspace"})
	must(t, err)
	if res, err := l.Discard(sel); err != nil || res.Discarded != 2 {
		t.Fatalf("discard of the space: %+v %v", res, err)
	}
}

// TestLayerDiscardOfOneNameUnderARemadeDirectory: a directory removed and
// made again hides every backing entry below it (an opaque directory of
// the layer); discarding the removal of one of them shows that one again,
// and only that one, and what the session made there stays.
func TestLayerDiscardOfOneNameUnderARemadeDirectory(t *testing.T) {
	backing, state := layerFixture(t)
	must(t, os.WriteFile(backing+"/src/c.txt", []byte("c\n"), 0o644))
	must(t, os.Mkdir(backing+"/src/deep", 0o755))
	must(t, os.WriteFile(backing+"/src/deep/d.txt", []byte("d\n"), 0o644))
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	merged := l.Merged("workspace")
	change(t, l, "/src", os.RemoveAll)
	change(t, l, "/src", func(p string) error { return os.Mkdir(p, 0o755) })
	change(t, l, "/src/deep", func(p string) error { return os.Mkdir(p, 0o755) })
	change(t, l, "/src/b.txt", func(p string) error { return os.WriteFile(p, []byte("b\n"), 0o644) })
	sel, err := l.ParseSelectors([]string{"workspace/src/a.txt"})
	must(t, err)
	if res, err := l.Discard(sel); err != nil || res.Discarded != 1 {
		t.Fatalf("discard src/a.txt: %+v %v", res, err)
	}
	if b, err := os.ReadFile(merged + "/src/a.txt"); err != nil || string(b) != "one\n" {
		t.Fatalf("src/a.txt after its discard: %q %v", b, err)
	}
	names, _ := os.ReadDir(merged + "/src")
	var got []string
	for _, n := range names {
		got = append(got, n.Name())
	}
	if strings.Join(got, ",") != "a.txt,b.txt,deep" {
		t.Fatalf("src after discarding a.txt: %v", got)
	}
	if _, err := os.Lstat(merged + "/src/deep/d.txt"); !os.IsNotExist(err) {
		t.Fatalf("a name still removed came back: %v", err)
	}
	if got := diffLines(t, l); strings.Join(got, ",") != "A workspace/src/b.txt,D workspace/src/c.txt,D workspace/src/deep/d.txt" {
		t.Fatalf("diff after the discard: %v", got)
	}
	if _, err := l.Discard(nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(merged + "/src/deep/d.txt"); err != nil || string(b) != "d\n" {
		t.Fatalf("after discarding all: %q %v", b, err)
	}
	if got := diffLines(t, l); len(got) != 0 {
		t.Fatalf("changes left: %v", got)
	}
}

// TestLayerCommitCutShortLeavesNoTemporary: a commit stopped between
// writing a file under its temporary name and renaming it over the target
// (as a daemon killed there is) leaves the temporary beside the target;
// the layer, opened again, removes it, and the commit run again ends as
// one not cut short.
func TestLayerCommitCutShortLeavesNoTemporary(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	change(t, l, "/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("two\n"), 0o644) })
	var tmp string
	testHookTemp = func(p, name string) {
		tmp = name
		runtime.Goexit() // the commit stops here, its temporary made
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Commit(nil, false)
	}()
	<-done
	testHookTemp = nil
	if _, err := os.Lstat(filepath.Join(backing, "src", tmp)); tmp == "" || err != nil {
		t.Fatalf("the commit cut short left no temporary %q: %v", tmp, err)
	}
	must(t, l.Close())
	l = openTestLayer(t, state, backing, false)
	defer l.Remove()
	if names, _ := os.ReadDir(filepath.Join(backing, "src")); len(names) != 1 || names[0].Name() != "a.txt" {
		t.Fatalf("after the layer opened again, src holds %v", names)
	}
	res, err := l.Commit(nil, false)
	if err != nil || res.Committed != 1 {
		t.Fatalf("the commit run again: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(backing, "src", "a.txt")); string(b) != "two\n" {
		t.Fatalf("a.txt: %q", b)
	}
}

// TestLayerCommitNeverAppliesAFileWrittenWhileCopied: a file the session
// writes while a commit copies it is left as a conflict, the backing tree
// keeps its file and no temporary stays beside it; the commit run again
// applies what the session wrote last.
func TestLayerCommitNeverAppliesAFileWrittenWhileCopied(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	change(t, l, "/src/a.txt", func(p string) error { return os.WriteFile(p, []byte("two\n"), 0o644) })
	testHookCopied = func(p string) {
		testHookCopied = nil
		f, err := os.OpenFile(filepath.Join(l.Merged("workspace"), p), os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		_, err = f.WriteString("three\n")
		must(t, err)
		must(t, f.Close())
	}
	defer func() { testHookCopied = nil }()
	res, err := l.Commit(nil, false)
	if err != nil || res.Committed != 0 || len(res.Conflicts) != 1 || !strings.Contains(res.Conflicts[0].Reason, "written in the session while it was committed") {
		t.Fatalf("a commit of a file written during its copy: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(backing + "/src/a.txt"); string(b) != "one\n" {
		t.Fatalf("the backing file after a torn copy: %q", b)
	}
	if names, _ := os.ReadDir(backing + "/src"); len(names) != 1 {
		t.Fatalf("src holds %v after the torn copy", names)
	}
	if res, err = l.Commit(nil, false); err != nil || res.Committed != 1 {
		t.Fatalf("the commit run again: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(backing + "/src/a.txt"); string(b) != "two\nthree\n" {
		t.Fatalf("the backing file after the commit run again: %q", b)
	}
}

// TestLayerRefusesAStateDirectoryTheMountOptionsCannotName: the upper and
// work directories are named in overlayfs's option string, where a comma
// would begin an option of the state directory's choosing.
func TestLayerRefusesAStateDirectoryTheMountOptionsCannotName(t *testing.T) {
	backing, _ := layerFixture(t)
	for _, name := range []string{"a,lowerdir=x", "a:b", `a\b`} {
		state := filepath.Join(t.TempDir(), name)
		must(t, os.MkdirAll(state, 0o700))
		must(t, os.WriteFile(filepath.Join(state, "kept"), nil, 0o600))
		if l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true}); err == nil {
			l.Close()
			t.Fatalf("state directory %q: opened", state)
		} else if !strings.Contains(err.Error(), "state directory") {
			t.Errorf("state directory %q: %v; want an error naming it", state, err)
		}
		if _, err := os.Stat(filepath.Join(state, "kept")); err != nil {
			t.Errorf("state directory %q: what it held is gone: %v", state, err)
		}
	}
}
