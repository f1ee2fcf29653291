package runs

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

const execConditions = `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/cat", "/workspace/bin/"]

[exec."/usr/bin/cat"]
when = "discord:dm"
action = "allow"

[workspace."/bin/private/"]
when = "tui"
action = "allow"
`

// TestExecPathCheck: path.check with "space":"exec" answers what a run in
// the session's current context may execute, follows context.set, and a
// reload with a broken [sandbox] keeps the last good config. exec is a
// space of rules only: the view shows no such directory.
func TestExecPathCheck(t *testing.T) {
	testenv.RequireFUSE(t)
	h := testenv.NewHome(t, execConditions, "version: 1\n")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.DM)

	check := func(path string) (decision, why string) {
		t.Helper()
		var ex struct{ Decision, Why string }
		d.Call("path.check", map[string]any{"session": "s", "space": "exec", "path": path}, &ex)
		return ex.Decision, ex.Why
	}
	expect := func(when string, want map[string]string) {
		t.Helper()
		for path, w := range want {
			if got, why := check(path); got != w {
				t.Errorf("%s: exec %s: %s (%s), want %s", when, path, got, why, w)
			}
		}
	}
	expect("dm", map[string]string{"/usr/bin/cat": "allow", "/bin/sh": "allow", "/usr/bin/nc": "deny",
		"/workspace/bin/run.sh": "allow", "/workspace/bin/private/x": "deny", "/workspace/run.sh": "deny"})
	d.SetContext("s", testenv.Guild)
	expect("guild", map[string]string{"/usr/bin/cat": "deny", "/bin/sh": "allow"})
	d.SetContext("s", []string{"tui"})
	expect("tui", map[string]string{"/usr/bin/cat": "deny", "/workspace/bin/private/x": "allow"})
	d.SetContext("s", testenv.DM)

	// An explicit context is answered the same way.
	var ex struct{ Decision string }
	d.Call("path.check", map[string]any{"context": testenv.Guild, "space": "exec", "path": "/usr/bin/cat"}, &ex)
	if ex.Decision != "deny" {
		t.Fatalf("explicit guild context: %s", ex.Decision)
	}
	d.CallErr("path.check", map[string]any{"session": "s", "space": "exec", "path": "usr/bin/cat"}, control.CodeInvalidParams)
	d.CallErr("path.check", map[string]any{"session": "s", "space": "exec", "path": "/usr/bin/cat\x00"}, control.CodeInvalidParams)
	d.CallErr("path.check", map[string]any{"session": "s", "space": "sandbox", "path": "/bin/sh"}, control.CodeInvalidParams)

	// The view's root holds memories and workspace only.
	if _, err := os.Stat(mnt + "/exec"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("stat %s/exec: %v", mnt, err)
	}
	if names, err := os.ReadDir(mnt); err != nil || len(names) != 2 || names[0].Name() != "memories" || names[1].Name() != "workspace" {
		t.Fatalf("the view's root: %v %v", names, err)
	}

	// Broken [sandbox] tables: each keeps the last good config, with the
	// error (FILE:LINE:COL) in status.
	before := testenv.ConditionsStatus(d)
	st := before
	for i, broken := range []string{
		strings.Replace(execConditions, `binaries = [`, "network = \"bridge\"\nbinaries = [", 1),
		strings.Replace(execConditions, `"/usr/bin/cat", "/workspace`, `"usr/bin/cat", "/workspace`, 1),
		strings.Replace(execConditions, `"/bin/sh"`, `"/bin/../usr/bin/nc"`, 1),
		strings.Replace(execConditions, `binaries = [`, "memory = \"1GB\"\nbinaries = [", 1),
		strings.Replace(execConditions, `binaries = [`, "shell = \"/bin/sh\"\nbinaries = [", 1),
	} {
		prev := ""
		if st.Error != nil {
			prev = *st.Error
		}
		testenv.WriteStyle(t, h, "rename", &broken, i+2)
		d.Within("the broken file's error in status", func() bool {
			st = testenv.ConditionsStatus(d)
			return st.Error != nil && *st.Error != prev
		})
		if st.Generation != before.Generation || !strings.Contains(*st.Error, "conditions.toml:3:") || !strings.Contains(*st.Error, "[sandbox]") {
			t.Fatalf("broken file %d: %+v %s", i, st, *st.Error)
		}
		expect("dm after a broken reload", map[string]string{"/usr/bin/cat": "allow", "/bin/sh": "allow", "/usr/bin/nc": "deny"})
		d.SetContext("s", testenv.Guild)
		expect("guild after a broken reload", map[string]string{"/usr/bin/cat": "deny"})
		d.SetContext("s", testenv.DM)
	}

	// A good change applies: cat for every context, sh no longer listed.
	good := strings.Replace(strings.Replace(execConditions, `when = "discord:dm"`, `when = ["discord:dm", "discord:guild:1"]`, 1), `"/bin/sh", `, "", 1)
	testenv.WriteStyle(t, h, "rename", &good, 10)
	st = testenv.WaitReload(d, before, true)
	if st.Generation != before.Generation+1 {
		t.Fatalf("good file: %+v", st)
	}
	d.SetContext("s", testenv.Guild)
	expect("guild after a good reload", map[string]string{"/usr/bin/cat": "allow", "/bin/sh": "deny"})
}
