package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// startServe runs condfs serve with no view (tool decisions need none)
// over a root whose policy is policyFile; it returns the socket path.
func startServe(t *testing.T, policyFile string) string {
	t.Helper()
	data, err := os.ReadFile(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Serve(t, testenv.NewHome(t, "-", string(data))).Socket
}

type hookOut struct {
	HookSpecificOutput struct {
		HookEventName            string          `json:"hookEventName"`
		PermissionDecision       string          `json:"permissionDecision"`
		PermissionDecisionReason string          `json:"permissionDecisionReason"`
		UpdatedInput             json.RawMessage `json:"updatedInput"`
	} `json:"hookSpecificOutput"`
}

// exampleWorkspace is the example policy's workspace, in recorded payloads.
const exampleWorkspace = "/srv/agent/workspace"

// hookWorkspace makes a workspace (its path resolved: the hook decides on
// resolved paths) with src/main.go and README.md, and a daemon deciding by
// the example policy with that workspace for /srv/agent/workspace. It
// returns the workspace and the socket.
func hookWorkspace(t *testing.T) (ws, sock string) {
	t.Helper()
	ws, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws = filepath.Join(ws, "workspace")
	os.MkdirAll(filepath.Join(ws, "src"), 0o755)
	writeFile(t, ws, "src/main.go", "package main\n")
	writeFile(t, ws, "README.md", "a\n")
	policy, err := os.ReadFile("../../examples/claude-code/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pf := writeFile(t, t.TempDir(), "policy.yaml", strings.ReplaceAll(string(policy), exampleWorkspace, ws))
	return ws, startServe(t, pf)
}

func runHookCmd(t *testing.T, sock string, payload []byte) (hookOut, result) {
	t.Helper()
	r := condfs(t, payload, "hook", "claude-code", "--socket", sock, "--context", "tui")
	var out hookOut
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("hook output is not JSON: %q %q", r.stdout, r.stderr)
	}
	return out, r
}

// TestClaudeCodeHook: recorded PreToolUse payloads for each built-in tool
// and MCP tools, decided by the example policy through a real daemon; every
// failure (malformed input, another event, a daemon that is down) is a
// deny with exit status 0, since Claude Code lets a call through when a
// hook crashes.
func TestClaudeCodeHook(t *testing.T) {
	ws, sock := hookWorkspace(t)
	for _, tc := range []struct{ file, want, reason string }{
		{"bash-ls.json", "ask", "approval"},
		{"bash-rm.json", "deny", "matches(args.command"},
		{"read-inside.json", "allow", "allowed"},
		{"read-outside.json", "deny", "startswith(args.file_path"},
		{"write-dotdot.json", "deny", "cannot be resolved safely"},
		{"edit-inside.json", "allow", "allowed"},
		{"webfetch-acme.json", "allow", "allowed"},
		{"webfetch-evil.json", "deny", "matches(args.url"},
		// Grep prints the lines it matches, of any path it is given: the
		// example constrains its path.
		{"grep-outside.json", "deny", "startswith(args.path"},
		{"grep-no-path.json", "deny", "args.path"},
		{"grep-dotdot.json", "deny", "startswith(args.path"},
		{"grep-inside.json", "allow", "allowed"},
		{"glob-absolute.json", "deny", "absolute"},
		{"glob-inside.json", "allow", "allowed"},
		{"mcp-create-issue.json", "ask", "mcp__github__create_issue"},
		{"mcp-unknown.json", "deny", "denied"},
		{"post-tool-use.json", "deny", "PreToolUse"},
		{"malformed.json", "deny", "malformed"},
		// Claude Code reads "tool_input" (exact keys); encoding/json folded
		// the later "Tool_input" onto it and decided that one: allow.
		{"read-folded-key.json", "deny", "duplicate key"},
	} {
		payload, err := os.ReadFile(filepath.Join("testdata/claude-code", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		payload = []byte(strings.ReplaceAll(string(payload), exampleWorkspace, ws))
		out, r := runHookCmd(t, sock, payload)
		d := out.HookSpecificOutput
		if r.code != 0 || d.HookEventName != "PreToolUse" || d.PermissionDecision != tc.want || !strings.Contains(d.PermissionDecisionReason, tc.reason) {
			t.Errorf("%s: exit %d, %+v; want %s with %q", tc.file, r.code, d, tc.want, tc.reason)
		}
	}
	// The daemon is down: deny, exit 0.
	payload, _ := os.ReadFile("testdata/claude-code/read-inside.json")
	payload = []byte(strings.ReplaceAll(string(payload), exampleWorkspace, ws))
	out, r := runHookCmd(t, filepath.Join(t.TempDir(), "nobody-here.sock"), payload)
	if r.code != 0 || out.HookSpecificOutput.PermissionDecision != "deny" || !strings.Contains(out.HookSpecificOutput.PermissionDecisionReason, "unreachable") {
		t.Errorf("daemon down: exit %d, %+v", r.code, out.HookSpecificOutput)
	}
	// A daemon that never answers: deny once --timeout passes.
	silent := filepath.Join(t.TempDir(), "silent.sock")
	ln, err := net.Listen("unix", silent)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	start := time.Now()
	r = condfs(t, payload, "hook", "claude-code", "--socket", silent, "--context", "tui", "--timeout", "300ms")
	if r.code != 0 || !strings.Contains(r.stdout, `"permissionDecision":"deny"`) || time.Since(start) > 10*time.Second {
		t.Errorf("silent daemon: exit %d, %s", r.code, r.stdout)
	}
	// Empty input.
	out, r = runHookCmd(t, sock, nil)
	if r.code != 0 || out.HookSpecificOutput.PermissionDecision != "deny" {
		t.Errorf("empty input: exit %d, %+v", r.code, out.HookSpecificOutput)
	}
}
