package integration

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

// changesRules: runRules with the programs that change files.
const changesRules = privateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/rm", "/usr/bin/mkdir", "/usr/bin/mv", "/usr/bin/ln", "/usr/bin/chmod", "/usr/bin/rmdir", "/usr/bin/truncate", "/usr/bin/cat"]
pids = 64
`

// shAsNobody runs a shell script as uid 65534 in dir (a view): what an
// agent's file tools do.
func shAsNobody(t *testing.T, dir, script string) string {
	t.Helper()
	// cd as 65534: the view admits its owner only, not root.
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c", `cd "$1" && eval "$2"`, "sh", dir, script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", script, err, out)
	}
	return strings.TrimSpace(string(out))
}

// backingTree describes a backing directory: each path's type, mode,
// content or target, and a file's mtime.
func backingTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := st.Mode().String()
		switch {
		case st.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc += fmt.Sprintf(" %q %d", b, st.ModTime().UnixNano())
		case st.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		}
		out[strings.TrimPrefix(p, root)] = desc
		return nil
	})
	return out
}

func sameBacking(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	var diffs []string
	for p, w := range want {
		if g := got[p]; g != w {
			diffs = append(diffs, fmt.Sprintf("%s = %q, want %q", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s extra (%s)", p, g))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Fatalf("%s:\n%s", what, strings.Join(diffs, "\n"))
	}
}

type rollbackResult struct {
	Restored  int `json:"restored"`
	Conflicts []struct {
		Space, Path, Reason string
	} `json:"conflicts"`
}

func (d *daemon) checkpoint(session, name string) string {
	d.t.Helper()
	var r struct{ ID string }
	d.call("checkpoint.create", map[string]any{"session": session, "name": name}, &r)
	return r.ID
}

func (d *daemon) rollback(session, cp string, force bool) rollbackResult {
	d.t.Helper()
	var r rollbackResult
	d.call("checkpoint.rollback", map[string]any{"session": session, "checkpoint": cp, "force": force}, &r)
	return r
}

// TestChangesRollbackUndoesFileToolsAndRuns: every kind of change made by
// an unprivileged caller through a view, by file tools and by a command in
// condfs run, is undone by a rollback to the checkpoint before it, back to
// content, type, mode, target and mtime; several checkpoints roll back in
// turn; ctl shows the diff like git status.
func TestChangesRollbackUndoesFileToolsAndRuns(t *testing.T) {
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/a.txt", "alpha\n")
		h.write("workspace/d/x.txt", "x\n")
		os.Symlink("a.txt", h.path("workspace/l"))
		for _, p := range []string{"workspace/a.txt", "workspace/d/x.txt", "workspace/d", "workspace/l"} {
			os.Lchown(h.path(p), nobody, nobody)
		}
	})
	ws := d.home.path("workspace")
	start := backingTree(t, ws)
	cp := d.checkpoint("s", "start")
	out, code := condfsRun(t, d, "", "--cwd", "/workspace", "--", "sh", "-c",
		`truncate -s 2 a.txt && mkdir rd && printf g > rd/g && mv d/x.txt d/y.txt && printf run > r.txt && chmod 600 r.txt`)
	if code != 0 {
		t.Fatalf("condfs run: %d %s\n%s", code, out, tail(d.log(), 30))
	}
	mid := backingTree(t, ws)
	cp2 := d.checkpoint("s", "mid")
	shAsNobody(t, mnt+"/workspace", `printf 'tool\n' >> a.txt && chmod 640 a.txt && rm d/y.txt && rmdir d && mv rd rd2 && ln -s rd2 l2 && rm l && ln -s r.txt l`)
	diff := asNobody(t, "condfs", "ctl", "--socket", d.socket, "diff", "s", "--since", "mid", "--content")
	for _, want := range []string{"M workspace/a.txt", "D workspace/d/", "D workspace/rd/", "A workspace/rd2/", "A workspace/l2", "M workspace/l", "+altool"} {
		if !strings.Contains(diff, want) {
			t.Errorf("ctl diff lacks %q:\n%s", want, diff)
		}
	}
	if r := d.rollback("s", cp2, false); len(r.Conflicts) != 0 {
		t.Fatalf("rollback to mid: %+v", r.Conflicts)
	}
	sameBacking(t, "after the rollback to mid", mid, backingTree(t, ws))
	if got := shAsNobody(t, mnt+"/workspace", "cat a.txt; echo; ls"); got != "al\na.txt\nd\nl\nr.txt\nrd\nw.txt" {
		t.Fatalf("the view after the rollback: %q", got)
	}
	r := d.rollback("s", cp, false)
	if len(r.Conflicts) != 0 {
		t.Fatalf("rollback to start: %+v", r.Conflicts)
	}
	sameBacking(t, "after the rollback to start", start, backingTree(t, ws))
	var list struct {
		Checkpoints []struct{ ID, Name string }
	}
	d.call("checkpoint.list", map[string]any{"session": "s"}, &list)
	if len(list.Checkpoints) != 1 || list.Checkpoints[0].Name != "start" {
		t.Fatalf("checkpoints after rolling back to the first: %+v", list.Checkpoints)
	}
}

// TestChangesConflictsAreReportedUnlessForced: a file changed in the
// backing tree after the session changed it is left as it is and reported;
// with force it is restored. The rest is restored either way.
func TestChangesConflictsAreReportedUnlessForced(t *testing.T) {
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/a.txt", "alpha\n")
		os.Chown(h.path("workspace/a.txt"), nobody, nobody)
	})
	ws := d.home.path("workspace")
	cp := d.checkpoint("s", "")
	shAsNobody(t, mnt+"/workspace", `printf 'session\n' > a.txt && printf b > b.txt`)
	time.Sleep(10 * time.Millisecond)
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("outside\n"), 0o644)
	r := d.rollback("s", cp, false)
	if len(r.Conflicts) != 1 || r.Conflicts[0].Path != "/a.txt" || r.Conflicts[0].Space != "workspace" {
		t.Fatalf("conflicts: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "outside\n" {
		t.Fatalf("a conflict was overwritten: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(ws, "b.txt")); !os.IsNotExist(err) {
		t.Fatalf("b.txt was not removed: %v", err)
	}
	cp = d.checkpoint("s", "")
	shAsNobody(t, mnt+"/workspace", `printf 'session again\n' > a.txt`)
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("outside again\n"), 0o644)
	out := asNobody(t, "condfs", "ctl", "--socket", d.socket, "rollback", "s", cp)
	if !strings.Contains(out, "conflict workspace/a.txt") {
		t.Fatalf("ctl rollback: %s", out)
	}
	if r := d.rollback("s", cp, true); len(r.Conflicts) != 0 {
		t.Fatalf("forced: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "outside\n" {
		t.Fatalf("forced rollback: %q", b)
	}
}

// TestChangesSurviveACrash: checkpoints come back with their session after
// kill -9, and a rollback then restores what the session changed before.
func TestChangesSurviveACrash(t *testing.T) {
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/a.txt", "alpha\n")
		os.Chown(h.path("workspace/a.txt"), nobody, nobody)
	})
	ws := d.home.path("workspace")
	start := backingTree(t, ws)
	d.checkpoint("s", "before")
	shAsNobody(t, mnt+"/workspace", `printf 'crashed\n' > a.txt && printf n > n.txt && mkdir m`)
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	os.Remove(d.socket)
	d2 := startDaemon(t, d.home, "--allow-uid", "65534", "--socket-mode", "0666")
	r := d2.rollback("s", "before", false)
	if len(r.Conflicts) != 0 || r.Restored != 3 {
		t.Fatalf("rollback after the crash: %+v\n%s", r, d2.log())
	}
	sameBacking(t, "after a crash and a rollback", start, backingTree(t, ws))
	if got := shAsNobody(t, mnt+"/workspace", "cat a.txt; ls"); got != "alpha\na.txt\nw.txt" {
		t.Fatalf("the restored view: %q", got)
	}
}

// TestChangesBadInputs: each bad input is answered with its code and
// changes nothing.
func TestChangesBadInputs(t *testing.T) {
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/a.txt", "alpha\n")
		os.Chown(h.path("workspace/a.txt"), nobody, nobody)
	})
	cp := d.checkpoint("s", "one")
	shAsNobody(t, mnt+"/workspace", `printf changed > a.txt`)
	d.callErr("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "nope"}, control.CodeUnknownCheckpoint)
	d.callErr("changes.diff", map[string]any{"session": "s", "since": "nope"}, control.CodeUnknownCheckpoint)
	d.callErr("checkpoint.create", map[string]any{"session": "s", "name": "one"}, control.CodeInvalidParams)
	d.callErr("checkpoint.create", map[string]any{"session": "s", "name": "../x"}, control.CodeInvalidParams)
	d.callErr("changes.commit", map[string]any{"session": "s"}, control.CodeNotStaged)
	d.callErr("changes.discard", map[string]any{"session": "s"}, control.CodeNotStaged)
	d.callErr("session.open", map[string]any{"id": "st", "mount": d.home.path("mnt/st"), "context": dmCtx, "changes": "later"}, control.CodeInvalidParams)
	// Another uid's session: root opens one, 65534 asks for it.
	d.openFor("roots", 0, dmCtx)
	d.checkpoint("roots", "")
	out := asNobody(t, "condfs", "ctl", "--socket", d.socket, "--json", "call", "checkpoint.rollback", `{"session":"roots","checkpoint":"1"}`)
	if !strings.Contains(out, "another user") {
		t.Fatalf("another uid's session: %s", out)
	}
	if b, _ := os.ReadFile(d.home.path("workspace/a.txt")); string(b) != "changed" {
		t.Fatalf("a refused request changed the tree: %q", b)
	}
	var list struct{ Checkpoints []json.RawMessage }
	d.call("checkpoint.list", map[string]any{"session": "s"}, &list)
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
	d, mnt := runHomeFiles(t, changesRules+"\n[changes]\nmax_bytes = \"64KiB\"\nmax_checkpoints = 2\n", func(h *home) {
		h.write("workspace/big.bin", strings.Repeat("b", 128<<10))
		h.write("workspace/small.txt", "s\n")
		os.Chown(h.path("workspace/big.bin"), nobody, nobody)
		os.Chown(h.path("workspace/small.txt"), nobody, nobody)
	})
	first := d.checkpoint("s", "")
	out := shAsNobody(t, mnt+"/workspace", `printf x > big.bin 2>&1 || echo refused; printf t > small.txt; echo done`)
	if !strings.Contains(out, "No space left on device") || !strings.Contains(out, "refused") {
		t.Fatalf("a change beyond max_bytes: %q", out)
	}
	if b, _ := os.ReadFile(d.home.path("workspace/big.bin")); len(b) != 128<<10 {
		t.Fatalf("a refused change was made: %d bytes", len(b))
	}
	if !strings.Contains(d.log(), `"op":"enospc"`) {
		t.Fatalf("ENOSPC not audited:\n%s", tail(d.log(), 20))
	}
	d.checkpoint("s", "")
	d.checkpoint("s", "")
	d.callErr("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": first}, control.CodeUnknownCheckpoint)
	if !strings.Contains(d.log(), `"op":"dropped"`) {
		t.Fatalf("a dropped checkpoint not audited:\n%s", tail(d.log(), 20))
	}
	var st struct {
		Sessions []struct {
			ID      string
			Changes *struct{ Checkpoints int } `json:"changes"`
		}
	}
	d.call("status", nil, &st)
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
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/a.txt", orig)
		h.write("workspace/c.txt", "c\n")
		h.write("workspace/d/x.txt", xOrig)
		chownTree(t, h.path("workspace"), nobody)
	})
	ws := mnt + "/workspace"
	_, say := converseAsNobody(t, "shell2", "-")
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
	cp := d.checkpoint("s", "base")
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
		if r := d.rollback("s", cp, false); len(r.Conflicts) != 0 {
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
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/mine.txt", "mine\n")
		chownTree(t, h.path("workspace"), nobody)
		os.Chown(h.path("workspace"), 0, 0)
		os.Chmod(h.path("workspace"), 0o1777)
	})
	ws := d.home.path("workspace")
	d.checkpoint("s", "")
	shAsNobody(t, mnt+"/workspace", `printf 'session\n' > t.txt && printf 'changed\n' > mine.txt`)
	// Someone else (root) puts a file of its own at both names.
	for _, name := range []string{"t.txt", "mine.txt"} {
		os.Remove(filepath.Join(ws, name))
		if err := os.WriteFile(filepath.Join(ws, name), []byte("ROOT-ONLY-SECRET\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := asNobody(t, "condfs", "ctl", "--socket", d.socket, "--json", "call", "changes.diff", `{"session":"s","content":true}`)
	if !strings.Contains(out, "t.txt") || !strings.Contains(out, "mine.txt") {
		t.Fatalf("the changed paths are not listed: %s", out)
	}
	if strings.Contains(out, "ROOT-ONLY-SECRET") {
		t.Fatalf("changes.diff showed the session's owner a file it may not read:\n%s", out)
	}
	if _, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", filepath.Join(ws, "t.txt")).Output(); err == nil {
		t.Fatal("the owner could read the file natively: the test shows nothing")
	}
}

// TestChangesForceNeverReplacesAnotherUsersFile: a forced rollback restores
// what the session's owner changed outside the view, but never replaces or
// removes what another user put at a path since: the daemon restores with
// its own authority, and the owner could not (a sticky directory).
func TestChangesForceNeverReplacesAnotherUsersFile(t *testing.T) {
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/mine.txt", "mine\n")
		h.write("workspace/own.txt", "own\n")
		chownTree(t, h.path("workspace"), nobody)
		os.Chown(h.path("workspace"), 0, 0)
		os.Chmod(h.path("workspace"), 0o1777)
	})
	ws := d.home.path("workspace")
	cp := d.checkpoint("s", "")
	shAsNobody(t, mnt+"/workspace", `printf 'session\n' > t.txt && printf 'changed\n' > mine.txt && printf 'changed\n' > own.txt`)
	for _, name := range []string{"t.txt", "mine.txt"} {
		os.Remove(filepath.Join(ws, name))
		if err := os.WriteFile(filepath.Join(ws, name), []byte("ROOT\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The owner's own change outside the view: force restores it.
	if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", "printf outside > "+filepath.Join(ws, "own.txt")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	r := d.rollback("s", cp, true)
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
	d, mnt := runHomeFiles(t, changesRules+"\n[changes]\nmax_bytes = \"64KiB\"\n", func(h *home) {
		h.write("workspace/one.bin", strings.Repeat("1", 40<<10))
		h.write("workspace/two.bin", strings.Repeat("2", 40<<10))
		chownTree(t, h.path("workspace"), nobody)
	})
	mnt2 := d.openFor("s2", nobody, dmCtx)
	d.checkpoint("s", "")
	d.checkpoint("s2", "")
	shAsNobody(t, mnt+"/workspace", `printf x > one.bin`)
	out := shAsNobody(t, mnt2+"/workspace", `printf x > two.bin 2>&1 || echo refused`)
	if !strings.Contains(out, "refused") {
		t.Fatalf("a second session of the same uid kept past max_bytes: %q", out)
	}
	if b, _ := os.ReadFile(d.home.path("workspace/two.bin")); len(b) != 40<<10 {
		t.Fatalf("a refused change was made: %d bytes", len(b))
	}
	// Root's sessions are not the uid's: its own share is whole.
	d.call("session.close", map[string]any{"id": "s2"}, nil)
	mnt3 := d.openFor("r", 0, dmCtx)
	d.checkpoint("r", "")
	if err := os.WriteFile(mnt3+"/workspace/two.bin", []byte("y"), 0o644); err != nil {
		t.Fatalf("root's session was refused by another uid's use: %v", err)
	}
}

// TestChangesCheckpointNameNeverShadowsAnID: a checkpoint's name is never
// one a later checkpoint's id can be (all digits): a rollback to an id
// would otherwise find the older checkpoint named so first and undo more
// than was asked.
func TestChangesCheckpointNameNeverShadowsAnID(t *testing.T) {
	d, _ := runHomeFiles(t, changesRules, nil)
	for _, name := range []string{"3", "0", "007"} {
		d.callErr("checkpoint.create", map[string]any{"session": "s", "name": name}, control.CodeInvalidParams)
	}
	out := asNobody(t, "condfs", "ctl", "--socket", d.socket, "checkpoint", "s", "--name", "2")
	var list struct {
		Checkpoints []struct{ ID, Name string }
	}
	d.call("checkpoint.list", map[string]any{"session": "s"}, &list)
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
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/d/x.txt", "x\n")
		chownTree(t, h.path("workspace/d"), nobody)
		h.write("outside/x.txt", "OUTSIDE\n")
		h.write("outside/new.txt", "OUTSIDE NEW\n")
	})
	ws, outside := d.home.path("workspace"), d.home.path("outside")
	cp := d.checkpoint("s", "")
	shAsNobody(t, mnt+"/workspace", `printf changed > d/x.txt && printf n > d/new.txt`)
	// The caller, natively: d becomes a link to a directory it may not write.
	if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
		`cd "$1" && mv d d.real && ln -s "$2" d`, "sh", ws, outside).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	for _, force := range []bool{false, true} {
		d.rollback("s", cp, force)
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
	d, mnt := runHomeFiles(t, changesRules, func(h *home) {
		h.write("workspace/a.txt", "alpha\n")
		chownTree(t, h.path("workspace"), nobody)
	})
	ws := d.home.path("workspace")
	_, say := converseAsNobody(t, "shell2", "-")
	h := shellAnswer(say("open " + mnt + "/workspace/a.txt"))
	cp := d.checkpoint("s", "")
	if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "mv", filepath.Join(ws, "a.txt"), filepath.Join(ws, "b.txt")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	answer := say("write " + h + " ZZ")
	r := d.rollback("s", cp, false)
	t.Logf("write: %s; rollback: %+v", answer, r)
	b, _ := os.ReadFile(filepath.Join(ws, "b.txt"))
	if string(b) != "alpha\n" && len(r.Conflicts) == 0 {
		t.Fatalf("a write through a handle (%s) changed the renamed file unrecorded: %q after a rollback with no conflict", answer, b)
	}
}
