package runs

import (
	"os"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// viewWriteRules: the coreutils a shell tool runs on its files.
var viewWriteRules = strings.Replace(testenv.RunRules, `"/usr/bin/tr"]`,
	`"/usr/bin/tr", "/usr/bin/truncate", "/usr/bin/ln", "/usr/bin/rm", "/usr/bin/readlink"]`, 1)

// checkRunWritesView: runs, one after another as an agent makes them, each
// write the view beside a file tool (uid 65534 through the view's mount,
// outside any run), as that uid does natively: truncate its own file the
// file tool made mode 0600, make a symlink, remove a symlink the run made
// and one the file tool made. Each run's change leaves the kernel's
// attributes of /workspace stale for the next sandbox's confinement, and
// so does each change of the file tool.
func checkRunWritesView(t *testing.T, h *testenv.Home, mnt string, run func(args ...string) (string, int)) {
	t.Helper()
	tool := func(script string) {
		t.Helper()
		cmd := testenv.CommandAs(testenv.Nobody, "sh", "-ec", `cd "$0"; `+script, mnt+"/workspace")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("file tool: %s: %v %s", script, err, out)
		}
	}
	tool("echo hello > f; chmod 600 f; ln -s w.txt tl")
	for _, c := range [][]string{
		{"truncate", "-s", "0", "/workspace/f"},
		{"ln", "-s", "w.txt", "/workspace/rl"},
		{"rm", "/workspace/rl"},
		{"rm", "/workspace/tl"},
	} {
		if out, code := run(c...); code != 0 {
			t.Errorf("%s in a run: exit %d %q", strings.Join(c, " "), code, out)
		}
	}
	if b, err := os.ReadFile(h.Path("workspace/f")); err != nil || len(b) != 0 {
		t.Errorf("after the run's truncate, the backing file: %q %v", b, err)
	}
	// Natively the same uid does the same (the answer a run must match).
	tool("echo hello > f; chmod 600 f; truncate -s 0 f; ln -s w.txt nl; rm nl")
}

// TestRunWritesViewAfterChanges: a run's command writes the view it is
// given, whatever a previous command or a file tool changed there. The
// root init's thread that confines the next command looked at /workspace
// with a stat; once its cached attributes were stale the view (which
// admits its owner, not root) refused it, and Landlock left the view out
// of the command's writable places: every other run's truncate, ln -s and
// rm failed with EACCES, and nothing reached the daemon's log.
func TestRunWritesViewAfterChanges(t *testing.T) {
	d, mnt := testenv.RunHomeWith(t, viewWriteRules)
	checkRunWritesView(t, d.Home, mnt, func(args ...string) (string, int) {
		return testenv.CondfsRun(t, d, "", append([]string{"--"}, args...)...)
	})
}

// TestRunWritesViewAfterChangesUnprivilegedDaemon: the same on the
// user-namespace path (a daemon run by the session's owner).
func TestRunWritesViewAfterChangesUnprivilegedDaemon(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	h := testenv.OpenHome(t, viewWriteRules)
	h.Write("config/policy.yaml", testenv.RunPolicy)
	h.Write("workspace/w.txt", "work\n")
	sock, logs := testenv.StartUnprivileged(t, h)
	checkRunWritesView(t, h, h.Path("mnt/v"), func(args ...string) (string, int) {
		cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), append([]string{"run", "--socket", sock, "--session", "default", "--"}, args...)...)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() == 125 {
			t.Logf("daemon log:\n%s", testenv.Tail(logs(), 20))
		}
		return string(out), cmd.ProcessState.ExitCode()
	})
}
