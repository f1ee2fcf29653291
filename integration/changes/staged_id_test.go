package changes

import (
	"os"
	"testing"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

// TestSessionIDsThatNameADirectoryAboveAreRefused: a session's id names its
// directory under STATE_DIR/changes; "." and ".." would name that directory
// or the state directory itself, which a new session's layer or store
// clears first (every other session's staged changes and checkpoints, and
// sessions.json, with it). They are refused, and nothing is removed.
func TestSessionIDsThatNameADirectoryAboveAreRefused(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	testenv.ShAsNobody(t, mnt+"/workspace", `printf staged > kept.txt`)
	for _, id := range []string{".", ".."} {
		for _, mode := range []string{"staged", "direct"} {
			d.CallErr("session.open", map[string]any{"id": id, "mount": d.Home.Path("mnt/dot"), "context": testenv.DM,
				"owner": testenv.Nobody, "changes": mode}, control.CodeInvalidParams)
		}
	}
	if got, _ := stagedDiff(d, "s"); len(got) != 1 || got[0] != "A workspace/kept.txt" {
		t.Fatalf("the staged session's changes after sessions named %q and %q: %v", ".", "..", got)
	}
	if got := testenv.ShAsNobody(t, mnt+"/workspace", `cat kept.txt`); got != "staged" {
		t.Fatalf("the staged file: %q", got)
	}
	if _, err := os.Stat(d.Socket); err != nil {
		t.Fatalf("the control socket: %v", err)
	}
}
