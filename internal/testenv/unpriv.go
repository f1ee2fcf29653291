package testenv

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/condfs/condfs/control"
)

// An unprivileged daemon (uid 65534) builds its runs with user
// namespaces: the command, its init and the daemon share one uid, each
// session has a FUSE connection of its own (every context.set bumps its
// epoch), and fusermount3 made the host's view mount.

// UnprivRules lets /workspace/bin/ run in DMs only; sh, cat and python3
// everywhere (cat in DMs only, as RunRules says).
var UnprivRules = strings.Replace(RunRules, `"/usr/bin/tr"]`, `"/usr/bin/tr", "/usr/bin/python3", "/workspace/bin/"]`, 1) + `
[exec."/workspace/bin/"]
when = "discord:dm"
action = "allow"
`

// UnprivHome is an unprivileged daemon's home.
type UnprivHome struct {
	Home   *Home
	Socket string
	Logs   func() string
	Mnt    string // the host's view mount of session "default"
}

// StartUnprivHome starts condfs serve as 65534 (startUnprivDaemon: session
// "default" in a DM, mounted at mnt/v) with files made first.
func StartUnprivHome(t *testing.T, rules string, files func(h *Home)) *UnprivHome {
	t.Helper()
	RequireUnprivilegedFUSE(t)
	h := OpenHome(t, rules)
	h.Write("config/policy.yaml", RunPolicy)
	h.Write("memories/private/p.md", "dm secret\n")
	h.Write("memories/pub.md", "public\n")
	h.Write("workspace/w.txt", "work\n")
	h.Write("workspace/bin/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	h.Write("workspace/bin/tool42", "\xb8\x2a\x00\x00\x00\xc3")
	echoELF, _ := os.ReadFile("/usr/bin/echo")
	h.Write("workspace/bin/echo", string(echoELF))
	for _, p := range []string{"workspace/bin/hello.sh", "workspace/bin/tool42", "workspace/bin/echo"} {
		os.Chmod(h.Path(p), 0o755)
	}
	if files != nil {
		files(h)
	}
	sock, logs := StartUnprivileged(t, h)
	return &UnprivHome{Home: h, Socket: sock, Logs: logs, Mnt: h.Path("mnt/v")}
}

// Run runs `condfs run` as 65534 in session "default" through sh, so that
// stdin may be redirected by the caller's shell (redir, "" for none).
func (a *UnprivHome) Run(t *testing.T, redir string, argv ...string) (string, int) {
	t.Helper()
	q := make([]string, len(argv))
	for i, s := range argv {
		q[i] = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	line := fmt.Sprintf("exec %s run --socket %s --session default -- %s %s", Condfs(), a.Socket, strings.Join(q, " "), redir)
	cmd := CommandAs(Nobody, "sh", "-c", line)
	out, _ := cmd.CombinedOutput()
	return string(out), cmd.ProcessState.ExitCode()
}

// Shell starts `condfs run -- sh -c script` as 65534 in session "default".
func (a *UnprivHome) Shell(t *testing.T, script string) (*exec.Cmd, io.WriteCloser, chan string) {
	t.Helper()
	return RunShell(t, a.Socket, "default", script)
}

// RunShell starts `condfs run -- sh -c script` as 65534 in session over
// the daemon at socket, and returns its stdin and a channel of its output
// lines (stdout and stderr), closed when the output ends.
func RunShell(t *testing.T, socket, session, script string) (*exec.Cmd, io.WriteCloser, chan string) {
	t.Helper()
	cmd := CommandAs(Nobody, Condfs(), "run", "--socket", socket, "--session", session, "--",
		"sh", "-c", script)
	stdin, _ := cmd.StdinPipe()
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
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	return cmd, stdin, lines
}

// Call makes a control call as root (admitted by every daemon).
func (a *UnprivHome) Call(t *testing.T, method string, params, out any) error {
	t.Helper()
	c, err := control.Dial(a.Socket)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(method, params, out)
}

// SetContext switches session "default" to atoms.
func (a *UnprivHome) SetContext(t *testing.T, atoms []string) {
	t.Helper()
	if err := a.Call(t, "context.set", map[string]any{"session": "default", "context": atoms}, nil); err != nil {
		t.Fatalf("context.set: %v", err)
	}
}
