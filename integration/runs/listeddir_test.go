package runs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestRunListedDirectory: a directory of the host listed in binaries runs
// as a whole where the exec rules allow every path beneath it, live, so
// git's helpers (/usr/lib/git-core/, in the egress example) run.
func TestRunListedDirectory(t *testing.T) {
	const git, ld = "/usr/lib/git-core/git", "/lib64/ld-linux-x86-64.so.2"
	d, _ := testenv.RunHomeWith(t, testenv.PrivateRule+`
[sandbox]
binaries = ["/bin/sh", "/usr/bin/tr", "/usr/lib/git-core/"]

[exec."/usr/lib/git-core/"]
when = "discord:dm"
action = "allow"
`)
	cmd, stdin, ask := runShell(t, d)
	defer func() { stdin.Close(); cmd.Wait() }()
	for i, c := range []struct {
		ctx        []string
		line, want string
	}{
		{testenv.DM, git + " --version", "git version"},
		{testenv.DM, "/usr/lib/git-core/git-http-push", "usage"},
		{testenv.Guild, git + " --version", "Permission denied"},
		{testenv.Guild, ld + " " + git + " --version", "failed to map segment"},
		{testenv.DM, ld + " " + git + " --version", "git version"},
	} {
		if i > 0 {
			d.SetContext("s", c.ctx)
		}
		if got := ask(c.line); !strings.Contains(got, c.want) {
			t.Errorf("step %d, %s: %q, want %q", i, c.line, got, c.want)
		}
	}
}

// runShell starts, as uid 65534, a shell run of session "s" that runs each
// line it is asked and answers one line: its output and exit status.
func runShell(t *testing.T, d *testenv.Daemon) (*exec.Cmd, io.WriteCloser, func(string) string) {
	t.Helper()
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", d.Socket, "--session", "s", "--",
		"sh", "-c", `while read line; do out=$(eval "$line" 2>&1 | tr -d '\n'); echo "$out [$?]"; done`)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	return cmd, stdin, func(line string) string {
		t.Helper()
		fmt.Fprintln(stdin, line)
		if !lines.Scan() {
			t.Fatal("the run ended")
		}
		return lines.Text()
	}
}
