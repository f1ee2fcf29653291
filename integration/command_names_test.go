package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// namesRules list true and sh by /usr/bin, ls by /bin, and decide true
// and ls by keys written the other way.
const namesRules = privateRule + `
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
		p.setContext(guildCtx)
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
	d, _ := runHomeFiles(t, markerRules(marker), nil)
	pathEnv := "PATH=" + filepath.Dir(marker) + ":/usr/bin"
	if out, code := condfsRun(t, d, "", "--env", pathEnv, "--", "marker", "-c", "echo found"); code != 0 || out != "found\n" {
		t.Errorf("marker on --env %s: exit %d %q", pathEnv, code, out)
	}
	if out, code := condfsRun(t, d, "", "--env", "PATH=/nonexistent", "--", "true"); code != 127 {
		t.Errorf("true on PATH=/nonexistent: exit %d %q, want 127", code, out)
	}
	d.setContext("s", guildCtx)
	if out, code := condfsRun(t, d, "", "--env", pathEnv, "--", "marker", "-c", "echo found"); code != 126 {
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
	d, _ := runHomeFiles(t, namesRules, nil)
	for _, c := range []struct {
		ctx  []string
		name string
		want string
	}{
		{dmCtx, "/bin/true", "allow"}, {dmCtx, "/usr/bin/true", "allow"}, {dmCtx, "/bin/ls", "allow"}, {dmCtx, "/usr/bin/ls", "allow"},
		{dmCtx, "/bin/sh", "allow"}, {dmCtx, "/usr/bin/wc", "deny"},
		{guildCtx, "/bin/true", "deny"}, {guildCtx, "/usr/bin/true", "deny"}, {guildCtx, "/bin/ls", "deny"}, {guildCtx, "/usr/bin/ls", "deny"},
		{guildCtx, "/bin/sh", "allow"}, {guildCtx, "/usr/bin/sh", "allow"},
	} {
		var ex struct{ Decision, Path, Why string }
		if err := d.client.Call("path.check", map[string]any{"context": c.ctx, "space": "exec", "path": c.name}, &ex); err != nil || ex.Decision != c.want || ex.Path != c.name {
			t.Errorf("%v %s: %v %+v, want %s", c.ctx, c.name, err, ex, c.want)
		}
	}
}

// TestCommandOnAPathIntoTheViewRunsNoViewFile: a PATH (--env) that leads
// into the view, to a file named like an allowed binary, never runs that
// file: the view is noexec and lists nothing here, before the run as
// inside it.
func TestCommandOnAPathIntoTheViewRunsNoViewFile(t *testing.T) {
	d, _ := runHomeFiles(t, namesRules, func(h *home) {
		for _, p := range []string{"workspace/bin/true", "workspace/bin/ls"} {
			h.write(p, "#!/usr/bin/sh\necho VIEW-RAN\n")
			os.Chmod(h.path(p), 0o755)
		}
		os.Chmod(h.path("workspace/bin"), 0o755)
	})
	for _, c := range [][]string{
		{"--env", "PATH=/workspace/bin:/usr/bin", "--", "true"},
		{"--env", "PATH=/workspace/bin", "--", "ls"},
		{"--cwd", "/workspace", "--env", "PATH=bin:/usr/bin", "--", "sh", "-c", "true; ls; command -v ls"},
	} {
		if out, code := condfsRun(t, d, "", c...); strings.Contains(out, "VIEW-RAN") {
			t.Errorf("%v: a file of the view ran (exit %d): %q", c, code, out)
		}
	}
}
