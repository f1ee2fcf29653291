package changes

import (
	"os"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestUnprivilegedDaemonStagesChanges: a daemon that is not root keeps a
// staged session's changes in its layer (mounted in a user namespace of
// its own, attached nowhere): the backing tree and another session see
// none of them until the commit; a checkpoint is rolled back to, a path
// discarded, the rest committed; a file held open and locked across each
// remount stays locked.
func TestUnprivilegedDaemonStagesChanges(t *testing.T) {
	d, h, mnt, other := unprivilegedStagedHome(t)
	ws := mnt + "/workspace"

	testenv.ShAsNobody(t, ws, `printf l > l.txt`)
	first, holder := testenv.ConverseAsNobody(t, "locker", ws+"/l.txt")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	if got := holder("ofd w nb"); got != "ok" {
		t.Fatalf("lock: %s", got)
	}
	testenv.ShAsNobody(t, ws, `printf changed > a.txt && printf new > n.txt && rm gone.txt && mkdir dd && printf y > dd/y.txt && mv d e`)
	if got := testenv.ShAsNobody(t, ws, `cat a.txt n.txt dd/y.txt e/x.txt; ls`); got != "changednewyx\na.txt\ndd\ne\nl.txt\nn.txt" {
		t.Fatalf("the staged view: %q", got)
	}
	if got := testenv.ShAsNobody(t, other+"/workspace", `cat a.txt gone.txt d/x.txt; ls`); got != "alpha\ngone\nx\na.txt\nd\ngone.txt" {
		t.Fatalf("another session sees the staged changes: %q", got)
	}
	if got, _ := os.ReadFile(h.Path("workspace/a.txt")); string(got) != "alpha\n" {
		t.Fatalf("the backing tree changed before the commit: %q", got)
	}
	want := "A workspace/dd/ A workspace/dd/y.txt A workspace/e/ A workspace/e/x.txt A workspace/l.txt A workspace/n.txt D workspace/d/ D workspace/gone.txt M workspace/a.txt"
	if got, _ := stagedDiff(d, "s"); strings.Join(got, " ") != want {
		t.Fatalf("changes:\n%s\nwant\n%s", strings.Join(got, " "), want)
	}

	d.Call("checkpoint.create", map[string]any{"session": "s", "name": "one"}, nil)
	testenv.ShAsNobody(t, ws, `printf again > a.txt && rm n.txt`)
	d.Call("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "one"}, nil)
	if got := testenv.ShAsNobody(t, ws, `cat a.txt n.txt`); got != "changednew" {
		t.Fatalf("after the rollback: %q", got)
	}
	d.Call("changes.discard", map[string]any{"session": "s", "paths": []string{"workspace/n.txt"}}, nil)
	first, other2 := testenv.ConverseAsNobody(t, "locker", ws+"/l.txt")
	if first != "open" {
		t.Fatalf("open after the remounts: %s", first)
	}
	if got := other2("ofd w nb"); got != "errno EAGAIN" {
		t.Fatalf("a lock held across the remounts: another descriptor's lock answers %s", got)
	}
	var res commitResult
	d.Call("changes.commit", map[string]any{"session": "s"}, &res)
	if len(res.Conflicts) != 0 || res.Committed == 0 {
		t.Fatalf("commit: %+v", res)
	}
	got := testenv.BackingTree(t, h.Path("workspace"))
	for p, want := range map[string]string{"/a.txt": `"changed"`, "/l.txt": `"l"`, "/dd/y.txt": `"y"`, "/e/x.txt": `"x\n"`} {
		if !strings.Contains(got[p], want) {
			t.Errorf("after the commit the backing %s is %s, want %s", p, got[p], want)
		}
	}
	for _, p := range []string{"/n.txt", "/gone.txt", "/d"} {
		if _, ok := got[p]; ok {
			t.Errorf("after the commit the backing tree has %s", p)
		}
	}
	if got := holder("ofd un"); got != "ok" {
		t.Fatalf("unlock: %s", got)
	}
}

// unprivilegedStagedHome starts a daemon as uid 65534 over a home of its
// own, with a staged session s and a direct session o.
func unprivilegedStagedHome(t *testing.T) (d *testenv.Daemon, h *testenv.Home, mnt, other string) {
	testenv.RequireUnprivilegedFUSE(t)
	h = testenv.OpenHome(t, testenv.ChangesRules)
	h.Write("workspace/a.txt", "alpha\n")
	h.Write("workspace/gone.txt", "gone\n")
	h.Write("workspace/d/x.txt", "x\n")
	os.MkdirAll(h.Path("run"), 0o755)
	testenv.ChownTree(t, h.Root, testenv.Nobody)
	d = testenv.StartUnder(t, h, testenv.AsUID(testenv.Nobody))
	mnt, other = h.Path("mnt/s"), h.Path("mnt/o")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": testenv.DM, "owner": testenv.Nobody, "changes": "staged"}, nil)
	d.Call("session.open", map[string]any{"id": "o", "mount": other, "context": testenv.DM, "owner": testenv.Nobody}, nil)
	return d, h, mnt, other
}

// TestUnprivilegedStagedViewShowsFileReplacedInBacking: a daemon that is
// not root has no fanotify watch of the backing filesystem, yet a backing
// file another writer replaces by rename, and a directory removed and
// made again, show in its staged view that had looked them up: the view's
// watch of the backing directories it looked up tells the layer, which is
// mounted afresh.
func TestUnprivilegedStagedViewShowsFileReplacedInBacking(t *testing.T) {
	_, h, mnt, _ := unprivilegedStagedHome(t)
	view := mnt + "/workspace"
	if got := testenv.ShAsNobody(t, view, `cat a.txt d/x.txt && printf n > new.txt`); got != "alpha\nx" {
		t.Fatalf("before: %q", got)
	}
	ws := h.Path("workspace")
	replaceByRename(t, ws+"/a.txt", "renamed over\n")
	eventually(t, view, `cat a.txt`, "renamed over", "a file replaced by rename")
	remakeDir(t, ws+"/d", "y.txt", "y\n")
	eventually(t, view, `ls d; cat d/y.txt`, "y.txt\ny", "a directory removed and made again")
	if got := testenv.ShAsNobody(t, view, `cat new.txt`); got != "n" {
		t.Fatalf("the session's own change after the remounts: %q", got)
	}
}

// TestUnprivilegedStagedViewKeepsItsBackingRootWhenItsPathIsReplaced: a
// writer of the backing root's parent who renames the backing directory
// away and puts a symlink to another directory at its path changes nothing
// the staged view serves: a mount of the layer stacks it over the
// directory the layer opened (the one its changes are diffed against and
// committed to) or is refused, never over whatever the path names at the
// time, and the view keeps the mount it had.
func TestUnprivilegedStagedViewKeepsItsBackingRootWhenItsPathIsReplaced(t *testing.T) {
	d, h, mnt, _ := unprivilegedStagedHome(t)
	view := mnt + "/workspace"
	if got := testenv.ShAsNobody(t, view, `cat a.txt && printf n > n.txt`); got != "alpha" {
		t.Fatalf("before: %q", got)
	}
	h.Write("elsewhere/secret.txt", "secret\n")
	testenv.ChownTree(t, h.Path("elsewhere"), testenv.Nobody)
	ws := h.Path("workspace")
	if err := os.Rename(ws, ws+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(h.Path("elsewhere"), ws); err != nil {
		t.Fatal(err)
	}
	// A discard mounts the layer again: refused, the path leads elsewhere.
	if e := d.CallErr("changes.discard", map[string]any{"session": "s", "paths": []string{"workspace/n.txt"}}, -32603); !strings.Contains(e.Message, "no symlink") {
		t.Fatalf("the remount over a replaced backing root: %s", e.Message)
	}
	if got := testenv.ShAsNobody(t, view, `cat a.txt; ls`); got != "alpha\na.txt\nd\ngone.txt" {
		t.Fatalf("after the backing root's path was replaced by a symlink the view shows %q", got)
	}
}
