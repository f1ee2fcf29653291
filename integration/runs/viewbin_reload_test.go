package runs

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// linkedBinHome is staleBinHome, also returning the host mountpoint of session s's view.
func linkedBinHome(t *testing.T, rules string) (*testenv.Daemon, string) {
	t.Helper()
	d, mnt := testenv.RunHomeWith(t, rules)
	h := d.Home
	echoELF, _ := os.ReadFile("/usr/bin/echo")
	h.Write("workspace/bin/echo", string(echoELF))
	h.Write("workspace/bin/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	h.Write("workspace/bin/tool42", "\xb8\x2a\x00\x00\x00\xc3")
	h.Write("workspace/tool.sh", "#!/bin/sh\necho tool-ran\n")
	for _, p := range []string{"workspace/bin/echo", "workspace/bin/hello.sh", "workspace/bin/tool42", "workspace/tool.sh"} {
		os.Chmod(h.Path(p), 0o755)
	}
	testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	return d, mnt
}

// runAsNobody starts a python3 script as 65534 on the host (the agent's own
// access to its view mount) and returns a channel of its output lines.
func runAsNobody(t *testing.T, script string, args ...string) chan string {
	t.Helper()
	cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", append([]string{"-c", script}, args...)...)
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return lines
}

// linkedWriter: as 65534 through the host view mount, try to rewrite
// argv[1] in place ("mov eax, 1337; ret") until the view lets it.
const linkedWriter = `
import os, sys, time
p = sys.argv[1]
dfd = os.open(os.path.dirname(p), os.O_RDONLY | os.O_DIRECTORY)
print("writer ready", flush=True)
n = 0
while True:
    try:
        fd = os.open(os.path.basename(p), os.O_WRONLY, dir_fd=dfd)
        os.pwrite(fd, b"\xb8\x39\x05\x00\x00\xc3", 0)
        os.close(fd)
        print("writer: wrote after", n, "EROFS at", "%.6f" % time.time(), flush=True)
        break
    except OSError as e:
        n += 1
        if n % 20000 == 0:
            print("writer:", e.strerror, n, flush=True)
`

// linkedRunner: in the run, hold /workspace/bin/tool42 through the bind
// and, once its bytes change, map it executable and call it.
const linkedRunner = `python3 -c '
import os, sys
fds = [os.open("/workspace/w.txt", os.O_RDONLY) for i in range(900)]
import time; time.sleep(3600)' &
exec python3 -c '
import os, sys, mmap, ctypes, time
fd = os.open("/workspace/bin/tool42", os.O_RDONLY)
print("ready", flush=True)
t0 = time.time()
while time.time() - t0 < 30:
    b = os.pread(fd, 6, 0)
    if b[1:3] == b"\x39\x05":
        print("saw at %.6f noexec %s" % (time.time(), bool(os.fstatvfs(fd).f_flag & 8)), flush=True)
        try:
            m = mmap.mmap(fd, 6, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_EXEC)
        except Exception as e:
            print("saw the new bytes; mmap exec:", e, flush=True); break
        ino = str(os.fstat(fd).st_ino)
        for l in open("/proc/self/maps"):
            f = l.split()
            if len(f) >= 6 and "x" in f[1] and f[4] == ino:
                fn = ctypes.CFUNCTYPE(ctypes.c_int)(int(f[0].split("-")[0], 16))
                print("called:", fn(), flush=True)
                time.sleep(2)
                print("2s later (reload long applied): fd noexec %s, called again: %d" % (bool(os.fstatvfs(fd).f_flag & 8), fn()), flush=True)
        break
print("end", flush=True)
'`

// TestViewBinaryUnlistedAtReloadNeverExecutes: a reload that drops /workspace/bin/ from
// binaries swaps the config (the views stop treating it as read-only) before
// allowRuns detaches the run's executable bind of it. In between, the
// session writes its own bytes into the listed file through its view mount,
// and the run maps them executable through the still-attached bind.
func TestViewBinaryUnlistedAtReloadNeverExecutes(t *testing.T) {
	after := strings.Replace(staleBinRules, `"/workspace/bin/", `, ``, 1)
	if after == staleBinRules {
		t.Fatal("rules not changed")
	}
	d, mnt := linkedBinHome(t, staleBinRules)
	_, _, lines := binShell(t, d, linkedRunner)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	w := runAsNobody(t, linkedWriter, mnt+"/workspace/bin/tool42")
	if o, ok := waitLine(t, w, "writer ready", 10*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	time.Sleep(300 * time.Millisecond)
	reloadRules(t, d, after, 0)
	wo, _ := waitLine(t, w, "writer: wrote", 10*time.Second)
	t.Logf("writer:\n%s", wo)
	o, _ := waitLine(t, lines, "end", 35*time.Second)
	t.Logf("run:\n%s", o)
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, "reload") || strings.Contains(l, "binaries") {
			t.Log(l)
		}
	}
	if strings.Contains(o, "called: 1337") {
		t.Errorf("BROKE: bytes the session wrote into listed /workspace/bin/tool42 were mapped executable through the run's bind")
	}
}

// TestViewBinaryUnderMemoriesCannotBeChanged: /memories/bin/ and /memories/a/b/bin/ listed:
// through the host view mount as 65534, every way to change what they show.
func TestViewBinaryUnderMemoriesCannotBeChanged(t *testing.T) {
	rules := testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3", "/memories/bin/", "/memories/a/b/tool", "/workspace/x/y/bin/"]
`
	d, mnt := testenv.RunHomeWith(t, rules)
	d.Home.Write("memories/bin/t.sh", "#!/bin/sh\necho orig\n")
	os.Chmod(d.Home.Path("memories/bin/t.sh"), 0o755)
	testenv.ChownTree(t, d.Home.Path("memories"), testenv.Nobody)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	w := runAsNobody(t, `
import os, sys
m = sys.argv[1]
def tr(name, f):
    try:
        f(); print(name, "OK", flush=True)
    except OSError as e:
        print(name, e.strerror, flush=True)
tr("write", lambda: os.close(os.open(m+"/memories/bin/t.sh", os.O_WRONLY)))
tr("create", lambda: os.close(os.open(m+"/memories/bin/n.sh", os.O_WRONLY|os.O_CREAT, 0o755)))
tr("chmod", lambda: os.chmod(m+"/memories/bin/t.sh", 0o777))
tr("mkdir a", lambda: os.mkdir(m+"/memories/a"))
tr("mkdir a/b", lambda: os.mkdir(m+"/memories/a/b"))
tr("create tool", lambda: os.close(os.open(m+"/memories/a/b/tool", os.O_WRONLY|os.O_CREAT, 0o755)))
tr("symlink tool", lambda: os.symlink("../../pub.md", m+"/memories/a/b/tool"))
os.makedirs(m+"/memories/c/b", exist_ok=True)
open(m+"/memories/c/b/tool", "w").write("#!/bin/sh\necho PWNED\n")
tr("rename c->a (a exists)", lambda: os.rename(m+"/memories/c", m+"/memories/a"))
tr("rename c/b -> a/b", lambda: os.rename(m+"/memories/c/b", m+"/memories/a/b"))
tr("rmdir a/b", lambda: os.rmdir(m+"/memories/a/b"))
tr("rmdir a", lambda: os.rmdir(m+"/memories/a"))
tr("symlink a", lambda: os.symlink("c", m+"/memories/a"))
tr("rename file c/b/tool -> a/b/tool", lambda: os.rename(m+"/memories/c/b/tool", m+"/memories/a/b/tool"))
tr("exchange", lambda: None)
os.makedirs(m+"/workspace/q/bin", exist_ok=True)
tr("rename q -> x/y (x absent)", lambda: os.rename(m+"/workspace/q", m+"/workspace/x"))
tr("mkdir x", lambda: os.mkdir(m+"/workspace/x"))
tr("rename q -> x/y", lambda: os.rename(m+"/workspace/q", m+"/workspace/x/y"))
print("done", flush=True)
`, mnt)
	o, _ := waitLine(t, w, "done", 20*time.Second)
	t.Logf("\n%s", o)
	out, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "/memories/bin/t.sh; /memories/a/b/tool; ls -la /workspace/x/y/bin 2>&1; /workspace/x/y/bin/true; echo st=$?")
	t.Logf("run (%d): %s", code, out)
	if strings.Contains(out, "PWNED") {
		t.Errorf("BROKE")
	}
}

// TestViewBinaryWithLinkedWriterNeverRuns: before a reload lists /workspace/tool.sh, the
// session (65534, through its host view mount) gives it a second name and
// holds that name open for writing. The reload hides tool.sh (two names)
// and leaves the handle (its own name is not listed). The session then
// removes its name (not listed: allowed), writes through the held handle
// (its decision is cached; no event re-decides it), closes it: tool.sh has
// one name again, is shown, bound and run with the session's bytes.
func TestViewBinaryWithLinkedWriterNeverRuns(t *testing.T) {
	// Before: the workspace lists no path for runs (so the hard-link
	// rule is off there, and the session may make a second name).
	before := strings.Replace(staleBinRules, `, "/workspace/bin/", "/workspace/tool.sh", "/workspace/link/"`, ``, 1)
	if before == staleBinRules {
		t.Fatalf("rules not changed: %s", before)
	}
	d, mnt := linkedBinHome(t, before)
	w := runAsNobody(t, `
import os, sys, time
m = sys.argv[1] + "/workspace/"
os.link(m + "tool.sh", m + "alias")
fd = os.open(m + "alias", os.O_WRONLY)
print("held", flush=True)
for i in range(2000):
    try:
        os.close(os.open(m + "tool.sh", os.O_RDONLY)); time.sleep(0.01)
    except OSError as e:
        print("listed now: tool.sh", e.strerror, flush=True); break
for f in (lambda: os.unlink(m + "alias"), lambda: os.pwrite(fd, b"#!/bin/sh\necho PWNED-BY-SESSION\n", 0)):
    try:
        f()
    except OSError as e:
        print("refused:", e.strerror, flush=True)
os.close(fd)
print("done", flush=True)
`, mnt)
	if o, ok := waitLine(t, w, "held", 10*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	reloadRules(t, d, staleBinRules, 0)
	o, ok := waitLine(t, w, "done", 20*time.Second)
	t.Logf("writer:\n%s", o)
	if !ok {
		t.Fatal("writer did not finish")
	}
	out, code := testenv.CondfsRun(t, d, "", "--", "/workspace/tool.sh")
	t.Logf("run (%d): %s", code, out)
	back, _ := os.ReadFile(d.Home.Path("workspace/tool.sh"))
	t.Logf("backing: %q", back)
	if strings.Contains(out, "PWNED") {
		t.Errorf("BROKE: a run executed bytes the session wrote into listed /workspace/tool.sh after its listing")
	}
}
