package fsys

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/condfs/condfs/changes"
)

// TestChangesThroughAMountAreUndone: every kind of change a program makes
// through a mounted view (write, truncate, O_TRUNC, create, mkdir,
// symlink, chmod, unlink, rmdir, rename of a file and of a directory,
// writes through a file opened before the checkpoint) is recorded at the
// choke point and undone by a rollback; before a checkpoint nothing is
// recorded.
func TestChangesThroughAMountAreUndone(t *testing.T) {
	canMount(t)
	mem, work, mnt := t.TempDir(), t.TempDir(), t.TempDir()
	rules, host := testRulesHost(t, mountRules)
	st, err := changes.Open(changes.Options{Dir: filepath.Join(t.TempDir(), "c"), Roots: map[string]string{"memories": mem, "workspace": work}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	v, err := host.Mount(Options{Mountpoint: mnt, Memories: mem, Workspace: work, Rules: rules, Context: dm, Owner: uint32(os.Getuid())})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Unmount()
	v.SetChanges(st)
	defer v.SetChanges(nil)
	sh(t, mnt, `cd workspace && printf 'one\n' > a && printf 'two\n' > b && mkdir d && printf x > d/x && ln -s a l && chmod 640 a`)
	if u := st.Use(); u.Bytes != 0 {
		t.Fatalf("recorded before a checkpoint: %+v", u)
	}
	want := snapshotTree(t, work)
	cp, _, err := st.Create("c", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	out := sh(t, mnt, `cd workspace && exec 3>>b && printf 'appended\n' >&3 &&
		printf 'new\n' > a && chmod 600 a && truncate -s 1 a && : > b &&
		mkdir nd && printf f > nd/f && mv nd nd2 && ln -s nd2 l2 && rm l && ln -s b l &&
		rm d/x && rmdir d && mv b c && printf late >&3 && echo ok`)
	if out != "ok" {
		t.Fatalf("changes through the view: %q", out)
	}
	res, err := st.Rollback(cp.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 0 {
		t.Fatalf("conflicts: %+v", res.Conflicts)
	}
	if got := snapshotTree(t, work); !equalTrees(got, want) {
		t.Fatalf("after rollback:\n%v\nwant\n%v", got, want)
	}
	if got := sh(t, mnt, "cat workspace/a workspace/b"); got != "one\ntwo" {
		t.Fatalf("through the view after rollback: %q", got)
	}
}

func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		d := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			d += " " + string(b) + " " + fi.ModTime().String()
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			d += " -> " + l
		}
		out[p[len(root):]] = d
		return nil
	})
	return out
}

func equalTrees(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
