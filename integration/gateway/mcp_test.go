package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestToolsListFilteredWhateverItsIDForm: the gateway remembers a tools/list by
// its id as re-encoded ("2.5"), but the official Go SDK reads a numeric id
// as a float64 and answers with int64(id) ("2"). The answer then matches
// no listing in flight and passes unfiltered: the client sees the tools
// its roles can never call (the listing of the "secret" tool the policy
// denies), though a listing that cannot be filtered must list none.
func TestToolsListFilteredWhateverItsIDForm(t *testing.T) {
	dir := t.TempDir()
	server := filepath.Join(dir, "testserver")
	if out, err := exec.Command("go", "build", "-o", server, "../../mcpproxy/internal/testserver").CombinedOutput(); err != nil {
		t.Fatalf("build testserver: %v\n%s", err, out)
	}
	h := testenv.NewHome(t, "-", `version: 1
roles:
  default:
    tools:
      echo: {mode: allow}
      secret: {mode: deny}
`)
	d := testenv.Start(t, h)
	cmd := exec.Command(testenv.Condfs(), "mcp", "proxy", "--socket", d.Socket, "--context", "tui", "--", server)
	cmd.Env = append(os.Environ(), "CALL_LOG="+filepath.Join(dir, "calls"))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	io.WriteString(stdin, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":1,"method":"tools/list"}
{"jsonrpc":"2.0","id":2.5,"method":"tools/list"}
`)
	listed := map[string][]string{}
	deadline := time.After(20 * time.Second)
	for len(listed) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the proxy ended; listings so far: %v", listed)
			}
			var m struct {
				ID     json.RawMessage `json:"id"`
				Result struct {
					Tools []struct {
						Name string `json:"name"`
					} `json:"tools"`
				} `json:"result"`
			}
			if json.Unmarshal([]byte(l), &m) != nil || string(m.ID) == "0" {
				continue
			}
			var names []string
			for _, tool := range m.Result.Tools {
				names = append(names, tool.Name)
			}
			listed[string(m.ID)] = names
		case <-deadline:
			t.Fatalf("no answer to both listings; so far: %v", listed)
		}
	}
	if !slices.Contains(listed["1"], "echo") || slices.Contains(listed["1"], "secret") {
		t.Fatalf("the plain listing (id 1) is not filtered as expected: %v", listed["1"])
	}
	for id, names := range listed {
		if slices.Contains(names, "secret") {
			t.Fatalf("a tools/list sent with id 2.5 was answered with id %s and passed unfiltered: the client sees %v, the denied tool \"secret\" among them", id, names)
		}
	}
}

// TestMCPFilesystemServer runs the official MCP filesystem server (Node,
// @modelcontextprotocol/server-filesystem) behind `condfs mcp proxy`, over a
// session's view: the policy decides its tools, and the view decides what
// its files are. .ci/run installs it; elsewhere the test says why it skips.
func TestMCPFilesystemServer(t *testing.T) {
	testenv.RequireFUSE(t)
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
	h := testenv.NewHome(t, rules, policy)
	h.Write("workspace/a.txt", "hello from the view")
	h.Write("workspace/secret.txt", "s3cret")
	h.Write("workspace/private/dm.txt", "only in a DM")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.Guild)
	ws := mnt + "/workspace"
	cmd := exec.Command(testenv.Condfs(), "mcp", "proxy", "--socket", d.Socket, "--session", "s", "--", server, ws)
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
	if _, err := os.Stat(filepath.Join(h.Root, "workspace/new.txt")); err == nil {
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
