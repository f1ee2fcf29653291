package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Nobody is the uid (and gid) the tests' unprivileged callers run as.
const Nobody = 65534

// AsUID is the argv prefix that runs a program as uid, with gid uid and no
// supplementary groups: a caller the daemon knows only by its credentials.
func AsUID(uid int) []string {
	u := strconv.Itoa(uid)
	return []string{"setpriv", "--reuid=" + u, "--regid=" + u, "--clear-groups"}
}

// CommandAs is exec.Command for name run as uid (AsUID).
func CommandAs(uid int, name string, args ...string) *exec.Cmd {
	argv := append(AsUID(uid), name)
	return exec.Command(argv[0], append(argv[1:], args...)...)
}

// NofileLimit is a wrapper for StartUnder: the daemon's RLIMIT_NOFILE set
// to n, and CAP_SYS_RESOURCE out of its bounding set so that it cannot
// raise it again.
func NofileLimit(n int) []string {
	l := strconv.Itoa(n)
	return []string{"prlimit", "--nofile=" + l + ":" + l, "setpriv", "--bounding-set=-sys_resource", "--"}
}

// AsNobody runs the attacker (or, with a leading "condfs", the condfs
// binary) as uid and gid 65534 with no groups, and returns its output.
func AsNobody(t *testing.T, args ...string) string {
	t.Helper()
	bin := Attacker()
	if len(args) > 0 && args[0] == "condfs" {
		bin, args = Condfs(), args[1:]
	}
	cmd := CommandAs(Nobody, bin, args...)
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

// ConverseAsNobody starts the attacker as uid and gid 65534 for a
// subcommand that answers stdin line by line; it returns the first line and
// a function that sends a line and returns the answer.
func ConverseAsNobody(t *testing.T, args ...string) (string, func(string) string) {
	t.Helper()
	cmd := CommandAs(Nobody, Attacker(), args...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("attacker %v exited at once", args)
	}
	return lines.Text(), func(line string) string {
		t.Helper()
		fmt.Fprintln(stdin, line)
		if !lines.Scan() {
			t.Fatal("attacker exited")
		}
		return lines.Text()
	}
}

// ChownTree gives everything below root to uid.
func ChownTree(t *testing.T, root string, uid int) {
	t.Helper()
	filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			os.Lchown(p, uid, uid)
		}
		return nil
	})
}

// ShAsNobody runs a shell script as uid 65534 in dir (a view): what an
// agent's file tools do.
func ShAsNobody(t *testing.T, dir, script string) string {
	t.Helper()
	// cd as 65534: the view admits its owner only, not root.
	cmd := CommandAs(Nobody, "/bin/sh", "-c", `cd "$1" && eval "$2"`, "sh", dir, script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", script, err, out)
	}
	return strings.TrimSpace(string(out))
}

// PythonAs runs a Python script as uid (and gid, no groups), with the
// control socket as argv[1] and args after it, and returns its output.
func PythonAs(t *testing.T, uid int, timeout time.Duration, script string, args ...string) string {
	t.Helper()
	argv := append([]string{strconv.Itoa(int(timeout / time.Second))}, AsUID(uid)...)
	cmd := exec.Command("timeout", append(append(argv, "/usr/bin/python3", "-c", script), args...)...)
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

// HoldOpen starts, as uid, a process that opens path n times and holds
// the files until its stdin closes. It returns the count opened (and the
// error that stopped it) and a function that ends it.
func HoldOpen(t *testing.T, uid int, path string, n int) (string, func()) {
	t.Helper()
	cmd := CommandAs(uid, "/usr/bin/python3", "-c", `
import os, sys, resource
s, h = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
fds, err = [], "none"
try:
    for i in range(int(sys.argv[2])):
        fds.append(os.open(sys.argv[1], os.O_RDONLY))
except OSError as e:
    err = e.strerror
print("held", len(fds), "err", err, flush=True)
sys.stdin.readline()
`, path, strconv.Itoa(n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	stop := func() { stdin.Close(); cmd.Wait() }
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	return strings.TrimSpace(line), stop
}
