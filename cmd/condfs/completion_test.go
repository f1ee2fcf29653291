package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// needShell finds a shell; in CI (which installs them) it must be there.
func needShell(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed; .ci/run installs it", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

func completionScript(t *testing.T, shell string) string {
	t.Helper()
	r := condfs(t, nil, "completion", shell)
	if r.code != 0 {
		t.Fatalf("completion %s: %d %s", shell, r.code, r.stderr)
	}
	f := filepath.Join(t.TempDir(), "condfs."+shell)
	os.WriteFile(f, []byte(r.stdout), 0o644)
	return f
}

// Completion offers what --help documents: commands, subcommands and
// flags, in bash and fish (driven as a user's shell would), and zsh's
// script parses.
func TestCompletion(t *testing.T) {
	cases := []struct {
		line string // the words typed, the last one being completed
		want string
	}{
		{"condfs ser", "serve"},
		{"condfs serve --metr", "--metrics"},
		{"condfs serve --max-s", "--max-sessions"},
		{"condfs policy te", "test"},
		{"condfs policy test --cov", "--coverage"},
		{"condfs ctl sta", "status"},
		{"condfs acl check --spa", "--space"},
		{"condfs hook cl", "claude-code"},
		{"condfs mcp pro", "proxy"},
		{"condfs completion fi", "fish"},
	}
	t.Run("bash", func(t *testing.T) {
		bash := needShell(t, "bash")
		script := completionScript(t, "bash")
		for _, c := range cases {
			words := strings.Fields(c.line)
			cmd := exec.Command(bash, "-c", `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _condfs; printf '%s\n' "${COMPREPLY[@]}"`, "-", script)
			cmd.Args = append(cmd.Args, words...)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains("\n"+string(out), "\n"+c.want+"\n") {
				t.Errorf("bash %q: %q %v, want %s", c.line, out, err, c.want)
			}
		}
	})
	t.Run("fish", func(t *testing.T) {
		fish := needShell(t, "fish")
		script := completionScript(t, "fish")
		for _, c := range cases {
			out, err := exec.Command(fish, "--no-config", "-c", `source $argv[1]; complete -C $argv[2]`, script, c.line).CombinedOutput()
			if err != nil || !strings.Contains("\n"+string(out), "\n"+c.want) {
				t.Errorf("fish %q: %q %v, want %s", c.line, out, err, c.want)
			}
		}
	})
	t.Run("zsh", func(t *testing.T) {
		zsh := needShell(t, "zsh")
		script := completionScript(t, "zsh")
		if out, err := exec.Command(zsh, "-n", script).CombinedOutput(); err != nil {
			t.Fatalf("zsh -n: %v %s", err, out)
		}
		data, _ := os.ReadFile(script)
		for _, w := range []string{"--metrics", "--coverage", "claude-code", "status"} {
			if !strings.Contains(string(data), w) {
				t.Errorf("zsh script lacks %s", w)
			}
		}
	})
	if r := condfs(t, nil, "completion", "tcsh"); r.code != 2 || !strings.Contains(r.stderr, "bash, zsh or fish") {
		t.Fatalf("unknown shell: %d %q", r.code, r.stderr)
	}
}
