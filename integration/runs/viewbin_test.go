package runs

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// viewBinHome is runHomeWith(viewBinRules) with the view's programs: two
// scripts and a copy of true in bin/, and the same outside anything listed.
func viewBinHome(t *testing.T) *testenv.Daemon {
	t.Helper()
	trueELF, err := os.ReadFile("/usr/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	d, _ := testenv.RunHomeFiles(t, viewBinRules, func(h *testenv.Home) { viewBinFiles(t, h, trueELF) })
	return d
}

// viewBinFiles makes viewBinHome's files.
func viewBinFiles(t *testing.T, h *testenv.Home, trueELF []byte) {
	h.Write("workspace/bin/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	h.Write("workspace/bin/true", string(trueELF))
	h.Write("workspace/tool.sh", "#!/bin/sh\necho tool-ran\n")
	h.Write("workspace/other.sh", "#!/bin/sh\necho other-ran\n")
	h.Write("workspace/true", string(trueELF))
	for _, p := range []string{"workspace/bin/hello.sh", "workspace/bin/true", "workspace/tool.sh", "workspace/other.sh", "workspace/true"} {
		if err := os.Chmod(h.Path(p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(".", h.Path("workspace/link")); err != nil {
		t.Fatal(err)
	}
}

// TestRunViewBinaries: a listed view path runs where the exec rules allow
// it, live in a running shell, and nothing else of the view runs, by
// execve or through the ELF interpreter; what a run may execute of the
// view it cannot write; a listed name that is a symlink in the view makes
// nothing executable (bound through it, the whole workspace would be).
func TestRunViewBinaries(t *testing.T) {
	d := viewBinHome(t)
	const ld = "/lib64/ld-linux-x86-64.so.2"
	const denied, unmapped = "Permission denied", "failed to map segment"
	// As the command itself: its exit statuses (sandbox.md).
	for _, c := range []struct {
		cmd  string
		code int
		want string
	}{
		{"/workspace/bin/hello.sh", 0, "hello-from-view"},
		{"/workspace/other.sh", 126, ""},
		{"/workspace/bin/nothing", 127, ""},
	} {
		if out, code := testenv.CondfsRun(t, d, "", "--", c.cmd); code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("condfs run -- %s: exit %d %q, want %d", c.cmd, code, out, c.code)
		}
	}
	cmd, stdin, ask := runShell(t, d)
	defer func() { stdin.Close(); cmd.Wait() }()
	prev := testenv.DM
	for i, c := range []struct {
		ctx        []string
		line, want string
	}{
		{testenv.DM, "/workspace/bin/hello.sh", "hello-from-view [0]"},
		{testenv.DM, "/workspace/bin/true", "[0]"},
		{testenv.DM, ld + " /workspace/bin/true", "[0]"},
		{testenv.DM, "/workspace/tool.sh", "tool-ran [0]"},
		{testenv.DM, "/workspace/other.sh", denied},
		{testenv.DM, "/workspace/true", denied},
		{testenv.DM, ld + " /workspace/true", unmapped},
		{testenv.DM, "echo x > /workspace/bin/new.sh", "Read-only file system"},
		{testenv.DM, "echo x > /workspace/bin/true", "Read-only file system"},
		{testenv.DM, "/workspace/link/other.sh", denied},
		{testenv.DM, ld + " /workspace/link/true", unmapped},
		{testenv.Guild, "/workspace/bin/hello.sh", denied},
		{testenv.Guild, "/workspace/bin/true", denied},
		{testenv.Guild, ld + " /workspace/bin/true", unmapped},
		{testenv.Guild, "/workspace/tool.sh", "tool-ran [0]"},
		{testenv.Guild, "echo x > /workspace/other.sh; echo wrote", "wrote [0]"},
		{testenv.DM, "/workspace/bin/hello.sh", "hello-from-view [0]"},
	} {
		if !slices.Equal(c.ctx, prev) {
			d.SetContext("s", c.ctx)
			prev = c.ctx
		}
		if got := ask(c.line); !strings.Contains(got, c.want) {
			t.Errorf("step %d (%v), %s: %q, want %q", i, c.ctx[0], c.line, got, c.want)
		}
	}
}

// TestViewBinaryCwdRunsNothingAfterSwitch: a shell whose working directory is an allowed
// directory of the view executes nothing from it once a switch takes the
// directory away: the bind it stands in is made noexec before it goes.
func TestViewBinaryCwdRunsNothingAfterSwitch(t *testing.T) {
	d := viewBinHome(t)
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", d.Socket, "--session", "s", "--",
		"sh", "-c", `cd /workspace/bin && ./hello.sh && read x && ./hello.sh; ./true; echo "status $?"`)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "hello-from-view" {
		t.Fatalf("in a DM: %q", lines.Text())
	}
	d.SetContext("s", testenv.Guild)
	fmt.Fprintln(stdin, "go")
	stdin.Close()
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	cmd.Wait()
	out := strings.Join(rest, "\n")
	if strings.Contains(out, "hello-from-view") || !strings.Contains(out, "status 126") {
		t.Fatalf("after the switch, from the old working directory: %q", out)
	}
}
