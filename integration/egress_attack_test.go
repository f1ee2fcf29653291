package integration

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pyServer starts `python3 -m http.server` (HTTP/1.1) in the servers'
// namespace on egressSrv:8000, serving pub/ok.txt and private/secret.txt.
// web.test is allowed on any port by egressPolicy, only for GET and not
// under /private.
func (n *egressNet) pyServer(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "pub"), 0o755)
	os.MkdirAll(filepath.Join(dir, "private"), 0o755)
	os.WriteFile(filepath.Join(dir, "pub/ok.txt"), []byte("public\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "private/secret.txt"), []byte("SECRET-DATA\n"), 0o644)
	cmd := exec.Command("ip", "netns", "exec", n.ns, "python3", "-m", "http.server", "8000",
		"--bind", egressSrv, "--protocol", "HTTP/1.1", "--directory", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", egressSrv+":8000"); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("python server did not start")
}

const pyReadResp = `
import socket, time
def readresp(s):
    data = b""
    while b"\r\n\r\n" not in data:
        b = s.recv(4096)
        if not b:
            return b"EOF " + data
        data += b
    head, _, body = data.partition(b"\r\n\r\n")
    n = 0
    for l in head.split(b"\r\n"):
        if l.lower().startswith(b"content-length:"):
            n = int(l.split(b":")[1])
    while len(body) < n:
        body += s.recv(4096)
    return head.split(b"\r\n")[0] + b" | " + body[:n]
`

// TestAttackEgressRequests: requests the policy denies (a path under
// /private, a method other than GET) that reached the servers all the
// same, found by an attacker's review of the first gateway: each got its
// answer (the audit showed only what was decided: tcp, or the allowed
// GET); now each is refused.
func TestAttackEgressRequests(t *testing.T) {
	d, n := egressHomeNet(t)
	n.pyServer(t)
	cases := []struct{ name, code, bad string }{
		// 1. The gateway classifies by the first bytes within 500 ms; a
		// program that waits is "tcp", which the policy allows for
		// web.test (its http rules are written for protocol http), and
		// then speaks HTTP through the tunnel.
		{"silence first: a denied method and path through a tcp tunnel", pyReadResp + `
s = socket.create_connection(("web.test", 80), timeout=5)
time.sleep(1)
s.sendall(b"POST /private/k HTTP/1.1\r\nHost: web.test\r\nContent-Length: 0\r\n\r\n")
print(readresp(s))
`, "POST /private/k host=web.test"},
		{"silence first, through the proxy's CONNECT", pyReadResp + `
s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
s.sendall(b"CONNECT web.test:80 HTTP/1.1\r\nHost: web.test:80\r\n\r\n")
print(readresp(s))
time.sleep(1)
s.sendall(b"DELETE /private/k HTTP/1.1\r\nHost: web.test\r\n\r\n")
print(readresp(s))
`, "DELETE /private/k host=web.test"},
		// 2. A request line sniff() does not call http, that a server
		// reads as one: leading space, tabs (Python's http.server splits
		// the request line on any whitespace). No wait needed.
		{"leading space in the request line", pyReadResp + `
s = socket.create_connection(("web.test", 8000), timeout=5)
s.sendall(b" GET /private/secret.txt HTTP/1.1\r\nHost: web.test:8000\r\n\r\n")
print(readresp(s))
`, "SECRET-DATA"},
		{"tabs in the request line", pyReadResp + `
s = socket.create_connection(("web.test", 8000), timeout=5)
s.sendall(b"GET\t/private/secret.txt\tHTTP/1.1\r\nHost: web.test:8000\r\n\r\n")
print(readresp(s))
`, "SECRET-DATA"},
		// 3. %2F is left encoded by normalPath, so dot segments around it
		// survive; a server that decodes before it normalises reads
		// /private.
		{"encoded slash around a dot segment", pyReadResp + `
s = socket.create_connection(("web.test", 8000), timeout=5)
s.sendall(b"GET /pub/..%2Fprivate/secret.txt HTTP/1.1\r\nHost: web.test:8000\r\n\r\n")
print(readresp(s))
`, "SECRET-DATA"},
		// 4. A GET with a body is forwarded with its body; a server that
		// ignores a GET's body reads the body as its next request,
		// undecided, and the gateway relays that request's answer as the
		// answer to the program's next (allowed) request.
		{"a request smuggled in a GET's body", pyReadResp + `
s = socket.create_connection(("web.test", 8000), timeout=5)
smug = b"GET /private/secret.txt HTTP/1.1\r\nHost: web.test:8000\r\n\r\n"
s.sendall(b"GET /pub/ok.txt HTTP/1.1\r\nHost: web.test:8000\r\nContent-Length: %d\r\n\r\n" % len(smug) + smug)
print("first", readresp(s))
s.sendall(b"GET /pub/ok.txt HTTP/1.1\r\nHost: web.test:8000\r\n\r\n")
print("second", readresp(s))
`, "SECRET-DATA"},
		{"the same through the proxy (absolute form)", pyReadResp + `
s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
smug = b"GET /private/secret.txt HTTP/1.1\r\nHost: web.test:8000\r\n\r\n"
s.sendall(b"GET http://web.test:8000/pub/ok.txt HTTP/1.1\r\nHost: web.test:8000\r\nContent-Length: %d\r\n\r\n" % len(smug) + smug)
print("first", readresp(s))
s.sendall(b"GET http://web.test:8000/pub/ok.txt HTTP/1.1\r\nHost: web.test:8000\r\n\r\n")
print("second", readresp(s))
`, "SECRET-DATA"},
	}
	for _, c := range cases {
		out := egressPy(t, d, c.code)
		refused := strings.Contains(out, "HTTP/1.1 4") || strings.Contains(out, "EOF") || strings.Contains(out, "Error")
		if strings.Contains(out, c.bad) || !refused {
			t.Errorf("HOLE %s: the server answered a request the policy denies, or nothing refused it:\n%s", c.name, out)
		}
	}
	if t.Failed() {
		t.Log(d.log())
	}
}

// TestAttackEgressReloadReach: a reload that takes a network out of
// reach_private cuts the open connections to it (it left them open: the
// first gateway decided only the policy again).
func TestAttackEgressReloadReach(t *testing.T) {
	d, _ := egressHomeNet(t)
	stdin, line := egressLive(t, d, "s", `
import socket, sys
e = socket.create_connection(("echo.test", 7000), timeout=10)
print(e.recv(7).decode().strip(), flush=True)
sys.stdin.readline()
try:
    e.sendall(b"ping")
    print("echo", e.recv(4), flush=True)
except Exception as x:
    print("echo cut", type(x).__name__, flush=True)
try:
    f = socket.create_connection(("echo.test", 7000), timeout=10)
    print("new", f.recv(7), flush=True)
except Exception as x:
    print("new refused", type(x).__name__, flush=True)
`)
	if l := line(); l != "banner" {
		t.Fatalf("first line %q\n%s", l, d.log())
	}
	rules := strings.Replace(egressRules(d.home.path("config/hosts")), `reach_private = ["10.231.0.0/24"]`, `reach_private = []`, 1)
	d.home.write("config/conditions.toml", rules)
	d.call("config.reload", map[string]any{}, nil)
	io.WriteString(stdin, "go\n")
	old, nw := line(), line()
	if !strings.HasPrefix(old, "echo cut") && old != "echo b''" || !strings.HasPrefix(nw, "new refused") {
		t.Errorf("HOLE: after the reload, the open connection: %q, a new one: %q\n%s", old, nw, d.log())
	}
}

// TestAttackEgressMemory: what one run can make the daemon hold: its
// connection limit's worth of tunnels whose peers do not read. The first
// gateway held about 1.6 MB for each (gVisor's default windows): 400 MB
// for one run, which no run's memory limit counts; each is now bounded by
// the stack's buffer ranges (egress/gateway.go), the node's total by its
// connection bound (daemon/egress.go).
func TestAttackEgressMemory(t *testing.T) {
	n := newEgressNet(t)
	n.serve(t)
	h := openHome(t, "-")
	h.t = t
	hosts := h.write("config/hosts", egressHosts)
	h.write("config/conditions.toml", strings.Replace(egressRules(hosts), "connections = 8", "connections = 256\nmemory = \"64MiB\"", 1))
	h.write("config/policy.yaml", egressPolicy)
	os.Chmod(h.path("workspace"), 0o777)
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(h.path("run"), 0o755)
	d.openFor("s", nobody, dmCtx)
	rss := func() int { return procKB(t, d.cmd.Process.Pid, "VmRSS") }
	before := rss()
	stdin, line := egressLive(t, d, "s", `
import socket, sys
cs = []
for i in range(250):
    try:
        c = socket.create_connection(("echo.test", 7000), timeout=5)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.setblocking(False)
        cs.append(c)
    except Exception as e:
        print("conn", i, e, flush=True)
        break
chunk = b"x" * 65536
sent = 0
for rnd in range(200):
    for c in cs:
        try:
            sent += c.send(chunk)
        except BlockingIOError:
            pass
print("conns", len(cs), "sent MB", sent >> 20, flush=True)
sys.stdin.readline()
`)
	for l := line(); l != "" && !strings.HasPrefix(l, "conns"); l = line() {
		t.Logf("run: %s", l)
	}
	time.Sleep(2 * time.Second)
	holding := rss()
	io.WriteString(stdin, "\n")
	for line() != "" {
	}
	t.Logf("daemon VmRSS %d kB -> %d kB", before, holding)
	if holding-before > 200<<10 {
		t.Errorf("the daemon grew from %d kB to %d kB for one run's 250 stalled connections", before, holding)
	}
}
