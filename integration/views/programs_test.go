package views

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// programRules rule workspace/proj/ (allowed in both programCtxA and
// programCtxB, hidden in a guild) and workspace/secret/ (allowed in
// programCtxA only); programRulesExtra also hides workspace/extra/, which
// programRules leaves without a rule.
const programRules = `
[workspace."/proj/"]
when = "discord:dm"
action = "allow"

[workspace."/secret/"]
when = "discord:channel:7"
action = "allow"
`

const programRulesExtra = programRules + `
[workspace."/extra/"]
when = "discord:channel:99"
action = "allow"
`

var (
	programCtxA = []string{"discord:dm", "discord:channel:7"}
	programCtxB = []string{"discord:dm", "discord:channel:8"}
)

// TestAgentProgramsWorkAcrossSwitchesAndReloads: git, npm, go build and go
// test, a venv, sqlite3 in WAL mode, make -j2 over cc and prove
// (testenv.Programs), each in a directory of its own under a ruled
// directory of a view, all at once, while the session switches between
// two contexts that both allow it and the rules are reloaded: every program
// succeeds (a switch or reload that keeps a path allowed is invisible to a
// program working there), while every switch and reload hides and shows
// the paths its decision changes at once. A switch to a context that hides
// the directory makes it vanish; the next one gives back what the programs
// left. On each invalidation path: the shared connection, and a
// connection per session (a daemon that is not root) whose every cache is
// also dropped between the changes (a directory above the backing roots
// changing, as when the watch's events are lost;
// TestCwdNameHoldsThroughSwitchesWhileOthersWalk holds the name of a
// program's working directory there).
func TestAgentProgramsWorkAcrossSwitchesAndReloads(t *testing.T) {
	for _, c := range []struct {
		name    string
		dropAll bool
		flags   []string
	}{
		{"shared connection", false, nil},
		{"connection per session, every cache dropped", true, []string{"--connections=per-session"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			programsAcrossChanges(t, c.dropAll, c.flags...)
		})
	}
}

func programsAcrossChanges(t *testing.T, dropAll bool, flags ...string) {
	h := testenv.OpenHome(t, programRules)
	h.Write("workspace/secret/s.txt", "s")
	h.Write("workspace/extra/e.txt", "e")
	os.MkdirAll(h.Path("workspace/proj"), 0o755)
	testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	d := testenv.Start(t, h, flags...)
	mnt := d.Home.Path("mnt/s")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": programCtxA, "owner": testenv.Nobody, "allow_uids": []int{0}}, nil)
	ws := mnt + "/workspace"
	dir := func(p testenv.Program) string { return ws + "/proj/" + p.Name }

	// Switches and reloads until every program is done, each checked to
	// be in force when it answers.
	extra := false
	ran := testenv.RunPrograms(t, testenv.Programs, func(p testenv.Program) *exec.Cmd { return p.Command(dir(p)) }, func(i int) {
		switch i % 3 {
		case 0, 1:
			ctx, secret := programCtxB, false
			if i%2 == 1 {
				ctx, secret = programCtxA, true
			}
			d.SetContext("s", ctx)
			shows(t, ws, "secret", "s.txt", secret)
		case 2:
			text := programRules
			if extra = !extra; extra {
				text = programRulesExtra
			}
			testenv.WriteStyle(t, h, "rename", &text, i)
			d.Call("config.reload", map[string]any{}, nil)
			shows(t, ws, "extra", "e.txt", !extra)
		}
		if dropAll {
			// A directory above the backing roots changed: the view
			// cannot say which entries that changes, so every view's
			// cache goes (as when the watch's events are lost).
			if err := os.Chmod(h.Root, 0o755); err != nil {
				t.Error(err)
			}
		}
		shows(t, ws, "proj", "", true)
	})

	// A switch that hides the directory hides it from everyone at once; the
	// next gives back what the programs left.
	d.SetContext("s", testenv.Guild)
	shows(t, ws, "proj", "", false)
	d.SetContext("s", programCtxA)
	shows(t, ws, "proj", "", true)
	testenv.CheckPrograms(t, ran, dir)
}

// shows checks that the view's dir (under ws) and its file name (if any)
// are visible, or absent from both lookups and ws's listing. (It does not
// stop the test: the programs are still running.)
func shows(t *testing.T, ws, dir, name string, visible bool) {
	t.Helper()
	p := ws + "/" + dir
	if name != "" {
		p += "/" + name
	}
	_, err := os.Stat(p)
	entries, lerr := os.ReadDir(ws)
	if lerr != nil {
		t.Errorf("listing %s: %v", ws, lerr)
		return
	}
	listed := slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() == dir })
	switch {
	case visible && (err != nil || !listed):
		t.Errorf("%s should be visible: stat %v, listed %v", strings.TrimPrefix(p, ws), err, listed)
	case !visible && (!errors.Is(err, fs.ErrNotExist) || listed):
		t.Errorf("%s should be hidden: stat %v, listed %v", strings.TrimPrefix(p, ws), err, listed)
	}
}
