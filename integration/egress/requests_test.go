package egress

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// pyRaw reads everything the connection returns until EOF or timeout.
const pyRaw = `
import socket, time
def readall(s):
    got = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            got += b
    except Exception as e:
        got += b" <" + type(e).__name__.encode() + b">"
    return got
`

// TestEgressHTTPRequestLinesClassifiedHTTP: request lines Python's http.server reads as a
// request that the gateway classified "tcp" (allowed for web.test), so the
// policy's http rules (GET only, nothing under /private) never applied:
// each would be served /private/secret.txt. Each is classified http and
// refused.
func TestEgressHTTPRequestLinesClassifiedHTTP(t *testing.T) {
	d, n := egressHomeNet(t)
	n.pyServer(t)
	cases := []struct{ name, code string }{
		// HTTP/0.9: two fields, a target without a leading "/".
		{"HTTP/0.9 relative target", pyRaw + `
s = socket.create_connection(("web.test", 8000), timeout=5)
s.sendall(b"GET private/secret.txt\r\n\r\n")
print(readall(s))
`},
		// Latin-1 NEL (0x85) and NBSP (0xa0) as separators: Python splits
		// on them; requestLine's FieldsFunc decodes UTF-8 and sees U+FFFD.
		{"0x85 separators", pyRaw + `
s = socket.create_connection(("web.test", 8000), timeout=5)
s.sendall(b"GET\x85/private/secret.txt\x85HTTP/1.0\r\n\r\n")
print(readall(s))
`},
		{"0xa0 separators", pyRaw + `
s = socket.create_connection(("web.test", 8000), timeout=5)
s.sendall(b"GET\xa0/private/secret.txt\xa0HTTP/1.0\r\n\r\n")
print(readall(s))
`},
		// A control byte ends requestLine's scan as "tcp" at once; Python
		// splits the target at "?" (and "#") before it looks at the file.
		{"a control byte in the query", pyRaw + `
s = socket.create_connection(("web.test", 8000), timeout=5)
s.sendall(b"GET /private/secret.txt?\x01 HTTP/1.0\r\n\r\n")
print(readall(s))
`},
		{"DEL in the fragment", pyRaw + `
s = socket.create_connection(("web.test", 8000), timeout=5)
s.sendall(b"GET /private/secret.txt#\x7f HTTP/1.0\r\n\r\n")
print(readall(s))
`},
	}
	for _, c := range cases {
		out := egressPy(t, d, c.code)
		if strings.Contains(out, "SECRET-DATA") || !strings.Contains(out, "HTTP/1.1 4") && !strings.Contains(out, "Error") {
			t.Errorf("HOLE %s: /private/secret.txt was served, or nothing refused it:\n%s", c.name, out)
		}
	}
	if t.Failed() {
		logs := d.Log()
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, `"msg":"connect"`) && strings.Contains(l, "8000") {
				t.Log(l)
			}
		}
	}
}

// TestEgressReachDecidedOnTheDialledAddress: a reload that takes the servers'
// network out of reach_private while the gateway is dialling it: Recheck
// saw no dialled address yet and left the connection, which then carried
// data to an address reach_private no longer listed. The dialled upstream
// is adopted under the lock Recheck excludes, its address checked
// again. The dial is held up by a full accept queue (SYNs dropped until
// the server accepts).
func TestEgressReachDecidedOnTheDialledAddress(t *testing.T) {
	d, n := egressHomeNet(t)
	flag := filepath.Join(t.TempDir(), "go")
	srv := exec.Command("ip", "netns", "exec", n.ns, "python3", "-u", "-c", `
import socket, os, sys, time
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("`+egressSrv+`", 7100))
l.listen(0)
print("listening", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
filler, _ = l.accept()
c, _ = l.accept()
c.sendall(b"banner\n")
while True:
    b = c.recv(100)
    if not b:
        break
    c.sendall(b)
`, flag)
	srvOut, _ := srv.StdoutPipe()
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	bufio.NewReader(srvOut).ReadString('\n')
	filler, err := net.Dial("tcp", egressSrv+":7100") // fills the accept queue
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()

	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", d.Socket, "--session", "s", "--",
		"python3", "-u", "-c", `
import socket
s = socket.create_connection(("echo.test", 7100), timeout=30)
try:
    print("got", s.recv(7), flush=True)
    s.sendall(b"ping\n")
    print("echo", s.recv(5), flush=True)
except Exception as x:
    print("cut", type(x).__name__, flush=True)
`)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The gateway is dialling once the host has a SYN-SENT socket to it
	// (its SYNs dropped by the full queue).
	for i := 0; ; i++ {
		o, _ := exec.Command("ss", "-Htn", "state", "syn-sent", "dst", egressSrv+":7100").Output()
		if strings.TrimSpace(string(o)) != "" {
			t.Logf("the gateway is dialling: %s", strings.TrimSpace(string(o)))
			break
		}
		// A run's start and its 500 ms of sniffing take seconds under
		// -race on a loaded machine (4 s was once too few in CI).
		if i > 1000 {
			t.Fatalf("no dial in 20 s; the run: %q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	rules := strings.Replace(egressRules(d.Home.Path("config/hosts")), `reach_private = ["10.231.0.0/24"]`, `reach_private = []`, 1)
	d.Home.Write("config/conditions.toml", rules)
	d.Call("config.reload", map[string]any{}, nil)
	t.Logf("reloaded: reach_private = []")
	os.WriteFile(flag, nil, 0o644) // the server accepts: the next SYN gets through
	cmd.Wait()
	t.Logf("run: %s", out.String())
	after := egressPy(t, d, `
import socket
try:
    s = socket.create_connection(("echo.test", 7000), timeout=5)
    print("new", s.recv(7))
except Exception as x:
    print("new refused", type(x).__name__)
`)
	t.Logf("a new connection after the reload: %s", after)
	if strings.Contains(out.String(), "echo b'ping\\n'") || !strings.Contains(after, "new refused") {
		t.Errorf("HOLE: a connection dialled across the reload carries data to an address reach_private no longer lists:\n%s\nafter: %s\n%s", out.String(), after, d.Log())
	}
}

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
	// python3 may be a pyenv shim that takes seconds to start on a busy
	// machine: up to 30 s.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", egressSrv+":8000"); err == nil {
			c.Close()
			return
		}
	}
	t.Fatal("python server did not start in 30 s")
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

// TestEgressDeniedRequestsNeverReachTheServer: requests the policy denies (a path under
// /private, a method other than GET) never reach the servers: each is
// refused, and the audit shows what was decided.
func TestEgressDeniedRequestsNeverReachTheServer(t *testing.T) {
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
		t.Log(d.Log())
	}
}

// TestEgressReloadCutsWhatLeavesReach: a reload that takes a network out of
// reach_private cuts the open connections to it (it left them open: the
// first gateway decided only the policy again).
func TestEgressReloadCutsWhatLeavesReach(t *testing.T) {
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
		t.Fatalf("first line %q\n%s", l, d.Log())
	}
	rules := strings.Replace(egressRules(d.Home.Path("config/hosts")), `reach_private = ["10.231.0.0/24"]`, `reach_private = []`, 1)
	d.Home.Write("config/conditions.toml", rules)
	d.Call("config.reload", map[string]any{}, nil)
	io.WriteString(stdin, "go\n")
	old, nw := line(), line()
	if !strings.HasPrefix(old, "echo cut") && old != "echo b''" || !strings.HasPrefix(nw, "new refused") {
		t.Errorf("HOLE: after the reload, the open connection: %q, a new one: %q\n%s", old, nw, d.Log())
	}
}

// egressNet is a network namespace of the test's own holding its servers,
// reached from the host (where the daemon dials) by a veth pair:
// 10.231.0.1 on the host's end, 10.231.0.2 on the servers'.
type egressNet struct {
	ns string
}

const egressSrv = "10.231.0.2"

// listen opens a TCP listener inside the namespace: a socket stays in the
// namespace it was made in, whichever thread serves it afterwards.
func (n *egressNet) listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	type res struct {
		l   net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		f, err := os.Open("/run/netns/" + n.ns)
		if err != nil {
			ch <- res{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- res{nil, err}
			return
		}
		l, err := net.Listen("tcp", addr)
		ch <- res{l, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen %s in %s: %v", addr, n.ns, r.err)
	}
	t.Cleanup(func() { r.l.Close() })
	return r.l
}

// serveEgress starts the servers: plain HTTP on :80 (it answers with what
// it was asked), HTTPS for api.test on :443, and on :7000 a server that
// speaks first and then echoes.
func (n *egressNet) serve(t *testing.T) {
	echo := func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s host=%s", r.Method, r.RequestURI, r.Host)
	}
	go http.Serve(n.listen(t, egressSrv+":80"), http.HandlerFunc(echo))
	go http.Serve(tls.NewListener(n.listen(t, egressSrv+":443"), &tls.Config{Certificates: []tls.Certificate{selfSigned(t, "api.test")}}),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "api %s", r.URL.Path) }))
	el := n.listen(t, egressSrv+":7000")
	go func() {
		for {
			c, err := el.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "banner\n")
				io.Copy(c, c)
			}()
		}
	}()
}

func selfSigned(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// egressRules: the run's connections go through the gateway; the test's
// servers' network may be reached; names come from the test's hosts file.
func egressRules(hosts string) string {
	return testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/curl", "/usr/bin/python3", "/usr/bin/cat"]
network = "policy"
connections = 8
reach_private = ["10.231.0.0/24"]
hosts = "` + hosts + `"
`
}

func egressHomeNet(t *testing.T) (*testenv.Daemon, *egressNet) {
	t.Helper()
	n := newEgressNet(t)
	n.serve(t)
	h := testenv.OpenHome(t, "-")
	hosts := h.Write("config/hosts", egressHosts)
	h.Write("config/conditions.toml", egressRules(hosts))
	h.Write("config/policy.yaml", egressPolicy)
	os.Chmod(h.Path("workspace"), 0o777)
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(h.Path("run"), 0o755)
	d.OpenFor("s", testenv.Nobody, testenv.DM)
	return d, n
}

// udpCount counts datagrams reaching addr in the servers' namespace.
func (n *egressNet) udpCount(t *testing.T, addr string) func() int {
	t.Helper()
	ch := make(chan net.PacketConn, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + n.ns)
		if err == nil {
			unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Errorf("listen udp %s: %v", addr, err)
		}
		ch <- pc
	}()
	pc := <-ch
	if pc == nil {
		t.FailNow()
	}
	t.Cleanup(func() { pc.Close() })
	var mu sync.Mutex
	got := 0
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			mu.Lock()
			got++
			mu.Unlock()
		}
	}()
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}
