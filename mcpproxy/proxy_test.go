package mcpproxy_test

// End to end, through real processes: a real MCP client (the official Go
// SDK) starts `condfs mcp proxy`, which starts a real MCP server (the SDK,
// internal/testserver) and decides through a real daemon (`condfs serve`,
// no views needed) over its socket.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var condfsBin, serverBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "condfs-mcp")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	condfsBin, serverBin = filepath.Join(dir, "condfs"), filepath.Join(dir, "testserver")
	for pkg, out := range map[string]string{"../cmd/condfs": condfsBin, "../cmd/condfsd": filepath.Join(dir, "condfsd"), "./internal/testserver": serverBin} {
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, b)
			os.Exit(1)
		}
	}
	testenv.UseBinaries(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const policy = `version: 1
roles:
  default:
    tools:
      echo: {mode: allow, constraints: ["count(args.text) < 20"]}
      ask: {mode: approval_required}
      roots: {mode: allow}
      secret: {mode: deny}
      t03: {mode: allow}
      t17: {mode: allow}
      t25: {mode: approval_required}
`

// serve starts a daemon and returns its socket.
func serve(t testing.TB) string {
	t.Helper()
	return servePolicy(t, policy)
}

// servePolicy starts a daemon with policy and returns its socket.
func servePolicy(t testing.TB, policy string) string {
	t.Helper()
	return testenv.Serve(t, testenv.NewHome(t, "-", policy)).Socket
}

type rig struct {
	t       *testing.T
	session *mcp.ClientSession
	log     string
}

// connect starts client → proxy → server; approve, when set, answers the
// proxy's approval questions (and declares the elicitation capability).
func connect(t *testing.T, sock string, approve func(*mcp.ElicitRequest) (*mcp.ElicitResult, error)) *rig {
	t.Helper()
	callLog := filepath.Join(t.TempDir(), "calls")
	cmd := exec.Command(condfsBin, "mcp", "proxy", "--socket", sock, "--context", "tui", "--", serverBin)
	cmd.Env = append(os.Environ(), "CALL_LOG="+callLog)
	cmd.Stderr = os.Stderr
	opts := &mcp.ClientOptions{}
	if approve != nil {
		opts.ElicitationHandler = func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) { return approve(req) }
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "condfs-test-client", Version: "1"}, opts)
	//lint:ignore SA1019 roots is deprecated but served; it is the server-to-client request the test relays
	client.AddRoots(&mcp.Root{URI: "file:///srv/agent/workspace", Name: "workspace"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &rig{t: t, session: s, log: callLog}
}

func (r *rig) call(name string, args map[string]any) (text string, isError bool) {
	r.t.Helper()
	res, err := r.session.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		r.t.Fatalf("call %s: %v", name, err)
	}
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	return text, res.IsError
}

func (r *rig) calls() []string {
	data, _ := os.ReadFile(r.log)
	return strings.Fields(string(data))
}

func TestAllowDenyAndListing(t *testing.T) {
	sock := serve(t)
	r := connect(t, sock, nil)
	if text, isErr := r.call("echo", map[string]any{"text": "hi"}); isErr || text != "echo:hi" {
		t.Fatalf("allowed call: %q %v", text, isErr)
	}
	if text, isErr := r.call("echo", map[string]any{"text": strings.Repeat("x", 30)}); !isErr || !strings.Contains(text, "count(args.text)") {
		t.Fatalf("a call its constraint denies: %q %v", text, isErr)
	}
	if text, isErr := r.call("secret", nil); !isErr || !strings.Contains(text, "Denied by policy") {
		t.Fatalf("a denied tool: %q %v", text, isErr)
	}
	if text, isErr := r.call("ask", nil); !isErr || !strings.Contains(text, "approval required") {
		t.Fatalf("approval without the capability: %q %v", text, isErr)
	}
	if got := r.calls(); !slices.Equal(got, []string{"echo"}) {
		t.Fatalf("the server saw %v; only the allowed call may reach it", got)
	}
	before := len(r.calls())
	// A server's request to the client (roots) goes through both ways: in
	// the call's result, and back in the retried call, decided again.
	if text, isErr := r.call("roots", nil); isErr || text != "roots:1" {
		t.Fatalf("roots: %q %v", text, isErr)
	}
	if got := r.calls(); !slices.Equal(got, []string{"echo", "roots-asked", "roots"}) {
		t.Fatalf("the server saw %v", got)
	}
	// tools/list, page by page: only the tools some call may reach.
	var names []string
	cursor := ""
	for pages := 0; ; pages++ {
		res, err := r.session.ListTools(context.Background(), &mcp.ListToolsParams{Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, tool := range res.Tools {
			names = append(names, tool.Name)
		}
		if res.NextCursor == "" {
			if pages < 2 {
				t.Fatalf("the listing did not paginate (%d pages)", pages+1)
			}
			break
		}
		cursor = res.NextCursor
	}
	slices.Sort(names)
	if want := []string{"ask", "echo", "roots", "t03", "t17", "t25"}; !slices.Equal(names, want) {
		t.Fatalf("tools/list shows %v, want %v", names, want)
	}
	// Many calls in flight at once.
	var wg sync.WaitGroup
	errs := make(chan string, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name, want := "echo", fmt.Sprintf("echo:%d", i)
			args := map[string]any{"text": fmt.Sprint(i)}
			if i%2 == 1 {
				name, want, args = "secret", "Denied", nil
			}
			res, err := r.session.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
			if err != nil {
				errs <- err.Error()
				return
			}
			if tc, _ := res.Content[0].(*mcp.TextContent); tc == nil || !strings.Contains(tc.Text, want) {
				errs <- fmt.Sprintf("call %d: %+v", i, res.Content)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for _, c := range r.calls()[before:] {
		if c == "secret" {
			t.Fatal("a denied call reached the server")
		}
	}
}

func TestApproval(t *testing.T) {
	sock := serve(t)
	var asked []string
	var mu sync.Mutex
	answer := "accept"
	r := connect(t, sock, func(req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, req.Params.Message)
		switch answer {
		case "accept":
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": true}}, nil
		case "accept-no":
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": false}}, nil
		}
		return &mcp.ElicitResult{Action: answer}, nil
	})
	if text, isErr := r.call("ask", map[string]any{"text": "please"}); isErr || text != "askedplease" {
		t.Fatalf("an approved call: %q %v", text, isErr)
	}
	for _, a := range []string{"accept-no", "decline", "cancel"} {
		mu.Lock()
		answer = a
		mu.Unlock()
		if text, isErr := r.call("ask", nil); !isErr || !strings.Contains(text, "approval required") {
			t.Fatalf("answer %s: %q %v", a, text, isErr)
		}
	}
	if got := r.calls(); !slices.Equal(got, []string{"ask"}) {
		t.Fatalf("the server saw %v", got)
	}
	if len(asked) != 4 || !strings.Contains(asked[0], `call "ask" with the arguments`) || !strings.Contains(asked[0], "please") {
		t.Fatalf("the questions: %q", asked)
	}
}

func TestDaemonDown(t *testing.T) {
	r := connect(t, filepath.Join(t.TempDir(), "no.sock"), nil)
	if text, isErr := r.call("echo", map[string]any{"text": "hi"}); !isErr || !strings.Contains(text, "unreachable") {
		t.Fatalf("daemon down: %q %v", text, isErr)
	}
	res, err := r.session.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) != 0 {
		t.Fatalf("daemon down: tools/list shows %d tools, want none", len(res.Tools))
	}
	if got := r.calls(); len(got) != 0 {
		t.Fatalf("the server saw %v", got)
	}
}

// TestShutdown: when the client closes its end, the proxy closes the
// server's input and exits with the server's status; when the server
// exits, the proxy exits with its status.
func TestShutdown(t *testing.T) {
	sock := serve(t)
	cmd := exec.Command(condfsBin, "mcp", "proxy", "--socket", sock, "--context", "tui", "--", serverBin)
	cmd.Env = append(os.Environ(), "CALL_LOG="+filepath.Join(t.TempDir(), "calls"))
	client := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil)
	s, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 20 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > 10*time.Second || cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Fatalf("client closed: the proxy took %v and ended %v", d, cmd.ProcessState)
	}
	// The server exits on its own: the proxy ends with its status.
	p := exec.Command(condfsBin, "mcp", "proxy", "--socket", sock, "--context", "tui", "--", "sh", "-c", "exit 3")
	stdin, _ := p.StdinPipe() // held open: the client has not gone
	defer stdin.Close()
	done := make(chan error, 1)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- p.Wait() }()
	select {
	case <-done:
		if p.ProcessState.ExitCode() != 3 {
			t.Fatalf("the proxy exited %d, want the server's 3", p.ProcessState.ExitCode())
		}
	case <-time.After(10 * time.Second):
		p.Process.Kill()
		t.Fatal("the proxy outlived its server")
	}
}

// BenchmarkToolCall: one allowed tools/call through the proxy (which adds
// a tool.decide round trip to the daemon), beside the same call to the same
// server without the proxy, in one run.
func BenchmarkToolCall(b *testing.B) {
	sock := serve(b)
	run := func(b *testing.B, cmd *exec.Cmd) {
		cmd.Env = append(os.Environ(), "CALL_LOG="+filepath.Join(b.TempDir(), "calls"))
		client := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
		s, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "x"}}
		for b.Loop() {
			if res, err := s.CallTool(context.Background(), params); err != nil || res.IsError {
				b.Fatal(err)
			}
		}
	}
	b.Run("direct", func(b *testing.B) { run(b, exec.Command(serverBin)) })
	b.Run("proxied", func(b *testing.B) {
		run(b, exec.Command(condfsBin, "mcp", "proxy", "--socket", sock, "--context", "tui", "--", serverBin))
	})
}

// pyServer is a stdio server as the Python SDK reads: universal newlines
// (a CR ends a line too), keys matched exactly. It records every tools/call
// it parses and answers every request.
const pyServer = `
import io, json, os, sys
src = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline=None)
for line in src:
    try:
        m = json.loads(line)
    except Exception:
        continue
    if not isinstance(m, dict):
        continue
    if m.get("method") == "tools/call":
        with open(os.environ["CALL_LOG"], "a") as f:
            f.write(str(m.get("params", {}).get("name")) + " " + json.dumps(m.get("params", {}).get("arguments")) + "\n")
    if "id" in m and "method" in m:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {}}) + "\n")
        sys.stdout.flush()
`

// TestParserDifferentials: the attacks that made the proxy decide one
// message and forward another, against the official Go SDK's server and a
// server that reads as Python's does. Folded duplicate keys are refused;
// a call hidden between CRs inside an allowed ping reaches the server only
// as the ping the proxy decided, re-encoded on one line.
func TestParserDifferentials(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 is needed (CI installs it)")
		}
		t.Skip("no python3")
	}
	py := filepath.Join(t.TempDir(), "server.py")
	os.WriteFile(py, []byte(pyServer), 0o644)
	sock := serve(t)
	for name, server := range map[string][]string{"go-sdk": {serverBin}, "python": {python, py}} {
		t.Run(name, func(t *testing.T) {
			callLog := filepath.Join(t.TempDir(), "calls")
			cmd := exec.Command(condfsBin, append([]string{"mcp", "proxy", "--socket", sock, "--context", "tui", "--"}, server...)...)
			cmd.Env = append(os.Environ(), "CALL_LOG="+callLog)
			in, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { in.Close(); cmd.Wait() }()
			r := bufio.NewReader(out)
			send := func(line string) string {
				t.Helper()
				if _, err := in.Write([]byte(line + "\n")); err != nil {
					t.Fatal(err)
				}
				got, err := r.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			send(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
			in.Write([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n"))
			for _, line := range []string{
				`{"jsonrpc":"2.0","id":1,"method":"tools/call","Method":"ping","params":{"name":"secret","arguments":{}}}`,
				`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","Name":"secret","arguments":{}}}`,
				`[{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"secret"}},`,
				// The attacks: U+017F folds onto 's' in encoding/json.
				`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"secret","arguments":{}},"paramſ":{"name":"echo","arguments":{}}}`,
				`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},"argumentſ":{"text":"x"}}}`,
				`{"jsonrpc":"2.0","id":6,"Method":"tools/call","params":{"name":"secret","arguments":{}}}`,
				"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"ech\\ud800o\"}}",
				// The Go SDK answers id 2.5 as 2: a listing the proxy could
				// not match to its request went out unfiltered.
				`{"jsonrpc":"2.0","id":2.5,"method":"tools/list"}`,
				`{"jsonrpc":"2.0","id":1e0,"method":"tools/list"}`,
				`{"jsonrpc":"2.0","id":-0,"method":"tools/list"}`,
			} {
				if got := send(line); !strings.Contains(got, "refused") {
					t.Fatalf("%s: %q", line, got)
				}
			}
			// One ping to the proxy, with a call between CRs: the server
			// gets the ping on one line and answers it once.
			hidden := "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\",\"params\":{\"x\":\r{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/call\",\"params\":{\"name\":\"secret\",\"arguments\":{}}}\r}}"
			if got := send(hidden); !strings.Contains(got, `"id":4`) {
				t.Fatalf("ping: %q", got)
			}
			// An allowed call still runs.
			if got := send(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"text":"ok"}}}`); !strings.Contains(got, `"id":8`) {
				t.Fatalf("echo: %q", got)
			}
			data, _ := os.ReadFile(callLog)
			if calls := strings.Fields(string(data)); len(calls) == 0 || calls[0] != "echo" || strings.Contains(string(data), "secret") {
				t.Fatalf("the server ran %q; want only the allowed echo", data)
			}
		})
	}
}
