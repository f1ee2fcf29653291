package main

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// fakeDaemon answers every tool.decide with decision; it returns the socket.
func fakeDaemon(t *testing.T, decision string) string {
	t.Helper()
	sock, _ := stepDaemon(t, decision, "")
	return sock
}

// TestHookRoutesBashThroughRun: with --bash-via-run, a Bash call that is
// not denied is given to Claude Code as condfs run under the session,
// running exactly the command decided (bash -c COMMAND, quoted so that
// bash reads it back whole); a denied one is not rewritten. Through the
// real hook binary.
func TestHookRoutesBashThroughRun(t *testing.T) {
	sock := fakeDaemon(t, "approval_required")
	command := `echo 'it'"'"'s' "$HOME" \; $(id) | tee x; rm -- -x`
	input, _ := json.Marshal(map[string]any{"command": command, "description": "d"})
	payload, _ := json.Marshal(map[string]any{"cwd": "/", "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": json.RawMessage(input)})
	r := condfs(t, payload, "hook", "claude-code", "--socket", sock, "--session", "s1", "--role", "dev", "--bash-via-run")
	var out hookOut
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("hook output: %q %q", r.stdout, r.stderr)
	}
	d := out.HookSpecificOutput
	var updated struct{ Command, Description string }
	json.Unmarshal(d.UpdatedInput, &updated)
	if d.PermissionDecision != "ask" || updated.Description != "d" {
		t.Fatalf("%s (%s), updatedInput %s", d.PermissionDecision, d.PermissionDecisionReason, d.UpdatedInput)
	}
	// What bash reads the rewritten command as: each word it runs.
	words, err := exec.Command("bash", "-c", `printf '%s\0' `+updated.Command).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(words), "\x00"), "\x00")
	want := []string{condfsBin, "run", "--socket", sock, "--session", "s1", "--role", "dev", "--", "bash", "-c", command}
	if !slices.Equal(got, want) {
		t.Errorf("bash runs %q\nwant %q", got, want)
	}
	// Denied: no rewrite.
	r = condfs(t, payload, "hook", "claude-code", "--socket", fakeDaemon(t, "deny"), "--session", "s1", "--bash-via-run")
	if !strings.Contains(r.stdout, `"permissionDecision":"deny"`) || strings.Contains(r.stdout, "updatedInput") {
		t.Errorf("a denied call: %s", r.stdout)
	}
	// --bash-via-run without a session is a usage error.
	if r := condfs(t, payload, "hook", "claude-code", "--socket", sock, "--context", "tui", "--bash-via-run"); r.code == 0 {
		t.Errorf("--bash-via-run with --context: exit 0, %s", r.stdout)
	}
}

// TestHookDeniesBashCommandWithNul: bash drops a NUL byte from a script
// it reads ("r\x00m -rf" runs rm -rf), and no argv can carry one: a Bash
// command with a NUL is never run as the text decided, and is denied,
// with --bash-via-run or without. Through the real hook binary.
func TestHookDeniesBashCommandWithNul(t *testing.T) {
	sock := fakeDaemon(t, "allow")
	input, _ := json.Marshal(map[string]any{"command": "r\x00m -rf ~/x", "description": "d"})
	payload, _ := json.Marshal(map[string]any{"cwd": "/", "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": json.RawMessage(input)})
	for _, flags := range [][]string{{"--context", "tui"}, {"--session", "s1", "--bash-via-run"}} {
		r := condfs(t, payload, append([]string{"hook", "claude-code", "--socket", sock}, flags...)...)
		if r.code != 0 || !strings.Contains(r.stdout, `"permissionDecision":"deny"`) || !strings.Contains(r.stdout, "NUL") {
			t.Errorf("%v: a command with a NUL byte: exit %d, %s", flags, r.code, r.stdout)
		}
	}
}
