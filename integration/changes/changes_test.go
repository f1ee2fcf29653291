package changes

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

func sameBacking(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	if diffs := testenv.TreeDiff(want, got); len(diffs) > 0 {
		t.Fatalf("%s:\n%s", what, strings.Join(diffs, "\n"))
	}
}

// TestChangesRollbackUndoesFileToolsAndRuns: every kind of change made by
// an unprivileged caller through a view, by file tools and by a command in
// condfs run, is undone by a rollback to the checkpoint before it, back to
// content, type, mode, target and mtime; several checkpoints roll back in
// turn; ctl shows the diff like git status.
func TestChangesRollbackUndoesFileToolsAndRuns(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/a.txt", "alpha\n")
		h.Write("workspace/d/x.txt", "x\n")
		os.Symlink("a.txt", h.Path("workspace/l"))
		for _, p := range []string{"workspace/a.txt", "workspace/d/x.txt", "workspace/d", "workspace/l"} {
			os.Lchown(h.Path(p), testenv.Nobody, testenv.Nobody)
		}
	})
	ws := d.Home.Path("workspace")
	start := testenv.BackingTree(t, ws)
	cp := testenv.Checkpoint(d, "s", "start")
	out, code := testenv.CondfsRun(t, d, "", "--cwd", "/workspace", "--", "sh", "-c",
		`truncate -s 2 a.txt && mkdir rd && printf g > rd/g && mv d/x.txt d/y.txt && printf run > r.txt && chmod 600 r.txt`)
	if code != 0 {
		t.Fatalf("condfs run: %d %s\n%s", code, out, testenv.Tail(d.Log(), 30))
	}
	mid := testenv.BackingTree(t, ws)
	cp2 := testenv.Checkpoint(d, "s", "mid")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'tool\n' >> a.txt && chmod 640 a.txt && rm d/y.txt && rmdir d && mv rd rd2 && ln -s rd2 l2 && rm l && ln -s r.txt l`)
	diff := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "diff", "s", "--since", "mid", "--content")
	for _, want := range []string{"M workspace/a.txt", "D workspace/d/", "D workspace/rd/", "A workspace/rd2/", "A workspace/l2", "M workspace/l", "+altool"} {
		if !strings.Contains(diff, want) {
			t.Errorf("ctl diff lacks %q:\n%s", want, diff)
		}
	}
	if r := testenv.Rollback(d, "s", cp2, false); len(r.Conflicts) != 0 {
		t.Fatalf("rollback to mid: %+v", r.Conflicts)
	}
	sameBacking(t, "after the rollback to mid", mid, testenv.BackingTree(t, ws))
	if got := testenv.ShAsNobody(t, mnt+"/workspace", "cat a.txt; echo; ls"); got != "al\na.txt\nd\nl\nr.txt\nrd\nw.txt" {
		t.Fatalf("the view after the rollback: %q", got)
	}
	r := testenv.Rollback(d, "s", cp, false)
	if len(r.Conflicts) != 0 {
		t.Fatalf("rollback to start: %+v", r.Conflicts)
	}
	sameBacking(t, "after the rollback to start", start, testenv.BackingTree(t, ws))
	var list struct {
		Checkpoints []struct{ ID, Name string }
	}
	d.Call("checkpoint.list", map[string]any{"session": "s"}, &list)
	if len(list.Checkpoints) != 1 || list.Checkpoints[0].Name != "start" {
		t.Fatalf("checkpoints after rolling back to the first: %+v", list.Checkpoints)
	}
}

// TestChangesConflictsAreReportedUnlessForced: a file changed in the
// backing tree after the session changed it is left as it is and reported;
// with force it is restored. The rest is restored either way.
func TestChangesConflictsAreReportedUnlessForced(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/a.txt", "alpha\n")
		os.Chown(h.Path("workspace/a.txt"), testenv.Nobody, testenv.Nobody)
	})
	ws := d.Home.Path("workspace")
	cp := testenv.Checkpoint(d, "s", "")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'session\n' > a.txt && printf b > b.txt`)
	time.Sleep(10 * time.Millisecond)
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("outside\n"), 0o644)
	r := testenv.Rollback(d, "s", cp, false)
	if len(r.Conflicts) != 1 || r.Conflicts[0].Path != "/a.txt" || r.Conflicts[0].Space != "workspace" {
		t.Fatalf("conflicts: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "outside\n" {
		t.Fatalf("a conflict was overwritten: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(ws, "b.txt")); !os.IsNotExist(err) {
		t.Fatalf("b.txt was not removed: %v", err)
	}
	cp = testenv.Checkpoint(d, "s", "")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'session again\n' > a.txt`)
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("outside again\n"), 0o644)
	out := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "rollback", "s", cp)
	if !strings.Contains(out, "conflict workspace/a.txt") {
		t.Fatalf("ctl rollback: %s", out)
	}
	if r := testenv.Rollback(d, "s", cp, true); len(r.Conflicts) != 0 {
		t.Fatalf("forced: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "outside\n" {
		t.Fatalf("forced rollback: %q", b)
	}
}

// TestChangesSurviveACrash: checkpoints come back with their session after
// kill -9, and a rollback then restores what the session changed before.
func TestChangesSurviveACrash(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/a.txt", "alpha\n")
		os.Chown(h.Path("workspace/a.txt"), testenv.Nobody, testenv.Nobody)
	})
	ws := d.Home.Path("workspace")
	start := testenv.BackingTree(t, ws)
	testenv.Checkpoint(d, "s", "before")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'crashed\n' > a.txt && printf n > n.txt && mkdir m`)
	d.Cmd.Process.Signal(syscall.SIGKILL)
	<-d.Exited()
	os.Remove(d.Socket)
	d2 := testenv.Start(t, d.Home, "--allow-uid", "65534", "--socket-mode", "0666")
	r := testenv.Rollback(d2, "s", "before", false)
	if len(r.Conflicts) != 0 || r.Restored != 3 {
		t.Fatalf("rollback after the crash: %+v\n%s", r, d2.Log())
	}
	sameBacking(t, "after a crash and a rollback", start, testenv.BackingTree(t, ws))
	if got := testenv.ShAsNobody(t, mnt+"/workspace", "cat a.txt; ls"); got != "alpha\na.txt\nw.txt" {
		t.Fatalf("the restored view: %q", got)
	}
}

// TestChangesBadInputs: each bad input is answered with its code and
// changes nothing.
func TestChangesBadInputs(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/a.txt", "alpha\n")
		os.Chown(h.Path("workspace/a.txt"), testenv.Nobody, testenv.Nobody)
	})
	cp := testenv.Checkpoint(d, "s", "one")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf changed > a.txt`)
	d.CallErr("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "nope"}, control.CodeUnknownCheckpoint)
	d.CallErr("changes.diff", map[string]any{"session": "s", "since": "nope"}, control.CodeUnknownCheckpoint)
	d.CallErr("checkpoint.create", map[string]any{"session": "s", "name": "one"}, control.CodeInvalidParams)
	d.CallErr("checkpoint.create", map[string]any{"session": "s", "name": "../x"}, control.CodeInvalidParams)
	d.CallErr("changes.commit", map[string]any{"session": "s"}, control.CodeNotStaged)
	d.CallErr("changes.discard", map[string]any{"session": "s"}, control.CodeNotStaged)
	d.CallErr("session.open", map[string]any{"id": "st", "mount": d.Home.Path("mnt/st"), "context": testenv.DM, "changes": "later"}, control.CodeInvalidParams)
	// Another uid's session: root opens one, 65534 asks for it.
	d.OpenFor("roots", 0, testenv.DM)
	testenv.Checkpoint(d, "roots", "")
	out := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "--json", "call", "checkpoint.rollback", `{"session":"roots","checkpoint":"1"}`)
	if !strings.Contains(out, "another user") {
		t.Fatalf("another uid's session: %s", out)
	}
	if b, _ := os.ReadFile(d.Home.Path("workspace/a.txt")); string(b) != "changed" {
		t.Fatalf("a refused request changed the tree: %q", b)
	}
	var list struct{ Checkpoints []json.RawMessage }
	d.Call("checkpoint.list", map[string]any{"session": "s"}, &list)
	if len(list.Checkpoints) != 1 {
		t.Fatalf("checkpoints: %d", len(list.Checkpoints))
	}
	_ = cp
}

// TestChangesLimits: a change that would take the session's checkpoints
// past [changes] max_bytes answers ENOSPC to the caller, is audited, and
// changes nothing; beyond max_checkpoints the oldest is dropped; status
// shows the session's use.
func TestChangesLimits(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules+"\n[changes]\nmax_bytes = \"64KiB\"\nmax_checkpoints = 2\n", func(h *testenv.Home) {
		h.Write("workspace/big.bin", strings.Repeat("b", 128<<10))
		h.Write("workspace/small.txt", "s\n")
		os.Chown(h.Path("workspace/big.bin"), testenv.Nobody, testenv.Nobody)
		os.Chown(h.Path("workspace/small.txt"), testenv.Nobody, testenv.Nobody)
	})
	first := testenv.Checkpoint(d, "s", "")
	out := testenv.ShAsNobody(t, mnt+"/workspace", `printf x > big.bin 2>&1 || echo refused; printf t > small.txt; echo done`)
	if !strings.Contains(out, "No space left on device") || !strings.Contains(out, "refused") {
		t.Fatalf("a change beyond max_bytes: %q", out)
	}
	if b, _ := os.ReadFile(d.Home.Path("workspace/big.bin")); len(b) != 128<<10 {
		t.Fatalf("a refused change was made: %d bytes", len(b))
	}
	if !strings.Contains(d.Log(), `"op":"enospc"`) {
		t.Fatalf("ENOSPC not audited:\n%s", testenv.Tail(d.Log(), 20))
	}
	testenv.Checkpoint(d, "s", "")
	testenv.Checkpoint(d, "s", "")
	d.CallErr("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": first}, control.CodeUnknownCheckpoint)
	if !strings.Contains(d.Log(), `"op":"dropped"`) {
		t.Fatalf("a dropped checkpoint not audited:\n%s", testenv.Tail(d.Log(), 20))
	}
	var st struct {
		Sessions []struct {
			ID      string
			Changes *struct{ Checkpoints int } `json:"changes"`
		}
	}
	d.Call("status", nil, &st)
	if len(st.Sessions) != 1 || st.Sessions[0].Changes == nil || st.Sessions[0].Changes.Checkpoints != 2 {
		t.Fatalf("status: %+v", st.Sessions)
	}
}

// shellAnswer is the result of an attacker shell's "ok" answer, or the
// answer itself when it is not one.
func shellAnswer(line string) string {
	if rest, ok := strings.CutPrefix(line, "ok "); ok {
		if s, err := strconv.Unquote(rest); err == nil {
			return s
		}
	}
	return line
}

// TestChangesRollbackIsInForceWhenItAnswers: once checkpoint.rollback has
// answered, an unprivileged caller's view shows the restored state at once,
// with no window where the kernel's cache still answers for the rolled-back
// one: stat, read and listing of each restored path (a file restored in
// place, one removed, one brought back, a directory made, a directory
// moved and a file changed in it before the move), and a descriptor opened
// before the rollback, whose pages the kernel caches, reads the restored
// content. 50 times.
func TestChangesRollbackIsInForceWhenItAnswers(t *testing.T) {
	const orig, xOrig = "alpha original content\n", "x original\n"
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/a.txt", orig)
		h.Write("workspace/c.txt", "c\n")
		h.Write("workspace/d/x.txt", xOrig)
		testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	})
	ws := mnt + "/workspace"
	_, say := testenv.ConverseAsNobody(t, "shell2", "-")
	ok := func(cmd string) string {
		t.Helper()
		a := say(cmd)
		if !strings.HasPrefix(a, "ok ") {
			t.Fatalf("%s: %s", cmd, a)
		}
		return shellAnswer(a)
	}
	want := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %q, want %q", what, got, want)
		}
	}
	sortedLs := func(dir string) string {
		names := strings.Split(ok("ls "+dir), "/")
		sort.Strings(names)
		return strings.Join(names, " ")
	}
	h := ok("open " + ws + "/a.txt")
	cp := testenv.Checkpoint(d, "s", "base")
	for round := 0; round < 50 && !t.Failed(); round++ {
		// Read through the view first: the kernel caches entries,
		// attributes and pages.
		want("read through the open descriptor", ok("read "+h), orig)
		want("cat", ok("cat "+ws+"/a.txt"), orig)
		want("x.txt", ok("cat "+ws+"/d/x.txt"), xOrig)
		ok("modify " + ws + "/a.txt truncate")
		ok("write " + h + " ZZ")
		ok("creat " + ws + "/new.txt n")
		ok("unlink " + ws + "/c.txt")
		ok("mkdir " + ws + "/nd")
		ok("modify " + ws + "/d/x.txt truncate")
		ok("rename " + ws + "/d " + ws + "/d2")
		// The view shows the session's changes (and caches them).
		want("read before the rollback", ok("read "+h), "ZZ")
		want("stat before the rollback", ok("stat "+ws+"/a.txt"), "2")
		want("listing before the rollback", sortedLs(ws), "a.txt d2 nd new.txt w.txt")
		want("moved x.txt before the rollback", ok("cat "+ws+"/d2/x.txt"), "x")
		if r := testenv.Rollback(d, "s", cp, false); len(r.Conflicts) != 0 {
			t.Fatalf("round %d: conflicts %+v", round, r.Conflicts)
		}
		// At once: no wait of any kind.
		want("read through a descriptor opened before", ok("read "+h), orig)
		want("stat of a file restored in place", ok("stat "+ws+"/a.txt"), strconv.Itoa(len(orig)))
		want("cat of a file restored in place", ok("cat "+ws+"/a.txt"), orig)
		want("listing", sortedLs(ws), "a.txt c.txt d w.txt")
		want("a file the session made", say("stat "+ws+"/new.txt"), "errno ENOENT")
		want("a directory the session made", say("stat "+ws+"/nd"), "errno ENOENT")
		want("a directory's new name", say("stat "+ws+"/d2"), "errno ENOENT")
		want("a file the session removed", ok("cat "+ws+"/c.txt"), "c\n")
		want("a file in a directory moved back", ok("cat "+ws+"/d/x.txt"), xOrig)
		want("listing of a directory moved back", sortedLs(ws+"/d"), "x.txt")
		if t.Failed() {
			t.Logf("round %d", round)
		}
	}
}

// TestChangesDiffShowsOnlyWhatTheOwnerMayRead: changes.diff --content
// reads a file's content now with the session owner's authority, not the
// daemon's: a root-only file put in a path the session changed is listed,
// and its content is not shown.
func TestChangesDiffShowsOnlyWhatTheOwnerMayRead(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/mine.txt", "mine\n")
		testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
		os.Chown(h.Path("workspace"), 0, 0)
		os.Chmod(h.Path("workspace"), 0o1777)
	})
	ws := d.Home.Path("workspace")
	testenv.Checkpoint(d, "s", "")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'session\n' > t.txt && printf 'changed\n' > mine.txt`)
	// Someone else (root) puts a file of its own at both names.
	for _, name := range []string{"t.txt", "mine.txt"} {
		os.Remove(filepath.Join(ws, name))
		if err := os.WriteFile(filepath.Join(ws, name), []byte("ROOT-ONLY-SECRET\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "--json", "call", "changes.diff", `{"session":"s","content":true}`)
	if !strings.Contains(out, "t.txt") || !strings.Contains(out, "mine.txt") {
		t.Fatalf("the changed paths are not listed: %s", out)
	}
	if strings.Contains(out, "ROOT-ONLY-SECRET") {
		t.Fatalf("changes.diff showed the session's owner a file it may not read:\n%s", out)
	}
	if _, err := testenv.CommandAs(testenv.Nobody, "cat", filepath.Join(ws, "t.txt")).Output(); err == nil {
		t.Fatal("the owner could read the file natively: the test shows nothing")
	}
}

// TestChangesForceNeverReplacesAnotherUsersFile: a forced rollback restores
// what the session's owner changed outside the view, but never replaces or
// removes what another user put at a path since: the daemon restores with
// its own authority, and the owner could not (a sticky directory).
func TestChangesForceNeverReplacesAnotherUsersFile(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/mine.txt", "mine\n")
		h.Write("workspace/own.txt", "own\n")
		testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
		os.Chown(h.Path("workspace"), 0, 0)
		os.Chmod(h.Path("workspace"), 0o1777)
	})
	ws := d.Home.Path("workspace")
	cp := testenv.Checkpoint(d, "s", "")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'session\n' > t.txt && printf 'changed\n' > mine.txt && printf 'changed\n' > own.txt`)
	for _, name := range []string{"t.txt", "mine.txt"} {
		os.Remove(filepath.Join(ws, name))
		if err := os.WriteFile(filepath.Join(ws, name), []byte("ROOT\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The owner's own change outside the view: force restores it.
	if out, err := testenv.CommandAs(testenv.Nobody, "sh", "-c", "printf outside > "+filepath.Join(ws, "own.txt")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	r := testenv.Rollback(d, "s", cp, true)
	for _, name := range []string{"t.txt", "mine.txt"} {
		b, err := os.ReadFile(filepath.Join(ws, name))
		var st syscall.Stat_t
		syscall.Lstat(filepath.Join(ws, name), &st)
		if err != nil || string(b) != "ROOT\n" || st.Uid != 0 {
			t.Errorf("%s: root's file replaced or removed by a forced rollback: %q %v uid %d", name, b, err, st.Uid)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "own.txt")); string(b) != "own\n" {
		t.Errorf("own.txt: the owner's own change not restored by force: %q", b)
	}
	if len(r.Conflicts) != 2 {
		t.Errorf("conflicts: %+v", r.Conflicts)
	}
}

// TestChangesOneUidsSessionsShareMaxBytes: what one uid's sessions keep in
// the state directory is bounded together by [changes] max_bytes, not once
// per session: a uid opening many sessions cannot fill the state
// directory, where every other user's checkpoints live (a change that
// cannot be recorded is refused, so a full state directory would refuse
// everyone's changes).
func TestChangesOneUidsSessionsShareMaxBytes(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules+"\n[changes]\nmax_bytes = \"64KiB\"\n", func(h *testenv.Home) {
		h.Write("workspace/one.bin", strings.Repeat("1", 40<<10))
		h.Write("workspace/two.bin", strings.Repeat("2", 40<<10))
		testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	})
	mnt2 := d.OpenFor("s2", testenv.Nobody, testenv.DM)
	testenv.Checkpoint(d, "s", "")
	testenv.Checkpoint(d, "s2", "")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf x > one.bin`)
	out := testenv.ShAsNobody(t, mnt2+"/workspace", `printf x > two.bin 2>&1 || echo refused`)
	if !strings.Contains(out, "refused") {
		t.Fatalf("a second session of the same uid kept past max_bytes: %q", out)
	}
	if b, _ := os.ReadFile(d.Home.Path("workspace/two.bin")); len(b) != 40<<10 {
		t.Fatalf("a refused change was made: %d bytes", len(b))
	}
	// Root's sessions are not the uid's: its own share is whole.
	d.Call("session.close", map[string]any{"id": "s2"}, nil)
	mnt3 := d.OpenFor("r", 0, testenv.DM)
	testenv.Checkpoint(d, "r", "")
	if err := os.WriteFile(mnt3+"/workspace/two.bin", []byte("y"), 0o644); err != nil {
		t.Fatalf("root's session was refused by another uid's use: %v", err)
	}
}

// TestChangesCheckpointNameNeverShadowsAnID: a checkpoint's name is never
// one a later checkpoint's id can be (all digits): a rollback to an id
// would otherwise find the older checkpoint named so first and undo more
// than was asked.
func TestChangesCheckpointNameNeverShadowsAnID(t *testing.T) {
	d, _ := testenv.RunHomeFiles(t, testenv.ChangesRules, nil)
	for _, name := range []string{"3", "0", "007"} {
		d.CallErr("checkpoint.create", map[string]any{"session": "s", "name": name}, control.CodeInvalidParams)
	}
	out := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "checkpoint", "s", "--name", "2")
	var list struct {
		Checkpoints []struct{ ID, Name string }
	}
	d.Call("checkpoint.list", map[string]any{"session": "s"}, &list)
	for _, c := range list.Checkpoints {
		if c.Name == "2" {
			t.Fatalf("a checkpoint named like an id: %+v (%s)", list.Checkpoints, out)
		}
	}
}

// TestChangesRollbackNeverWritesThroughASymlink: a directory above paths a
// session changed, swapped by the caller for a symlink out of the space,
// never leads a rollback (the daemon, writing as itself) out of the
// backing tree, forced or not: the paths below it are reported, and what
// the link points at is untouched.
func TestChangesRollbackNeverWritesThroughASymlink(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/d/x.txt", "x\n")
		testenv.ChownTree(t, h.Path("workspace/d"), testenv.Nobody)
		h.Write("outside/x.txt", "OUTSIDE\n")
		h.Write("outside/new.txt", "OUTSIDE NEW\n")
	})
	ws, outside := d.Home.Path("workspace"), d.Home.Path("outside")
	cp := testenv.Checkpoint(d, "s", "")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf changed > d/x.txt && printf n > d/new.txt`)
	// The caller, natively: d becomes a link to a directory it may not write.
	if out, err := testenv.CommandAs(testenv.Nobody, "sh", "-c",
		`cd "$1" && mv d d.real && ln -s "$2" d`, "sh", ws, outside).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	for _, force := range []bool{false, true} {
		testenv.Rollback(d, "s", cp, force)
		if b, _ := os.ReadFile(filepath.Join(outside, "x.txt")); string(b) != "OUTSIDE\n" {
			t.Fatalf("force %v: a rollback wrote through a symlink: %q", force, b)
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "new.txt")); string(b) != "OUTSIDE NEW\n" {
			t.Fatalf("force %v: a rollback removed a file through a symlink: %q", force, b)
		}
	}
}

// TestChangesHandleWriteAfterOutsideRenameIsNeverUnrecorded: a write
// through a descriptor opened before a checkpoint, after its file was
// renamed outside the view, is recorded under the file's name now (or
// refused, or reported by the rollback): never made unrecorded, with a
// rollback that finds nothing to undo and says nothing.
func TestChangesHandleWriteAfterOutsideRenameIsNeverUnrecorded(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/a.txt", "alpha\n")
		testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	})
	ws := d.Home.Path("workspace")
	_, say := testenv.ConverseAsNobody(t, "shell2", "-")
	h := shellAnswer(say("open " + mnt + "/workspace/a.txt"))
	cp := testenv.Checkpoint(d, "s", "")
	if out, err := testenv.CommandAs(testenv.Nobody, "mv", filepath.Join(ws, "a.txt"), filepath.Join(ws, "b.txt")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	answer := say("write " + h + " ZZ")
	r := testenv.Rollback(d, "s", cp, false)
	t.Logf("write: %s; rollback: %+v", answer, r)
	b, _ := os.ReadFile(filepath.Join(ws, "b.txt"))
	if string(b) != "alpha\n" && len(r.Conflicts) == 0 {
		t.Fatalf("a write through a handle (%s) changed the renamed file unrecorded: %q after a rollback with no conflict", answer, b)
	}
}

// TestChangesRollbackNeverWritesIntoAFileTheSessionHolds: a rollback gives
// a path back a file's content, owner and mode in a new file unless the
// path still holds the very inode the checkpoint had there. A file of the
// session's, held open and renamed over root's file, stays the session's:
// were the restore made into it (chowned to root), the descriptor would
// then write the content of a root-owned file in the backing tree.
func TestChangesRollbackNeverWritesIntoAFileTheSessionHolds(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/g", "root's\n") // root's, 0644
		os.Chmod(h.Path("workspace"), 0o777)
	})
	ws := mnt + "/workspace"
	testenv.ShAsNobody(t, ws, `printf mine > mine`)
	first, held := testenv.ConverseAsNobody(t, "hold2", ws+"/mine", "rw")
	if first != "open" {
		t.Fatalf("hold2: %s", first)
	}
	cp := testenv.Checkpoint(d, "s", "")
	testenv.ShAsNobody(t, ws, `mv mine g`)
	if r := testenv.Rollback(d, "s", cp, false); len(r.Conflicts) != 0 {
		t.Fatalf("rollback: %+v", r.Conflicts)
	}
	if got := held("w evil"); got != "wrote" {
		t.Fatalf("write through the held descriptor: %s", got)
	}
	var st syscall.Stat_t
	b, err := os.ReadFile(d.Home.Path("workspace/g"))
	syscall.Lstat(d.Home.Path("workspace/g"), &st)
	if err != nil || string(b) != "root's\n" || st.Uid != 0 {
		t.Fatalf("g after the rollback and a write through the descriptor held: %q %v uid %d", b, err, st.Uid)
	}
	if got := testenv.ShAsNobody(t, ws, `stat -c '%u' mine && cat mine`); got != "65534\nmine" {
		t.Fatalf("mine after the rollback: %q", got)
	}
}
