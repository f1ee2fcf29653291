package runs

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// binSecretRules: /workspace/bin/ executable in DMs only (staleBinRules), and
// /workspace/bin/secret shown in guilds only. No context allows a run to
// execute secret: in a DM the view hides it, in a guild /workspace/bin/ may
// not run.
var binSecretRules = staleBinRules + `
[workspace."/bin/secret"]
when = "discord:guild:1"
action = "allow"
`

// TestViewBinaryNoWindowAtSwitch: the view switches its context
// (SetContext) before allowRuns withdraws the DM's bind of /workspace/bin:
// in between, the guild's view shows bin/secret beneath the DM's still
// executable bind. A run that keeps trying to execute it runs it.
func TestViewBinaryNoWindowAtSwitch(t *testing.T) {
	d := staleBinHome(t, binSecretRules)
	d.Home.Write("workspace/bin/secret", "#!/bin/sh\necho PWNED-SECRET-RAN\n")
	os.Chmod(d.Home.Path("workspace/bin/secret"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	if o, _ := testenv.CondfsRun(t, d, "", "--", "/workspace/bin/secret"); strings.Contains(o, "PWNED") {
		t.Fatalf("secret ran in a DM: %q", o)
	}
	d.SetContext("s", testenv.Guild)
	if o, code := testenv.CondfsRun(t, d, "", "--", "/workspace/bin/secret"); strings.Contains(o, "PWNED") {
		t.Fatalf("secret ran in a guild: %q", o)
	} else {
		t.Logf("control, in a guild (%d): %q", code, o)
	}
	if o, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "i=0; while [ $i -lt 300 ]; do /workspace/bin/secret 2>/dev/null; i=$((i+1)); done; echo loop-done $i"); strings.Contains(o, "PWNED") {
		t.Fatalf("secret ran in a guild: %q", o)
	} else {
		t.Logf("control, a loop in a guild (%d): %q", code, o)
	}
	d.SetContext("s", testenv.DM)
	secretWindow(t, d, 20, func(int) {
		time.Sleep(100 * time.Millisecond)
		d.SetContext("s", testenv.Guild)
		time.Sleep(100 * time.Millisecond)
		d.SetContext("s", testenv.DM)
	})
}

// secretWindow runs, in the session's current context, a shell that keeps
// trying /workspace/bin/secret (900 files of the view held open, so that
// the view's updates take long), makes rounds updates by step, and fails
// if secret ever ran. A run killed meanwhile ran nothing: it is logged.
func secretWindow(t *testing.T, d *testenv.Daemon, rounds int, step func(i int)) {
	t.Helper()
	_, stdin, lines := binShell(t, d, `python3 -c '
import os, sys
fds = [os.open("/workspace/w.txt", os.O_RDONLY) for i in range(900)]
import time; time.sleep(3600)' &
sleep 0.5
/workspace/bin/echo bind-ok
echo ready
while :; do /workspace/bin/secret 2>/dev/null && break; done &
L=$!
read x
kill $L
echo end`)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok || !strings.Contains(o, "bind-ok") {
		t.Fatalf("%q", o)
	}
	seen := ""
	for i := 0; i < rounds && !strings.Contains(seen, "PWNED"); i++ {
		step(i)
	drain:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Logf("the run ended after %d rounds: %q\n%s", i+1, seen, testenv.Tail(d.Log(), 8))
					return
				}
				seen += l + "\n"
			default:
				break drain
			}
		}
	}
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "end", 20*time.Second)
	if o = seen + o; strings.Contains(o, "PWNED-SECRET-RAN") {
		t.Errorf("BROKE: /workspace/bin/secret, which no context or rules let run, ran in a run:\n%s", o)
	}
}

// TestViewBinaryHostSyscallsChangeNothing: as 65534 through the host view
// mount, every other syscall that changes a listed path is refused.
func TestViewBinaryHostSyscallsChangeNothing(t *testing.T) {
	d, mnt := linkedBinHome(t, staleBinRules)
	d.Home.Write("workspace/plain.txt", "plain\n")
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	w := runAsNobody(t, `
import os, sys, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
m = sys.argv[1] + "/workspace"
def tr(name, f):
    try:
        r = f(); print(name, "OK", r, flush=True)
    except OSError as e:
        print(name, e.strerror, flush=True)
def c(r):
    if r < 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
    return r
O_TMPFILE = 0o20000000 | os.O_DIRECTORY
tr("O_TMPFILE in bin", lambda: os.open(m+"/bin", O_TMPFILE|os.O_RDWR, 0o755))
def tmplink():
    fd = os.open(m, O_TMPFILE|os.O_RDWR, 0o755)
    os.write(fd, b"#!/bin/sh\necho PWNED\n")
    os.link("/proc/self/fd/%d" % fd, m+"/bin/tmpl", follow_symlinks=True)
tr("O_TMPFILE+link into bin", tmplink)
rfd = os.open(m+"/bin/hello.sh", os.O_RDONLY)
tr("reopen ro fd rw via /proc", lambda: os.open("/proc/self/fd/%d" % rfd, os.O_RDWR))
tr("reopen ro fd trunc via /proc", lambda: os.open("/proc/self/fd/%d" % rfd, os.O_WRONLY|os.O_TRUNC))
pfd = os.open(m+"/bin/hello.sh", os.O_PATH)
tr("reopen O_PATH rw via /proc", lambda: os.open("/proc/self/fd/%d" % pfd, os.O_RDWR))
tr("truncate /proc path", lambda: os.truncate("/proc/self/fd/%d" % pfd, 0))
tr("chmod /proc path", lambda: os.chmod("/proc/self/fd/%d" % pfd, 0o777))
tr("fallocate ro", lambda: c(libc.fallocate(rfd, 3, ctypes.c_long(0), ctypes.c_long(4))))
tr("ftruncate ro", lambda: os.ftruncate(rfd, 0))
tr("fchmod ro", lambda: os.fchmod(rfd, 0o777))
tr("futimes ro", lambda: os.utime(rfd, (0, 0)))
tr("fchown ro", lambda: os.fchown(rfd, 65534, 65534))
tr("setxattr user", lambda: os.setxattr(m+"/bin/hello.sh", "user.x", b"1"))
tr("fsetxattr user ro", lambda: os.setxattr(rfd, "user.x", b"1"))
tr("setxattr cap", lambda: os.setxattr(m+"/bin/hello.sh", "security.capability", b"\x01\x00\x00\x02" + b"\xff"*4 + b"\x00"*12))
tr("removexattr", lambda: os.removexattr(m+"/bin/hello.sh", "user.x"))
tr("setxattr posix acl dir", lambda: os.setxattr(m+"/bin", "system.posix_acl_default", b"\x02\x00\x00\x00"))
tr("setxattr bin dir", lambda: os.setxattr(m+"/bin", "user.y", b"1"))
RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1, 2, 4
AT = -100
def ren(a, b, fl):
    return c(libc.syscall(316, AT, a.encode(), AT, b.encode(), fl))
tr("renameat2 NOREPLACE plain->bin/new", lambda: ren(m+"/plain.txt", m+"/bin/new", RENAME_NOREPLACE))
tr("renameat2 WHITEOUT bin/hello.sh->x", lambda: ren(m+"/bin/hello.sh", m+"/x", RENAME_WHITEOUT))
tr("renameat2 WHITEOUT plain->bin/hello.sh", lambda: ren(m+"/plain.txt", m+"/bin/hello.sh", RENAME_WHITEOUT))
tr("renameat2 EXCHANGE plain<->bin/hello.sh", lambda: ren(m+"/plain.txt", m+"/bin/hello.sh", RENAME_EXCHANGE))
tr("renameat2 EXCHANGE plain<->tool.sh", lambda: ren(m+"/plain.txt", m+"/tool.sh", RENAME_EXCHANGE))
os.mkdir(m+"/d2")
tr("renameat2 EXCHANGE d2<->bin", lambda: ren(m+"/d2", m+"/bin", RENAME_EXCHANGE))
tr("mknod in bin", lambda: os.mknod(m+"/bin/fifo", 0o10644))
tr("symlink in bin", lambda: os.symlink("hello.sh", m+"/bin/l"))
wfd = os.open(m+"/plain.txt", os.O_RDWR)
tr("copy_file_range plain->hello", lambda: os.copy_file_range(wfd, rfd, 10))
tr("sendfile into ro", lambda: os.sendfile(rfd, wfd, 0, 10))
tr("utime NOW", lambda: os.utime(m+"/bin/hello.sh"))
tr("chmod dir bin", lambda: os.chmod(m+"/bin", 0o777))
print("done", flush=True)
`, mnt)
	o, _ := waitLine(t, w, "done", 20*time.Second)
	t.Logf("\n%s", o)
	out, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "ls -la /workspace/bin; /workspace/bin/hello.sh; /workspace/bin/tmpl; /workspace/bin/new")
	t.Logf("run (%d): %s", code, out)
	b, _ := os.ReadFile(d.Home.Path("workspace/bin/hello.sh"))
	t.Logf("backing hello.sh: %q", b)
	if strings.Contains(out, "PWNED") || !strings.Contains(string(b), "hello-from-view") {
		t.Errorf("BROKE")
	}
}

// TestViewBinaryNoWindowAtReload: TestViewBinaryNoWindowAtSwitch by reload: in a
// DM, rules A let /workspace/bin/ run and hide bin/secret; rules B show
// bin/secret and let bin/ run only in guilds. No rules ever let secret run,
// but between the swap and the runs' new allowlist a DM run's bind of bin/
// would still be executable while the view already showed secret beneath
// it. What the new rules take is taken from the runs before the swap.
func TestViewBinaryNoWindowAtReload(t *testing.T) {
	rulesB := strings.NewReplacer(
		"[workspace.\"/bin/secret\"]\nwhen = \"discord:guild:1\"", "[workspace.\"/bin/secret\"]\nwhen = \"discord:dm\"",
		"[exec.\"/workspace/bin/\"]\nwhen = \"discord:dm\"", "[exec.\"/workspace/bin/\"]\nwhen = \"discord:guild:1\"",
	).Replace(binSecretRules)
	if strings.Count(rulesB, "discord:guild:1") != 1 || rulesB == binSecretRules {
		t.Fatalf("rules B:\n%s", rulesB)
	}
	d := staleBinHome(t, binSecretRules)
	d.Home.Write("workspace/bin/secret", "#!/bin/sh\necho PWNED-SECRET-RAN\n")
	os.Chmod(d.Home.Path("workspace/bin/secret"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	secretWindow(t, d, 6, func(i int) {
		reloadRules(t, d, rulesB, i)
		reloadRules(t, d, binSecretRules, i)
	})
}
