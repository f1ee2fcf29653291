package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestAdmittedUidCannotUseDaemonMount: a uid admitted with --allow-uid
// cannot use the daemon's mount(2): no view over root-owned directories,
// no directory made anywhere, no unmount of what a swapped symlink names,
// and no switch or close of others' sessions.
func TestAdmittedUidCannotUseDaemonMount(t *testing.T) {
	h := testenv.OpenHome(t, "")
	mountRoot := h.Path("views")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666", "--mount-root", mountRoot)
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	rootOnly := h.Path("rootonly")
	os.Mkdir(rootOnly, 0o700)
	ctl := func(args ...string) string {
		return testenv.AsNobody(t, append([]string{"condfs", "ctl", "--socket", d.Socket}, args...)...)
	}
	if out := ctl("open", "x", rootOnly, "--context", "tui"); !strings.Contains(out, "may mount only") {
		t.Fatalf("mount over a root-owned directory: %s", out)
	}
	fresh := h.Path("nowhere/a/b")
	if out := ctl("open", "y", fresh, "--context", "tui"); strings.Contains(out, "mounted at") {
		t.Fatalf("mount on a new path: %s", out)
	}
	if _, err := os.Stat(h.Path("nowhere")); err == nil {
		t.Fatal("the daemon created directories for an unprivileged peer")
	}
	// A symlink anywhere on the way is refused, so a swap cannot redirect
	// the mount or, later, the unmount.
	own := h.Path("own")
	os.Mkdir(own, 0o755)
	os.Chown(own, testenv.Nobody, testenv.Nobody)
	link := h.Path("link")
	os.Symlink(own, link)
	if out := ctl("open", "z", link, "--context", "tui"); !strings.Contains(out, "symlink") {
		t.Fatalf("mount through a symlink: %s", out)
	}
	// What it may do: an empty directory it owns, or under --mount-root.
	if out := ctl("open", "mine", own, "--context", "tui"); !strings.Contains(out, "mounted at") {
		t.Fatalf("mount on its own empty directory: %s", out)
	}
	if out := ctl("open", "under", mountRoot+"/under", "--context", "tui"); !strings.Contains(out, "mounted at") {
		t.Fatalf("mount under --mount-root: %s", out)
	}
	// Another uid's session is not its to read, switch or close.
	d.Open("rootsess", []string{"tui"})
	for _, args := range [][]string{{"close", "rootsess"}, {"context", "rootsess", "discord:dm"}, {"blocks", "rootsess"}} {
		if out := ctl(args...); !strings.Contains(out, "belongs to another user") {
			t.Fatalf("ctl %v on root's session: %s", args, out)
		}
	}
	if out := ctl("list"); strings.Contains(out, "rootsess") || !strings.Contains(out, "mine") {
		t.Fatalf("session.list shows nobody: %s", out)
	}
	if out := ctl("close", "mine"); !strings.Contains(out, "closed") {
		t.Fatalf("close its own session: %s", out)
	}
}

// TestHungMountpointHoldsNoLock: a session.open whose mountpoint hangs
// holds no lock of the daemon's: every other session's context.set and
// status are answered meanwhile.
func TestHungMountpointHoldsNoLock(t *testing.T) {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	h.Write("memories/private/p.md", "p")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.DM)
	// A FUSE filesystem that never answers: mounted, its fd never read.
	hung := h.Path("hung")
	os.Mkdir(hung, 0o755)
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("hung", hung, "fuse.hung", 0, fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			unix.Unmount(hung, unix.MNT_DETACH)
			unix.Close(fd)
		}
	}
	defer release()
	go func() {
		c, err := control.Dial(d.Socket)
		if err != nil {
			return
		}
		defer c.Close()
		c.Call("session.open", map[string]any{"id": "stuck", "mount": hung + "/sub", "context": []string{"tui"}}, nil)
	}()
	time.Sleep(300 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		c, err := control.Dial(d.Socket)
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		if err := c.Call("context.set", map[string]any{"session": "s", "context": testenv.Guild}, nil); err != nil {
			done <- err
			return
		}
		done <- c.Call("status", map[string]any{}, nil)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a hung session.open stalled another session's context.set")
	}
	if testenv.Exists(mnt + "/memories/private/p.md") {
		t.Fatal("the switched session still sees its old context")
	}
	release()
}

// TestDecideRequestMemoryBounded: a tool.decide request of 1 MiB whose arguments
// are arrays of 10,000 zeros (each within the spec's bounds) would be
// decoded into 70 MB of values, and a strict check that built a tree would
// hold another 40 times the line: one uid's 120 connections sending them at
// once would take the daemon from 15 MB to 6.6 GB, a load that would end
// every session with the daemon. A request's values are bounded (65,536),
// the check keeps no tree, and large requests are decoded a few at a time.
func TestDecideRequestMemoryBounded(t *testing.T) {
	h := testenv.OpenHome(t, "")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	pid := d.Cmd.Process.Pid
	before := testenv.ProcKB(t, pid, "VmHWM")
	first, _ := testenv.ConverseAsNobody(t, "bigdecide", d.Socket, "40", "2")
	after := testenv.ProcKB(t, pid, "VmHWM")
	var got struct {
		Answered int
		First    string
	}
	if err := json.Unmarshal([]byte(first), &got); err != nil {
		t.Fatalf("attacker: %q: %v", first, err)
	}
	t.Logf("uid 65534's 40 connections, 2 requests of 1 MiB each: %d answered (%.200s); daemon peak %d MB -> %d MB", got.Answered, got.First, before>>10, after>>10)
	if got.Answered != 80 || !strings.Contains(got.First, "more than 65536 values") {
		t.Errorf("the requests were not each denied for their values: %d answered, first %s", got.Answered, got.First)
	}
	if after-before > 1<<20 {
		t.Errorf("HOLE: one uid's 80 requests of 1 MiB took the daemon's peak memory from %d MB to %d MB", before>>10, after>>10)
	}
}
