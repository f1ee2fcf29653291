package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPFilesystemServer runs the official MCP filesystem server (Node,
// @modelcontextprotocol/server-filesystem) behind `condfs mcp proxy`, over a
// session's view: the policy decides its tools, and the view decides what
// its files are. .ci/run installs it; elsewhere the test says why it skips.
func TestMCPFilesystemServer(t *testing.T) {
	requireFUSE(t)
	server, err := exec.LookPath("mcp-server-filesystem")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mcp-server-filesystem is not installed (.ci/run installs it with npm): %v", err)
		}
		t.Skipf("SKIPPING: mcp-server-filesystem is not on PATH (npm install -g @modelcontextprotocol/server-filesystem)")
	}
	const rules = `
[workspace."/private/"]
when = "discord:dm"
action = "allow"
`
	const policy = `version: 1
roles:
  default:
    tools:
      list_directory: {mode: allow}
      read_text_file: {mode: allow, constraints: ['not contains(args.path, "secret")']}
      read_file: {mode: allow, constraints: ['not contains(args.path, "secret")']}
      write_file: {mode: deny}
`
	h := newHome(t, rules, policy)
	h.write("workspace/a.txt", "hello from the view")
	h.write("workspace/secret.txt", "s3cret")
	h.write("workspace/private/dm.txt", "only in a DM")
	d := startDaemon(t, h)
	mnt := d.open("s", guildCtx)
	ws := mnt + "/workspace"
	cmd := exec.Command(condfsBin, "mcp", "proxy", "--socket", d.socket, "--session", "s", "--", server, ws)
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "condfs-it", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	list, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
	}
	read := "read_text_file"
	if !slices.Contains(names, read) {
		read = "read_file"
	}
	if !slices.Contains(names, read) || !slices.Contains(names, "list_directory") || slices.Contains(names, "write_file") || slices.Contains(names, "move_file") {
		t.Fatalf("tools/list through the proxy: %v", names)
	}
	call := func(tool string, args map[string]any) (string, bool) {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		var text string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
		return text, res.IsError
	}
	if text, isErr := call(read, map[string]any{"path": ws + "/a.txt"}); isErr || !strings.Contains(text, "hello from the view") {
		t.Fatalf("read an allowed file: %q %v", text, isErr)
	}
	if text, isErr := call(read, map[string]any{"path": ws + "/secret.txt"}); !isErr || !strings.Contains(text, "Denied by policy") {
		t.Fatalf("a read the policy denies: %q %v", text, isErr)
	}
	if text, isErr := call("write_file", map[string]any{"path": ws + "/new.txt", "content": "x"}); !isErr || !strings.Contains(text, "Denied by policy") {
		t.Fatalf("a denied tool: %q %v", text, isErr)
	}
	if _, err := os.Stat(filepath.Join(h.root, "workspace/new.txt")); err == nil {
		t.Fatal("the denied write reached the server")
	}
	// The view hides private/ in a guild: the server cannot see it either.
	if text, isErr := call("list_directory", map[string]any{"path": ws}); isErr || strings.Contains(text, "private") || !strings.Contains(text, "a.txt") {
		t.Fatalf("list the workspace in a guild: %q %v", text, isErr)
	}
	if text, isErr := call(read, map[string]any{"path": ws + "/private/dm.txt"}); !isErr || strings.Contains(text, "only in a DM") {
		t.Fatalf("read a path the view hides: %q %v", text, isErr)
	}
}
