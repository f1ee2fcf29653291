package runs

import (
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// staleBinRules: /workspace/bin/ allowed in DMs only; python3 for probes.
var staleBinRules = strings.Replace(viewBinRules, `"/usr/bin/tr",`, `"/usr/bin/tr", "/usr/bin/python3",`, 1)

func staleBinHome(t *testing.T, rules string) *testenv.Daemon {
	t.Helper()
	d := binHome(t, rules)
	echoELF, err := os.ReadFile("/usr/bin/echo")
	if err != nil {
		t.Fatal(err)
	}
	d.Home.Write("workspace/bin/echo", string(echoELF))
	os.Chmod(d.Home.Path("workspace/bin/echo"), 0o755)
	// tool42: machine code "mov eax, 42; ret", a stand-in for any
	// program's text.
	d.Home.Write("workspace/bin/tool42", "\xb8\x2a\x00\x00\x00\xc3")
	os.Chmod(d.Home.Path("workspace/bin/tool42"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	return d
}

// binScript: hold /workspace/bin/tool42 open through the bind (allowed),
// walk /workspace/bin in the background (a stale dentry is revalidated,
// and invalidated with its mount, as soon as the epoch moves) while 900
// open files lengthen the revoke between the epoch bump and allowRuns;
// at the first "go" stop; after the disallowing switch map the held fd
// executable and call it.
const binScript = `cd /workspace/bin && ./echo in-bind && echo ready
P=""
for i in 1 2 3; do ( while :; do [ -e /workspace/bin/echo ]; done ) & P="$P $!"; done
# Many open files in the view: each update's revoke decides each one,
# after the epoch moved and before the binds are made again.
python3 -c '
import os, sys
fds = [os.open("/workspace/w.txt", os.O_RDONLY) for i in range(int(sys.argv[1]))]
import time; time.sleep(3600)' 900 & P="$P $!"
exec python3 -c '
import os, sys, mmap, ctypes
fd = os.open("/workspace/bin/tool42", os.O_RDONLY)   # through the bind, while allowed
sys.stdin.readline()
[os.kill(int(p), 9) for p in sys.argv[1:]]
print("fd noexec after update:", bool(os.fstatvfs(fd).f_flag & 8), flush=True)
print("checked", flush=True)
sys.stdin.readline()
print("fd noexec after switch:", bool(os.fstatvfs(fd).f_flag & 8), flush=True)
try:
    os.stat("/workspace/bin/tool42"); print("new path noexec:", bool(os.statvfs("/workspace/bin").f_flag & 8), flush=True)
except OSError as e:
    print("path:", e, flush=True)
try:
    m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_EXEC)
    print("mmap exec: ok", flush=True)
except Exception as e:
    print("mmap exec:", e, flush=True); print("end", flush=True); sys.exit(0)
ino = str(os.fstat(fd).st_ino)
for l in open("/proc/self/maps"):
    f = l.split()
    if len(f) >= 6 and "x" in f[1] and f[4] == ino:
        print("mapped executable:", l.strip(), flush=True)
        print("called:", ctypes.CFUNCTYPE(ctypes.c_int)(int(f[0].split("-")[0], 16))(), flush=True)
        break
print("end", flush=True)
' $P`

func reloadRules(t *testing.T, d *testenv.Daemon, rules string, n int) {
	t.Helper()
	before := strings.Count(d.Log(), "conditions reloaded")
	d.Home.Write("config/conditions.toml", rules+strings.Repeat("\n# touched\n", n))
	for i := 0; i < 200 && strings.Count(d.Log(), "conditions reloaded") == before; i++ {
		time.Sleep(25 * time.Millisecond)
	}
	if strings.Count(d.Log(), "conditions reloaded") == before {
		t.Fatalf("no reload")
	}
}

// TestViewBinaryStaleBindGoneAtReload (E1): a reload that changes nothing about
// /workspace/bin/ (still allowed) bumps the connection's epoch before
// allowRuns; a walk of /workspace/bin in that window has the kernel
// detach the run's bind itself (d_invalidate of a mount point), still
// executable. detachView then gets EINVAL for a slot still allowed and
// forgets it silently. A descriptor opened through the old bind keeps an
// executable mount that no later update makes noexec or kills the run
// for: after a switch that disallows /workspace/bin/, the file is mapped
// PROT_EXEC from it and called (a cwd there does not help: Landlock
// refuses every open beneath a detached mount).
func TestViewBinaryStaleBindGoneAtReload(t *testing.T) {
	staleBind(t, func(d *testenv.Daemon) { reloadRules(t, d, staleBinRules, 1) })
}

// TestViewBinaryStaleBindGoneAtSwitch (E2): as E1, with a context.set between two
// contexts that both allow /workspace/bin/ as the allowed update (a
// per-session connection bumps its epoch at every switch).
func TestViewBinaryStaleBindGoneAtSwitch(t *testing.T) {
	staleBind(t, func(d *testenv.Daemon) {
		d.SetContext("s", []string{"discord:dm", "discord:dm:8", "discord:channel:8"})
	})
}

// staleBind runs binScript in a DM, makes the update that keeps
// /workspace/bin/ allowed, then switches to a guild, where it is not: the
// file held through the bind must not be called.
func staleBind(t *testing.T, update func(d *testenv.Daemon)) {
	d := staleBinHome(t, staleBinRules)
	_, stdin, lines := binShell(t, d, binScript)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	time.Sleep(200 * time.Millisecond)
	update(d)
	time.Sleep(300 * time.Millisecond)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "checked", 20*time.Second)
	t.Logf("after the update that keeps it allowed:\n%s", o)
	d.SetContext("s", testenv.Guild)
	io.WriteString(stdin, "go\n")
	o, _ = waitLine(t, lines, "end", 20*time.Second)
	t.Logf("after the switch to a guild:\n%s", o)
	if strings.Contains(o, "called: 42") {
		t.Errorf("BROKE: code of /workspace/bin/tool42 (exec rule: DMs only) mapped executable and called after the switch to a guild returned")
	}
}

// TestViewBinaryWriterMappedBeforeListingNeverRuns (F2): the agent's run holds /workspace/tool.sh
// (not yet listed: its own file) open for writing and mapped shared. A
// reload lists it and allows it (the maintainer then trusts it, and could
// even install it in place in the backing). After the reload has returned,
// the held mapping writes the page cache of the listed file (brought back
// by a read-only open, or by the run's own exec): the next run executes
// the writer's code through the read-only bind, although the backing file
// is unchanged and the daemon refused every WRITE.
func TestViewBinaryWriterMappedBeforeListingNeverRuns(t *testing.T) {
	before := testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3", "/usr/bin/cat"]
`
	after := testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3", "/usr/bin/cat", "/workspace/tool.sh"]
`
	d := binHome(t, before)
	d.Home.Write("workspace/tool.sh", "#!/bin/sh\necho trusted-tool-ran\n"+strings.Repeat("#", 100)+"\n")
	os.Chmod(d.Home.Path("workspace/tool.sh"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	_, stdin, lines := binShell(t, d, `exec python3 -c '
import os, sys, mmap
fd = os.open("/workspace/tool.sh", os.O_RDWR)
m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
print("ready", flush=True)
sys.stdin.readline()
try:
    os.pwrite(fd, b"x", 0); print("pwrite: wrote", flush=True)
except OSError as e:
    print("pwrite:", e.strerror, flush=True)
r = os.open("/workspace/tool.sh", os.O_RDONLY)
os.read(r, 4096)
m[10:32] = b"echo PWNED-BY-SESSION;"
# Have the dirty page written back (refused) and its error consumed, so
# that it is a clean page of the cache with the new bytes; the writable
# handle stays open (its release would tell the watcher).
try:
    m.flush()
except OSError as e:
    print("msync:", e.strerror, flush=True)
for i in range(3):
    try:
        x = os.open("/workspace/tool.sh", os.O_RDONLY); os.close(x)
    except OSError as e:
        print("close:", e.strerror, flush=True)
x = os.open("/workspace/tool.sh", os.O_RDONLY)
print("cache now:", os.read(x, 40), flush=True)
os.close(x)
print("mapped write done", flush=True)
sys.stdin.readline()
'`)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	reloadRules(t, d, after, 0)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "mapped write done", 20*time.Second)
	t.Logf("writer:\n%s", o)
	out, code := testenv.CondfsRun(t, d, "", "--", "/workspace/tool.sh")
	t.Logf("next run of the listed /workspace/tool.sh (%d): %q", code, out)
	dbg, dcode := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "/workspace/tool.sh; echo st=$?; python3 -c \"import os; fd=os.open(\x27/workspace/tool.sh\x27, os.O_RDONLY); print(\x27opened\x27, os.fstat(fd).st_nlink, flush=True); print(os.read(fd, 60))\"")
	t.Logf("a run reading it (%d): %s", dcode, dbg)
	out += dbg
	back, _ := os.ReadFile(d.Home.Path("workspace/tool.sh"))
	t.Logf("backing: %q", back)
	io.WriteString(stdin, "go\n")
	time.Sleep(500 * time.Millisecond)
	out2, code2 := testenv.CondfsRun(t, d, "", "--", "/workspace/tool.sh")
	t.Logf("after the writer is gone (%d): %q", code2, out2)
	if strings.Contains(o, "cache now: b'#!/bin/sh\\necho PWNED") || strings.Contains(out, "PWNED") || strings.Contains(out2, "PWNED") {
		t.Errorf("BROKE: the listed /workspace/tool.sh shows (a fresh read-only open through the view) bytes a session wrote after the reload listed it and cut its handle")
	}
}

// TestViewBinaryDetachedAtEpochNeverExecutes: a connection per session bumps its epoch at
// every context.set, so walking /workspace/bin during a switch between two
// DMs (both allow it) has the kernel detach the run's bind itself, still
// executable. A descriptor of tool42 opened through it is then mapped
// executable after the switch to a guild (which withdraws bin/).
func TestViewBinaryDetachedAtEpochNeverExecutes(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	_, stdin, lines := a.Shell(t, strings.Replace(binScript, "900", "300", 1))
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q\n%s", o, testenv.Tail(a.Logs(), 20))
	}
	for i := 0; i < 6; i++ {
		time.Sleep(100 * time.Millisecond)
		if i%2 == 0 {
			a.SetContext(t, []string{"discord:dm", "discord:dm:8", "discord:channel:8"})
		} else {
			a.SetContext(t, testenv.DM)
		}
	}
	time.Sleep(300 * time.Millisecond)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "checked", 20*time.Second)
	t.Logf("after switches that keep it allowed:\n%s", o)
	a.SetContext(t, testenv.Guild)
	io.WriteString(stdin, "go\n")
	o, _ = waitLine(t, lines, "end", 20*time.Second)
	t.Logf("after the switch to a guild:\n%s", o)
	for _, l := range strings.Split(a.Logs(), "\n") {
		if strings.Contains(l, "binaries not updated") {
			t.Log(l)
		}
	}
	if strings.Contains(o, "called: 42") {
		t.Errorf("HOLE: tool42 (DMs only) mapped executable and called after the switch to a guild returned")
	}
}

// binShell starts `condfs run -- sh -c script` as 65534 in session "s".
func binShell(t *testing.T, d *testenv.Daemon, script string) (*exec.Cmd, io.WriteCloser, chan string) {
	t.Helper()
	return testenv.RunShell(t, d.Socket, "s", script)
}

func waitLine(t *testing.T, lines chan string, want string, d time.Duration) (string, bool) {
	t.Helper()
	var all []string
	timeout := time.After(d)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return strings.Join(all, "\n"), false
			}
			all = append(all, l)
			if strings.Contains(l, want) {
				return strings.Join(all, "\n"), true
			}
		case <-timeout:
			return strings.Join(all, "\n"), false
		}
	}
}

func binHome(t *testing.T, rules string) *testenv.Daemon {
	t.Helper()
	d, _ := testenv.RunHomeWith(t, rules)
	h := d.Home
	trueELF, err := os.ReadFile("/usr/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	h.Write("workspace/bin/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	h.Write("workspace/bin/true", string(trueELF))
	h.Write("workspace/tool.sh", "#!/bin/sh\necho tool-ran\n")
	for _, p := range []string{"workspace/bin/hello.sh", "workspace/bin/true", "workspace/tool.sh"} {
		os.Chmod(h.Path(p), 0o755)
	}
	// The agent's files are its own (65534 is the session's owner).
	testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	return d
}

// viewBinRules: /workspace/bin/ may be executed in DMs only, the file
// /workspace/tool.sh everywhere; /workspace/link/ is listed too, but is a
// symlink to the workspace itself (the view shows only links that stay in
// their space).
const viewBinRules = testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/tr", "/workspace/bin/", "/workspace/tool.sh", "/workspace/link/"]

[exec."/workspace/bin/"]
when = "discord:dm"
action = "allow"
`
