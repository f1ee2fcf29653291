package fsys

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/internal/fuseconn"
	"golang.org/x/sys/unix"
)

// canMount reports whether this process may mount a view: as root, or
// through fusermount3 with /dev/fuse open to it (make test-unprivileged
// makes it so). In CI it must.
func canMount(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			why = "no fusermount3"
		} else if unix.Access("/dev/fuse", unix.R_OK|unix.W_OK) != nil {
			why = "/dev/fuse is not open to this uid"
		}
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("a view cannot be mounted here (%s); CI must mount it", why)
	}
	t.Skipf("a view cannot be mounted here: %s", why)
}

// testRulesHost parses rules into a pointer a view reads them from, and
// makes a host closed when t ends.
func testRulesHost(t *testing.T, rules string) (*atomic.Pointer[acl.Config], *Host) {
	t.Helper()
	p := &atomic.Pointer[acl.Config]{}
	cfg, err := acl.Parse("conditions.toml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	p.Store(cfg)
	host, err := NewHost(HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	return p, host
}

// sh runs script in a child process (this process serves the mount, and
// a Go process that also used it could wait on itself).
func sh(t *testing.T, dir, script string) string {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

// pyOps exercises what the shell does not: extended attributes, locks,
// attributes, sync, allocation, seeking, statfs and listings by handle.
const pyOps = `
import os, fcntl, errno
w = "workspace/"
os.makedirs(w + "x/y")
p = w + "x/f"
with open(p, "w") as f:
    f.write("hello world")
    f.flush(); os.fsync(f.fileno())
    fcntl.flock(f, fcntl.LOCK_EX); fcntl.flock(f, fcntl.LOCK_UN)
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); fcntl.lockf(f, fcntl.LOCK_UN)
    fcntl.lockf(f, fcntl.LOCK_EX); fcntl.lockf(f, fcntl.LOCK_UN)
    os.posix_fallocate(f.fileno(), 0, 8192)
    os.ftruncate(f.fileno(), 5)
    assert os.fstat(f.fileno()).st_size == 5
    assert os.lseek(f.fileno(), 0, os.SEEK_END) == 5
try:
    os.setxattr(p, "user.k", b"v")
    assert os.getxattr(p, "user.k") == b"v"
    assert "user.k" in os.listxattr(p)
    os.removexattr(p, "user.k")
except OSError as e:
    assert e.errno in (errno.ENOTSUP, errno.EPERM), e
os.chmod(p, 0o600)
assert os.stat(p).st_mode & 0o777 == 0o600
os.utime(p, (1, 2))
assert os.stat(p).st_mtime == 2
os.truncate(p, 1)
d = os.open(w + "x", os.O_RDONLY | os.O_DIRECTORY)
os.fsync(d)
assert sorted(os.listdir(d)) == ["f", "y"]
os.close(d)
assert sorted(e.name for e in os.scandir(w + "x")) == ["f", "y"]
os.statvfs(w)
os.rename(w + "x/f", w + "x/y/g")
os.link(w + "x/y/g", w + "x/h")
os.unlink(w + "x/h")
os.mkfifo(w + "x/fifo")
os.unlink(w + "x/fifo")
os.symlink("y/g", w + "x/s")
assert os.readlink(w + "x/s") == "y/g"
os.utime(w + "x/s", (3, 4), follow_symlinks=False)
assert os.lstat(w + "x/s").st_mtime == 4
os.unlink(w + "x/s")
os.unlink(w + "x/y/g")
os.removedirs(w + "x/y")
try:
    os.listdir("memories/nothere")
except FileNotFoundError:
    pass
print("ok")
`

const mountRules = `
[memories."/private/"]
when = "discord:dm"
action = "allow"
`

// TestMountedView: a view mounted for real (a root daemon's own
// connection, or fusermount3 for an ordinary user), used by other
// processes: what a context shows, a switch and a reload taking effect as
// they return, files made, renamed and removed through it, a second mount
// on a live one refused, and nothing left after Unmount.
func TestMountedView(t *testing.T) {
	canMount(t)
	mem, work, mnt := t.TempDir(), t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(mem, "private"), 0o755)
	os.WriteFile(filepath.Join(mem, "private/p.md"), []byte("dm secret\n"), 0o644)
	os.WriteFile(filepath.Join(mem, "pub.md"), []byte("public\n"), 0o644)
	rules, host := testRulesHost(t, mountRules)
	cfg := rules.Load()
	var denied atomic.Int64
	v, err := host.Mount(Options{Mountpoint: mnt, Memories: mem, Workspace: work, Rules: rules,
		Context: dm, Owner: uint32(os.Getuid()),
		OnDeny: func(cctx.Set, acl.Space, string, string) { denied.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			v.Unmount()
		}
	}()
	if v.Mountpoint() != mnt || v.Owner() != uint32(os.Getuid()) || host.Shared() {
		t.Errorf("Mountpoint %q Owner %d Shared %v", v.Mountpoint(), v.Owner(), host.Shared())
	}
	if got := sh(t, mnt, "ls memories; cat memories/private/p.md"); got != "private\npub.md\ndm secret" {
		t.Errorf("in a DM: %q", got)
	}

	// A switch hides private/ before it returns: the cached listing and
	// entry go with it.
	if err := v.SetContext(guild); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, mnt, "ls memories; cat memories/private/p.md 2>&1 >/dev/null | grep -c 'No such file'"); got != "pub.md\n1" {
		t.Errorf("in a guild: %q", got)
	}
	if denied.Load() == 0 {
		t.Error("the denied lookup was not reported")
	}

	// A reload that opens private/ to guilds shows it before Invalidate
	// returns.
	open, err := acl.Parse("conditions.toml", []byte(strings.Replace(mountRules, `"discord:dm"`, `"discord:guild:2"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	old := rules.Swap(open)
	if err := v.Invalidate(old); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, mnt, "cat memories/private/p.md"); got != "dm secret" {
		t.Errorf("after the reload: %q", got)
	}

	// Files made, renamed and removed through the view reach the backing.
	script := "echo hi > workspace/a && mkdir workspace/d && mv workspace/a workspace/d/b && cat workspace/d/b && ln -s b workspace/d/l && readlink workspace/d/l && rm workspace/d/l workspace/d/b && rmdir workspace/d && ls -A workspace"
	if got := sh(t, mnt, script); got != "hi\nb" {
		t.Errorf("make, rename, remove: %q", got)
	}
	if ents, _ := os.ReadDir(work); len(ents) != 0 {
		t.Errorf("the backing keeps %d entries", len(ents))
	}

	// The rest of the file operations, from one Python process.
	if got := sh(t, mnt, "python3 -c '"+pyOps+"'"); got != "ok" {
		t.Errorf("file operations through the view:\n%s", got)
	}

	// A file held open loses its authority when a switch hides it, before
	// SetContext returns.
	held := exec.Command("python3", "-c", `import sys
f = open("memories/private/p.md")
print(f.read(2), flush=True)
sys.stdin.readline()
try:
    f.seek(0); print(f.read(), flush=True)
except OSError as e:
    print("cut", e.errno, flush=True)
`)
	held.Dir = mnt
	var errOut strings.Builder
	held.Stderr = &errOut
	in, _ := held.StdinPipe()
	outp, _ := held.StdoutPipe()
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(outp)
	if !lines.Scan() || lines.Text() != "dm" {
		t.Errorf("held file: %q %s", lines.Text(), errOut.String())
	}
	if err := v.SetContext(dm); err != nil { // private/ is the DM's again...
		t.Fatal(err)
	}
	rules.Store(cfg) // ...and no longer the guild's
	if err := v.Invalidate(open); err != nil {
		t.Fatal(err)
	}
	if err := v.SetContext(guild); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("\n"))
	lines.Scan()
	got := lines.Text()
	held.Wait()
	if !strings.HasPrefix(got, "cut ") {
		t.Errorf("a held file read after the switch hid it: %q %s", got, errOut.String())
	}

	if v.Panics() != 0 || host.Panics() != 0 {
		t.Errorf("panics: view %d, host %d", v.Panics(), host.Panics())
	}
	if v.DaemonReads() == 0 {
		t.Error("no READ reached the daemon (the held file's first read must have)")
	}

	// The mountpoint is a live FUSE mount: nothing else mounts there.
	if err := fuseconn.ClearStale(mnt); err == nil {
		t.Error("ClearStale of a live view succeeded")
	}
	if _, err := host.Mount(Options{Mountpoint: mnt, Memories: mem, Workspace: work, Rules: rules, Owner: uint32(os.Getuid())}); err == nil {
		t.Error("a second view mounted over a live one")
	}
	parent, err := unix.Open(filepath.Dir(mnt), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(parent)
	over, err := fuseconn.MountID(parent, filepath.Base(mnt))
	if err != nil {
		t.Fatal(err)
	}

	if err := v.Unmount(); err != nil {
		t.Fatal(err)
	}
	mounted = false
	under, err := fuseconn.MountID(parent, filepath.Base(mnt))
	if err != nil {
		t.Fatal(err)
	}
	if under == over {
		t.Errorf("mount %d still on the mountpoint after Unmount", over)
	}
	fd, err := unix.Open(mnt, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if st, err := fuseconn.Probe(fd); err != nil || st != fuseconn.Plain {
		t.Errorf("after Unmount: %v %v, want Plain", st, err)
	}
	if err := fuseconn.ClearStale(mnt); err != nil {
		t.Errorf("ClearStale of a plain directory: %v", err)
	}
}
