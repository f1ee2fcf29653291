package runs

import (
	"os"
	"os/exec"
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
// owner, all at once, in a ruled directory of the run's view, while the
// session switches between two contexts that both allow the directory and
// its programs, and the rules are reloaded: every run succeeds, and what
// it left checks out in the view afterwards.
func TestAgentProgramsWorkInRunsAcrossSwitches(t *testing.T) {
	d, mnt := testenv.RunHomeFiles(t, programRunRules, func(h *testenv.Home) {
		os.MkdirAll(h.Path("workspace/proj"), 0o755)
		os.Chown(h.Path("workspace/proj"), testenv.Nobody, testenv.Nobody)
	})
	var progs []testenv.Program
	for _, p := range testenv.Programs {
		if p.Name == "git" || p.Name == "sqlite3" || p.Name == "prove" {
			progs = append(progs, p)
		}
	}
	other := []string{"discord:dm", "discord:channel:8"}
	ran := testenv.RunPrograms(t, progs, func(p testenv.Program) *exec.Cmd {
		args := append([]string{"run", "--socket", d.Socket, "--session", "s"}, p.RunArgs("/workspace/proj/"+p.Name)...)
		return testenv.CommandAs(testenv.Nobody, testenv.Condfs(), args...)
	}, func(i int) {
		switch i % 3 {
		case 0:
			d.SetContext("s", other)
		case 1:
			d.SetContext("s", testenv.DM)
		case 2:
			d.Call("config.reload", map[string]any{}, nil)
		}
	})
	testenv.CheckPrograms(t, ran, func(p testenv.Program) string { return mnt + "/workspace/proj/" + p.Name })
}
