package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// condfsBin is the binary built once for the CLI tests: they run the real
// command, as a user or CI would.
var condfsBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "condfs-cli")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	condfsBin = filepath.Join(dir, "condfs")
	// The client and, beside it, the daemon binary it executes.
	out, err := exec.Command("go", "build", "-o", dir+"/", ".", "../condfsd").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.Exit(1)
	}
	testenv.UseBinaries(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

func condfs(t testing.TB, stdin []byte, args ...string) result {
	t.Helper()
	cmd := exec.Command(condfsBin, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run condfs %v: %v", args, err)
	}
	return result{so.String(), se.String(), code}
}

func writeFile(t testing.TB, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCtlFlagsBelongToTheirCommand: a flag another subcommand owns is a
// usage error, never ignored (the socket is not even dialled).
func TestCtlFlagsBelongToTheirCommand(t *testing.T) {
	for _, args := range [][]string{
		{"ctl", "--socket", "/nonexistent", "list", "--tool", "x"},
		{"ctl", "--socket", "/nonexistent", "close", "s", "--context", "tui"},
		{"ctl", "--socket", "/nonexistent", "open", "s", "/m", "--context", "tui", "--role", "r"},
		{"ctl", "--socket", "/nonexistent", "status", "--session", "s"},
	} {
		r := condfs(t, nil, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "does not take --") {
			t.Errorf("%v: exit %d, %q", args, r.code, r.stderr)
		}
	}
}

// TestClientAlone: the client binary without condfsd beside it or on PATH
// runs its own commands and says what is missing for the daemon's.
func TestClientAlone(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(condfsBin)
	if err != nil {
		t.Fatal(err)
	}
	alone := filepath.Join(dir, "condfs")
	if err := os.WriteFile(alone, data, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, int) {
		cmd := exec.Command(alone, args...)
		cmd.Env = []string{"PATH=" + dir}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	for _, c := range []string{"serve", "policy", "mcp"} {
		out, code := run(c, "--help")
		if code != 1 || !strings.Contains(out, "condfsd (the daemon and the offline tools) is neither beside this binary nor on PATH") {
			t.Errorf("condfs %s without condfsd: exit %d, %q", c, code, out)
		}
	}
	if out, code := run("ctl", "--socket", filepath.Join(dir, "none.sock"), "status"); code != 1 || !strings.Contains(out, "none.sock") {
		t.Errorf("condfs ctl without condfsd: exit %d, %q", code, out)
	}
	if out, code := run("help"); code != 0 || !strings.Contains(out, "run a command in a sandbox") {
		t.Errorf("condfs help without condfsd: exit %d, %q", code, out)
	}
}
