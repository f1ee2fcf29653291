package runs

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// limitRules: runRules with python3 (to allocate and write exactly), a
// 64 MiB memory limit and 1 MiB of /tmp and /dev/shm together.
var limitRules = strings.Replace(testenv.RunRules, `"/usr/bin/tr"]`, `"/usr/bin/tr", "/usr/bin/python3", "/workspace/bin/"]
memory = "64MiB"
tmp_size = "1MiB"`, 1)

// TestRunLimits: [sandbox] memory and tmp_size hold for a run's command
// (cgroup v1 memory controller on this root daemon's machine), and what
// stays under them runs.
func TestRunLimits(t *testing.T) {
	d, _ := testenv.RunHomeWith(t, limitRules)
	py := func(code string) (string, int) {
		t.Helper()
		return testenv.CondfsRun(t, d, "", "--", "python3", "-c", code)
	}
	if out, code := py("b = bytearray(16 << 20); b[-1] = 1; print(len(b))"); code != 0 || strings.TrimSpace(out) != "16777216" {
		t.Errorf("16 MiB under a 64 MiB limit: exit %d %q", code, out)
	}
	// Touched page by page, so an overcommitting kernel must back it.
	if out, code := py("b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('kept')"); code == 0 || strings.Contains(out, "kept") {
		t.Errorf("256 MiB under a 64 MiB limit: exit %d %q", code, out)
	}
	write := func(path string, n int) string {
		return "open(" + pyQuote(path) + ", 'wb').write(b'x' * " + strconv.Itoa(n) + ")"
	}
	if out, code := py(write("/tmp/a", 600<<10)); code != 0 {
		t.Errorf("600 KiB in /tmp under 1 MiB: exit %d %q", code, out)
	}
	if out, code := py(write("/tmp/a", 2<<20)); code == 0 || !strings.Contains(out, "No space left") {
		t.Errorf("2 MiB in /tmp under 1 MiB: exit %d %q", code, out)
	}
	// /tmp and /dev/shm share the bound.
	if out, code := py(write("/tmp/a", 600<<10) + "; " + write("/dev/shm/b", 600<<10)); code == 0 || !strings.Contains(out, "No space left") {
		t.Errorf("600 KiB in /tmp and 600 KiB in /dev/shm under 1 MiB together: exit %d %q", code, out)
	}
}

func pyQuote(s string) string { return "'" + s + "'" }

// TestRunsLeaveTheDaemonItsReserve: the files one uid's views may hold are half the
// room, and the reserve (an eighth of RLIMIT_NOFILE, at least 512) is all
// that is left for the rest of the daemon; runs hold descriptors the file
// budget does not count (their connection, the init's channel, pidfd,
// cgroups, stdio). One uid holds its half of the files and starts as many
// runs as its connections allow: does another uid's view, or root's
// control call, still work?
func TestRunsLeaveTheDaemonItsReserve(t *testing.T) {
	d := testenv.LowNofileDaemon(t)
	pid := d.Cmd.Process.Pid
	victim := d.OpenFor("victim", 1000, testenv.DM)
	base := testenv.FDs(pid)
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	for i := 0; i < 6; i++ {
		id := fmt.Sprintf("a%d", i)
		mnt := d.OpenFor(id, testenv.Nobody, testenv.DM)
		got, stop := testenv.HoldOpen(t, testenv.Nobody, mnt+"/workspace/w.txt", 128)
		stops = append(stops, stop)
		t.Logf("65534's session %s: %s", id, got)
	}
	t.Logf("daemon fds with the files held: %d (base %d)", testenv.FDs(pid), base)
	var runs []*exec.Cmd
	defer func() {
		for _, c := range runs {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for i := 0; i < 120; i++ {
		c := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", d.Socket,
			"--session", fmt.Sprintf("a%d", i%6), "--", "sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, c)
		if i%20 == 19 {
			time.Sleep(time.Second)
			t.Logf("%d runs: daemon fds %d", i+1, testenv.FDs(pid))
		}
	}
	time.Sleep(3 * time.Second)
	t.Logf("daemon fds with the runs: %d", testenv.FDs(pid))
	testenv.CheckOthersServed(t, d, victim, "uid 65534 held its half of the files and started 120 runs")
}

// TestRunOpenFilesCannotExhaustDaemon: each file a run opens through the view
// is a descriptor of the daemon's (the backing file, reopened). The run's
// processes inherit the daemon's hard RLIMIT_NOFILE: one run that opens as
// many files as it may leaves the daemon none, and every other session
// (and the control socket) fails while it holds them.
func TestRunOpenFilesCannotExhaustDaemon(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	os.MkdirAll(a.Home.Path("mnt/other"), 0o755)
	testenv.ChownTree(t, a.Home.Path("mnt/other"), testenv.Nobody)
	if err := a.Call(t, "session.open", map[string]any{"id": "other", "mount": a.Home.Path("mnt/other"), "context": testenv.DM, "owner": testenv.Nobody}, nil); err != nil {
		t.Fatalf("open other: %v", err)
	}
	readOther := func() (string, error) {
		out, err := testenv.CommandAs(testenv.Nobody, "cat", a.Home.Path("mnt/other/memories/pub.md")).CombinedOutput()
		return string(out), err
	}
	if o, err := readOther(); err != nil || o != "public\n" {
		t.Fatalf("other session before: %v %q", err, o)
	}
	_, stdin, lines := a.Shell(t, `python3 -c '
import os, resource, sys
s, h = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
fds = []
try:
    while True:
        fds.append(os.open("/workspace/w.txt", os.O_RDONLY))
except OSError as e:
    print("held", len(fds), "of", h, "then", e.strerror, flush=True)
sys.stdin.readline()
' & python3 -c '
import os, resource, sys, time
time.sleep(2)
s, h = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
fds = []
try:
    while True:
        fds.append(os.open("/workspace/w.txt", os.O_RDONLY))
except OSError as e:
    print("second held", len(fds), "then", e.strerror, flush=True)
sys.stdin.readline()
'; wait; echo end`)
	o, ok := waitLine(t, lines, "second held", 120*time.Second)
	t.Logf("run: %s (ok %v)", o, ok)
	out, err := readOther()
	t.Logf("other session while the run holds them: %v %q", err, out)
	var st map[string]any
	cerr := a.Call(t, "status", map[string]any{}, &st)
	t.Logf("status: %v", cerr)
	broken := err != nil || out != "public\n" || cerr != nil
	io.WriteString(stdin, "go\ngo\n")
	waitLine(t, lines, "end", 60*time.Second)
	for _, l := range strings.Split(a.Logs(), "\n") {
		if strings.Contains(l, "too many open files") || strings.Contains(l, "EMFILE") {
			t.Log(testenv.Tail(l, 1))
			break
		}
	}
	if broken {
		t.Errorf("HOLE: while one session's run holds files of its view open, another session's view fails (%v %q) / control: %v", err, out, cerr)
	}
}
