package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// stepDaemon answers tool.decide with decision and checkpoint.create with
// a checkpoint, or with checkpointErr (a JSON-RPC error object) when set;
// calls gives the methods and params it was sent, in order.
func stepDaemon(t *testing.T, decision, checkpointErr string) (sock string, calls func() []string) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var got []string
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if err != nil {
						return
					}
					var req struct {
						ID     json.RawMessage `json:"id"`
						Method string          `json:"method"`
						Params json.RawMessage `json:"params"`
					}
					json.Unmarshal(line, &req)
					mu.Lock()
					got = append(got, req.Method+" "+string(req.Params))
					mu.Unlock()
					switch {
					case req.Method == "checkpoint.create" && checkpointErr != "":
						fmt.Fprintf(c, `{"jsonrpc":"2.0","id":%s,"error":%s}`+"\n", req.ID, checkpointErr)
					case req.Method == "checkpoint.create":
						fmt.Fprintf(c, `{"jsonrpc":"2.0","id":%s,"result":{"id":"1","name":"","created":"2026-12-06T00:00:00Z"}}`+"\n", req.ID)
					default:
						fmt.Fprintf(c, `{"jsonrpc":"2.0","id":%s,"result":{"decision":%q,"role":null,"reasons":[]}}`+"\n", req.ID, decision)
					}
				}
			}(c)
		}
	}()
	return sock, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

func toolPayload(t *testing.T, tool, useID string, input map[string]any) []byte {
	t.Helper()
	in, _ := json.Marshal(input)
	ev := map[string]any{"cwd": "/", "hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": json.RawMessage(in)}
	if useID != "" {
		ev["tool_use_id"] = useID
	}
	b, _ := json.Marshal(ev)
	return b
}

func hookDecision(t *testing.T, r result) (decision, reason string) {
	t.Helper()
	var out hookOut
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("hook output: %q %q", r.stdout, r.stderr)
	}
	return out.HookSpecificOutput.PermissionDecision, out.HookSpecificOutput.PermissionDecisionReason
}

// TestHookCheckpointsBeforeEachCallThatCanWrite: with --checkpoint, a
// call that is let through (allowed, or put to the user) and can write
// has a checkpoint of the session made before the hook answers, named
// after its tool_use_id; a read-only tool or a denied call has none.
// Through the real hook binary.
func TestHookCheckpointsBeforeEachCallThatCanWrite(t *testing.T) {
	cases := []struct {
		decision, tool, useID string
		want                  string // the checkpoint.create params, or "" for none
		hook                  string // the hook's decision
	}{
		{"allow", "Write", "toolu_01AbC", `{"name":"toolu_01AbC","session":"s1"}`, "allow"},
		{"allow", "Bash", "toolu_2", `{"name":"toolu_2","session":"s1"}`, "allow"},
		{"approval_required", "Edit", "toolu_3", `{"name":"toolu_3","session":"s1"}`, "ask"},
		{"allow", "mcp__fs__write_file", "toolu_4", `{"name":"toolu_4","session":"s1"}`, "allow"},
		// An id that cannot name a checkpoint: one is made, unnamed.
		{"allow", "Write", "toolu/../x", `{"session":"s1"}`, "allow"},
		{"allow", "Write", "", `{"session":"s1"}`, "allow"},
		{"allow", "Read", "toolu_5", "", "allow"},
		{"allow", "Grep", "toolu_6", "", "allow"},
		{"deny", "Write", "toolu_7", "", "deny"},
	}
	file := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	file, err := filepath.EvalSymlinks(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		sock, calls := stepDaemon(t, c.decision, "")
		r := condfs(t, toolPayload(t, c.tool, c.useID, map[string]any{"command": "true", "file_path": file, "pattern": "x"}),
			"hook", "claude-code", "--socket", sock, "--session", "s1", "--checkpoint")
		if d, why := hookDecision(t, r); d != c.hook {
			t.Errorf("%s %s: %s (%s), want %s", c.decision, c.tool, d, why, c.hook)
		}
		var made []string
		for _, call := range calls() {
			if p, ok := strings.CutPrefix(call, "checkpoint.create "); ok {
				made = append(made, p)
			}
		}
		switch {
		case c.want == "" && len(made) != 0:
			t.Errorf("%s %s: checkpoints %q, want none", c.decision, c.tool, made)
		case c.want != "" && (len(made) != 1 || made[0] != c.want):
			t.Errorf("%s %s: checkpoints %q, want one with %s", c.decision, c.tool, made, c.want)
		}
		if all := calls(); c.want != "" && (len(all) == 0 || !strings.HasPrefix(all[0], "tool.decide ")) {
			t.Errorf("%s %s: the checkpoint came before the decision: %q", c.decision, c.tool, all)
		}
	}
}

// TestHookDeniesCallItCannotCheckpoint: with --checkpoint, a call that
// can write is let through only with its checkpoint made: a daemon that
// refuses one (no state directory, an unknown session) denies the call,
// saying why. A name taken already is the same call asked about again,
// and goes through. --checkpoint needs --session.
func TestHookDeniesCallItCannotCheckpoint(t *testing.T) {
	payload := toolPayload(t, "Bash", "toolu_9", map[string]any{"command": "echo y > x"})
	sock, _ := stepDaemon(t, "allow", `{"code":-32603,"message":"session \"s1\" keeps no checkpoints: the daemon has no state directory (--state-dir)"}`)
	r := condfs(t, payload, "hook", "claude-code", "--socket", sock, "--session", "s1", "--checkpoint")
	if d, why := hookDecision(t, r); d != "deny" || !strings.Contains(why, "no state directory") {
		t.Errorf("checkpoint refused: %s (%s), want a deny saying why", d, why)
	}
	sock, _ = stepDaemon(t, "allow", `{"code":-32602,"message":"changes: bad checkpoint name: \"toolu_9\" names a checkpoint already"}`)
	r = condfs(t, payload, "hook", "claude-code", "--socket", sock, "--session", "s1", "--checkpoint")
	if d, why := hookDecision(t, r); d != "allow" {
		t.Errorf("the same call again: %s (%s), want allow", d, why)
	}
	// Without --checkpoint, no checkpoint is asked for.
	sock, calls := stepDaemon(t, "allow", "")
	condfs(t, payload, "hook", "claude-code", "--socket", sock, "--session", "s1")
	if got := calls(); len(got) != 1 {
		t.Errorf("without --checkpoint: %q", got)
	}
	if r := condfs(t, payload, "hook", "claude-code", "--socket", sock, "--context", "tui", "--checkpoint"); r.code == 0 {
		t.Errorf("--checkpoint with --context: exit 0, %s", r.stdout)
	}
}
