package views

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

// TestLeasedFileStallsNoOtherView: every open of a view file is the daemon's
// open(2) of the backing file, as the caller, holding one of the view's
// places (maxActingPerView, 4 on 2 cores) and one of the daemon's
// (maxActing, 16). A local user who owns backing files (it made them
// through its view, or in the backing tree it must be able to reach for
// the daemon to act as it) takes a write lease (F_SETLEASE F_WRLCK, no
// privilege needed on one's own file) on 16 of them, then opens them
// through four views of its own (sessions cost nothing: no per-uid cap).
// Each daemon open waits in break_lease for /proc/sys/fs/lease-break-time
// (45 s): every place of the daemon is held, and every other session's
// backing work (uid 1000's read of its own file) waits that long; the
// attacker leases again and repeats. docs/performance.md counts on "a
// backing that hangs" being the operator's; here any admitted uid makes it.
func TestLeasedFileStallsNoOtherView(t *testing.T) {
	d := testenv.LimitedDaemon(t, 4096)
	victim := d.OpenFor("victim", 1000, testenv.DM)
	cmd := leaseAllScript(t, d)
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	out := testenv.PythonAs(t, 1000, 60*time.Second, `
import time, sys
t0 = time.time()
data = open(sys.argv[1]).read()
print("read %r in %.1fs" % (data, time.time() - t0))
`, victim+"/workspace/w.txt")
	t.Logf("uid 1000 reads its own session's file: %s", out)
	var secs float64
	if i := strings.LastIndex(out, " in "); i >= 0 {
		secs, _ = strconv.ParseFloat(strings.TrimSuffix(out[i+4:], "s"), 64)
	}
	if secs > 5 || !strings.Contains(out, "work") {
		t.Errorf("HOLE: uid 65534's leases on its own backing files held every place of the daemon: uid 1000's read of its own session's file took %s", out)
	}
}

// leaseScript is a Python prelude for the lease attacks: SIGIO ignored,
// the arguments (socket, views, backing workspace, places), and four
// sessions a0..a3 of the caller's own under views.
const leaseScript = testenv.PyCall + `
import fcntl, signal, threading
signal.signal(signal.SIGIO, signal.SIG_IGN)
sock, views, ws, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
per = (total + 3) // 4
c = conn(sock)
for v in range(4):
    r = call(c, "session.open", {"id": "a%d" % v, "mount": views + "/a%d" % v, "context": ["tui"]})
    assert "error" not in r, r
def lease(n):  # n files of the caller's own in the backing workspace, each write-leased
    fds = []
    for i in range(n):
        p = ws + "/l%d" % i
        with open(p, "w") as f:
            f.write("x")
        fd = os.open(p, os.O_RDONLY)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        fds.append(fd)
    return fds
def opener(v, i):  # open leased file i through view v
    try:
        os.close(os.open(views + "/a%d/workspace/l%d" % (v, i), os.O_RDONLY))
    except OSError as e:
        pass
`

// leaseAllScript: uid 65534 opens four sessions, makes as many files of its
// own in the backing workspace as the daemon has places (maxActing,
// 4 x GOMAXPROCS + 8: 16 on 2 cores), takes a write lease on each, and
// opens each through its views (a quarter a view): every place waits in
// break_lease.
func leaseAllScript(t *testing.T, d *testenv.Daemon) *exec.Cmd {
	t.Helper()
	first, _, cmd := pythonPeer(t, testenv.Nobody, leaseScript+`
leases = lease(total)
for i in range(total):
    threading.Thread(target=opener, args=(i // per, i), daemon=True).start()
time.sleep(1)
print("leased and opening", flush=True)
sys.stdin.readline()
`, d.Socket, d.Home.Path("views"), d.Home.Path("workspace"), strconv.Itoa(4*runtime.GOMAXPROCS(0)+8))
	t.Logf("attacker: %s", first)
	if first != "leased and opening" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("setup failed: %q", first)
	}
	return cmd
}

// TestLeasedFileDelaysNoReload: a reload waits for every view's listings in
// flight (View.invalidate: listingsIn.wait, then barrier notifications
// that take each directory's lock), and a listing is in flight from before
// it waits for its place (node.OpendirHandle). uid 65534 fills every place
// with opens of its own leased files (each held for lease-break-time, 45
// s), queues four more such opens in one of its views and then lists that
// view's workspace: the listing waits behind them, and root's config.reload
// with it, holding reloadMu, before it has invalidated or narrowed the runs
// of the sessions after that view. Every 45 s of delay costs the attacker
// four more leased files queued ahead of the listing: no privilege, no
// special mount, default kernel settings.
func TestLeasedFileDelaysNoReload(t *testing.T) {
	d := testenv.LimitedDaemonWith(t, secretRules, 4096)
	first, _, cmd := pythonPeer(t, testenv.Nobody, leaseScript+`
os.listdir(views + "/a0")
leases = lease(total + per)
for i in range(total):
    threading.Thread(target=opener, args=(i // per, i), daemon=True).start()
time.sleep(0.5)
for i in range(total, total + per):
    threading.Thread(target=opener, args=(0, i), daemon=True).start()
time.sleep(0.5)
threading.Thread(target=lambda: os.listdir(views + "/a0/workspace"), daemon=True).start()
time.sleep(0.5)
print("ready", flush=True)
sys.stdin.readline()
`, d.Socket, d.Home.Path("views"), d.Home.Path("workspace"), strconv.Itoa(4*runtime.GOMAXPROCS(0)+8))
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	t.Logf("attacker: %s", first)
	if first != "ready" {
		t.Fatalf("setup: %q", first)
	}
	d.Home.Write("config/conditions.toml", secretRules+"\n# edited\n")
	c, err := control.Dial(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	err = c.Call("config.reload", map[string]any{}, nil)
	took := time.Since(start)
	t.Logf("root's config.reload: %v, took %v", err, took)
	if took > 10*time.Second {
		t.Errorf("HOLE: uid 65534's leased opens and one queued listing held root's config.reload (and reloadMu) for %v", took.Round(time.Second))
	}
}

// TestLeaseWaitEndsAtBreakTime: the wait for a lease is bounded by
// lease-break-time, then EAGAIN. Opens are non-blocking (O_NONBLOCK)
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
func TestLeaseWaitEndsAtBreakTime(t *testing.T) {
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
	d := testenv.LimitedDaemon(t, 4096)
	victim := d.OpenFor("victim", 1000, testenv.DM)
	leased := d.Home.Path("workspace/l0")
	first, send, cmd := pythonPeer(t, testenv.Nobody, `
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
	viaView := testenv.PythonAs(t, 1000, 30*time.Second, read, victim+"/workspace/l0")
	t.Logf("uid 1000 reads l0 through its view: %s (%v); attacker: %s", viaView, time.Since(start).Round(time.Millisecond), send("count"))
	native := testenv.PythonAs(t, 1000, 30*time.Second, read, leased)
	t.Logf("uid 1000 reads l0 natively: %s; attacker: %s", native, send("count"))
	// The view waits no longer than a lease break takes, then
	// answers EAGAIN (a blocked open(2), which counts as an open of the
	// file, would have kept the owner from its next lease).
	if strings.Contains(viaView, "no answer") {
		t.Errorf("HOLE: an open through the view retried without end while the owner re-took its lease after each break (%s); natively the same open completed: %s", viaView, native)
	}
}
