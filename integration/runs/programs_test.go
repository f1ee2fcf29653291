package runs

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// programRunRules rule workspace/proj/ (allowed in both contexts the test
// switches between) and let git, sqlite3 and prove run.
const programRunRules = `
[workspace."/proj/"]
when = "discord:dm"
action = "allow"

[sandbox]
binaries = ` + testenv.RunBinaries + `
pids = 256
`

// TestAgentProgramsWorkInRunsAcrossSwitches: git (commit, branch, stash,
// merge, fsck), sqlite3 in WAL mode (a 10,000-row transaction beside a
// reader) and prove, each in a condfs run of its own as the session's
// owner, all at once, in a ruled directory of the run's view of a direct
// session and of a staged one, while both sessions switch between two
// contexts that both allow the directory and its programs, and the rules
// are reloaded: every run succeeds; what the direct session's runs left
// checks out in its view, and what the staged one's left, once committed,
// in the backing tree.
func TestAgentProgramsWorkInRunsAcrossSwitches(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, programRunRules, func(h *testenv.Home) {
		os.MkdirAll(h.Path("workspace/proj"), 0o755)
		os.Chown(h.Path("workspace/proj"), testenv.Nobody, testenv.Nobody)
	})
	d.Call("session.open", map[string]any{"id": "st", "mount": d.Home.Path("mnt/st"), "context": testenv.DM, "owner": testenv.Nobody, "changes": "staged"}, nil)
	var progs []testenv.Program
	for _, session := range []string{"s", "st"} {
		for _, p := range testenv.Programs {
			if p.Name == "git" || p.Name == "sqlite3" || p.Name == "prove" {
				p.Name = session + "-" + p.Name
				progs = append(progs, p)
			}
		}
	}
	session := func(p testenv.Program) string { s, _, _ := strings.Cut(p.Name, "-"); return s }
	other := []string{"discord:dm", "discord:channel:8"}
	ran := testenv.RunPrograms(t, progs, func(p testenv.Program) *exec.Cmd {
		args := append([]string{"run", "--socket", d.Socket, "--session", session(p)}, p.RunArgs("/workspace/proj/"+p.Name)...)
		return testenv.CommandAs(testenv.Nobody, testenv.Condfs(), args...)
	}, func(i int) {
		for _, id := range []string{"s", "st"} {
			switch i % 3 {
			case 0:
				d.SetContext(id, other)
			case 1:
				d.SetContext(id, testenv.DM)
			}
		}
		if i%3 == 2 {
			d.Call("config.reload", map[string]any{}, nil)
		}
	})
	var direct, staged []testenv.Program
	for _, p := range ran {
		if session(p) == "s" {
			direct = append(direct, p)
		} else {
			staged = append(staged, p)
		}
	}
	testenv.CheckPrograms(t, direct, func(p testenv.Program) string { return mnt + "/workspace/proj/" + p.Name })
	for _, p := range staged {
		if _, err := os.Stat(d.Home.Path("workspace/proj/" + p.Name)); err == nil {
			t.Errorf("%s's staged work reached the backing tree before the commit", p.Name)
		}
	}
	var r struct {
		Committed int
		Conflicts []struct{ Space, Path, Reason string }
	}
	d.Call("changes.commit", map[string]any{"session": "st"}, &r)
	if r.Committed == 0 || len(r.Conflicts) != 0 {
		t.Fatalf("commit: %+v", r)
	}
	testenv.CheckPrograms(t, staged, func(p testenv.Program) string { return d.Home.Path("workspace/proj/" + p.Name) })
}
