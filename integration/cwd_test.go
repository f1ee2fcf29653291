package integration

// A process inside a directory of a view keeps the directory's name (getcwd)
// for as long as the directory stays visible, whatever the view invalidates:
// its own new entries, a switch, a reload, a change in the backing tree, a
// rename beside it. A directory that becomes hidden leaves its processes
// nowhere. Each test runs as an unprivileged owner, and `make test` runs
// them on every invalidation path (NOSTALE).

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cwdRules rule memories/private/ (allowed in both contexts cwdCtxA and
// cwdCtxB, hidden in guildCtx); workspace/ has no rule.
const cwdRules = privateRule

var (
	cwdCtxA = []string{"discord:dm", "discord:channel:7"}
	cwdCtxB = []string{"discord:dm", "discord:channel:8"}
)

// cwdView starts a daemon over a home whose spaces nobody owns and opens a
// view served to nobody in cwdCtxA.
func cwdView(t *testing.T) (*home, *daemon, string) {
	t.Helper()
	h := openHome(t, cwdRules)
	for _, p := range []string{"workspace/src/deep/f", "workspace/src/sib/f", "workspace/other/f", "memories/private/deep/f", "memories/private/sib/f", "memories/other/f"} {
		h.write(p, "x")
	}
	chownTree(t, h.path("workspace"), nobody)
	chownTree(t, h.path("memories"), nobody)
	d := startDaemon(t, h)
	return h, d, d.openFor("s", nobody, cwdCtxA)
}

// TestNewDirectoryKeepsItsNameForItsCwd: `mkdir app && cd app && node`
// through a view, 20 times in each space, and `mkdir -p` of an absolute
// path by another process, then a shell's cd there: getcwd(2) answers the
// directory's path at once and 60 ms later (after the backing tree's
// watch has reported the view's own mkdir).
func TestNewDirectoryKeepsItsNameForItsCwd(t *testing.T) {
	_, _, mnt := cwdView(t)
	sh := startShell(t)
	failed := 0
	for _, dir := range []string{"workspace", "memories/private"} {
		for i := range 20 {
			p := fmt.Sprintf("%s/%s/app%d", mnt, dir, i)
			if ok, res := sh.do("mkcd", p, "60"); !ok || res != p {
				if failed++; failed <= 3 {
					t.Errorf("mkdir %s && cd && getcwd: %v %s", p, ok, res)
				}
			}
		}
	}
	p := mnt + "/workspace/made/by/mkdir-p"
	if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "mkdir", "-p", p).CombinedOutput(); err != nil {
		t.Fatalf("mkdir -p %s: %v %s", p, err, out)
	}
	if ok, res := sh.do("cd", p); !ok {
		t.Fatalf("cd %s: %s", p, res)
	}
	time.Sleep(60 * time.Millisecond)
	if ok, res := sh.do("pwd", "-"); !ok || res != p {
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
	var shells []*shellProc
	for _, dir := range dirs {
		sh := startShell(t)
		if ok, res := sh.do("cd", dir); !ok {
			t.Fatalf("cd %s: %s", dir, res)
		}
		shells = append(shells, sh)
	}
	walker := startShell(t)
	n := 0
	events := []struct {
		what string
		do   func()
	}{
		{"context.set keeping it visible", func() { d.setContext("s", cwdCtxB) }},
		{"context.set back", func() { d.setContext("s", cwdCtxA) }},
		{"config.reload", func() { d.call("config.reload", map[string]any{}, nil) }},
		{"a file made in the backing directory", func() {
			n++
			for _, sp := range []string{"workspace/src/deep", "memories/private/deep", "workspace/src", "memories/private"} {
				h.write(fmt.Sprintf("%s/new%d", sp, n), "x")
			}
		}},
		{"a sibling renamed through the view", func() {
			walker.do("rename", mnt+"/workspace/src/sib", mnt+"/workspace/src/sib2")
			walker.do("rename", mnt+"/memories/private/sib", mnt+"/memories/private/sib2")
		}},
		{"a parent's sibling renamed through the view", func() {
			walker.do("rename", mnt+"/workspace/other", mnt+"/workspace/other2")
			walker.do("rename", mnt+"/memories/other", mnt+"/memories/other2")
		}},
		{"a sibling renamed in the backing tree", func() {
			os.Rename(h.path("workspace/src/sib2"), h.path("workspace/src/sib"))
			os.Rename(h.path("memories/private/sib2"), h.path("memories/private/sib"))
		}},
		{"a parent's sibling renamed in the backing tree", func() {
			os.Rename(h.path("workspace/other2"), h.path("workspace/other"))
			os.Rename(h.path("memories/other2"), h.path("memories/other"))
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
						if ok, res := walker.do("stat", p); !ok {
							t.Fatalf("after %s: stat %s by another process: %s", ev.what, p, res)
						}
					}
				}
				if ok, res := shells[i].do("pwd", "-"); !ok || res != dir {
					t.Errorf("after %s (walked: %v): getcwd in %s: %v %s", ev.what, walked, dir, ok, res)
				}
				if ok, res := shells[i].do("stat", "f"); !ok {
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
	sh, walker := startShell(t), startShell(t)
	if ok, res := sh.do("cd", dir); !ok {
		t.Fatalf("cd %s: %s", dir, res)
	}
	d.setContext("s", guildCtx)
	if ok, res := walker.do("stat", dir); ok || !strings.Contains(res, "ENOENT") {
		t.Fatalf("stat of the hidden directory: %v %s", ok, res)
	}
	if ok, res := sh.do("stat", "f"); ok || !strings.Contains(res, "ENOENT") {
		t.Errorf("relative stat in the hidden directory: %v %s, want ENOENT", ok, res)
	}
	if ok, res := sh.do("ls", "."); ok || !strings.Contains(res, "ENOENT") {
		t.Errorf("listing the hidden directory: %v %s, want ENOENT", ok, res)
	}
	if ok, res := sh.do("creat", "new", "x"); ok || !strings.Contains(res, "ENOENT") {
		t.Errorf("create in the hidden directory: %v %s, want ENOENT", ok, res)
	}
}
