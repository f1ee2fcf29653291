package changes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// replaceByRename writes content to p as editors and build tools do: a
// new file renamed over the old one.
func replaceByRename(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		t.Fatal(err)
	}
}

// connections are the invalidation paths a staged view is tested on: the
// shared connection (entries expired), a connection per session, entries
// dropped (as kernels before 6.2) and the epoch.
var connections = []struct {
	name, invalidation string
	flags              []string
}{
	{"shared connection", "", nil},
	{"connection per session", "", []string{"--connections=per-session"}},
	{"entries dropped", "entries-drop", nil},
	{"epoch", "epoch", nil},
}

// onEachConnection runs f on each invalidation path.
func onEachConnection(t *testing.T, f func(t *testing.T, flags []string)) {
	for _, c := range connections {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("CONDFS_INVALIDATION", c.invalidation) // the daemon's
			f(t, c.flags)
		})
	}
}

// remakeDir removes the directory p and makes it again holding one file.
func remakeDir(t *testing.T, p, file, content string) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p+"/"+file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStagedViewShowsFileReplacedInBackingAfterDiscard: overlayfs keeps
// what it looked up of the backing tree, so a file another writer replaced
// by rename, and a directory removed and made again, stayed as the staged
// view had first seen them. A discard mounts the layer afresh: from its
// answer the view shows the backing tree as it is now, for the paths it
// discarded and every other.
func TestStagedViewShowsFileReplacedInBackingAfterDiscard(t *testing.T) {
	onEachConnection(t, func(t *testing.T, flags []string) {
		d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil, flags...)
		ws := d.Home.Path("workspace")
		if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt d/x.txt && printf n > new.txt`); got != "alpha\nx" {
			t.Fatalf("before: %q", got)
		}
		replaceByRename(t, ws+"/a.txt", "renamed over\n")
		remakeDir(t, ws+"/d", "y.txt", "y\n")
		d.Call("changes.discard", map[string]any{"session": "s", "paths": []string{"workspace/new.txt"}}, nil)
		if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt; ls d; cat d/y.txt; ls`); got != "renamed over\ny.txt\ny\na.txt\nd\ngone.txt\nl" {
			t.Fatalf("after the discard: %q", got)
		}
	})
}

// TestStagedViewShowsFileReplacedInBackingAfterCommit: a commit leaves in
// the layer nothing it made the backing tree hold, and mounts it afresh:
// a file the view had looked up before the commit, which another writer
// replaced by rename, shows its new content from the commit's answer.
func TestStagedViewShowsFileReplacedInBackingAfterCommit(t *testing.T) {
	onEachConnection(t, func(t *testing.T, flags []string) {
		d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil, flags...)
		ws := d.Home.Path("workspace")
		if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt && printf mine > gone.txt`); got != "alpha" {
			t.Fatalf("before: %q", got)
		}
		replaceByRename(t, ws+"/a.txt", "renamed over\n")
		var res commitResult
		d.Call("changes.commit", map[string]any{"session": "s"}, &res)
		if res.Committed != 1 || len(res.Conflicts) != 0 {
			t.Fatalf("commit: %+v", res)
		}
		if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt gone.txt`); got != "renamed over\nmine" {
			t.Fatalf("after the commit: %q", got)
		}
		if got, _ := stagedDiff(d, "s"); len(got) != 0 {
			t.Fatalf("changes left after the commit: %v", got)
		}
	})
}

// TestStagedWorkingDirectoryLivesThroughARemount: a process whose working
// directory is in a staged view keeps it across a discard (the layer is
// mounted afresh; every inode keeps its identity), and a file it kept open
// reads what it opened.
func TestStagedWorkingDirectoryLivesThroughARemount(t *testing.T) {
	onEachConnection(t, func(t *testing.T, flags []string) {
		d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil, flags...)
		testenv.ShAsNobody(t, mnt+"/workspace", `printf n > new.txt`)
		cmd := testenv.CommandAs(testenv.Nobody, "/bin/sh", "-c", `cd "$1" && exec 3<x.txt && read -r line && cat x.txt && pwd && cat <&3`, "sh", mnt+"/workspace/d")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the shell is in d, x.txt open
		d.Call("changes.discard", map[string]any{"session": "s"}, nil)
		in.Write([]byte("go\n"))
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("the shell across the remount: %v: %s", err, out.String())
		}
		if got := strings.TrimSpace(out.String()); got != "x\n"+mnt+"/workspace/d\nx" {
			t.Fatalf("the shell across the remount: %q", got)
		}
	})
}

// eventually waits for the staged view to answer script with want: a
// change in the backing tree shows within the watch's delay and a
// remount, well inside the view's attribute timeout.
func eventually(t *testing.T, dir, script, want, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := testenv.ShAsNobody(t, dir, script+` 2>&1 || true`)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the staged view shows %q, want %q", what, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStagedViewShowsFileReplacedInBacking: a backing file another writer
// replaces by rename (as editors, git checkout and build tools write), and
// a directory removed and made again, show in a staged view that had
// looked them up, without a commit or discard: the daemon watches the
// backing filesystem and mounts the layer afresh. So do changes made after
// a discard and after a commit.
func TestStagedViewShowsFileReplacedInBacking(t *testing.T) {
	onEachConnection(t, func(t *testing.T, flags []string) {
		d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil, flags...)
		ws := d.Home.Path("workspace")
		view := mnt + "/workspace"
		if got := testenv.ShAsNobody(t, view, `cat a.txt d/x.txt && printf n > new.txt`); got != "alpha\nx" {
			t.Fatalf("before: %q", got)
		}
		replaceByRename(t, ws+"/a.txt", "renamed over\n")
		eventually(t, view, `cat a.txt`, "renamed over", "a file replaced by rename")
		remakeDir(t, ws+"/d", "y.txt", "y\n")
		eventually(t, view, `ls d; cat d/y.txt`, "y.txt\ny", "a directory removed and made again")

		d.Call("changes.discard", map[string]any{"session": "s"}, nil)
		testenv.ShAsNobody(t, view, `cat a.txt gone.txt`)
		replaceByRename(t, ws+"/a.txt", "after the discard\n")
		eventually(t, view, `cat a.txt`, "after the discard", "a change after a discard")

		testenv.ShAsNobody(t, view, `printf mine > gone.txt`)
		var res commitResult
		d.Call("changes.commit", map[string]any{"session": "s"}, &res)
		if res.Committed != 1 || len(res.Conflicts) != 0 {
			t.Fatalf("commit: %+v", res)
		}
		if got := testenv.ShAsNobody(t, view, `cat gone.txt`); got != "mine" {
			t.Fatalf("after the commit: %q", got)
		}
		replaceByRename(t, ws+"/gone.txt", "after the commit\n")
		eventually(t, view, `cat gone.txt`, "after the commit", "a committed file replaced after the commit")
		if got, _ := stagedDiff(d, "s"); len(got) != 0 {
			t.Fatalf("another writer's changes listed as the session's: %v", got)
		}
	})
}

// TestStagedDescriptorFromBeforeARemountIsDecidedByItsNameNow: a file held
// open across a remount (a discard) and then moved, through the new
// mount, under a path the next context hides reads nothing after the
// switch: a descriptor of a detached mount is decided by the name it
// gives only while the current mount has the same file there (a rename
// made since is not seen by the detached mount); else the name is not
// known and the descriptor is refused.
func TestStagedDescriptorFromBeforeARemountIsDecidedByItsNameNow(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	testenv.ShAsNobody(t, mnt+"/memories", `printf 'dm only' > s.md && printf junk > junk.md`)
	first, ask := testenv.ConverseAsNobody(t, "hold", mnt+"/memories/s.md")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	d.Call("changes.discard", map[string]any{"session": "s", "paths": []string{"memories/junk.md"}}, nil)
	testenv.ShAsNobody(t, mnt+"/memories", `mv s.md private/s.md`)
	d.SetContext("s", testenv.Guild)
	if got := ask("r"); strings.Contains(got, "dm only") {
		t.Fatalf("a descriptor of a file moved under a hidden path reads after the switch: %s", got)
	}
}

// TestStagedWorkingDirectoryMovedAfterARemountIsDecidedByItsNameNow: a
// process whose working directory was entered before a remount, and moved
// after it under a path the next context hides, reads nothing through it
// after the switch, as natively its directory would be hidden.
func TestStagedWorkingDirectoryMovedAfterARemountIsDecidedByItsNameNow(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	testenv.ShAsNobody(t, mnt+"/memories", `mkdir d && printf 'dm only' > d/f.md && printf junk > junk.md`)
	sh := testenv.StartShell(t)
	if ok, res := sh.Do("cd", mnt+"/memories/d"); !ok {
		t.Fatalf("cd: %s", res)
	}
	d.Call("changes.discard", map[string]any{"session": "s", "paths": []string{"memories/junk.md"}}, nil)
	testenv.ShAsNobody(t, mnt+"/memories", `mv d private/d`)
	d.SetContext("s", testenv.Guild)
	for _, name := range []string{"f.md", "./f.md"} {
		if ok, res := sh.Do("cat", name); ok || strings.Contains(res, "dm only") {
			t.Fatalf("cat %s in a working directory moved under a hidden path, after the switch: %v %s", name, ok, res)
		}
	}
	if ok, res := sh.Do("ls", "."); ok && strings.Contains(res, "f.md") {
		t.Fatalf("ls of a working directory moved under a hidden path, after the switch: %s", res)
	}
}

// TestStagedDirectoryHeldAcrossARemountIsDecidedByItsNameNow: a directory
// opened before a remount and moved after it under a path the next
// context hides lists nothing, and opens nothing relative to it, after the
// switch.
func TestStagedDirectoryHeldAcrossARemountIsDecidedByItsNameNow(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	testenv.ShAsNobody(t, mnt+"/memories", `mkdir d && printf 'dm only' > d/f.md && printf junk > junk.md`)
	first, ask := testenv.ConverseAsNobody(t, "dirhold", mnt+"/memories/d")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	d.Call("changes.discard", map[string]any{"session": "s", "paths": []string{"memories/junk.md"}}, nil)
	testenv.ShAsNobody(t, mnt+"/memories", `mv d private/d`)
	d.SetContext("s", testenv.Guild)
	if got := ask("ls"); strings.Contains(got, "f.md") {
		t.Fatalf("a directory held across a remount and moved under a hidden path lists after the switch: %s", got)
	}
	if got := ask("at f.md"); strings.Contains(got, "dm only") {
		t.Fatalf("a directory held across a remount and moved under a hidden path opens after the switch: %s", got)
	}
}

// TestStagedDescriptorFollowsItsFileAcrossARemount: a file held open
// across a remount (a discard of another path) and then renamed through
// the view is read and written through the descriptor under its new name,
// as natively: a remount moves every open file onto the new mount.
func TestStagedDescriptorFollowsItsFileAcrossARemount(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	testenv.ShAsNobody(t, mnt+"/memories", `printf 'mine' > s.md && printf junk > junk.md`)
	first, ask := testenv.ConverseAsNobody(t, "hold", mnt+"/memories/s.md")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	d.Call("changes.discard", map[string]any{"session": "s", "paths": []string{"memories/junk.md"}}, nil)
	testenv.ShAsNobody(t, mnt+"/memories", `mv s.md t.md`)
	if got := ask("r"); got != `read "mine"` {
		t.Fatalf("a held file renamed after a remount reads %s", got)
	}
	if got := ask("w"); got != "wrote" {
		t.Fatalf("a held file renamed after a remount: write answers %s", got)
	}
	if got := testenv.ShAsNobody(t, mnt+"/memories", `cat t.md`); got != "Wine" {
		t.Fatalf("the file written through the held descriptor holds %q", got)
	}
}

// TestStagedLockHeldAcrossARemountStillExcludes: a lock taken before a
// remount keeps every descriptor opened after it out, and is let go as
// before: each mount of a layer has inodes of its own, so a lock held on
// the old mount's would exclude nothing opened on the new.
// The locked file is one the session made, or a backing file copied into
// the layer by the open itself (whose number changes at the remount: a
// copy has its own from the next mount on).
func TestStagedLockHeldAcrossARemountStillExcludes(t *testing.T) {
	for _, c := range []struct{ kind, file string }{
		{"flock", "memories/l.md"}, {"ofd", "memories/l.md"}, {"posix", "memories/l.md"},
		{"flock", "workspace/a.txt"}, {"ofd", "workspace/a.txt"}, {"posix", "workspace/a.txt"},
	} {
		kind := c.kind
		t.Run(kind+" "+c.file, func(t *testing.T) {
			d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
			testenv.ShAsNobody(t, mnt, `printf x > memories/l.md && printf junk > memories/junk.md && printf junk > workspace/junk.md`)
			first, holder := testenv.ConverseAsNobody(t, "locker", mnt+"/"+c.file)
			if first != "open" {
				t.Fatalf("open: %s", first)
			}
			if got := holder(kind + " w nb"); got != "ok" {
				t.Fatalf("lock: %s", got)
			}
			// A discard in the file's space mounts it again.
			d.Call("changes.discard", map[string]any{"session": "s", "paths": []string{filepath.Dir(c.file) + "/junk.md"}}, nil)
			first, other := testenv.ConverseAsNobody(t, "locker", mnt+"/"+c.file)
			if first != "open" {
				t.Fatalf("open after the remount: %s", first)
			}
			if got := other(kind + " w nb"); got != "errno EAGAIN" && got != "errno EWOULDBLOCK" {
				t.Fatalf("a lock held across a remount: another descriptor's lock answers %s\n%s", got, d.Log())
			}
			if got := holder(kind + " un"); got != "ok" {
				t.Fatalf("unlock after the remount: %s", got)
			}
			if got := other(kind + " w nb"); got != "ok" {
				t.Fatalf("a lock let go after a remount: another descriptor's lock answers %s", got)
			}
		})
	}
}

// TestStagedListedBinaryNeverShowsTheSessionsCopy: a backing file the
// session copied into its layer (a chmod), then installed by another
// writer under a path [sandbox] lists (renamed there in the backing tree,
// as build tools install), is two files in the staged view with one
// inode number: overlayfs numbers the copy as the file it came from. The
// listed path, read-only in the view, never shows what the session writes
// to its copy, whichever name the view looked up first.
func TestStagedListedBinaryNeverShowsTheSessionsCopy(t *testing.T) {
	rules := testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/cat", "/workspace/bin/"]
`
	for _, first := range []string{"bin/tool tool.new", "tool.new bin/tool"} {
		t.Run(first, func(t *testing.T) {
			d, mnt, _ := stagedHome(t, rules, func(h *testenv.Home) {
				h.Write("workspace/tool.new", "ORIGINAL\n")
				os.Chown(h.Path("workspace/tool.new"), testenv.Nobody, testenv.Nobody)
				os.Mkdir(h.Path("workspace/bin"), 0o755)
			})
			ws := d.Home.Path("workspace")
			view := mnt + "/workspace"
			if got := testenv.ShAsNobody(t, view, `chmod 0755 tool.new && cat tool.new`); got != "ORIGINAL" {
				t.Fatalf("the session's copy: %q", got)
			}
			if err := os.Rename(ws+"/tool.new", ws+"/bin/tool"); err != nil {
				t.Fatal(err)
			}
			replaceByRename(t, ws+"/bin/marker", "m\n")
			eventually(t, view, `cat bin/marker`, "m", "a file installed after the binary")
			got := testenv.ShAsNobody(t, view, `stat -c %n `+first+` >/dev/null 2>&1; { mv tool.new tool.x && mv tool.x tool.new && printf 'EVIL\n' 1<> tool.new && cat tool.new; } 2>&1; echo ---; cat bin/tool 2>&1 || true`)
			copied, listed, _ := strings.Cut(got, "---\n")
			// With the backing file's inode looked up first, overlayfs may
			// refuse the copy's name (ESTALE) while it keeps that inode.
			if copied != "EVIL\nNAL\n" && (strings.HasPrefix(first, "tool.new") || !strings.Contains(got, "Stale file handle")) {
				t.Fatalf("the session's copy, written, reads %q", got)
			}
			if strings.Contains(listed, "EVIL") {
				t.Fatalf("the listed binary, read through the view, shows the session's copy: %q", listed)
			}
			if b, _ := os.ReadFile(ws + "/bin/tool"); string(b) != "ORIGINAL\n" {
				t.Fatalf("the backing binary holds %q", b)
			}
		})
	}
}
