package views

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// cwdRules rule memories/private/ (allowed in both contexts cwdCtxA and
// cwdCtxB, hidden in guildCtx); workspace/ has no rule.
const cwdRules = testenv.PrivateRule

var (
	cwdCtxA = []string{"discord:dm", "discord:channel:7"}
	cwdCtxB = []string{"discord:dm", "discord:channel:8"}
)

// cwdView starts a daemon over a home whose spaces nobody owns and opens a
// view served to nobody in cwdCtxA.
func cwdView(t *testing.T) (*testenv.Home, *testenv.Daemon, string) {
	t.Helper()
	h := testenv.OpenHome(t, cwdRules)
	for _, p := range []string{"workspace/src/deep/f", "workspace/src/sib/f", "workspace/other/f", "memories/private/deep/f", "memories/private/sib/f", "memories/other/f"} {
		h.Write(p, "x")
	}
	testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	testenv.ChownTree(t, h.Path("memories"), testenv.Nobody)
	d := testenv.Start(t, h)
	return h, d, d.OpenFor("s", testenv.Nobody, cwdCtxA)
}

// TestNewDirectoryKeepsItsNameForItsCwd: `mkdir app && cd app && node`
// through a view, 20 times in each space, and `mkdir -p` of an absolute
// path by another process, then a shell's cd there: getcwd(2) answers the
// directory's path at once and 60 ms later (after the backing tree's
// watch has reported the view's own mkdir).
func TestNewDirectoryKeepsItsNameForItsCwd(t *testing.T) {
	_, _, mnt := cwdView(t)
	sh := testenv.StartShell(t)
	failed := 0
	for _, dir := range []string{"workspace", "memories/private"} {
		for i := range 20 {
			p := fmt.Sprintf("%s/%s/app%d", mnt, dir, i)
			if ok, res := sh.Do("mkcd", p, "60"); !ok || res != p {
				if failed++; failed <= 3 {
					t.Errorf("mkdir %s && cd && getcwd: %v %s", p, ok, res)
				}
			}
		}
	}
	p := mnt + "/workspace/made/by/mkdir-p"
	if out, err := testenv.CommandAs(testenv.Nobody, "mkdir", "-p", p).CombinedOutput(); err != nil {
		t.Fatalf("mkdir -p %s: %v %s", p, err, out)
	}
	if ok, res := sh.Do("cd", p); !ok {
		t.Fatalf("cd %s: %s", p, res)
	}
	time.Sleep(60 * time.Millisecond)
	if ok, res := sh.Do("pwd", "-"); !ok || res != p {
		failed++
		t.Errorf("getcwd in %s, made by mkdir -p: %v %s", p, ok, res)
	}
	if failed > 0 {
		t.Errorf("%d of 41 new directories lost their name for a process inside", failed)
	}
}

// TestVisibleDirectoryKeepsItsNameForItsCwd: shells left in a directory
// without rules and in a ruled one keep their working directory's name
// across a switch that keeps it visible, a reload, a change in the backing
// tree, and renames of a sibling and of a parent's sibling (through the
// view and in the backing tree), while another process walks the path.
func TestVisibleDirectoryKeepsItsNameForItsCwd(t *testing.T) {
	h, d, mnt := cwdView(t)
	dirs := []string{mnt + "/workspace/src/deep", mnt + "/memories/private/deep"}
	var shells []*testenv.Shell
	for _, dir := range dirs {
		sh := testenv.StartShell(t)
		if ok, res := sh.Do("cd", dir); !ok {
			t.Fatalf("cd %s: %s", dir, res)
		}
		shells = append(shells, sh)
	}
	walker := testenv.StartShell(t)
	n := 0
	events := []struct {
		what string
		do   func()
	}{
		{"context.set keeping it visible", func() { d.SetContext("s", cwdCtxB) }},
		{"context.set back", func() { d.SetContext("s", cwdCtxA) }},
		{"config.reload", func() { d.Call("config.reload", map[string]any{}, nil) }},
		{"a file made in the backing directory", func() {
			n++
			for _, sp := range []string{"workspace/src/deep", "memories/private/deep", "workspace/src", "memories/private"} {
				h.Write(fmt.Sprintf("%s/new%d", sp, n), "x")
			}
		}},
		{"a sibling renamed through the view", func() {
			walker.Do("rename", mnt+"/workspace/src/sib", mnt+"/workspace/src/sib2")
			walker.Do("rename", mnt+"/memories/private/sib", mnt+"/memories/private/sib2")
		}},
		{"a parent's sibling renamed through the view", func() {
			walker.Do("rename", mnt+"/workspace/other", mnt+"/workspace/other2")
			walker.Do("rename", mnt+"/memories/other", mnt+"/memories/other2")
		}},
		{"a sibling renamed in the backing tree", func() {
			os.Rename(h.Path("workspace/src/sib2"), h.Path("workspace/src/sib"))
			os.Rename(h.Path("memories/private/sib2"), h.Path("memories/private/sib"))
		}},
		{"a parent's sibling renamed in the backing tree", func() {
			os.Rename(h.Path("workspace/other2"), h.Path("workspace/other"))
			os.Rename(h.Path("memories/other2"), h.Path("memories/other"))
		}},
	}
	for _, ev := range events {
		ev.do()
		// The backing tree's watch reports within its coalescing delay.
		time.Sleep(50 * time.Millisecond)
		// Before another process walks the path (a walk that looks the
		// directory up again gives a dropped entry its name back), and
		// after.
		for _, walked := range []bool{false, true} {
			for i, dir := range dirs {
				if walked {
					for _, p := range []string{filepath.Dir(dir), dir, dir + "/f"} {
						if ok, res := walker.Do("stat", p); !ok {
							t.Fatalf("after %s: stat %s by another process: %s", ev.what, p, res)
						}
					}
				}
				if ok, res := shells[i].Do("pwd", "-"); !ok || res != dir {
					t.Errorf("after %s (walked: %v): getcwd in %s: %v %s", ev.what, walked, dir, ok, res)
				}
				if ok, res := shells[i].Do("stat", "f"); !ok {
					t.Errorf("after %s (walked: %v): stat f in %s: %s", ev.what, walked, dir, res)
				}
			}
		}
	}
}

// TestHiddenDirectoryLeavesItsCwdNowhere: a shell in a directory a switch
// hides finds nothing there (whether getcwd still names it depends on the
// invalidation path: docs/conditions.md).
func TestHiddenDirectoryLeavesItsCwdNowhere(t *testing.T) {
	_, d, mnt := cwdView(t)
	dir := mnt + "/memories/private/deep"
	sh, walker := testenv.StartShell(t), testenv.StartShell(t)
	if ok, res := sh.Do("cd", dir); !ok {
		t.Fatalf("cd %s: %s", dir, res)
	}
	d.SetContext("s", testenv.Guild)
	if ok, res := walker.Do("stat", dir); ok || !strings.Contains(res, "ENOENT") {
		t.Fatalf("stat of the hidden directory: %v %s", ok, res)
	}
	if ok, res := sh.Do("stat", "f"); ok || !strings.Contains(res, "ENOENT") {
		t.Errorf("relative stat in the hidden directory: %v %s, want ENOENT", ok, res)
	}
	if ok, res := sh.Do("ls", "."); ok || !strings.Contains(res, "ENOENT") {
		t.Errorf("listing the hidden directory: %v %s, want ENOENT", ok, res)
	}
	if ok, res := sh.Do("creat", "new", "x"); ok || !strings.Contains(res, "ENOENT") {
		t.Errorf("create in the hidden directory: %v %s, want ENOENT", ok, res)
	}
}

// TestCwdNameHoldsThroughSwitchesWhileOthersWalk: a process asking
// getcwd(2) again and again in a directory that stays visible never loses
// its name while the session switches back and forth, or the rules are
// reloaded again and again, or a directory above the backing roots changes
// again and again (the view cannot say which entries that changes, as when
// events are lost, and drops every cache), and another process walks the
// path (which makes the kernel look up again whatever the view left
// stale): on every invalidation path, getcwd answers the directory's path
// every time. Each expires the entries it keeps rather than marking all of
// them stale with the epoch, where the kernel can (Linux 6.2 and later): a
// stale entry is dropped on the next walk, and for that lookup's round
// trip the directory has no name (so not with CONDFS_INVALIDATION=epoch,
// which forces the epoch where the kernel could expire).
func TestCwdNameHoldsThroughSwitchesWhileOthersWalk(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(d *testenv.Daemon, i int)
	}{
		{"switches", func(d *testenv.Daemon, i int) {
			ctx := cwdCtxB
			if i%2 == 1 {
				ctx = cwdCtxA
			}
			d.SetContext("s", ctx)
		}},
		{"reloads", func(d *testenv.Daemon, i int) { d.Call("config.reload", map[string]any{}, nil) }},
		{"every cache dropped", func(d *testenv.Daemon, i int) {
			if err := os.Chmod(d.Home.Root, 0o755); err != nil {
				t.Error(err)
			}
			time.Sleep(time.Millisecond)
		}},
	} {
		t.Run(c.name, func(t *testing.T) { cwdNameHolds(t, c.change) })
	}
}

func cwdNameHolds(t *testing.T, change func(d *testenv.Daemon, i int)) {
	_, d, mnt := cwdView(t)
	dirs := []string{mnt + "/workspace/src/deep", mnt + "/memories/private/deep"}
	type loop struct {
		pwd, walk *testenv.Shell
		dir       string
	}
	var loops []loop
	for _, dir := range dirs {
		l := loop{pwd: testenv.StartShell(t), walk: testenv.StartShell(t), dir: dir}
		if ok, res := l.pwd.Do("cd", dir); !ok {
			t.Fatalf("cd %s: %s", dir, res)
		}
		loops = append(loops, l)
	}
	const ms = 3000
	results := make(chan string, 2*len(loops))
	for _, l := range loops {
		go func() {
			_, res := l.pwd.Do("pwdloop", strconv.Itoa(ms))
			results <- l.dir + ": " + res
		}()
		go func() {
			l.walk.Do("statloop", l.dir+"/f", strconv.Itoa(ms))
			results <- ""
		}()
	}
	changes := 0
	for end := time.Now().Add(ms * time.Millisecond); time.Now().Before(end); changes++ {
		change(d, changes)
	}
	for range 2 * len(loops) {
		res := <-results
		if res == "" {
			continue
		}
		var first string
		var calls, failures int
		dir, counts, _ := strings.Cut(res, ": ")
		if _, err := fmt.Sscanf(counts, "%d %d %q", &calls, &failures, &first); err != nil {
			t.Fatalf("%s: %v", res, err)
		}
		t.Logf("%s: %d getcwd calls over %d changes", dir, calls, changes)
		if failures != 0 {
			t.Errorf("%s: getcwd failed %d of %d times over %d changes (first: %s)", dir, failures, calls, changes, first)
		}
	}
}
