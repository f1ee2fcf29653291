package integration

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A binary listed outside the bin directories and /usr (a copy of the
// host's sh under /opt), which the exec rules allow in DMs only, on both
// build paths: a root daemon, and an ordinary user's daemon that builds its
// runs with user namespaces. Every command runs as uid 65534.

// runPath is one build path's daemon, with one session in a DM.
type runPath struct {
	name       string
	run        func(args ...string) (string, int)
	shell      func(script string) (io.WriteCloser, chan string)
	setContext func(atoms []string)
	dm         []string
}

// markerRules: sh, python3 and true everywhere; the marker in DMs only.
func markerRules(marker string) string {
	return privateRule + fmt.Sprintf(`
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3", "/usr/bin/true", %q]
pids = 64

[exec.%q]
when = "discord:dm"
action = "allow"
`, marker, marker)
}

// hostMarker copies the host's sh to a directory of its own under /opt,
// which both build paths' daemons may read, and returns its path.
func hostMarker(t *testing.T) string {
	t.Helper()
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll("/opt", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/opt", "condfs-marker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	m := filepath.Join(dir, "marker")
	if err := os.WriteFile(m, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return m
}

// eachRunPath runs f on a root daemon and on an unprivileged one, each
// with rules.
func eachRunPath(t *testing.T, rules string, f func(t *testing.T, p runPath)) {
	t.Run("root", func(t *testing.T) {
		d, _ := runHomeFiles(t, rules, nil)
		f(t, runPath{
			name: "root",
			run: func(args ...string) (string, int) {
				return condfsRun(t, d, "", append([]string{"--"}, args...)...)
			},
			shell: func(script string) (io.WriteCloser, chan string) {
				_, in, lines := atkShell(t, d, script)
				return in, lines
			},
			setContext: func(atoms []string) { d.setContext("s", atoms) },
			dm:         dmCtx,
		})
	})
	t.Run("userns", func(t *testing.T) {
		a := atk6Home(t, rules, nil)
		f(t, runPath{
			name: "userns",
			run:  func(args ...string) (string, int) { return a.run(t, "", args...) },
			shell: func(script string) (io.WriteCloser, chan string) {
				_, in, lines := a.shell(t, script)
				return in, lines
			},
			setContext: func(atoms []string) { a.setContext(t, atoms) },
			dm:         []string{"discord:dm", "discord:dm:7"},
		})
	})
}

// heldScript opens the marker (argv 1) O_RDONLY and O_PATH and starts it
// (a process that stays), says "held", and once a line comes on stdin runs
// it by every route it knows, each printing MARKER-RAN <route> if it runs.
const heldScript = `
import os, subprocess, sys
m = sys.argv[1]
LD = "/lib64/ld-linux-x86-64.so.2"
subprocess.run([m, "-c", "echo MARKER-DM"])
ro = os.open(m, os.O_RDONLY)
op = os.open(m, os.O_PATH)
held = subprocess.Popen([m, "-c", "read x"], stdin=subprocess.PIPE)
print("held", flush=True)
sys.stdin.readline()
def fexec(fd, name):
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(fd, ["m", "-c", "echo MARKER-RAN " + name], {})
        except OSError as e:
            print(name, "refused:", e, flush=True)
        os._exit(126)
    os.waitpid(pid, 0)
def run(argv, name, fds=()):
    try:
        subprocess.run(argv + ["-c", "echo MARKER-RAN " + name], pass_fds=fds)
    except OSError as e:
        print(name, "refused:", e, flush=True)
fexec(ro, "fexecve-rdonly")
fexec(op, "fexecve-opath")
run([LD, "/proc/self/fd/%d" % ro], "ld-rdonly", (ro,))
run([LD, "/proc/self/fd/%d" % op], "ld-opath", (op,))
run(["/proc/%d/exe" % held.pid], "proc-exe")
run([LD, "/proc/%d/exe" % held.pid], "ld-proc-exe")
run([m], "path")
held.stdin.close()
held.wait()
print("done", flush=True)
`

// TestWithdrawnBinaryNotExecutableFromHeldDescriptor: once a switch
// withdraws a binary listed outside the bin directories, nothing the
// command opened while it was allowed runs it: not fexecve of an O_RDONLY
// or an O_PATH descriptor, not the ELF interpreter given its /proc name,
// not /proc/PID/exe of a process still running it, not its path.
func TestWithdrawnBinaryNotExecutableFromHeldDescriptor(t *testing.T) {
	marker := hostMarker(t)
	eachRunPath(t, markerRules(marker), func(t *testing.T, p runPath) {
		in, lines := p.shell(fmt.Sprintf("exec python3 -c '%s' %s", heldScript, marker))
		if out, ok := waitLine(t, lines, "held", 30*time.Second); !ok || !strings.Contains(out, "MARKER-DM") {
			t.Fatalf("in the DM: %s", out)
		}
		p.setContext(guildCtx)
		fmt.Fprintln(in, "go")
		out, ok := waitLine(t, lines, "done", 30*time.Second)
		if !ok {
			t.Fatalf("the routes did not end: %s", out)
		}
		var ran []string
		for _, route := range []string{"fexecve-rdonly", "fexecve-opath", "ld-rdonly", "ld-opath", "proc-exe", "ld-proc-exe", "path"} {
			if strings.Contains(out, "MARKER-RAN "+route) {
				ran = append(ran, route)
			}
		}
		if len(ran) > 0 || strings.Contains(out, "MARKER-RAN") {
			t.Errorf("the withdrawn marker ran by %v:\n%s", ran, out)
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
		p.setContext(guildCtx)
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
