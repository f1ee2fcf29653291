package runs

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// heldRules: markerRules, and the host's sh under its own name in a bin
// directory (binSh) and git (a program of /usr outside them) in DMs only.
func heldRules(marker, binSh string) string {
	return strings.Replace(markerRules(marker), `"/usr/bin/true", `, fmt.Sprintf(`"/usr/bin/true", %q, "/usr/lib/git-core/git", `, binSh), 1) +
		fmt.Sprintf(`
[exec.%q]
when = "discord:dm"
action = "allow"

[exec."/usr/lib/git-core/git"]
when = "discord:dm"
action = "allow"
`, binSh)
}

// heldScript takes KIND=PATH arguments. In the DM it runs each, opens it
// O_RDONLY and O_PATH and starts it as a process that stays, and says
// "held"; once a line comes on stdin it runs each by every route it
// knows, printing "RAN KIND ROUTE" for each that runs, and "done"; at the
// next line it runs each by its path again ("BACK-OK KIND").
const heldScript = `
import mmap, os, subprocess, sys
LD = "/lib64/ld-linux-x86-64.so.2"
targets = [a.split("=", 1) for a in sys.argv[1:]]
def args(p, hold):
    if os.path.basename(p) == "git":
        return ["hash-object", "--stdin"] if hold else ["--version"]
    return ["-c", "read x"] if hold else ["-c", "exit 0"]
held = {}
for kind, p in targets:
    if subprocess.run([p] + args(p, False), stdout=subprocess.DEVNULL).returncode == 0:
        print("DM-OK", kind, flush=True)
    held[kind] = (os.open(p, os.O_RDONLY), os.open(p, os.O_PATH),
        subprocess.Popen([p] + args(p, True), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL))
print("held", flush=True)
sys.stdin.readline()
def fexec(kind, p, fd, route):
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(fd, [p] + args(p, False), {})
        except OSError:
            pass
        os._exit(126)
    _, st = os.waitpid(pid, 0)
    print("RAN" if os.waitstatus_to_exitcode(st) == 0 else "refused", kind, route, flush=True)
def run(kind, p, argv, route, fds=()):
    try:
        code = subprocess.run(argv + args(p, False), pass_fds=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    except OSError:
        code = -1
    print("RAN" if code == 0 else "refused", kind, route, flush=True)
def mapx(kind, fd):
    try:
        mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
        print("RAN", kind, "mmap-exec", flush=True)
    except OSError:
        print("refused", kind, "mmap-exec", flush=True)
for kind, p in targets:
    ro, op, proc = held[kind]
    mapx(kind, ro)
    fexec(kind, p, ro, "fexecve-rdonly")
    fexec(kind, p, op, "fexecve-opath")
    run(kind, p, [LD, "/proc/self/fd/%d" % ro], "ld-rdonly", (ro,))
    run(kind, p, [LD, "/proc/self/fd/%d" % op], "ld-opath", (op,))
    run(kind, p, ["/proc/%d/exe" % proc.pid], "proc-exe")
    run(kind, p, [LD, "/proc/%d/exe" % proc.pid], "ld-proc-exe")
    run(kind, p, [p], "path")
    proc.stdin.close()
    proc.wait()
print("done", flush=True)
sys.stdin.readline()
for kind, p in targets:
    if subprocess.run([p] + args(p, False), stdout=subprocess.DEVNULL).returncode == 0:
        print("BACK-OK", kind, flush=True)
print("back", flush=True)
`

// heldRoutes are the routes heldScript tries.
var heldRoutes = []string{"mmap-exec", "fexecve-rdonly", "fexecve-opath", "ld-rdonly", "ld-opath", "proc-exe", "ld-proc-exe", "path"}

// TestWithdrawnBinaryNotExecutableFromHeldDescriptor: once a switch
// withdraws a binary, of any kind (listed outside the bin directories and
// /usr, in a bin directory, in /usr outside them), nothing the command
// opened while it was allowed runs it: not a mapping of it executable,
// not fexecve of an O_RDONLY or an O_PATH descriptor, not the ELF
// interpreter given its /proc name, not /proc/PID/exe of a process still
// running it (directly or through the interpreter), not its path. (A binary of the view: TestViewBinaryHeldDescriptorStopsAtSwitch
// and the view-binary attacks.)
func TestWithdrawnBinaryNotExecutableFromHeldDescriptor(t *testing.T) {
	marker := hostMarker(t)
	binSh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	targets := []string{"elsewhere=" + marker, "bindir=" + binSh, "shown=/usr/lib/git-core/git"}
	eachRunPath(t, heldRules(marker, binSh), func(t *testing.T, p runPath) {
		in, lines := p.shell(fmt.Sprintf("exec python3 -c '%s' %s", heldScript, strings.Join(targets, " ")))
		out, ok := waitLine(t, lines, "held", 30*time.Second)
		for _, k := range []string{"elsewhere", "bindir", "shown"} {
			if !strings.Contains(out, "DM-OK "+k) {
				t.Errorf("in the DM, %s did not run:\n%s", k, out)
			}
		}
		if !ok {
			t.Fatalf("in the DM: %s", out)
		}
		p.setContext(testenv.Guild)
		fmt.Fprintln(in, "go")
		out, ok = waitLine(t, lines, "done", 30*time.Second)
		if !ok {
			t.Fatalf("the routes did not end: %s", out)
		}
		for _, k := range []string{"elsewhere", "bindir", "shown"} {
			for _, route := range heldRoutes {
				if !strings.Contains(out, "refused "+k+" "+route) {
					t.Errorf("withdrawn, %s %s: not refused", k, route)
				}
			}
		}
		if strings.Contains(out, "RAN ") {
			t.Logf("routes:\n%s", out)
		}
		// Back in the DM, the same command runs each again: what the
		// withdrawal made noexec was the bind it took away, not the
		// clone the next attach uses.
		p.setContext(p.dm)
		fmt.Fprintln(in, "back")
		out, ok = waitLine(t, lines, "back", 30*time.Second)
		for _, k := range []string{"elsewhere", "bindir", "shown"} {
			if !ok || !strings.Contains(out, "BACK-OK "+k) {
				t.Errorf("back in the DM, %s did not run:\n%s", k, out)
			}
		}
	})
}

// TestKeptSandboxFollowsSwitchBack: a sandbox kept for a session's next
// run follows every switch both ways: the marker, withdrawn in a guild
// while the sandbox waited, runs in it again once the session is back in
// the DM.
func TestKeptSandboxFollowsSwitchBack(t *testing.T) {
	marker := hostMarker(t)
	eachRunPath(t, markerRules(marker), func(t *testing.T, p runPath) {
		if out, code := p.run(marker, "-c", "echo dm"); code != 0 || out != "dm\n" {
			t.Fatalf("DM: exit %d %q", code, out)
		}
		p.setContext(testenv.Guild)
		// In a row: its sandbox is kept, and waits in the guild.
		if out, code := p.run("/usr/bin/true"); code != 0 {
			t.Fatalf("guild true: exit %d %q", code, out)
		}
		if out, code := p.run(marker, "-c", "echo guild"); code != 126 {
			t.Fatalf("guild marker: exit %d %q, want 126", code, out)
		}
		p.setContext(p.dm)
		if out, code := p.run(marker, "-c", "echo back"); code != 0 || out != "back\n" {
			t.Fatalf("back in the DM: exit %d %q", code, out)
		}
	})
}

// raceScript runs the marker (argv[1]) from 4 threads over and over until
// a line comes on stdin, printing "OK T0 T1" for each run that exits 0,
// T0 and T1 the monotonic clock (ns) read before it was forked and after
// it ended; then "done".
const raceScript = `
import os, subprocess, sys, threading, time
m = sys.argv[1]
stop = threading.Event()
def loop():
    while not stop.is_set():
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        try:
            code = subprocess.run([m, "-c", "exit 0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        except OSError:
            code = -1
        t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        print(("OK %d %d" % (t0, t1)) if code == 0 else "NO", flush=True)
ts = [threading.Thread(target=loop) for _ in range(4)]
for t in ts:
    t.start()
print("looping", flush=True)
sys.stdin.readline()
stop.set()
for t in ts:
    t.join()
print("done", flush=True)
`

// TestWithdrawnBinaryStartsNotAfterItsSwitch: execs of the marker race 10
// switches between the DM and a guild; no run of it is forked after a
// switch to the guild returned and ends before the next switch back began.
func TestWithdrawnBinaryStartsNotAfterItsSwitch(t *testing.T) {
	marker := hostMarker(t)
	mono := func() int64 {
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		return ts.Nano()
	}
	eachRunPath(t, markerRules(marker), func(t *testing.T, p runPath) {
		in, lines := p.shell(fmt.Sprintf("exec python3 -c '%s' %s", raceScript, marker))
		if out, ok := waitLine(t, lines, "OK ", 30*time.Second); !ok {
			t.Fatalf("the marker did not run in the DM: %s", out)
		}
		var withdrawn [][2]int64 // from a switch's return to the next switch's start
		for i := 0; i < 10; i++ {
			p.setContext(testenv.Guild)
			from := mono()
			time.Sleep(100 * time.Millisecond)
			withdrawn = append(withdrawn, [2]int64{from, mono()})
			p.setContext(p.dm)
			time.Sleep(100 * time.Millisecond)
		}
		fmt.Fprintln(in, "stop")
		out, ok := waitLine(t, lines, "done", 30*time.Second)
		if !ok {
			t.Fatalf("the loop did not end: %s", out)
		}
		var ran, refused int
		for _, l := range strings.Split(out, "\n") {
			var t0, t1 int64
			if l == "NO" {
				refused++
			} else if _, err := fmt.Sscanf(l, "OK %d %d", &t0, &t1); err == nil {
				ran++
				for _, w := range withdrawn {
					if t0 > w[0] && t1 < w[1] {
						t.Errorf("HOLE: the marker was started %v after the switch to the guild returned", time.Duration(t0-w[0]))
					}
				}
			}
		}
		t.Logf("%d runs of the marker, %d refused", ran, refused)
		if refused == 0 {
			t.Errorf("no run was refused in the guild: the race did not race")
		}
	})
}
