package gateway

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stepsPolicy lets an agent write through both of its routes: Claude
// Code's Write (the hook) and an MCP server's write_file (the gateway).
const stepsPolicy = `version: 1
roles:
  default:
    tools:
      Write: {mode: allow}
      Read: {mode: allow}
      write_file: {mode: allow}
      read_text_file: {mode: allow}
      read_file: {mode: allow}
`

func checkpointNames(d *testenv.Daemon, session string) []string {
	var list struct {
		Checkpoints []struct{ ID, Name string }
	}
	d.Call("checkpoint.list", map[string]any{"session": session}, &list)
	var names []string
	for _, c := range list.Checkpoints {
		names = append(names, c.Name)
	}
	return names
}

// TestHookCheckpointMakesEachToolCallUndoable: `condfs hook claude-code
// --checkpoint` makes a checkpoint of the session, named after the call's
// tool_use_id, before it lets a call that can write through; rolling back
// to it undoes what the call then did through the view. A read-only call
// makes none. The hook runs as the session's owner, as Claude Code would.
// In a staged session the same holds of what the session holds back.
func TestHookCheckpointMakesEachToolCallUndoable(t *testing.T) {
	d, direct := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("config/policy.yaml", stepsPolicy)
		h.Write("workspace/a.txt", "before\n")
		os.Lchown(h.Path("workspace/a.txt"), testenv.Nobody, testenv.Nobody)
	})
	staged := d.Home.Path("mnt/st")
	d.Call("session.open", map[string]any{"id": "st", "mount": staged, "context": testenv.DM, "owner": testenv.Nobody, "changes": "staged"}, nil)
	for _, c := range []struct{ session, mnt string }{{"s", direct}, {"st", staged}} {
		t.Run(c.session, func(t *testing.T) {
			file := c.mnt + "/workspace/a.txt"
			hook := func(tool, useID string) string {
				t.Helper()
				in, _ := json.Marshal(map[string]any{
					"hook_event_name": "PreToolUse", "cwd": c.mnt + "/workspace", "tool_name": tool, "tool_use_id": useID,
					"tool_input": map[string]any{"file_path": file, "content": "after\n"},
				})
				cmd := testenv.CommandAs(testenv.Nobody,
					testenv.Condfs(), "hook", "claude-code", "--socket", d.Socket, "--session", c.session, "--checkpoint")
				cmd.Stdin = strings.NewReader(string(in))
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("hook: %v: %s", err, out)
				}
				return string(out)
			}
			if out := hook("Read", "toolu_read1"); !strings.Contains(out, `"permissionDecision":"allow"`) {
				t.Fatalf("Read: %s", out)
			}
			if got := checkpointNames(d, c.session); len(got) != 0 {
				t.Fatalf("a read-only call made checkpoints %q", got)
			}
			if out := hook("Write", "toolu_01Write"); !strings.Contains(out, `"permissionDecision":"allow"`) {
				t.Fatalf("Write: %s", out)
			}
			// Claude Code runs the call: its write goes through the view.
			testenv.ShAsNobody(t, c.mnt+"/workspace", `printf 'after\n' > a.txt && printf new > b.txt`)
			if got := checkpointNames(d, c.session); len(got) != 1 || got[0] != "toolu_01Write" {
				t.Fatalf("checkpoints after a Write: %q", got)
			}
			if r := testenv.Rollback(d, c.session, "toolu_01Write", false); len(r.Conflicts) != 0 {
				t.Fatalf("rollback: %+v", r.Conflicts)
			}
			if got := testenv.ShAsNobody(t, c.mnt+"/workspace", "cat a.txt; ls"); got != "before\na.txt\nw.txt" {
				t.Fatalf("the view after undoing the call: %q", got)
			}
		})
	}
}

// TestGatewayCheckpointMakesEachToolCallUndoable: `condfs mcp proxy
// --checkpoint` makes a checkpoint of the session before each allowed
// tools/call it forwards; rolling back to it undoes what the MCP server
// did. The official filesystem server, over a view, as the session's
// owner.
func TestGatewayCheckpointMakesEachToolCallUndoable(t *testing.T) {
	server := requireFilesystemServer(t)
	d, mnt := testenv.RunHomeFiles(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("config/policy.yaml", stepsPolicy)
		h.Write("workspace/a.txt", "before\n")
		os.Lchown(h.Path("workspace/a.txt"), testenv.Nobody, testenv.Nobody)
	})
	ws := mnt + "/workspace"
	cmd := testenv.CommandAs(testenv.Nobody,
		testenv.Condfs(), "mcp", "proxy", "--socket", d.Socket, "--session", "s", "--checkpoint", "--", server, ws)
	cmd.Env = append(os.Environ(), "HOME=/tmp")
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "condfs-it", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"path": ws + "/a.txt", "content": "after\n"}})
	if err != nil || res.IsError {
		t.Fatalf("write_file: %v %+v", err, res)
	}
	if got := testenv.ShAsNobody(t, ws, "cat a.txt"); got != "after" {
		t.Fatalf("a.txt after write_file: %q", got)
	}
	names := checkpointNames(d, "s")
	if len(names) != 1 || !strings.HasPrefix(names[0], "mcp-write_file-") {
		t.Fatalf("checkpoints after one call: %q", names)
	}
	if r := testenv.Rollback(d, "s", names[0], false); len(r.Conflicts) != 0 {
		t.Fatalf("rollback: %+v", r.Conflicts)
	}
	if got := testenv.ShAsNobody(t, ws, "cat a.txt"); got != "before" {
		t.Fatalf("a.txt after undoing the call: %q", got)
	}
}

// requireFilesystemServer finds the official MCP filesystem server, which
// .ci/run installs; elsewhere the test says why it skips.
func requireFilesystemServer(t *testing.T) string {
	t.Helper()
	testenv.RequireFUSE(t)
	server, err := exec.LookPath("mcp-server-filesystem")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mcp-server-filesystem is not installed (.ci/run installs it with npm): %v", err)
		}
		t.Skipf("SKIPPING: mcp-server-filesystem is not on PATH (npm install -g @modelcontextprotocol/server-filesystem)")
	}
	return server
}
