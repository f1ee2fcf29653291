package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

// TestReview12DeletedNameWedgesReload: the eleventh review's fix states a
// listed name with statx (AT_STATX_DONT_SYNC, a mount-id check), so that
// a FUSE filesystem mounted in the backing tree is never asked. But
// backing.spacePath (fsys/backing.go), which names what an open handle's
// descriptor is on now, reads /proc/self/fd/N and, when that ends with
// " (deleted)", calls unix.Lstat on the whole absolute path: a walk by
// names from /, which crosses any mount on the way. Any user names a
// file "f (deleted)": readlink says ".../hd/f (deleted)" while the file
// is there. The attacker opens that file through its view, then mounts a
// FUSE filesystem that never answers on its directory hd (fusermount3;
// the same precondition as TestAtk11HungListingWedgesReload: made here by
// root with allow_other). Every reload and context switch decides each
// open handle again (View.invalidate -> revoke -> fileHandle.decide ->
// spacePath): the Lstat waits forever in the FUSE lookup of "f (deleted)"
// beneath hd, so root's config.reload (and the watch's reload, holding
// reloadMu) never returns, and the operator's deny of secret.txt never
// reaches the attacker's open handle. Any rename on the filesystem
// (Host.revokeMoved, every view) hangs the same way.
func TestReview12DeletedNameWedgesReload(t *testing.T) {
	requireUnprivilegedFUSE(t)
	d := atk11DaemonWith(t, atk11SecretRules, 4096)
	h := d.home
	h.write("workspace/secret.txt", "SECRET\n")
	hd := h.path("workspace/hd")
	os.Mkdir(hd, 0o777)
	os.Chmod(hd, 0o777)
	os.WriteFile(filepath.Join(hd, "f (deleted)"), []byte("x\n"), 0o644)
	first, send, acmd := atk11Attacker(t, nobody, atk11Call+`
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
`, d.socket, h.path("views"))
	var hcmd *exec.Cmd
	defer func() {
		if hcmd != nil {
			atk11Unhang(hcmd, hd) // first: the hung requests end
		}
		acmd.Process.Kill()
		acmd.Wait()
	}()
	t.Logf("attacker: %s", first)
	if !strings.Contains(first, "opened True") {
		t.Fatalf("setup: %s", first)
	}
	hfirst, _, c2 := atk11Attacker(t, 0, atk11Call+atk11Hang+`
keep = hang(sys.argv[1])
print("hung", flush=True)
sys.stdin.readline()
`, hd)
	hcmd = c2
	if hfirst != "hung" {
		t.Fatalf("hang: %q", hfirst)
	}
	h.write("config/conditions.toml", `
[workspace."/secret.txt"]
when = "tui"
action = "deny"
`)
	c, err := control.Dial(d.socket)
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
		t.Errorf("HOLE: a FUSE mount on the directory of an open file named \"f (deleted)\" wedged root's config.reload (fsys/backing.go spacePath: unix.Lstat of the full path crosses the mount)")
	}
	got := send("read")
	t.Logf("attacker's open handle on secret.txt after the deny: %s", got)
	if strings.Contains(got, "SECRET") {
		t.Errorf("HOLE: the deny of secret.txt did not reach the attacker's open handle: %s", got)
	}
}

// TestReview12DeletedNameHangsOthersRenames: the same handle makes every
// rename on the backing filesystem, through any view, hang: Rename calls
// Host.revokeMoved, which decides every open file of every view on that
// filesystem again (spacePath, the Lstat into the FUSE mount). uid 1000
// renames a file of its own session, and rename(2) does not return until
// the attacker's FUSE connection goes.
func TestReview12DeletedNameHangsOthersRenames(t *testing.T) {
	requireUnprivilegedFUSE(t)
	var victimDone chan error
	defer func() { // last: after the hung connection is gone
		if victimDone != nil {
			<-victimDone
		}
	}()
	d := atk11DaemonWith(t, atk11SecretRules, 4096)
	h := d.home
	victim := d.openFor("victim", 1000, dmCtx)
	h.write("workspace/v1.txt", "mine\n")
	os.Chown(h.path("workspace/v1.txt"), 1000, 1000)
	hd := h.path("workspace/hd")
	os.Mkdir(hd, 0o777)
	os.Chmod(hd, 0o777)
	os.WriteFile(filepath.Join(hd, "f (deleted)"), []byte("x\n"), 0o644)
	first, _, acmd := atk11Attacker(t, nobody, atk11Call+`
sock, views = sys.argv[1], sys.argv[2]
c = conn(sock)
r = call(c, "session.open", {"id": "a1", "mount": views + "/a1", "context": ["tui"]})
g = os.open(views + "/a1/workspace/hd/f (deleted)", os.O_RDONLY)
print("opened", "error" not in r, flush=True)
sys.stdin.readline()
`, d.socket, h.path("views"))
	var hcmd *exec.Cmd
	defer func() {
		if hcmd != nil {
			atk11Unhang(hcmd, hd)
		}
		acmd.Process.Kill()
		acmd.Wait()
	}()
	if !strings.Contains(first, "opened True") {
		t.Fatalf("setup: %s", first)
	}
	hfirst, _, c2 := atk11Attacker(t, 0, atk11Call+atk11Hang+`
keep = hang(sys.argv[1])
print("hung", flush=True)
sys.stdin.readline()
`, hd)
	hcmd = c2
	if hfirst != "hung" {
		t.Fatalf("hang: %q", hfirst)
	}
	vcmd := exec.Command("setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "/usr/bin/python3", "-c",
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

// TestReview12LeaseRetryLivelock (fixed: the wait is bounded by
// lease-break-time, then EAGAIN): opens are now non-blocking (O_NONBLOCK)
// and, on EAGAIN (a lease being broken), retried every 1..100 ms with no
// open file in between (fsys/node_open.go leased, node_locks.go
// waitRetry). Natively, a blocked open(2) counts as an open of the file
// (i_readcount/i_writecount are raised before break_lease), so the lease
// holder cannot take a new lease once it lets the old one go, and the
// open completes. Between the daemon's attempts nothing is open: a holder
// that, on each SIGIO, releases and at once takes a new write lease (no
// privilege: its own file) keeps every open of that file through any view
// retrying for as long as it likes, where the same open made natively
// completes at the first release. (Any user's file in a shared
// workspace, read by another uid's agent: a grep -r that never ends.)
func TestReview12LeaseRetryLivelock(t *testing.T) {
	// The wait is bounded by the kernel's lease-break-time: 3 s here.
	const knob = "/proc/sys/fs/lease-break-time"
	old, err := os.ReadFile(knob)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(knob, []byte("3"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(knob, old, 0o644)
	d := atk11Daemon(t, 4096)
	victim := d.openFor("victim", 1000, dmCtx)
	leased := d.home.path("workspace/l0")
	first, send, cmd := atk11Attacker(t, nobody, `
import fcntl, signal, os, sys
p = sys.argv[1]
with open(p, "w") as f:
    f.write("x\n")
os.chmod(p, 0o644)
fd = os.open(p, os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
n = [0, 0]
def on_break(sig, frame):
    n[0] += 1
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError:
        n[1] += 1
signal.signal(signal.SIGIO, on_break)
print("leased", flush=True)
for line in sys.stdin:
    print("breaks", n[0], "re-lease refused", n[1], flush=True)
`, leased)
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if first != "leased" {
		t.Fatalf("setup: %q", first)
	}
	read := `
import time, sys, signal
def late(*a):
    raise TimeoutError("no answer")
signal.signal(signal.SIGALRM, late)
signal.alarm(10)
t0 = time.time()
try:
    data = open(sys.argv[1]).read()
    print("read %r in %.1fs" % (data, time.time() - t0))
except Exception as e:
    print("failed (%s) after %.1fs" % (e, time.time() - t0))
`
	start := time.Now()
	viaView := atk11Py(t, 1000, 30*time.Second, read, victim+"/workspace/l0")
	t.Logf("uid 1000 reads l0 through its view: %s (%v); attacker: %s", viaView, time.Since(start).Round(time.Millisecond), send("count"))
	native := atk11Py(t, 1000, 30*time.Second, read, leased)
	t.Logf("uid 1000 reads l0 natively: %s; attacker: %s", native, send("count"))
	// Fixed: the view waits no longer than a lease break takes, then
	// answers EAGAIN (a blocked open(2), which counts as an open of the
	// file, would have kept the owner from its next lease).
	if strings.Contains(viaView, "no answer") {
		t.Errorf("HOLE: an open through the view retried without end while the owner re-took its lease after each break (%s); natively the same open completed: %s", viaView, native)
	}
}
