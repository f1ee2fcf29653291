package views

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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
// left. On each invalidation path: the shared connection expiring entries,
// a connection per session (a daemon that is not root), and a connection per
// session bumping its epoch at every switch and reload.
func TestAgentProgramsWorkAcrossSwitchesAndReloads(t *testing.T) {
	for _, c := range []struct {
		name, invalidation string
		flags              []string
	}{
		{"shared connection", "", nil},
		{"connection per session", "", []string{"--connections=per-session"}},
		{"epoch", "epoch", []string{"--connections=per-session"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var wrapper []string
			if c.invalidation != "" {
				wrapper = []string{"env", "CONDFS_INVALIDATION=" + c.invalidation}
			}
			programsAcrossChanges(t, wrapper, c.flags...)
		})
	}
}

func programsAcrossChanges(t *testing.T, wrapper []string, flags ...string) {
	h := testenv.OpenHome(t, programRules)
	h.Write("workspace/secret/s.txt", "s")
	h.Write("workspace/extra/e.txt", "e")
	os.MkdirAll(h.Path("workspace/proj"), 0o755)
	testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	d := testenv.StartUnder(t, h, wrapper, flags...)
	mnt := d.Home.Path("mnt/s")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": programCtxA, "owner": testenv.Nobody, "allow_uids": []int{0}}, nil)
	ws := mnt + "/workspace"

	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := map[string]string{}
	for _, p := range testenv.Programs {
		if tool := p.Missing(); tool != "" {
			if os.Getenv("CI") != "" {
				t.Errorf("%s: %s is not installed", p.Name, tool)
			} else {
				t.Logf("%s not run: %s is not installed", p.Name, tool)
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			out, err := p.Command(t, ws+"/proj/"+p.Name).CombinedOutput()
			t.Logf("%s: %v in %v", p.Name, err, time.Since(start).Round(time.Millisecond))
			if err != nil {
				mu.Lock()
				failed[p.Name] = err.Error() + "\n" + string(out)
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	// Switches and reloads until every program is done, each checked to
	// be in force when it answers.
	changes, extra := 0, false
	for running := true; running; changes++ {
		select {
		case <-done:
			running = false
		case <-time.After(20 * time.Millisecond):
		}
		switch changes % 3 {
		case 0, 1:
			ctx, secret := programCtxB, false
			if changes%2 == 1 {
				ctx, secret = programCtxA, true
			}
			d.SetContext("s", ctx)
			shows(t, ws, "secret", "s.txt", secret)
		case 2:
			text := programRules
			if extra = !extra; extra {
				text = programRulesExtra
			}
			testenv.WriteStyle(t, h, "rename", &text, changes)
			d.Call("config.reload", map[string]any{}, nil)
			shows(t, ws, "extra", "e.txt", !extra)
		}
		shows(t, ws, "proj", "", true)
	}
	t.Logf("%d switches and reloads while the programs ran", changes)
	for name, out := range failed {
		t.Errorf("%s failed in the view:\n%s", name, testenv.Tail(out, 30))
	}

	// A switch that hides the directory hides it from everyone at once; the
	// next gives back what the programs left.
	d.SetContext("s", testenv.Guild)
	shows(t, ws, "proj", "", false)
	d.SetContext("s", programCtxA)
	shows(t, ws, "proj", "", true)
	if _, ok := failed["git"]; !ok && testenv.Programs[0].Missing() == "" {
		if got := testenv.ShAsNobody(t, ws+"/proj/git", "HOME=$PWD git log --format=%s | tr '\\n' ' '; HOME=$PWD git status --porcelain"); got != "two one" {
			t.Errorf("git's repository after the switches: %q", got)
		}
	}
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
