package runs

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// namesRules list true and sh by /usr/bin, ls by /bin, and decide true
// and ls by keys written the other way.
const namesRules = testenv.PrivateRule + `
[sandbox]
binaries = ["/usr/bin/true", "/usr/bin/sh", "/bin/ls"]
pids = 64

[exec."/bin/true"]
when = "discord:dm"
action = "allow"

[exec."/usr/bin/ls"]
when = "discord:dm"
action = "allow"
`

// TestCommandNamedThroughUsrMergeLinks: where /bin is a link to usr/bin, a
// command named through it is the program listed through /usr/bin and the
// reverse, for the daemon's check before a run as inside it, and an exec
// rule's key decides the program whichever way it is written.
func TestCommandNamedThroughUsrMergeLinks(t *testing.T) {
	if fi, err := os.Lstat("/bin"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("/bin is not a link on this host (%v): the test needs a usr-merged host", err)
		}
		t.Skip("/bin is not a link on this host")
	}
	eachRunPath(t, namesRules, func(t *testing.T, p runPath) {
		// Each run that starts costs a sandbox; a refusal costs none.
		for _, c := range [][]string{{"/bin/true"}, {"/bin/sh", "-c", "/usr/bin/ls / >/dev/null && ls / >/dev/null"}} {
			if out, code := p.run(c...); code != 0 {
				t.Errorf("DM %v: exit %d %q", c, code, out)
			}
		}
		p.setContext(testenv.Guild)
		for _, c := range [][]string{{"true"}, {"/usr/bin/true"}, {"/bin/true"}, {"/bin/ls", "/"}, {"ls", "/"}} {
			if out, code := p.run(c...); code != 126 {
				t.Errorf("guild %v: exit %d %q, want 126", c, code, out)
			}
		}
		if out, code := p.run("/bin/sh", "-c", "/bin/true || exit 9; /usr/bin/ls / || exit 9; /bin/ls / || exit 9"); code != 9 {
			t.Errorf("guild, named inside the run: exit %d %q, want 9", code, out)
		}
	})
}

// TestCommandFoundOnItsOwnPath: a bare command name is looked up, before
// the run as inside it, on the PATH the command gets (--env PATH=...).
func TestCommandFoundOnItsOwnPath(t *testing.T) {
	marker := hostMarker(t)
	d, _ := testenv.RunHomeFiles(t, markerRules(marker), nil)
	pathEnv := "PATH=" + filepath.Dir(marker) + ":/usr/bin"
	if out, code := testenv.CondfsRun(t, d, "", "--env", pathEnv, "--", "marker", "-c", "echo found"); code != 0 || out != "found\n" {
		t.Errorf("marker on --env %s: exit %d %q", pathEnv, code, out)
	}
	if out, code := testenv.CondfsRun(t, d, "", "--env", "PATH=/nonexistent", "--", "true"); code != 127 {
		t.Errorf("true on PATH=/nonexistent: exit %d %q, want 127", code, out)
	}
	d.SetContext("s", testenv.Guild)
	if out, code := testenv.CondfsRun(t, d, "", "--env", pathEnv, "--", "marker", "-c", "echo found"); code != 126 {
		t.Errorf("marker on --env %s in a guild: exit %d %q, want 126", pathEnv, code, out)
	}
}

// TestPathCheckNamesCommandsAsARunDoes: path.check of the exec space
// answers for a name what a run does with it (TestCommandNamedThroughUsrMergeLinks):
// /bin/true is the program listed as /usr/bin/true, decided by the exec
// rules of every spelling.
func TestPathCheckNamesCommandsAsARunDoes(t *testing.T) {
	if fi, err := os.Lstat("/bin"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("/bin is not a link on this host (%v): the test needs a usr-merged host", err)
		}
		t.Skip("/bin is not a link on this host")
	}
	d, _ := testenv.RunHomeFiles(t, namesRules, nil)
	for _, c := range []struct {
		ctx  []string
		name string
		want string
	}{
		{testenv.DM, "/bin/true", "allow"}, {testenv.DM, "/usr/bin/true", "allow"}, {testenv.DM, "/bin/ls", "allow"}, {testenv.DM, "/usr/bin/ls", "allow"},
		{testenv.DM, "/bin/sh", "allow"}, {testenv.DM, "/usr/bin/wc", "deny"},
		{testenv.Guild, "/bin/true", "deny"}, {testenv.Guild, "/usr/bin/true", "deny"}, {testenv.Guild, "/bin/ls", "deny"}, {testenv.Guild, "/usr/bin/ls", "deny"},
		{testenv.Guild, "/bin/sh", "allow"}, {testenv.Guild, "/usr/bin/sh", "allow"},
	} {
		var ex struct{ Decision, Path, Why string }
		if err := d.Client.Call("path.check", map[string]any{"context": c.ctx, "space": "exec", "path": c.name}, &ex); err != nil || ex.Decision != c.want || ex.Path != c.name {
			t.Errorf("%v %s: %v %+v, want %s", c.ctx, c.name, err, ex, c.want)
		}
	}
}

// TestCommandOnAPathIntoTheViewRunsNoViewFile: a PATH (--env) that leads
// into the view, to a file named like an allowed binary, never runs that
// file: the view is noexec and lists nothing here, before the run as
// inside it.
func TestCommandOnAPathIntoTheViewRunsNoViewFile(t *testing.T) {
	d, _ := testenv.RunHomeFiles(t, namesRules, func(h *testenv.Home) {
		for _, p := range []string{"workspace/bin/true", "workspace/bin/ls"} {
			h.Write(p, "#!/usr/bin/sh\necho VIEW-RAN\n")
			os.Chmod(h.Path(p), 0o755)
		}
		os.Chmod(h.Path("workspace/bin"), 0o755)
	})
	for _, c := range [][]string{
		{"--env", "PATH=/workspace/bin:/usr/bin", "--", "true"},
		{"--env", "PATH=/workspace/bin", "--", "ls"},
		{"--cwd", "/workspace", "--env", "PATH=bin:/usr/bin", "--", "sh", "-c", "true; ls; command -v ls"},
	} {
		if out, code := testenv.CondfsRun(t, d, "", c...); strings.Contains(out, "VIEW-RAN") {
			t.Errorf("%v: a file of the view ran (exit %d): %q", c, code, out)
		}
	}
}

// A binary listed outside the bin directories and /usr (a copy of the
// host's sh under /opt), which the exec rules allow in DMs only, on both
// build paths: a root daemon, and an ordinary user's daemon that builds its
// runs with user namespaces. Every command runs as uid 65534.

// runPath is one build path's daemon, with one session in a DM.
type runPath struct {
	run        func(args ...string) (string, int)
	shell      func(script string) (io.WriteCloser, chan string)
	setContext func(atoms []string)
	dm         []string
}

// markerRules: sh, python3 and true everywhere; the marker in DMs only.
func markerRules(marker string) string {
	return testenv.PrivateRule + fmt.Sprintf(`
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
		d, _ := testenv.RunHomeFiles(t, rules, nil)
		f(t, runPath{
			run: func(args ...string) (string, int) {
				return testenv.CondfsRun(t, d, "", append([]string{"--"}, args...)...)
			},
			shell: func(script string) (io.WriteCloser, chan string) {
				_, in, lines := binShell(t, d, script)
				return in, lines
			},
			setContext: func(atoms []string) { d.SetContext("s", atoms) },
			dm:         testenv.DM,
		})
	})
	t.Run("userns", func(t *testing.T) {
		a := testenv.StartUnprivHome(t, rules, nil)
		f(t, runPath{
			run: func(args ...string) (string, int) { return a.Run(t, "", args...) },
			shell: func(script string) (io.WriteCloser, chan string) {
				_, in, lines := a.Shell(t, script)
				return in, lines
			},
			setContext: func(atoms []string) { a.SetContext(t, atoms) },
			dm:         []string{"discord:dm", "discord:dm:7"},
		})
	})
}
