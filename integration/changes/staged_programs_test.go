package changes

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// stagedProgramRules rule workspace/proj/, allowed in both contexts the
// test switches between.
const stagedProgramRules = `
[workspace."/proj/"]
when = "discord:dm"
action = "allow"
`

// TestAgentProgramsWorkStaged: agents' programs (testenv.Programs: git,
// npm, go build and go test, a venv, sqlite3 in WAL mode, make -j2 over cc,
// prove) run all at once in a staged view while the session switches
// between two contexts that allow their directory and the rules are
// reloaded; nothing reaches the backing tree until changes.commit, after
// which each program's check passes in the backing tree itself (the git
// repository, the binaries built, the database, node_modules, the venv).
// A second run (git, sqlite3, make), discarded, leaves the backing tree as the commit left it,
// and the view shows the committed work again.
func TestAgentProgramsWorkStaged(t *testing.T) {
	h := testenv.OpenHome(t, stagedProgramRules)
	os.MkdirAll(h.Path("workspace/proj"), 0o755)
	testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	d := testenv.Start(t, h)
	mnt := h.Path("mnt/s")
	ctxA, ctxB := []string{"discord:dm", "discord:channel:7"}, []string{"discord:dm", "discord:channel:8"}
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": ctxA, "owner": testenv.Nobody, "allow_uids": []int{0}, "changes": "staged"}, nil)
	ws, backing := mnt+"/workspace", h.Path("workspace")
	start := testenv.BackingTree(t, backing)

	in := func(root, dir string) func(p testenv.Program) string {
		return func(p testenv.Program) string { return root + "/" + dir + "/" + p.Name }
	}
	command := func(dir func(p testenv.Program) string) func(p testenv.Program) *exec.Cmd {
		return func(p testenv.Program) *exec.Cmd { return p.Command(dir(p)) }
	}
	ran := testenv.RunPrograms(t, testenv.Programs, command(in(ws, "proj")), func(i int) {
		switch i % 3 {
		case 0:
			d.SetContext("s", ctxB)
		case 1:
			d.SetContext("s", ctxA)
		case 2:
			d.Call("config.reload", map[string]any{}, nil)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	sameBacking(t, "the backing tree before commit", start, testenv.BackingTree(t, backing))
	var r commitResult
	d.Call("changes.commit", map[string]any{"session": "s"}, &r)
	if r.Committed == 0 || len(r.Conflicts) != 0 {
		t.Fatalf("commit: %+v", r)
	}
	if left, hidden := stagedDiff(d, "s"); len(left) != 0 || hidden != 0 {
		t.Fatalf("changes left after the commit: %v (hidden %d)", left, hidden)
	}
	testenv.CheckPrograms(t, ran, in(backing, "proj"))
	committed := testenv.BackingTree(t, backing)

	// The second run: the programs that write the most files in place.
	var again []testenv.Program
	for _, p := range ran {
		if p.Name == "git" || p.Name == "sqlite3" || p.Name == "make" {
			again = append(again, p)
		}
	}
	testenv.RunPrograms(t, again, command(in(ws, "again")), nil)
	if got := testenv.ShAsNobody(t, ws, "ls"); got != "again\nproj" {
		t.Fatalf("the staged view after the second run: %q", got)
	}
	d.Call("changes.discard", map[string]any{"session": "s"}, nil)
	sameBacking(t, "the backing tree after the discard", committed, testenv.BackingTree(t, backing))
	if _, err := os.Stat(ws + "/again"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the discarded run's directory in the view: %v", err)
	}
	testenv.CheckPrograms(t, ran, in(ws, "proj"))
}
