package integration

import (
	"strings"
	"testing"
)

// TestRunListedDirectory: a directory of the host listed in binaries runs
// as a whole where the exec rules allow every path beneath it, live.
// Before, a listed directory was never allowed: git's helpers
// (/usr/lib/git-core/, in the egress example) never ran.
func TestRunListedDirectory(t *testing.T) {
	const git, ld = "/usr/lib/git-core/git", "/lib64/ld-linux-x86-64.so.2"
	d, _ := runHomeWith(t, privateRule+`
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
		{dmCtx, git + " --version", "git version"},
		{dmCtx, "/usr/lib/git-core/git-http-push", "usage"},
		{guildCtx, git + " --version", "Permission denied"},
		{guildCtx, ld + " " + git + " --version", "failed to map segment"},
		{dmCtx, ld + " " + git + " --version", "git version"},
	} {
		if i > 0 {
			d.setContext("s", c.ctx)
		}
		if got := ask(c.line); !strings.Contains(got, c.want) {
			t.Errorf("step %d, %s: %q, want %q", i, c.line, got, c.want)
		}
	}
}
