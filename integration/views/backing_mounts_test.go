package views

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

// hangScript is a Python prelude: hang(path) mounts, with the setuid
// fusermount3 any local user may run, a FUSE filesystem at path (an empty
// directory the caller owns) whose server never answers, not even INIT:
// every stat of path waits until the process holding the returned
// descriptor dies.
const hangScript = `
import socket as _s, subprocess as _sp
def hang(path):
    a, b = _s.socketpair(_s.AF_UNIX, _s.SOCK_STREAM)
    env = dict(os.environ, _FUSE_COMMFD=str(b.fileno()))
    _sp.run(["fusermount3", "-o", "allow_other,rootmode=40000,user_id=%d,group_id=%d" % (os.getuid(), os.getgid()), "--", path],
        env=env, pass_fds=[b.fileno()], check=True)
    msg, fds, fl, ad = _s.recv_fds(a, 1, 1)
    return fds[0]
`

// pythonPeer starts a long-lived Python script as uid; it answers
// stdin lines. It returns the first line and a send function.
func pythonPeer(t *testing.T, uid int, script string, args ...string) (string, func(string) string, *exec.Cmd) {
	t.Helper()
	cmd := testenv.CommandAs(uid, "/usr/bin/python3", append([]string{"-c", script}, args...)...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	first := ""
	if lines.Scan() {
		first = lines.Text()
	}
	return first, func(line string) string {
		t.Helper()
		stdin.Write([]byte(line + "\n"))
		if !lines.Scan() {
			return "attacker exited"
		}
		return lines.Text()
	}, cmd
}

// unhangScript kills the attacker (its descriptor of the hung FUSE
// connection goes, every request waiting on it fails) and unmounts what
// it mounted.
func unhangScript(cmd *exec.Cmd, mnt string) {
	cmd.Process.Kill()
	cmd.Wait()
	exec.Command("umount", "-l", mnt).Run()
}

const secretRules = `
[workspace."/secret.txt"]
when = "tui"
action = "allow"
`

// TestFilesystemMountedOnListedNameNeverAsked: backing.statName never asks
// a filesystem mounted on a name, and refuses the name with EXDEV. The
// threat: a READDIRPLUS entry for a name the view does not know yet served
// with fstatat(dirfd, name)
// (fsys/node.go prepareAt), which crosses a mount: a local user mounts a
// FUSE filesystem that never answers (fusermount3, setuid; allow_other
// needs user_allow_other in /etc/fuse.conf, see below) on an empty
// directory of its own in the backing workspace
// (which it can reach natively: the daemon acts as the caller, so the
// caller's own access to the backing tree is what every view needs), and
// lists its own view's workspace. That READDIRPLUS never ends. A reload
// drops every view's cached listings after the listings in flight
// (View.Invalidate -> dropListings -> dropRec -> notifyEntry, which waits
// for the directory's lock the hung getdents holds): the reload never
// returns, holding reloadMu, so no later change of conditions.toml or
// policy.yaml reaches any session, and the views after the attacker's in
// the loop are never invalidated nor their runs' binaries narrowed.
func TestFilesystemMountedOnListedNameNeverAsked(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t) // /dev/fuse 0666, as distributions ship it
	d := testenv.LimitedDaemonWith(t, secretRules, 4096)
	h := d.Home
	h.Write("workspace/secret.txt", "SECRET\n")
	hangDir := h.Path("workspace/hang")
	os.Mkdir(hangDir, 0o755)
	// The hung mount: made here by root with allow_other, standing for a
	// user of a host whose /etc/fuse.conf has user_allow_other (without
	// it the daemon, acting as root with the caller's fsuid, gets EACCES
	// from the kernel and nothing hangs).
	hfirst, _, hcmd := pythonPeer(t, 0, testenv.PyCall+hangScript+`
keep = hang(sys.argv[1])
print("hung", flush=True)
sys.stdin.readline()
`, hangDir)
	// Cleanup order matters: the hung connection goes first (its
	// holder killed), so that the daemon's fstatat, the listing and the
	// reload's notification end; only then can the attacker be waited
	// for (a FUSE request already read by the daemon is waited out
	// uninterruptibly).
	var cmd *exec.Cmd
	defer func() {
		unhangScript(hcmd, hangDir)
		if cmd != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	if hfirst != "hung" {
		t.Fatalf("hang: %q", hfirst)
	}
	first, send, acmd := pythonPeer(t, testenv.Nobody, testenv.PyCall+`
import threading
sock, views = sys.argv[1], sys.argv[2]
c = conn(sock)
r = call(c, "session.open", {"id": "a1", "mount": views + "/a1", "context": ["tui"]})
fd = os.open(views + "/a1/workspace/secret.txt", os.O_RDONLY)
os.pread(fd, 100, 0)
done = []
def lister():
    os.listdir(views + "/a1/workspace")
    done.append(1)
threading.Thread(target=lister, daemon=True).start()
time.sleep(1)
print("opened", "error" not in r, "listing done" if done else "listing hangs", flush=True)
for line in sys.stdin:
    try:
        print("read", repr(os.pread(fd, 100, 0)), flush=True)
    except OSError as e:
        print("read", e.strerror, flush=True)
`, d.Socket, h.Path("views"))
	cmd = acmd
	t.Logf("attacker: %s", first)
	if !strings.Contains(first, "opened True") {
		t.Fatalf("setup: %s", first)
	}
	if strings.Contains(first, "listing hangs") {
		t.Errorf("HOLE: a listing of a view whose backing tree holds a FUSE mount that never answers hangs (the daemon stated the mountpoint by name)")
	}
	denySecretAndReload(t, d, send, "one uid's hung listing wedged the daemon's reload (reloadMu held; no later config change reaches any session)")
}

// denySecretAndReload has the operator deny secret.txt in the tui context
// and reload as root: the reload returns within 10 s (wedged says what a
// reload that does not means), and cuts the attacker's open handle on
// secret.txt (send("read") answers with what it still reads).
func denySecretAndReload(t *testing.T, d *testenv.Daemon, send func(string) string, wedged string) {
	t.Helper()
	d.Home.Write("config/conditions.toml", `
[workspace."/secret.txt"]
when = "tui"
action = "deny"
`)
	c, err := control.Dial(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res := make(chan error, 1)
	go func() { res <- c.Call("config.reload", map[string]any{}, nil) }()
	select {
	case err := <-res:
		t.Logf("config.reload returned: %v", err)
	case <-time.After(10 * time.Second):
		t.Errorf("HOLE: root's config.reload has not returned in 10 s: %s", wedged)
	}
	got := send("read")
	t.Logf("attacker's open handle on secret.txt after the deny was loaded: %s", got)
	if strings.Contains(got, "SECRET") {
		t.Errorf("HOLE: the reload that denies secret.txt did not cut the attacker's open handle: %s", got)
	}
}

// TestDeletedMountedNameNeverWedgesReload: statName states a
// listed name with statx (AT_STATX_DONT_SYNC, a mount-id check), so that
// a FUSE filesystem mounted in the backing tree is never asked. But
// backing.spacePath (fsys/backing.go), which names what an open handle's
// descriptor is on now, reads /proc/self/fd/N and, when that ends with
// " (deleted)", calls unix.Lstat on the whole absolute path: a walk by
// names from /, which crosses any mount on the way. Any user names a
// file "f (deleted)": readlink says ".../hd/f (deleted)" while the file
// is there. The attacker opens that file through its view, then mounts a
// FUSE filesystem that never answers on its directory hd (fusermount3;
// the same precondition as TestFilesystemMountedOnListedNameNeverAsked: made here by
// root with allow_other). Every reload and context switch decides each
// open handle again (View.invalidate -> revoke -> fileHandle.decide ->
// spacePath): the Lstat waits forever in the FUSE lookup of "f (deleted)"
// beneath hd, so root's config.reload (and the watch's reload, holding
// reloadMu) never returns, and the operator's deny of secret.txt never
// reaches the attacker's open handle. Any rename on the filesystem
// (Host.revokeMoved, every view) hangs the same way.
func TestDeletedMountedNameNeverWedgesReload(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	d := testenv.LimitedDaemonWith(t, secretRules, 4096)
	h := d.Home
	h.Write("workspace/secret.txt", "SECRET\n")
	hd := h.Path("workspace/hd")
	os.Mkdir(hd, 0o777)
	os.Chmod(hd, 0o777)
	os.WriteFile(filepath.Join(hd, "f (deleted)"), []byte("x\n"), 0o644)
	first, send, acmd := pythonPeer(t, testenv.Nobody, testenv.PyCall+`
sock, views = sys.argv[1], sys.argv[2]
c = conn(sock)
r = call(c, "session.open", {"id": "a1", "mount": views + "/a1", "context": ["tui"]})
fd = os.open(views + "/a1/workspace/secret.txt", os.O_RDONLY)
os.pread(fd, 100, 0)
g = os.open(views + "/a1/workspace/hd/f (deleted)", os.O_RDONLY)
print("opened", "error" not in r, flush=True)
for line in sys.stdin:
    try:
        print("read", repr(os.pread(fd, 100, 0)), flush=True)
    except OSError as e:
        print("read", e.strerror, flush=True)
`, d.Socket, h.Path("views"))
	var hcmd *exec.Cmd
	defer func() {
		if hcmd != nil {
			unhangScript(hcmd, hd) // first: the hung requests end
		}
		acmd.Process.Kill()
		acmd.Wait()
	}()
	t.Logf("attacker: %s", first)
	if !strings.Contains(first, "opened True") {
		t.Fatalf("setup: %s", first)
	}
	hfirst, _, c2 := pythonPeer(t, 0, testenv.PyCall+hangScript+`
keep = hang(sys.argv[1])
print("hung", flush=True)
sys.stdin.readline()
`, hd)
	hcmd = c2
	if hfirst != "hung" {
		t.Fatalf("hang: %q", hfirst)
	}
	denySecretAndReload(t, d, send, `a FUSE mount on the directory of an open file named "f (deleted)" wedged it (fsys/backing.go spacePath: unix.Lstat of the full path crosses the mount)`)
}

// TestDeletedMountedNameHangsNoRename: the same handle makes every
// rename on the backing filesystem, through any view, hang: Rename calls
// Host.revokeMoved, which decides every open file of every view on that
// filesystem again (spacePath, the Lstat into the FUSE mount). uid 1000
// renames a file of its own session, and rename(2) does not return until
// the attacker's FUSE connection goes.
func TestDeletedMountedNameHangsNoRename(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	var victimDone chan error
	defer func() { // last: after the hung connection is gone
		if victimDone != nil {
			<-victimDone
		}
	}()
	d := testenv.LimitedDaemonWith(t, secretRules, 4096)
	h := d.Home
	victim := d.OpenFor("victim", 1000, testenv.DM)
	h.Write("workspace/v1.txt", "mine\n")
	os.Chown(h.Path("workspace/v1.txt"), 1000, 1000)
	hd := h.Path("workspace/hd")
	os.Mkdir(hd, 0o777)
	os.Chmod(hd, 0o777)
	os.WriteFile(filepath.Join(hd, "f (deleted)"), []byte("x\n"), 0o644)
	first, _, acmd := pythonPeer(t, testenv.Nobody, testenv.PyCall+`
sock, views = sys.argv[1], sys.argv[2]
c = conn(sock)
r = call(c, "session.open", {"id": "a1", "mount": views + "/a1", "context": ["tui"]})
g = os.open(views + "/a1/workspace/hd/f (deleted)", os.O_RDONLY)
print("opened", "error" not in r, flush=True)
sys.stdin.readline()
`, d.Socket, h.Path("views"))
	var hcmd *exec.Cmd
	defer func() {
		if hcmd != nil {
			unhangScript(hcmd, hd)
		}
		acmd.Process.Kill()
		acmd.Wait()
	}()
	if !strings.Contains(first, "opened True") {
		t.Fatalf("setup: %s", first)
	}
	hfirst, _, c2 := pythonPeer(t, 0, testenv.PyCall+hangScript+`
keep = hang(sys.argv[1])
print("hung", flush=True)
sys.stdin.readline()
`, hd)
	hcmd = c2
	if hfirst != "hung" {
		t.Fatalf("hang: %q", hfirst)
	}
	vcmd := testenv.CommandAs(1000, "/usr/bin/python3", "-c",
		`import os, sys; os.rename(sys.argv[1] + "/workspace/v1.txt", sys.argv[1] + "/workspace/v2.txt"); print("renamed")`, victim)
	if err := vcmd.Start(); err != nil {
		t.Fatal(err)
	}
	victimDone = make(chan error, 1)
	go func() { victimDone <- vcmd.Wait() }()
	select {
	case err := <-victimDone:
		victimDone <- err
		t.Logf("uid 1000's rename in its own view returned: %v", err)
	case <-time.After(5 * time.Second):
		t.Errorf("HOLE: uid 65534's handle on \"hd/f (deleted)\" under its hung FUSE mount made uid 1000's rename in its own view hang (5 s and counting): Rename -> Host.revokeMoved -> fileHandle.decide -> backing.spacePath -> unix.Lstat")
	}
}
