package mcpproxy_test

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// scriptedServer is a stdio MCP server in Python that a test steers. It
// appends every line it reads to $RECV_LOG and answers each request after
// 200 ms (so that requests sent together are in flight together):
// initialize, tools/list (echo and secret, under the result's key LIST_KEY
// or "tools"; twice with ANSWER_TWICE), and
// any other method with {} (an id null too, answered under null), except
// "hang", never answered. A tools/call of t03 first writes each message of
// its arguments' "say" to stdout: the test speaks as the server. With
// PID_FILE it writes its pid there; with IGNORE_TERM it ignores SIGTERM;
// with IGNORE_EOF it stays once its input ends, as Node servers with open
// handles do; with GRANDCHILD it first forks a child that holds its
// output, ignores SIGTERM and writes its pid to PID_FILE.child; with
// STOP_READING it reads nothing more once it has answered initialize.
const scriptedServer = `
import json, os, signal, sys, time
if os.environ.get("PID_FILE"):
    with open(os.environ["PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ.get("GRANDCHILD") and os.fork() == 0:
    # A process the server leaves behind (as npx or a shell wrapper does),
    # holding its output, deaf to SIGTERM.
    os.close(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.environ["PID_FILE"] + ".child", "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(60)
def out(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    with open(os.environ["RECV_LOG"], "a") as f:
        f.write(line.rstrip("\n") + "\n")
    try:
        m = json.loads(line)
    except Exception:
        continue
    if not isinstance(m, dict) or "method" not in m or "id" not in m or m["method"] == "hang":
        continue
    time.sleep(0.2)
    method, result = m["method"], {}
    if method == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "py", "version": "1"}}
    elif method == "tools/list":
        result = {os.environ.get("LIST_KEY", "tools"): [{"name": "echo", "inputSchema": {"type": "object"}}, {"name": "secret", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        for said in (m.get("params", {}).get("arguments") or {}).get("say", []):
            out(said)
        result = {"content": [{"type": "text", "text": "done"}]}
    out({"jsonrpc": "2.0", "id": m["id"], "result": result})
    if method == "initialize" and os.environ.get("STOP_READING"):
        while True:
            time.sleep(60)
    if method == "tools/list" and os.environ.get("ANSWER_TWICE"):
        out({"jsonrpc": "2.0", "id": m["id"], "result": result})
if os.environ.get("IGNORE_EOF"):
    while True:
        time.sleep(60)
`

// gateway is `condfs mcp proxy` over scriptedServer, driven line by line.
type gateway struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  <-chan string
	recv string // what the server read
	pid  string // where the server wrote its pid
	done chan struct{}
}

// startGateway starts the gateway (flags before --) over scriptedServer,
// with env for the server; the client has declared elicitation.
func startGateway(t *testing.T, sock string, env []string, flags ...string) *gateway {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed")
	}
	dir := t.TempDir()
	py := filepath.Join(dir, "server.py")
	if err := os.WriteFile(py, []byte(scriptedServer), 0o644); err != nil {
		t.Fatal(err)
	}
	g := &gateway{t: t, recv: filepath.Join(dir, "recv"), pid: filepath.Join(dir, "pid"), done: make(chan struct{})}
	args := append([]string{"mcp", "proxy", "--socket", sock, "--context", "tui"}, flags...)
	g.cmd = exec.Command(condfsBin, append(args, "--", python, py)...)
	g.cmd.Env = append(append(os.Environ(), "RECV_LOG="+g.recv, "PID_FILE="+g.pid), env...)
	// A file, not a pipe: Wait must not wait for a server the gateway left
	// behind to close its stderr.
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { devNull.Close() })
	g.cmd.Stderr = devNull
	g.in, _ = g.cmd.StdinPipe()
	outp, _ := g.cmd.StdoutPipe()
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.out = peerLines(outp)
	go func() { g.cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		g.in.Close()
		g.cmd.Process.Kill()
		<-g.done
		for _, f := range []string{g.pid, g.pid + ".child"} {
			if pid, err := os.ReadFile(f); err == nil {
				exec.Command("kill", "-9", string(pid)).Run()
			}
		}
	})
	g.send(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{}},"clientInfo":{"name":"c","version":"1"}}}`)
	peerNext(t, g.out, 10*time.Second, "initialize")
	g.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return g
}

// send writes lines to the gateway in one write.
func (g *gateway) send(lines ...string) {
	g.t.Helper()
	if _, err := io.WriteString(g.in, strings.Join(lines, "\n")+"\n"); err != nil {
		g.t.Fatal(err)
	}
}

// collect gathers what the client gets within d.
func (g *gateway) collect(d time.Duration) []string {
	var got []string
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-g.out:
			if !ok {
				return got
			}
			got = append(got, l)
		case <-deadline:
			return got
		}
	}
}

// received is what the server read.
func (g *gateway) received() string {
	data, _ := os.ReadFile(g.recv)
	return string(data)
}

// exited reports whether the gateway exits within d.
func (g *gateway) exited(d time.Duration) bool {
	select {
	case <-g.done:
		return true
	case <-time.After(d):
		return false
	}
}
