package changes

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

// viewState is what uid 65534 sees below dir: each entry's type, mode,
// size and symlink target, and each file's content.
func viewState(t *testing.T, dir string) string {
	t.Helper()
	return testenv.ShAsNobody(t, dir, `find . -printf '%p %y %m %s %l\n' | sort; find . -type f | sort | xargs -r md5sum`)
}

// TestStagedRollbackGivesTheViewOfItsCheckpoint: a staged session keeps
// checkpoints of its layer; every kind of change made after one, by file
// tools and by a command in condfs run, is undone by a rollback to it (the
// view shows again exactly what it showed then), what was staged before it
// stays staged, and the backing tree never changes. A commit drops the
// checkpoints.
func TestStagedRollbackGivesTheViewOfItsCheckpoint(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	start := testenv.BackingTree(t, ws)
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'before\n' >> a.txt && mkdir kept && printf k > kept/k.txt`)
	at := viewState(t, mnt+"/workspace")
	if got := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "checkpoint", "s", "--name", "c1"); !strings.Contains(got, "c1") {
		t.Fatalf("ctl checkpoint: %s", got)
	}
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'after\n' >> a.txt && chmod 600 a.txt && rm gone.txt && rm -r d && mkdir d && printf y > d/y.txt && mv kept moved && ln -s moved/k.txt l2 && rm l`)
	if out, code := testenv.CondfsRun(t, d, "", "--cwd", "/workspace", "--", "sh", "-c", `printf run > r.txt && mkdir -p deep/er && printf e > deep/er/e.txt`); code != 0 {
		t.Fatalf("condfs run: %d %s", code, out)
	}
	if got := viewState(t, mnt+"/workspace"); got == at {
		t.Fatal("the changes after the checkpoint did not show")
	}
	var res struct {
		Restored  int
		Conflicts []struct{ Space, Path, Reason string }
	}
	d.Call("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "c1"}, &res)
	if len(res.Conflicts) != 0 || res.Restored == 0 {
		t.Fatalf("rollback: %+v", res)
	}
	if got := viewState(t, mnt+"/workspace"); got != at {
		t.Fatalf("the view after the rollback:\n%s\nwant, as at the checkpoint:\n%s", got, at)
	}
	want := []string{"A workspace/kept/", "A workspace/kept/k.txt", "M workspace/a.txt"}
	if got, _ := stagedDiff(d, "s"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("diff after the rollback: %v, want %v", got, want)
	}
	sameBacking(t, "the backing tree after the rollback", start, testenv.BackingTree(t, ws))

	// A later change and a second rollback to the same checkpoint.
	testenv.ShAsNobody(t, mnt+"/workspace", `rm -r kept a.txt`)
	d.Call("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "c1"}, &res)
	if got := viewState(t, mnt+"/workspace"); got != at {
		t.Fatalf("the view after a second rollback:\n%s\nwant:\n%s", got, at)
	}

	var r commitResult
	d.Call("changes.commit", map[string]any{"session": "s"}, &r)
	if r.Committed != 3 || len(r.Conflicts) != 0 {
		t.Fatalf("commit: %+v", r)
	}
	var list struct{ Checkpoints []any }
	d.Call("checkpoint.list", map[string]any{"session": "s"}, &list)
	if len(list.Checkpoints) != 0 {
		t.Fatalf("checkpoints after a commit: %v", list.Checkpoints)
	}
	d.CallErr("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "c1"}, control.CodeUnknownCheckpoint)
	if b, _ := os.ReadFile(ws + "/a.txt"); string(b) != "alpha\nbefore\n" {
		t.Fatalf("a.txt committed: %q", b)
	}
	for _, want := range []string{`"op":"rollback"`, `"op":"dropped"`, `"reason":"commit"`} {
		if !strings.Contains(d.Log(), want) {
			t.Errorf("the audit lacks %s", want)
		}
	}
}

// TestStagedCheckpointsComeBackAfterKill: a staged session's checkpoints
// are kept under the state directory with its layer; after kill -9 and a
// restart, a rollback to one still gives its view back.
func TestStagedCheckpointsComeBackAfterKill(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	testenv.ShAsNobody(t, mnt+"/workspace", `printf kept > k.txt`)
	at := viewState(t, mnt+"/workspace")
	d.Call("checkpoint.create", map[string]any{"session": "s", "name": "c1"}, nil)
	testenv.ShAsNobody(t, mnt+"/workspace", `rm k.txt a.txt && printf lost > lost.txt`)
	d.Cmd.Process.Signal(syscall.SIGKILL)
	<-d.Exited()
	os.Remove(d.Socket)
	d2 := testenv.Start(t, d.Home, "--allow-uid", "65534", "--socket-mode", "0666")
	d2.Call("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "c1"}, nil)
	if got := viewState(t, mnt+"/workspace"); got != at {
		t.Fatalf("the view after a rollback across a crash:\n%s\nwant:\n%s\n%s", got, at, testenv.Tail(d2.Log(), 20))
	}
}

// TestStagedRollbackNeverWritesIntoAFileTheSessionHolds: a rollback gives
// a path back a file's content, owner and mode in a new file unless the
// path still holds the very inode the checkpoint had there. A file of the
// session's, held open and renamed over a copy of root's file, stays the
// session's: were the restore made into it, the descriptor would write
// the content of a root-owned file, which a commit carries into the
// backing tree as root's.
func TestStagedRollbackNeverWritesIntoAFileTheSessionHolds(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/rootfile", "root's\n") // root's, 0644, in the 0777 workspace
	})
	ws := mnt + "/workspace"
	testenv.ShAsNobody(t, ws, `mv rootfile g && printf mine > mine`)
	at := viewState(t, ws)
	first, held := testenv.ConverseAsNobody(t, "hold2", ws+"/mine", "rw")
	if first != "open" {
		t.Fatalf("hold2: %s", first)
	}
	d.Call("checkpoint.create", map[string]any{"session": "s", "name": "c1"}, nil)
	testenv.ShAsNobody(t, ws, `mv mine g`)
	var res struct {
		Restored  int
		Conflicts []struct{ Space, Path, Reason string }
	}
	d.Call("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "c1"}, &res)
	if got := held("w evil"); got != "wrote" {
		t.Fatalf("write through the held descriptor: %s", got)
	}
	if got := testenv.ShAsNobody(t, ws, `stat -c '%u %s' g mine && cat g`); got != "0 7\n65534 4\nroot's" {
		t.Fatalf("g and mine after the rollback and a write through the descriptor held:\n%s", got)
	}
	if got := viewState(t, ws); got != at {
		t.Fatalf("the view after the rollback:\n%s\nwant, as at the checkpoint:\n%s", got, at)
	}
	var r commitResult
	d.Call("changes.commit", map[string]any{"session": "s"}, &r)
	if b, err := os.ReadFile(d.Home.Path("workspace/g")); err != nil || string(b) != "root's\n" {
		t.Fatalf("g committed: %q %v (commit %+v)", b, err, r)
	}
}
