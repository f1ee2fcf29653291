package changes

import (
	"os"
	"strings"
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

// TestStagedSessionOfAnotherUidRefusesItsMethods: uid 65534 may not diff,
// commit or discard root's staged session (-32011), whichever paths it
// names, nor make, list or roll back its checkpoints; the session's change
// stays staged.
func TestStagedSessionOfAnotherUidRefusesItsMethods(t *testing.T) {
	d, _, _ := stagedHome(t, testenv.ChangesRules, nil)
	rmnt := d.Home.Path("mnt/r")
	d.Call("session.open", map[string]any{"id": "r", "mount": rmnt, "context": testenv.DM, "changes": "staged"}, nil)
	d.Call("checkpoint.create", map[string]any{"session": "r", "name": "c1"}, nil)
	if err := os.WriteFile(rmnt+"/workspace/root.txt", []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, call := range []string{
		`changes.diff {"session":"r","content":true}`,
		`changes.commit {"session":"r"}`,
		`changes.commit {"session":"r","paths":["workspace/root.txt"],"force":true}`,
		`changes.discard {"session":"r"}`,
		`checkpoint.create {"session":"r","name":"c2"}`,
		`checkpoint.list {"session":"r"}`,
		`checkpoint.rollback {"session":"r","checkpoint":"c1","force":true}`,
		`session.close {"id":"r","discard":true}`,
	} {
		method, params, _ := strings.Cut(call, " ")
		out, _ := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "ctl", "--socket", d.Socket, "--json", "call", method, params).CombinedOutput()
		if !strings.Contains(string(out), "another user") || strings.Contains(string(out), "root's") {
			t.Errorf("uid 65534's %s on root's session: %s", call, out)
		}
	}
	if got, _ := stagedDiff(d, "r"); strings.Join(got, ",") != "A workspace/root.txt" {
		t.Fatalf("root's staged change after uid 65534's calls: %v", got)
	}
	if _, err := os.Stat(d.Home.Path("workspace/root.txt")); err == nil {
		t.Fatal("root's staged change reached the backing tree")
	}
	d.Call("session.close", map[string]any{"id": "r", "discard": true}, nil)
}
