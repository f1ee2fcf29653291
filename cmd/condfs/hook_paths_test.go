package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHookDecidesResolvedPath: the hook decides on the file the tool will
// open (symlinks, .., ~ and relative paths resolved where the tool runs),
// denies a path it cannot resolve safely, and gives the tool the resolved
// input. Through the real hook binary and a real daemon, by the example
// policy ("files stay under the workspace").
func TestHookDecidesResolvedPath(t *testing.T) {
	ws, sock := hookWorkspace(t)
	out := t.TempDir() // outside the workspace
	writeFile(t, out, "inner/x", "x")
	writeFile(t, out, "secret", "s3cret")
	for link, target := range map[string]string{
		"notes.md": "/etc/passwd",
		"sub":      filepath.Join(out, "inner"),
		"new.md":   filepath.Join(out, "created.md"), // nothing there yet
		"loop":     filepath.Join(ws, "loop"),
		"outdir":   out,
		"alias.go": filepath.Join(ws, "src/main.go"),
	} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("HOME", ws)
	type in map[string]any
	for _, tc := range []struct {
		name, tool string
		input      in
		cwd        string
		want       string // decision
		reason     string
		path       string // the path the tool is given, when not denied
	}{
		{"a symlink out, read", "Read", in{"file_path": ws + "/notes.md"}, ws, "deny", "startswith(args.file_path", ""},
		{"a symlink out, written", "Write", in{"file_path": ws + "/notes.md", "content": "x"}, ws, "deny", "startswith(args.file_path", ""},
		{"a relative symlink out", "Read", in{"file_path": "notes.md"}, ws, "deny", "startswith(args.file_path", ""},
		{"a symlink, then ..", "Read", in{"file_path": ws + "/sub/../secret"}, ws, "deny", "startswith(args.file_path", ""},
		{"a symlink to nothing, written", "Write", in{"file_path": ws + "/new.md", "content": "x"}, ws, "deny", "symlink to nothing", ""},
		{"a symlink loop", "Read", in{"file_path": ws + "/loop/x"}, ws, "deny", "cannot be resolved safely", ""},
		{"a file as a directory", "Write", in{"file_path": ws + "/README.md/x", "content": "x"}, ws, "deny", "cannot be resolved safely", ""},
		{"the root, written", "Write", in{"file_path": "/", "content": "x"}, ws, "deny", "does not name a file", ""},
		{"~user", "Read", in{"file_path": "~root/.bashrc"}, ws, "deny", "~user", ""},
		{"relative, no cwd", "Read", in{"file_path": "src/main.go"}, "", "deny", "cwd", ""},
		{"Grep of a symlink out", "Grep", in{"pattern": "root", "path": ws + "/notes.md"}, ws, "deny", "startswith(args.path", ""},
		{"Glob in a symlink out", "Glob", in{"pattern": "*", "path": ws + "/outdir"}, ws, "deny", "startswith(args.path", ""},
		{"Glob, braces with ..", "Glob", in{"pattern": "{..,x}/etc/passwd", "path": ws}, ws, "deny", "names ..", ""},
		{"Glob, braces making ..", "Glob", in{"pattern": "{.,x}{.,y}/secret", "path": ws}, ws, "deny", "names ..", ""},
		{"Glob, **/../", "Glob", in{"pattern": "**/../x", "path": ws}, ws, "deny", "names ..", ""},
		{"Glob, braces absolute", "Glob", in{"pattern": "{/etc,x}/passwd", "path": ws}, ws, "deny", "absolute", ""},
		{"Glob through a symlink out", "Glob", in{"pattern": "outdir/*", "path": ws}, ws, "deny", "leads out of", ""},
		// Allowed, and given the resolved path.
		{"a symlink in", "Read", in{"file_path": ws + "/alias.go"}, ws, "allow", "allowed", ws + "/src/main.go"},
		{"relative", "Edit", in{"file_path": "src/../README.md", "old_string": "a", "new_string": "b"}, ws, "allow", "allowed", ws + "/README.md"},
		{"~", "Read", in{"file_path": "~/src/main.go"}, "/", "allow", "allowed", ws + "/src/main.go"},
		{"a new file", "Write", in{"file_path": ws + "/src/new.go", "content": "x"}, ws, "allow", "allowed", ws + "/src/new.go"},
		{"Glob, no path", "Glob", in{"pattern": "src/*.go"}, ws + "/src/..", "allow", "allowed", ws},
	} {
		input, _ := json.Marshal(tc.input)
		payload, _ := json.Marshal(map[string]any{"session_id": "s", "cwd": tc.cwd, "hook_event_name": "PreToolUse", "tool_name": tc.tool, "tool_input": json.RawMessage(input)})
		got, r := runHookCmd(t, sock, payload)
		d := got.HookSpecificOutput
		if r.code != 0 || d.PermissionDecision != tc.want || !strings.Contains(d.PermissionDecisionReason, tc.reason) {
			t.Errorf("%s: %s %s: exit %d, %s (%s); want %s with %q", tc.name, tc.tool, input, r.code, d.PermissionDecision, d.PermissionDecisionReason, tc.want, tc.reason)
			continue
		}
		if tc.path == "" {
			continue
		}
		var updated map[string]any
		json.Unmarshal(d.UpdatedInput, &updated)
		key := "file_path"
		if tc.tool == "Glob" {
			key = "path"
		}
		if updated[key] != tc.path {
			t.Errorf("%s: the tool is given %s, want %s = %s", tc.name, d.UpdatedInput, key, tc.path)
		}
	}
}

// TestHookDeniesHardLinkedFile: a file with more than one name may be
// named outside the workspace too (a hard link to a file elsewhere): the
// hook cannot tell which of its names the policy would allow, and a Read,
// Write or Edit of it is denied. Directories (whose link count counts
// their subdirectories) and files with one name are decided as before.
func TestHookDeniesHardLinkedFile(t *testing.T) {
	ws, sock := hookWorkspace(t)
	out := filepath.Join(filepath.Dir(ws), "outside") // same filesystem
	writeFile(t, out, "secret", "s3cret")
	if err := os.Link(filepath.Join(out, "secret"), filepath.Join(ws, "notes.md")); err != nil {
		t.Fatal(err)
	}
	type in map[string]any
	for _, tc := range []struct {
		tool  string
		input in
		want  string
	}{
		{"Read", in{"file_path": ws + "/notes.md"}, "deny"},
		{"Write", in{"file_path": ws + "/notes.md", "content": "x"}, "deny"},
		{"Edit", in{"file_path": ws + "/notes.md", "old_string": "s", "new_string": "x"}, "deny"},
		{"Grep", in{"pattern": "s", "path": ws + "/notes.md"}, "deny"},
		{"Read", in{"file_path": ws + "/README.md"}, "allow"},
		{"Grep", in{"pattern": "s", "path": ws + "/src"}, "allow"},
	} {
		input, _ := json.Marshal(tc.input)
		payload, _ := json.Marshal(map[string]any{"cwd": ws, "hook_event_name": "PreToolUse", "tool_name": tc.tool, "tool_input": json.RawMessage(input)})
		got, r := runHookCmd(t, sock, payload)
		d := got.HookSpecificOutput
		if r.code != 0 || d.PermissionDecision != tc.want || (tc.want == "deny" && !strings.Contains(d.PermissionDecisionReason, "hard link")) {
			t.Errorf("%s %s: exit %d, %s (%s); want %s", tc.tool, input, r.code, d.PermissionDecision, d.PermissionDecisionReason, tc.want)
		}
	}
}
