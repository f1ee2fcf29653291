package changes

import (
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

// stagedHome starts a daemon whose session "s", served to uid 65534, is
// staged; other is a direct session "o" of the same uid over the same home.
func stagedHome(t *testing.T, rules string, files func(h *testenv.Home), flags ...string) (d *testenv.Daemon, mnt, other string) {
	t.Helper()
	h := testenv.OpenHome(t, rules)
	h.Write("config/policy.yaml", testenv.RunPolicy)
	h.Write("memories/private/p.md", "dm secret\n")
	h.Write("workspace/a.txt", "alpha\n")
	h.Write("workspace/gone.txt", "gone\n")
	h.Write("workspace/d/x.txt", "x\n")
	os.Symlink("a.txt", h.Path("workspace/l"))
	for _, p := range []string{"memories", "memories/private", "workspace", "workspace/d"} {
		os.Chmod(h.Path(p), 0o777)
	}
	for _, p := range []string{"workspace/a.txt", "workspace/gone.txt", "workspace/d/x.txt", "memories/private/p.md"} {
		os.Chown(h.Path(p), testenv.Nobody, testenv.Nobody)
	}
	if files != nil {
		files(h)
	}
	d = testenv.Start(t, h, append([]string{"--allow-uid", "65534", "--socket-mode", "0666"}, flags...)...)
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	mnt = d.Home.Path("mnt/s")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": testenv.DM, "owner": testenv.Nobody, "changes": "staged"}, nil)
	other = d.OpenFor("o", testenv.Nobody, testenv.DM)
	return d, mnt, other
}

type stagedChange struct{ Space, Path, Change string }

func stagedDiff(d *testenv.Daemon, session string) (list []string, hidden int) {
	var r struct {
		Changes []stagedChange
		Hidden  int
	}
	d.Call("changes.diff", map[string]any{"session": session}, &r)
	for _, c := range r.Changes {
		list = append(list, strings.ToUpper(c.Change[:1])+" "+c.Space+c.Path)
	}
	sort.Strings(list)
	return list, r.Hidden
}

type commitResult struct {
	Committed int
	Conflicts []struct{ Space, Path, Reason string }
}

// TestStagedChangesReachNothingUntilCommit: every kind of change uid 65534
// makes in a staged view, by file tools and by a command in condfs run,
// shows in that view only: the backing tree, another session over the same
// home and the host see none of it until changes.commit, which applies the
// paths named first and then the rest.
func TestStagedChangesReachNothingUntilCommit(t *testing.T) {
	d, mnt, other := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	start := testenv.BackingTree(t, ws)
	testenv.ShAsNobody(t, mnt+"/workspace", `printf 'tool\n' >> a.txt && chmod 600 a.txt && mkdir nd && printf n > nd/n.txt && ln -s nd/n.txt l2 && mv d/x.txt d/y.txt && rm gone.txt`)
	out, code := testenv.CondfsRun(t, d, "", "--cwd", "/workspace", "--", "sh", "-c", `printf run > r.txt && truncate -s 1 d/y.txt && rm l`)
	if code != 0 {
		t.Fatalf("condfs run: %d %s\n%s", code, out, testenv.Tail(d.Log(), 30))
	}
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt r.txt nd/n.txt; ls`); got != "alpha\ntool\nrunn"+"a.txt\nd\nl2\nnd\nr.txt" {
		t.Fatalf("the staged view: %q", got)
	}
	sameBacking(t, "the backing tree before commit", start, testenv.BackingTree(t, ws))
	if got := testenv.ShAsNobody(t, other+"/workspace", `cat a.txt gone.txt; ls`); got != "alpha\ngone\na.txt\nd\ngone.txt\nl" {
		t.Fatalf("another session over the same home sees staged changes: %q", got)
	}
	want := []string{"A workspace/d/y.txt", "A workspace/l2", "A workspace/nd/", "A workspace/nd/n.txt", "A workspace/r.txt",
		"D workspace/d/x.txt", "D workspace/gone.txt", "D workspace/l", "M workspace/a.txt"}
	if got, hidden := stagedDiff(d, "s"); strings.Join(got, ",") != strings.Join(want, ",") || hidden != 0 {
		t.Fatalf("diff %v (hidden %d), want %v", got, hidden, want)
	}
	ctl := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "diff", "s", "--content")
	if !strings.Contains(ctl, "M workspace/a.txt") || !strings.Contains(ctl, "D workspace/gone.txt") || !strings.Contains(ctl, "+tool") || !strings.Contains(ctl, "-gone") {
		t.Fatalf("ctl diff:\n%s", ctl)
	}

	var r commitResult
	d.Call("changes.commit", map[string]any{"session": "s", "paths": []string{"workspace/a.txt", "/workspace/nd"}}, &r)
	if r.Committed != 3 || len(r.Conflicts) != 0 {
		t.Fatalf("commit of some paths: %+v", r)
	}
	if b, _ := os.ReadFile(ws + "/a.txt"); string(b) != "alpha\ntool\n" {
		t.Fatalf("a.txt after its commit: %q", b)
	}
	if _, err := os.Stat(ws + "/gone.txt"); err != nil {
		t.Fatalf("a path not named was committed: %v", err)
	}
	if got := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "commit", "s"); !strings.Contains(got, "committed 6") {
		t.Fatalf("ctl commit: %s", got)
	}
	if got := testenv.ShAsNobody(t, other+"/workspace", `cat r.txt d/y.txt; ls`); got != "runx"+"a.txt\nd\nl2\nnd\nr.txt" {
		t.Fatalf("after commit, another session: %q", got)
	}
	if fi, err := os.Stat(ws + "/a.txt"); err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != testenv.Nobody {
		t.Fatalf("a.txt's mode and owner after commit: %v %v", fi, err)
	}
	if got, _ := stagedDiff(d, "s"); len(got) != 0 {
		t.Fatalf("changes left after commit: %v", got)
	}
	for _, want := range []string{`"op":"commit"`, `"committed":3`, `"committed":6`} {
		if !strings.Contains(d.Log(), want) {
			t.Errorf("the audit lacks %s", want)
		}
	}
	d.Call("session.close", map[string]any{"id": "s"}, nil)
}

// TestStagedDiscardShowsTheBackingTreeAgain: an agent's command deletes a
// file in a staged session; a discard of that path brings it back in the
// view, and a discard of the rest drops everything else.
func TestStagedDiscardShowsTheBackingTreeAgain(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	start := testenv.BackingTree(t, ws)
	if out, code := testenv.CondfsRun(t, d, "", "--cwd", "/workspace", "--", "sh", "-c", `rm -r d gone.txt && printf new > new.txt`); code != 0 {
		t.Fatalf("condfs run: %d %s", code, out)
	}
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `ls`); got != "a.txt\nl\nnew.txt" {
		t.Fatalf("staged view: %q", got)
	}
	if got := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "discard", "s", "workspace/d"); !strings.Contains(got, "discarded 1") {
		t.Fatalf("ctl discard: %s", got)
	}
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat d/x.txt; ls`); got != "x\na.txt\nd\nl\nnew.txt" {
		t.Fatalf("after discarding d: %q", got)
	}
	d.Call("changes.discard", map[string]any{"session": "s"}, nil)
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat gone.txt; ls`); got != "gone\na.txt\nd\ngone.txt\nl" {
		t.Fatalf("after discarding all: %q", got)
	}
	if got, _ := stagedDiff(d, "s"); len(got) != 0 {
		t.Fatalf("changes left after discard: %v", got)
	}
	sameBacking(t, "the backing tree after discard", start, testenv.BackingTree(t, ws))
}

// TestStagedConflictLeftUnlessForced: a path the host changed after the
// session staged it is reported and left by a commit; force commits it.
func TestStagedConflictLeftUnlessForced(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf session > a.txt && printf fine > b.txt`)
	os.WriteFile(ws+"/a.txt", []byte("host\n"), 0o644)
	var r commitResult
	d.Call("changes.commit", map[string]any{"session": "s"}, &r)
	if r.Committed != 1 || len(r.Conflicts) != 1 || r.Conflicts[0].Path != "/a.txt" {
		t.Fatalf("commit: %+v", r)
	}
	if b, _ := os.ReadFile(ws + "/a.txt"); string(b) != "host\n" {
		t.Fatalf("a conflict was overwritten: %q", b)
	}
	d.Call("changes.commit", map[string]any{"session": "s", "force": true}, &r)
	if r.Committed != 1 {
		t.Fatalf("forced commit: %+v", r)
	}
	if b, _ := os.ReadFile(ws + "/a.txt"); string(b) != "session" {
		t.Fatalf("force did not commit: %q", b)
	}
}

// TestStagedCloseWithUncommittedChangesRefused: closing a staged session
// that holds changes answers -32030 and keeps it; with discard it closes
// and nothing reached the backing tree.
func TestStagedCloseWithUncommittedChangesRefused(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	start := testenv.BackingTree(t, ws)
	testenv.ShAsNobody(t, mnt+"/workspace", `rm gone.txt`)
	d.CallErr("session.close", map[string]any{"id": "s"}, control.CodeUncommitted)
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `ls`); got != "a.txt\nd\nl" {
		t.Fatalf("the session after a refused close: %q", got)
	}
	d.Call("session.close", map[string]any{"id": "s", "discard": true}, nil)
	sameBacking(t, "the backing tree after close --discard", start, testenv.BackingTree(t, ws))
	// The layer went with the session: its merged directories are not
	// mounted, its directory is gone, and the daemon holds none of it.
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), d.Home.Root) && strings.Contains(string(mi), "overlay") {
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, "overlay") && strings.Contains(line, d.Home.Root) {
				t.Errorf("a closed session's layer is still mounted: %s", line)
			}
		}
	}
	layers, _ := filepath.Glob(d.Home.Root + "/*/changes/s")
	if len(layers) != 0 {
		t.Errorf("a closed session's layer is still on disk: %v", layers)
	}
	pid := d.Cmd.Process.Pid
	fds, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/fd/*")
	for _, fd := range fds {
		if l, _ := os.Readlink(fd); strings.Contains(l, "/changes/s/") {
			t.Errorf("the daemon holds %s of a closed session's layer", l)
		}
	}
}

// TestStagedLayerComesBackAfterKill: the daemon killed with -9 restarts
// with the staged session and its layer; a commit then applies it.
func TestStagedLayerComesBackAfterKill(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf kept > k.txt && rm gone.txt`)
	d.Cmd.Process.Signal(syscall.SIGKILL)
	<-d.Exited()
	os.Remove(d.Socket)
	d2 := testenv.Start(t, d.Home, "--allow-uid", "65534", "--socket-mode", "0666")
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat k.txt; ls`); got != "kepta.txt\nd\nk.txt\nl" {
		t.Fatalf("the restored staged view: %q\n%s", got, testenv.Tail(d2.Log(), 20))
	}
	if _, err := os.Stat(ws + "/k.txt"); err == nil {
		t.Fatal("a staged file reached the backing tree across the crash")
	}
	var r commitResult
	d2.Call("changes.commit", map[string]any{"session": "s"}, &r)
	if r.Committed != 2 {
		t.Fatalf("commit after restore: %+v", r)
	}
	if b, _ := os.ReadFile(ws + "/k.txt"); string(b) != "kept" {
		t.Fatalf("k.txt after commit: %q", b)
	}
}

// TestStagedFileUnderHiddenPathGoesWithSwitch: a staged file under a path
// the rules give the DM only is not in the view once the session switches
// to a guild (a descriptor opened before reads nothing more, the listing
// drops it, from the moment context.set answers), and the diff counts it
// as hidden. make test runs it on every invalidation path (NOSTALE).
func TestStagedFileUnderHiddenPathGoesWithSwitch(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	testenv.ShAsNobody(t, mnt+"/memories/private", `printf staged > s.md`)
	first, ask := testenv.ConverseAsNobody(t, "hold", mnt+"/memories/private/s.md")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	for range 2 { // the second read is served from the page cache
		if got := ask("r"); got != `read "staged"` {
			t.Fatalf("read before the switch: %s", got)
		}
	}
	if got := testenv.ShAsNobody(t, mnt+"/memories", `ls`); !strings.Contains(got, "private") {
		t.Fatalf("listing in the DM: %q", got)
	}
	d.SetContext("s", testenv.Guild)
	if got := ask("r"); strings.Contains(got, "staged") {
		t.Fatalf("a descriptor of a staged file reads after a switch hid it: %s", got)
	}
	if got := testenv.ShAsNobody(t, mnt+"/memories", `ls`); strings.Contains(got, "private") {
		t.Fatalf("listing in the guild shows the hidden directory: %q", got)
	}
	if got := testenv.AsNobody(t, "cat", mnt+"/memories/private/s.md"); strings.Contains(got, "staged") {
		t.Fatalf("a staged file under a hidden path is read after the switch: %s", got)
	}
	if got, hidden := stagedDiff(d, "s"); len(got) != 0 || hidden != 1 {
		t.Fatalf("diff in the guild: %v hidden %d", got, hidden)
	}
	d.SetContext("s", testenv.DM)
	if got := testenv.AsNobody(t, "cat", mnt+"/memories/private/s.md"); !strings.Contains(got, "staged") {
		t.Fatalf("back in the DM: %s", got)
	}
}

// TestStagedBadInputsChangeNothing: each bad input is answered with its
// code and leaves the layer and the backing tree as they were.
func TestStagedBadInputsChangeNothing(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	start := testenv.BackingTree(t, ws)
	testenv.ShAsNobody(t, mnt+"/workspace", `printf n > n.txt`)
	d.CallErr("changes.commit", map[string]any{"session": "o"}, control.CodeNotStaged)
	d.CallErr("changes.discard", map[string]any{"session": "o"}, control.CodeNotStaged)
	for _, paths := range [][]string{{"elsewhere/x"}, {"workspace/../memories"}, {"workspace/a.txt"}, {"workspace/n.txt", "nowhere"}} {
		d.CallErr("changes.commit", map[string]any{"session": "s", "paths": paths}, control.CodeInvalidParams)
		d.CallErr("changes.discard", map[string]any{"session": "s", "paths": paths}, control.CodeInvalidParams)
	}
	d.CallErr("changes.commit", map[string]any{"session": "nope"}, control.CodeUnknownSession)
	d.CallErr("checkpoint.rollback", map[string]any{"session": "s", "checkpoint": "9"}, control.CodeUnknownCheckpoint)
	d.CallErr("changes.diff", map[string]any{"session": "s", "since": "1"}, control.CodeInvalidParams)
	d.CallErr("session.open", map[string]any{"id": "x", "mount": d.Home.Path("mnt/x"), "context": testenv.DM, "changes": "later"}, control.CodeInvalidParams)
	sameBacking(t, "the backing tree after bad inputs", start, testenv.BackingTree(t, ws))
	if got, _ := stagedDiff(d, "s"); strings.Join(got, ",") != "A workspace/n.txt" {
		t.Fatalf("the layer after bad inputs: %v", got)
	}
}

// TestStagedLayerBoundedByMaxBytes: a change once the layer holds
// max_bytes answers ENOSPC, and the backing tree is untouched.
func TestStagedLayerBoundedByMaxBytes(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules+"\n[changes]\nmax_bytes = \"8KiB\"\n", nil)
	testenv.ShAsNobody(t, mnt+"/workspace", `head -c 8192 /dev/zero > big`)
	out, _ := testenv.CommandAs(testenv.Nobody, "/bin/sh", "-c", "printf x > "+mnt+"/workspace/more").CombinedOutput()
	if !strings.Contains(string(out), "No space left") {
		t.Fatalf("a change beyond max_bytes: %s", out)
	}
	var st struct {
		Sessions []struct {
			ID      string
			Changes *struct{ Bytes, MaxBytes int64 } `json:"changes"`
		}
	}
	d.Call("session.list", nil, &st)
	for _, s := range st.Sessions {
		if s.ID == "s" && (s.Changes == nil || s.Changes.Bytes != 8192) {
			t.Fatalf("session.list use: %+v", s.Changes)
		}
	}
	if !strings.Contains(d.Log(), `"op":"enospc"`) {
		t.Fatalf("no audit of the refusal:\n%s", testenv.Tail(d.Log(), 10))
	}
}

// TestStagedViewShowsBackingChangesToUnstagedPaths: a file the session has
// not changed is read from the backing tree: a change made there after the
// session opened shows in the staged view (within the view's short cache
// time, as in any directory the daemon does not watch).
func TestStagedViewShowsBackingChangesToUnstagedPaths(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt`); got != "alpha" {
		t.Fatalf("before: %q", got)
	}
	os.WriteFile(d.Home.Path("workspace/a.txt"), []byte("host\n"), 0o644)
	os.WriteFile(d.Home.Path("workspace/h.txt"), []byte("made\n"), 0o644)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt h.txt 2>&1 || true`)
		if got == "host\nmade" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the staged view never showed the backing tree's change: %q", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got, _ := stagedDiff(d, "s"); len(got) != 0 {
		t.Fatalf("a change in the backing tree is listed as the session's: %v", got)
	}
}

// TestStagedRefusedWhereNoUserNamespaceMayMountTheLayer: a daemon that is
// not root mounts a staged layer in a user namespace of its own; where
// the kernel refuses it one, session.open staged says so (-32602) and
// mounts nothing.
func TestStagedRefusedWhereNoUserNamespaceMayMountTheLayer(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	h := testenv.OpenHome(t, testenv.PrivateRule)
	os.MkdirAll(h.Path("run"), 0o755)
	os.MkdirAll(h.Path("mnt/v"), 0o755)
	testenv.ChownTree(t, h.Root, testenv.Nobody)
	sock := h.Path("run/condfs.sock")
	cmd := testenv.CommandAs(testenv.Nobody,
		testenv.Condfs(), "serve", "--root", h.Root, "--socket", sock)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + h.Root, "CONDFS_TEST_USERNS_AS_ROOT=1"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	var c *control.Client
	for i := 0; ; i++ {
		var err error
		if c, err = control.Dial(sock); err == nil {
			break
		}
		if i > 500 {
			t.Fatalf("no socket: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	err := c.Call("session.open", map[string]any{"id": "st", "mount": h.Path("mnt/v"), "context": testenv.DM, "changes": "staged"}, nil)
	if e, ok := err.(*control.Error); !ok || e.Code != control.CodeInvalidParams || !strings.Contains(e.Message, "staged") {
		t.Fatalf("staged where no user namespace may be made: %v", err)
	}
	if m := testenv.MountsUnder(h.Root); len(m) > 0 {
		t.Fatalf("a refused staged session left mounts: %v", m)
	}
}

// TestStagedLinkAndBackingDirectoryRenameAnswerEXDEV: link() and the
// rename of a directory of the backing tree answer EXDEV in a staged view,
// and mv, which then copies, still moves the directory there.
func TestStagedLinkAndBackingDirectoryRenameAnswerEXDEV(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	got := testenv.ShAsNobody(t, mnt+"/workspace", `ln a.txt hl 2>&1; python3 -c 'import os
try:
    os.rename("d", "d2")
except OSError as e:
    print(e.errno)'`)
	if !strings.Contains(got, "Invalid cross-device link") || !strings.HasSuffix(got, "18") {
		t.Fatalf("link and a directory rename: %q", got)
	}
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `mv d d2 && cat d2/x.txt && ls`); got != "x\na.txt\nd2\ngone.txt\nl" {
		t.Fatalf("mv of a backing directory: %q", got)
	}
	list, _ := stagedDiff(d, "s")
	if strings.Join(list, ",") != "A workspace/d2/,A workspace/d2/x.txt,D workspace/d/" {
		t.Fatalf("diff after mv: %v", list)
	}
}

// TestStagedRunChangesEachKindHeldThenCommitted: a command in condfs run
// makes each kind of change (chmod, mkdir, symlink, rename, rmdir, remove,
// truncate, create) in a staged session: the backing tree holds none of
// it, the session's view all of it, and after a commit the backing tree
// holds what the view showed.
func TestStagedRunChangesEachKindHeldThenCommitted(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	start := testenv.BackingTree(t, ws)
	out, code := testenv.CondfsRun(t, d, "", "--cwd", "/workspace", "--", "sh", "-c",
		`chmod 600 a.txt && truncate -s 2 a.txt && mkdir rd && mkdir rd/sub && rmdir rd/sub && ln -s a.txt rl && mv gone.txt g2.txt && rm d/x.txt && rmdir d && printf n > n.txt`)
	if code != 0 {
		t.Fatalf("condfs run: %d %s", code, out)
	}
	sameBacking(t, "the backing tree before commit", start, testenv.BackingTree(t, ws))
	const describe = `find . -printf '%p %M %u %s %l\n' | sort`
	view := testenv.ShAsNobody(t, mnt+"/workspace", describe)
	want := []string{"A workspace/g2.txt", "A workspace/n.txt", "A workspace/rd/", "A workspace/rl", "D workspace/d/", "D workspace/gone.txt", "M workspace/a.txt"}
	if got, _ := stagedDiff(d, "s"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("diff %v, want %v", got, want)
	}
	var r commitResult
	d.Call("changes.commit", map[string]any{"session": "s"}, &r)
	if r.Committed != len(want) || len(r.Conflicts) != 0 {
		t.Fatalf("commit: %+v", r)
	}
	if got := testenv.ShAsNobody(t, ws, describe); got != view {
		t.Fatalf("the backing tree after commit:\n%s\nthe staged view before it:\n%s", got, view)
	}
}

// TestStagedMaxBytesCountsWhatTheCallerCannotSearch: bytes in a directory
// of the layer the caller made unsearchable (and then renamed, which
// recounts the layer) still count against max_bytes: the directory and
// its file take two of three blocks, and a third entry fills the layer.
func TestStagedMaxBytesCountsWhatTheCallerCannotSearch(t *testing.T) {
	_, mnt, _ := stagedHome(t, testenv.ChangesRules+"\n[changes]\nmax_bytes = \"12KiB\"\n", nil)
	testenv.ShAsNobody(t, mnt+"/workspace", `mkdir x && head -c 3072 /dev/zero > x/big && chmod 000 x && mv x y`)
	out, _ := testenv.CommandAs(testenv.Nobody, "/bin/sh", "-c", "head -c 1 /dev/zero > "+mnt+"/workspace/more").CombinedOutput()
	if !strings.Contains(string(out), "No space left") {
		t.Fatalf("a change beyond max_bytes, the bytes in a 000 directory: %s", out)
	}
}

// TestStagedDiffNeverShowsWhatTheOwnerCannotRead: uid 65534 removes a
// root-only file it may remove but not read; the staged diff lists the
// removal and never shows the file's content.
func TestStagedDiffNeverShowsWhatTheOwnerCannotRead(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/root-only.txt", "ROOT SECRET\n")
		os.Chmod(h.Path("workspace/root-only.txt"), 0o600)
	})
	testenv.ShAsNobody(t, mnt+"/workspace", `rm -f root-only.txt`)
	out := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "diff", "s", "--content")
	if !strings.Contains(out, "D workspace/root-only.txt") || strings.Contains(out, "SECRET") {
		t.Fatalf("the staged diff of a root-only file removed:\n%s", out)
	}
}

// TestStagedViewKeepsItsBackingRootWhenItsPathIsReplaced: a writer of the
// backing root's parent who renames the backing directory away and puts a
// symlink to another directory at its path changes nothing the staged
// view serves: the layer is mounted again over the directory it opened
// (the one its changes are diffed against and committed to), never over
// whatever the path names at the time.
func TestStagedViewKeepsItsBackingRootWhenItsPathIsReplaced(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	view := mnt + "/workspace"
	if got := testenv.ShAsNobody(t, view, `cat a.txt && printf n > n.txt`); got != "alpha" {
		t.Fatalf("before: %q", got)
	}
	d.Home.Write("elsewhere/secret.txt", "secret\n")
	os.Chmod(d.Home.Path("elsewhere"), 0o777)
	ws := d.Home.Path("workspace")
	if err := os.Rename(ws, ws+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(d.Home.Path("elsewhere"), ws); err != nil {
		t.Fatal(err)
	}
	// A discard mounts the layer again.
	d.Call("changes.discard", map[string]any{"session": "s", "paths": []string{"workspace/n.txt"}}, nil)
	if got := testenv.ShAsNobody(t, view, `cat a.txt; ls`); got != "alpha\na.txt\nd\ngone.txt\nl" {
		t.Fatalf("after the backing root's path was replaced by a symlink the view shows %q", got)
	}
}
