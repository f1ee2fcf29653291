package daemon

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// deadMount mounts a FUSE filesystem on dir whose server is gone at once
// (the /dev/fuse fd is closed before it answers INIT): what a crashed
// daemon leaves, every request failing with ENOTCONN. The test process
// never serves it. It is unmounted at cleanup if still there.
func deadMount(t *testing.T, dir string) {
	t.Helper()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	err = unix.Mount("stale", dir, "fuse.stale", unix.MS_NOSUID|unix.MS_NODEV, opts)
	unix.Close(fd)
	if err != nil {
		t.Fatalf("mount a dead FUSE filesystem on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		for deadMounted(dir) {
			if unix.Unmount(dir, unix.MNT_DETACH) != nil {
				return
			}
		}
	})
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != unix.ENOTCONN {
		t.Fatalf("statfs on the dead mount %s: %v, want ENOTCONN", dir, err)
	}
}

// deadMounted reports whether a mount deadMount made is on dir, from
// /proc/self/mountinfo.
func deadMounted(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && fields[4] == dir && strings.Contains(sc.Text(), " fuse.stale ") {
			return true
		}
	}
	return false
}

// TestStaleMountClearedOnlyAfterConfinement: a refused session.open
// unmounts nothing: a stale mount is cleared only after the mountpoint is
// confined to what the peer may mount on, by one resolution without
// symlinks, so no peer has the daemon unmount, as root, a dead FUSE mount
// in a directory it cannot enter, nor aim the unmount at a live mount by a
// symlink swapped in between.
func TestStaleMountClearedOnlyAfterConfinement(t *testing.T) {
	h := testenv.OpenHome(t, "")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	rootOnly := h.Path("rootonly")
	os.Mkdir(rootOnly, 0o700)
	dead := filepath.Join(rootOnly, "dead")
	os.Mkdir(dead, 0o755)
	deadMount(t, dead)
	own := h.Path("own")
	os.Mkdir(own, 0o755)
	os.Chown(own, testenv.Nobody, testenv.Nobody)
	ctl := func(args ...string) string {
		return testenv.AsNobody(t, append([]string{"condfs", "ctl", "--socket", d.Socket}, args...)...)
	}
	// Named directly, through a symlink to it and through a symlink on the
	// way, each symlink nobody's own.
	// ctl prints the message of the error (-32012 for the first, -32003
	// for the symlinks).
	for i, c := range []struct{ target, want string }{
		{dead, "may mount only on an empty directory it owns"},
		{own + "/link", "no symlink may be on the way"},
		{own + "/dir/dead", "no symlink may be on the way"},
	} {
		target := c.target
		if i == 1 {
			os.Symlink(dead, own+"/link")
			os.Lchown(own+"/link", testenv.Nobody, testenv.Nobody)
		}
		if i == 2 {
			os.Symlink(rootOnly, own+"/dir")
			os.Lchown(own+"/dir", testenv.Nobody, testenv.Nobody)
		}
		out := ctl("open", fmt.Sprintf("s%d", i), target, "--context", "tui")
		if !strings.Contains(out, c.want) {
			t.Errorf("session.open on %s: %s", target, out)
		}
		if !deadMounted(dead) {
			t.Errorf("session.open on %s was refused (%s), and the dead mount at %s is gone all the same", target, out, dead)
			deadMount(t, dead)
		}
	}
}

// TestStaleClearedForItsPeer: a dead mount on a directory the peer may
// mount on (its own, or one the daemon made under --mount-root) is cleared
// and the view mounted there, for a peer that is neither root nor the
// daemon's uid.
func TestStaleClearedForItsPeer(t *testing.T) {
	h := testenv.OpenHome(t, "")
	h.Write("workspace/hello.md", "hello")
	mountRoot := h.Path("views")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666", "--mount-root", mountRoot)
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	mine := h.Path("mine")
	os.Mkdir(mine, 0o755)
	os.Chown(mine, testenv.Nobody, testenv.Nobody)
	os.Mkdir(mountRoot, 0o755)
	os.Mkdir(mountRoot+"/v", 0o700) // the daemon's, as it makes them
	deadMount(t, mine)
	deadMount(t, mountRoot+"/v")
	ctl := func(args ...string) string {
		return testenv.AsNobody(t, append([]string{"condfs", "ctl", "--socket", d.Socket}, args...)...)
	}
	for _, mp := range []string{mine, mountRoot + "/v"} {
		id := filepath.Base(mp)
		if out := ctl("open", id, mp, "--context", "tui"); !strings.Contains(out, "mounted at") {
			t.Fatalf("session.open on its own dead mountpoint %s: %s\n%s", mp, out, testenv.Tail(d.Log(), 20))
		}
		if deadMounted(mp) {
			t.Fatalf("the dead mount on %s is still there", mp)
		}
		if out := testenv.AsNobody(t, "cat", mp+"/workspace/hello.md"); out != `read "hello"` {
			t.Fatalf("the view on %s: %s", mp, out)
		}
		if out := ctl("close", id); !strings.Contains(out, "closed") {
			t.Fatalf("close %s: %s", id, out)
		}
	}
}

// TestStaleClearedOnRestore: after kill -9, the next start clears the
// dead view a peer that is neither root nor the daemon's uid had on its own
// directory, under that peer's mountpoint rules, and restores the session.
func TestStaleClearedOnRestore(t *testing.T) {
	h := testenv.OpenHome(t, "")
	h.Write("workspace/hello.md", "hello")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	mine := h.Path("mine")
	os.Mkdir(mine, 0o755)
	os.Chown(mine, testenv.Nobody, testenv.Nobody)
	ctl := func(d *testenv.Daemon, args ...string) string {
		return testenv.AsNobody(t, append([]string{"condfs", "ctl", "--socket", d.Socket}, args...)...)
	}
	if out := ctl(d, "open", "mine", mine, "--context", "tui"); !strings.Contains(out, "mounted at") {
		t.Fatalf("session.open on its own directory: %s", out)
	}
	d.Cmd.Process.Signal(unix.SIGKILL)
	<-d.Exited()
	os.Remove(d.Socket)
	var sfs unix.Statfs_t
	if err := unix.Statfs(mine, &sfs); err != unix.ENOTCONN {
		t.Fatalf("statfs on the crashed view: %v, want ENOTCONN", err)
	}
	d2 := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d2.Socket), 0o755)
	if out := testenv.AsNobody(t, "cat", mine+"/workspace/hello.md"); out != `read "hello"` {
		t.Fatalf("the restored view: %s\n%s", out, testenv.Tail(d2.Log(), 20))
	}
	if out := ctl(d2, "close", "mine"); !strings.Contains(out, "closed") {
		t.Fatalf("close the restored session: %s", out)
	}
}
