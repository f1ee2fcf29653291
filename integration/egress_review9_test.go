package integration

// The ninth attacker review of the egress gateway (network = "policy").
// Each test passes when condfs behaves as docs/sandbox.md ("Network")
// says; a hole makes its test fail with "HOLE".

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// atk9Hello builds TLS 1.3 client hellos by hand (hello: any server_name
// extensions; ch: one host name), so that a program can send a first hello
// naming one host and, after the server's HelloRetryRequest, a second one
// naming another.
const atk9Hello = `
import socket, struct, os, sys
def ext(t, body): return struct.pack(">HH", t, len(body)) + body
def hello(snis, share, sid):
    # snis: a list of server_name extensions, each a list of (type, name)
    e = b""
    for entries in snis:
        lst = b"".join(struct.pack(">BH", t, len(n)) + n.encode() for t, n in entries)
        e += ext(0, struct.pack(">H", len(lst)) + lst)
    e += ext(10, struct.pack(">HH", 2, 0x001d))
    e += ext(13, struct.pack(">HHHH", 6, 0x0403, 0x0804, 0x0401))
    e += ext(43, bytes([2]) + struct.pack(">H", 0x0304))
    e += ext(45, bytes([1, 1]))
    ks = b"" if share is None else struct.pack(">HH", 0x001d, 32) + share
    e += ext(51, struct.pack(">H", len(ks)) + ks)
    body = struct.pack(">H", 0x0303) + os.urandom(32) + bytes([32]) + sid + struct.pack(">HH", 2, 0x1301) + bytes([1, 0]) + struct.pack(">H", len(e)) + e
    hs = bytes([1]) + len(body).to_bytes(3, "big") + body
    return bytes([0x16, 3, 1]) + struct.pack(">H", len(hs)) + hs
def ch(sni, share, sid):
    return hello([[(0, sni)]], share, sid)
def rec(s):
    h = b""
    while len(h) < 5:
        b = s.recv(5 - len(h))
        if not b: return None
        h += b
    n = struct.unpack(">H", h[3:5])[0]
    d = b""
    while len(d) < n:
        b = s.recv(n - len(d))
        if not b: return None
        d += b
    return h + d
HRR = bytes.fromhex("CF21AD74E59A6111BE1D8C021E65B891C2A211167ABB8C5E079E09E2C8A8339C")
def retry(host, port, first, second):
    try:
        s = socket.create_connection((host, port), timeout=5)
        sid = os.urandom(32)
        s.sendall(ch(first, None, sid))
        r = rec(s)
        print("first answer", "hrr" if r and r[11:43] == HRR else repr(r), flush=True)
        s.sendall(ch(second, os.urandom(32), sid))
        for i in range(3):
            r = rec(s)
            if not r: break
            print("then record", r[:6].hex(), flush=True)
    except Exception as e:
        print("ended", type(e).__name__, e, flush=True)
`

// TestAtk9EgressTLSRetrySNI: the SNI check reads the first client hello
// only. After a HelloRetryRequest (the client offered no key share the
// server takes), the client sends a second hello, relayed unread: an
// OpenSSL server takes that hello's SNI, and switches to the virtual host
// it names (SSL_set_SSL_CTX in the servername callback, as nginx and
// s_server do). A connection decided as https to api.test then serves
// other.test, which the policy denies.
func TestAtk9EgressTLSRetrySNI(t *testing.T) {
	d, n := atk9HomeNet(t)
	srvOut := atk9SServer(t, n)
	got := egressPy(t, d, atk9Hello+`
retry("api.test", 8443, "api.test", "other.test")
`)
	atk9CheckRetry(t, got, srvOut, d.log)
}

// TestAtk9EgressTLSRetrySNIUnprivileged: the same on the user-namespace
// path (a daemon run by uid 65534).
func TestAtk9EgressTLSRetrySNIUnprivileged(t *testing.T) {
	requireUnprivilegedFUSE(t)
	n := atk9Net(t)
	srvOut := atk9SServer(t, n)
	h := openHome(t, "-")
	h.t = t
	h.write("config/conditions.toml", atk9Rules(h.write("config/hosts", atk9Hosts)))
	h.write("config/policy.yaml", egressPolicy)
	sock, logs := startUnprivDaemon(t, h)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", sock, "--session", "default", "--",
		"python3", "-c", atk9Hello+`
retry("api.test", 8443, "api.test", "other.test")
`)
	out, _ := cmd.CombinedOutput()
	atk9CheckRetry(t, string(out), srvOut, logs)
}

// atk9SServer starts openssl s_server on atk9Srv:8443: -cert for any
// SNI but -servername's, for which it switches to -cert2's context; it
// prints every SNI it reads. It returns its output so far.
func atk9SServer(t *testing.T, n *egressNet) func() string {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("openssl is needed: %v", err)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	for _, name := range []string{"api", "other"} {
		out, err := exec.Command("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
			"-keyout", filepath.Join(dir, name+".key"), "-out", filepath.Join(dir, name+".pem"),
			"-subj", "/CN="+name+".test", "-days", "1").CombinedOutput()
		if err != nil {
			t.Fatalf("openssl req: %v\n%s", err, out)
		}
	}
	srv := exec.Command("ip", "netns", "exec", n.ns, "stdbuf", "-o0", "-e0", "openssl", "s_server", "-accept", atk9Srv+":8443",
		"-cert", filepath.Join(dir, "api.pem"), "-key", filepath.Join(dir, "api.key"),
		"-servername", "other.test", "-cert2", filepath.Join(dir, "other.pem"), "-key2", filepath.Join(dir, "other.key"), "-tls1_3")
	out := syncBuilder{b: &strings.Builder{}, mu: make(chan struct{}, 1)}
	srv.Stdout, srv.Stderr = out, out
	stdin, _ := srv.StdinPipe() // s_server ends at its stdin's end: kept open
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); srv.Process.Kill(); srv.Wait() })
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", atk9Srv+":8443"); err == nil {
			c.Close()
			break
		}
		if i > 100 {
			t.Fatalf("s_server did not start:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return out.String
}

func atk9CheckRetry(t *testing.T, run string, srvOut, logs func() string) {
	t.Helper()
	time.Sleep(300 * time.Millisecond)
	srv := srvOut()
	t.Logf("run:\n%s\nserver:\n%s", run, srv)
	if !strings.Contains(srv, `Hostname in TLS extension: "api.test"`) {
		t.Fatalf("the allowed first hello did not reach the server (setup):\n%s", logs())
	}
	if strings.Contains(srv, `"other.test"`) || strings.Contains(srv, "Switching server context") {
		t.Errorf("HOLE: a connection decided as https api.test:8443 made the server read SNI other.test (a second client hello after a HelloRetryRequest), which the policy denies")
	}
}

// TestAtk9EgressKeptRunCut: a context switch decides again the connections
// of the session's runs (s.runs), but a sandbox kept for the session's
// next run (daemon/warm.go) has left s.runs while its gateway still serves
// the connections its last command opened: what that command wrote before
// it ended (the capture's buffers and its own socket's) still flows
// upstream after a switch that denies the host, and the switch does not cut
// it. The server here reads nothing until the switch has returned, then
// counts what arrives: all the command sent means nothing was cut.
func TestAtk9EgressKeptRunCut(t *testing.T) {
	toGuild := func(d *daemon) { d.setContext("s", guildCtx) } // echo.test is allowed only in a DM
	reload := func(d *daemon) {
		d.home.write("config/policy.yaml", strings.Replace(egressPolicy, `args.host != "echo.test" or when("discord:dm")`, `args.host != "echo.test"`, 1))
		d.call("config.reload", map[string]any{}, nil)
	}
	// The control: while the command runs, the switch cuts, and what
	// the buffers held is lost.
	t.Run("control: the command still runs", func(t *testing.T) { atk9KeptRunCut(t, toGuild, true) })
	t.Run("context.set", func(t *testing.T) { atk9KeptRunCut(t, toGuild, false) })
	t.Run("policy reload", func(t *testing.T) { atk9KeptRunCut(t, reload, false) })
}

// TestAtk9EgressCutDrainsUpstream: a cut closes the upstream socket
// gracefully (net.Conn.Close): what the gateway had queued toward the
// server before the switch (the send buffer the kernel autotunes, up to
// tcp_wmem's 4 MiB) is still sent after the switch returned, while the
// server reads. Only what the server's kernel held before the switch may
// reach it.
func TestAtk9EgressCutDrainsUpstream(t *testing.T) {
	inq, got := atk9KeptRunCut(t, func(d *daemon) { d.setContext("s", guildCtx) }, true)
	if inq < 0 {
		t.Fatal("setup: no SIOCINQ of the server's socket")
	}
	if late := got - int64(inq); late > 64<<10 {
		t.Errorf("HOLE: %d bytes the gateway had queued toward echo.test reached it after the context switch that cut the connection returned (the upstream is closed gracefully, not reset)", late)
	}
}

func atk9KeptRunCut(t *testing.T, deny func(d *daemon), live bool) (inq int, got int64) {
	d, n := atk9HomeNet(t)
	l := n.listen(t, atk9Srv+":7100")
	start := make(chan struct{})
	total := make(chan int64, 1)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			total <- -1
			close(accepted)
			return
		}
		defer c.Close()
		accepted <- c
		<-start
		var got int64
		buf := make([]byte, 64<<10)
		for {
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			k, err := c.Read(buf)
			got += int64(k)
			if err != nil {
				break
			}
		}
		total <- got
	}()
	// A run first, so that the next one runs "in a row" and its sandbox
	// is kept once its command ends.
	condfsRun(t, d, "", "--", "/bin/sh", "-c", "exit 0")
	code := `
import socket, time, sys
s = socket.create_connection(("echo.test", 7100), timeout=10)
s.setblocking(False)
sent, chunk, last = 0, (b"x" * 63 + b"\n") * 1024, time.time()
while time.time() - last < 1.5:
    try:
        sent += s.send(chunk)
        last = time.time()
    except BlockingIOError:
        time.sleep(0.05)
print("sent", sent, flush=True)
if len(sys.argv) > 1:
    time.sleep(30)
`
	var out string
	if live {
		_, line := egressLive(t, d, "s", "import sys\nsys.argv.append('live')\n"+code)
		out = line()
	} else {
		out, _ = condfsRun(t, d, "", "--", "python3", "-c", code)
	}
	var sent int64 = -1
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "sent" {
			sent, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	if sent <= 0 {
		t.Fatalf("the run: %s\n%s", out, d.log())
	}
	time.Sleep(time.Second) // the run leaves s.runs once answered
	var st map[string]any
	d.call("status", map[string]any{}, &st)
	t.Logf("status.runs after the run: %v; egress %v", st["runs"], st["egress"])
	// What the server's kernel holds of it before the change: the server
	// reads nothing, so nothing more arrives until it does.
	inq = -1
	if c, ok := <-accepted; ok {
		if rc, err := c.(*net.TCPConn).SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { inq, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		}
	}
	deny(d)
	close(start)
	select {
	case got = <-total:
	case <-time.After(60 * time.Second):
		t.Fatal("the server never ended")
	}
	t.Logf("the command sent %d bytes; the server held %d before the change and got %d in all", sent, inq, got)
	if got >= sent {
		t.Errorf("HOLE: after a change that denies echo.test returned, all %d bytes the ended command wrote reached echo.test:7100 (the kept sandbox's connection was not cut)", got)
	}
	return inq, got
}

// tomcatPath is the path a Tomcat-like server serves for a request
// target: path parameters dropped from each segment (CoyoteAdapter
// parsePathParameters), decoded, "//" merged and dot segments removed
// (normalize).
func tomcatPath(target string) string {
	p, _, _ := strings.Cut(target, "?")
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i], _, _ = strings.Cut(s, ";")
	}
	p = strings.Join(segs, "/")
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	return path.Clean(p)
}

// TestAtk9EgressParamSegment: a segment that is only ";" parameters.
// normalPath refuses a dot segment with parameters ("..;") and a path
// starting with "//", but "/;x/private/secret.txt" is neither: it is
// decided as is (not under /private) and forwarded as is; a server that
// drops path parameters and merges slashes (Tomcat) reads
// /private/secret.txt.
func TestAtk9EgressParamSegment(t *testing.T) {
	d, n := atk9HomeNet(t)
	go http.Serve(n.listen(t, atk9Srv+":8200"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := tomcatPath(r.RequestURI); strings.HasPrefix(p, "/private/") {
			fmt.Fprintf(w, "SECRET-DATA of %s", p)
		} else {
			fmt.Fprintf(w, "public %s", p)
		}
	}))
	for _, c := range []struct{ name, code string }{
		{"direct", pyRaw + `
s = socket.create_connection(("web.test", 8200), timeout=5)
s.sendall(b"GET /;x/private/secret.txt HTTP/1.1\r\nHost: web.test:8200\r\nConnection: close\r\n\r\n")
print(readall(s))
`},
		{"direct, an empty parameter", pyRaw + `
s = socket.create_connection(("web.test", 8200), timeout=5)
s.sendall(b"GET /;/private/secret.txt HTTP/1.1\r\nHost: web.test:8200\r\nConnection: close\r\n\r\n")
print(readall(s))
`},
		{"through the proxy", pyRaw + `
s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
s.sendall(b"GET http://web.test:8200/;x/private/secret.txt HTTP/1.1\r\nHost: web.test:8200\r\nConnection: close\r\n\r\n")
print(readall(s))
`},
	} {
		out := egressPy(t, d, c.code)
		// The setup: an allowed path is served.
		if strings.Contains(out, "SECRET-DATA") {
			t.Errorf("HOLE %s: a path decided as not under /private was read as /private by a server that drops path parameters:\n%s", c.name, out)
		}
	}
	if out := egressPy(t, d, pyRaw+`
s = socket.create_connection(("web.test", 8200), timeout=5)
s.sendall(b"GET /pub/ok HTTP/1.1\r\nHost: web.test:8200\r\nConnection: close\r\n\r\n")
print(readall(s))
`); !strings.Contains(out, "public /pub/ok") {
		t.Errorf("setup: an allowed request was not served:\n%s\n%s", out, d.log())
	}
}

// atk9Recorder is a server in the servers' namespace that keeps every byte
// it reads and reads requests with net/http's parser: for /switch it
// answers 101 and then reads raw; otherwise 200 (the body read).
type atk9Recorder struct {
	mu   sync.Mutex
	raw  strings.Builder
	reqs []string
}

func (a *atk9Recorder) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.raw.Write(p)
}

func (a *atk9Recorder) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(io.TeeReader(c, a))
			for {
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				a.mu.Lock()
				a.reqs = append(a.reqs, req.Method+" "+req.URL.Path+" host="+req.Host)
				a.mu.Unlock()
				if req.URL.Path == "/switch" {
					io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n")
					io.Copy(io.Discard, br)
					return
				}
				io.Copy(io.Discard, req.Body)
				body := "ok " + req.Method + " " + req.RequestURI
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}
		}()
	}
}

// TestAtk9EgressDesync: HTTP/1.1 framing and target tricks that would make
// the server read a request (under /private, or to another host, or with
// another method) the gateway did not decide. The server keeps every byte
// it reads: none of them may name /private or other.test, and every
// request it reads is a GET.
func TestAtk9EgressDesync(t *testing.T) {
	d, n := atk9HomeNet(t)
	rec := &atk9Recorder{}
	go rec.serve(n.listen(t, atk9Srv+":8300"))
	const H = `Host: web.test:8300\r\n`
	smug := `GET /private/x HTTP/1.1\r\n` + H + `\r\n`
	// its length as sent (the Python literal's escapes are two bytes each)
	sl := strconv.Itoa(len(strings.ReplaceAll(smug, `\r\n`, "..")))
	sx := strconv.FormatInt(int64(len(strings.ReplaceAll(smug, `\r\n`, ".."))), 16)
	direct := func(payload string) string {
		return pyRaw + `
s = socket.create_connection(("web.test", 8300), timeout=5)
s.sendall(b"` + payload + `")
print(readall(s))
`
	}
	proxied := func(payload string) string {
		return pyRaw + `
s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
s.sendall(b"` + payload + `")
print(readall(s))
`
	}
	cases := []struct{ name, code string }{
		{"two Content-Lengths", direct(`GET /a HTTP/1.1\r\n` + H + `Content-Length: 0\r\nContent-Length: ` + sl + `\r\n\r\n` + smug)},
		{"Content-Length and chunked on a GET", direct(`GET /a HTTP/1.1\r\n` + H + `Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n` + smug)},
		{"an unknown transfer coding", direct(`GET /a HTTP/1.1\r\n` + H + `Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n` + smug)},
		{"chunked, identity", direct(`GET /a HTTP/1.1\r\n` + H + `Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n` + smug)},
		{"a chunk extension on a GET", direct(`GET /a HTTP/1.1\r\n` + H + `Transfer-Encoding: chunked\r\n\r\n` + sx + `;x=\"\r\n` + smug + `\"\r\n0\r\n\r\n`)},
		{"bare LF and a bare CR", direct(`GET /a HTTP/1.1\n` + `Host: web.test:8300\nX: 1\rGET /private/x HTTP/1.1\n\n`)},
		{"a bare CR ending the head", direct(`GET /a HTTP/1.1\r\n` + H + `\r` + smug)},
		{"NUL in a header", direct(`GET /a HTTP/1.1\r\n` + H + `X: a\x00` + smug + `\r\n\r\n`)},
		{"a space before the colon", direct(`GET /a HTTP/1.1\r\n` + H + `Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n` + smug)},
		{"a header line with no colon", direct(`GET /a HTTP/1.1\r\n` + H + `Transfer-Encoding\r\n\r\n` + smug)},
		{"pipelined: absolute form naming another host", direct(`GET /a HTTP/1.1\r\n` + H + `\r\nGET http://other.test:8300/private/x HTTP/1.1\r\nHost: other.test:8300\r\n\r\n`)},
		{"pipelined: absolute form, Host of this connection", direct(`GET /a HTTP/1.1\r\n` + H + `\r\nGET http://other.test:8300/x HTTP/1.1\r\n` + H + `\r\n`)},
		{"pipelined: a denied path", direct(`GET /a HTTP/1.1\r\n` + H + `\r\n` + smug)},
		{"HTTP/1.0 keep-alive, then a denied path", direct(`GET /a HTTP/1.0\r\n` + H + `Connection: keep-alive\r\n\r\nGET /private/x HTTP/1.0\r\n` + H + `\r\n`)},
		{"Expect: 100-continue on a GET with a body", direct(`GET /a HTTP/1.1\r\n` + H + `Expect: 100-continue\r\nContent-Length: ` + sl + `\r\n\r\n` + smug)},
		{"a POST with Expect", direct(`POST /a HTTP/1.1\r\n` + H + `Expect: 100-continue\r\nContent-Length: ` + sl + `\r\n\r\n` + smug)},
		{"Upgrade: h2c", direct(`GET /a HTTP/1.1\r\n` + H + `Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n` + smug)},
		{"h2 prior knowledge", direct(`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n` + smug)},
		{"CONNECT inside a captured connection", direct(`CONNECT other.test:8300 HTTP/1.1\r\n` + H + `\r\n` + smug)},
		{"CONNECT to this host inside a captured connection", direct(`CONNECT web.test:8300 HTTP/1.1\r\n` + H + `\r\n` + smug)},
		{"OPTIONS *", direct(`OPTIONS * HTTP/1.1\r\n` + H + `\r\n` + smug)},
		{"lower-case get with a body", direct(`get /a HTTP/1.1\r\n` + H + `Content-Length: ` + sl + `\r\n\r\n` + smug)},
		{"a fragment", direct(`GET /a#/../../private/x HTTP/1.1\r\n` + H + `\r\n`)},
		{"encoded dots", direct(`GET /a/%2e%2e/private/x HTTP/1.1\r\n` + H + `\r\n`)},
		{"encoded dot and slash", direct(`GET /a/.%2E%2Fprivate/x HTTP/1.1\r\n` + H + `\r\n`)},
		{"a backslash", direct(`GET /a\\..\\private\\x HTTP/1.1\r\n` + H + `\r\n`)},
		{"a double slash", direct(`GET //private/x HTTP/1.1\r\n` + H + `\r\n`)},
		{"an encoded p", direct(`GET /%70rivate/x HTTP/1.1\r\n` + H + `\r\n`)},
		{"leading blank lines", direct(`\r\n\r\n` + smug)},
		{"a 101 answer, then a denied request on the same connection", pyRaw + `
s = socket.create_connection(("web.test", 8300), timeout=5)
s.sendall(b"GET /switch HTTP/1.1\r\n` + H + `\r\n")
time.sleep(0.5)
try:
    s.sendall(b"` + smug + `")
except Exception:
    pass
print(readall(s))
`},
		{"proxy: pipelined, another host", proxied(`GET http://web.test:8300/a HTTP/1.1\r\n` + H + `\r\nGET http://other.test:8300/private/x HTTP/1.1\r\nHost: other.test:8300\r\n\r\n`)},
		{"proxy: pipelined, origin form", proxied(`GET http://web.test:8300/a HTTP/1.1\r\n` + H + `\r\n` + smug)},
		{"proxy: userinfo", proxied(`GET http://web.test:8300@other.test:8300/private/x HTTP/1.1\r\nHost: other.test:8300\r\n\r\n`)},
		{"proxy: a query turned path", proxied(`GET http://web.test:8300?/../private/x HTTP/1.1\r\n` + H + `\r\n`)},
		{"proxy: CONNECT with a body", proxied(`CONNECT web.test:8300 HTTP/1.1\r\n` + H + `Content-Length: ` + sl + `\r\n\r\n` + smug)},
	}
	for _, c := range cases {
		out := egressPy(t, d, c.code)
		t.Logf("%s: %s", c.name, strings.TrimSpace(out))
	}
	rec.mu.Lock()
	raw, reqs := rec.raw.String(), append([]string(nil), rec.reqs...)
	rec.mu.Unlock()
	t.Logf("the server read %d requests: %q", len(reqs), reqs)
	if len(reqs) == 0 {
		t.Fatalf("setup: no request reached the server\n%s", d.log())
	}
	if strings.Contains(raw, "GET /private") || strings.Contains(raw, "other.test") {
		t.Errorf("HOLE: the server read bytes naming /private or other.test:\n%q", raw)
	}
	for _, r := range reqs {
		if f := strings.Fields(r); len(f) != 3 || f[0] != "GET" || strings.HasPrefix(f[1], "/private") || f[2] != "host=web.test:8300" {
			t.Errorf("HOLE: the server read %q (the policy allows GET only, not under /private)", r)
		}
	}
}

// TestAtk9EgressAddressForms: a policy that allows every host, and
// reach_private naming the servers' address alone: names (hosts file) and
// literals in every form that reach the host itself or its loopback must
// be refused. A listener of the host, on all its addresses, counts what
// reaches it.
func TestAtk9EgressAddressForms(t *testing.T) {
	n := atk9Net(t)
	go http.Serve(n.listen(t, atk9Srv+":80"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s host=%s", r.Method, r.RequestURI, r.Host)
	}))
	hl, err := net.Listen("tcp", "0.0.0.0:8400")
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	var mu sync.Mutex
	reached := 0
	go func() {
		for {
			c, err := hl.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			reached++
			mu.Unlock()
			c.Close()
		}
	}()
	h := openHome(t, "-")
	h.t = t
	hosts := h.write("config/hosts", atk9Srv+" web.test\n10.239.0.1 self.test\n127.0.0.1 multi.test\n"+atk9Srv+" multi.test\n"+
		"::ffff:10.239.0.1 mapped.test\n64:ff9b::aef:1 nat64.test\n0.0.0.0 zero.test\n::ffff:127.0.0.1 mloop.test\n")
	rules := strings.Replace(atk9Rules(hosts), `reach_private = ["10.239.0.0/24"]`, `reach_private = ["`+atk9Srv+`"]`, 1)
	h.write("config/conditions.toml", rules)
	h.write("config/policy.yaml", "version: 1\nroles:\n  default:\n    tools:\n      exec: {mode: allow}\n      connect: {mode: allow}\n")
	os.Chmod(h.path("workspace"), 0o777)
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(h.path("run"), 0o755)
	d.openFor("s", nobody, dmCtx)
	targets := []string{
		"self.test", "mapped.test", "nat64.test", "zero.test", "mloop.test",
		"10.239.0.1", "[::ffff:10.239.0.1]", "[::ffff:aef:1]", "[64:ff9b::10.239.0.1]", "0.0.0.0", "127.0.0.1",
		"[::1]", "[::]", "[::ffff:127.0.0.1]", "127.1", "2130706433", "0x7f.1", "017700000001", "0177.0.0.1", "10.239.1",
	}
	code := pyRaw + `
import sys
for t in sys.argv[1:]:
    for how in ("proxy", "direct"):
        try:
            if how == "proxy":
                s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
                s.sendall(("GET http://%s:8400/ HTTP/1.1\r\nHost: %s:8400\r\n\r\n" % (t, t)).encode())
            else:
                h = t.strip("[]")
                s = socket.create_connection((h, 8400), timeout=5)
                s.sendall(("GET / HTTP/1.1\r\nHost: %s:8400\r\n\r\n" % t).encode())
            print(how, t, readall(s)[:60], flush=True)
        except Exception as e:
            print(how, t, "error", type(e).__name__, flush=True)
`
	out, _ := condfsRun(t, d, "", append([]string{"--", "python3", "-c", code}, targets...)...)
	t.Logf("%s", out)
	// multi.test: 127.0.0.1 is skipped, the servers' address dialled.
	if o, _ := condfsRun(t, d, "", "--", "curl", "-sS", "--max-time", "10", "--noproxy", "*", "http://multi.test/m"); !strings.Contains(o, "GET /m host=multi.test") {
		t.Errorf("setup: multi.test was not reached at its allowed address: %s", o)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if reached != 0 {
		t.Errorf("HOLE: %d connections of the run reached a listener of the host itself\n%s", reached, d.log())
	}
}

// The tests here build their servers' network as egress_test.go's
// newEgressNet does, under names and addresses of their own (cfa9*,
// 10.239.0.0/24): newEgressNet removes every cfeg* network it finds, and
// so a test of another file run meanwhile took this file's servers away.
const atk9Srv = "10.239.0.2"

const atk9Hosts = atk9Srv + " web.test api.test echo.test other.test\n"

func atk9Rules(hosts string) string {
	return strings.Replace(egressRules(hosts), `reach_private = ["10.231.0.0/24"]`, `reach_private = ["10.239.0.0/24"]`, 1)
}

func atk9Net(t *testing.T) *egressNet { return newNetAt(t, "cfa9", "10.239.0") }

// atk9HomeNet is egressHomeNet on atk9Net: egressPolicy, session s in a
// DM, run by uid 65534.
func atk9HomeNet(t *testing.T) (*daemon, *egressNet) {
	t.Helper()
	n := atk9Net(t)
	h := openHome(t, "-")
	h.t = t
	h.write("config/conditions.toml", atk9Rules(h.write("config/hosts", atk9Hosts)))
	h.write("config/policy.yaml", egressPolicy)
	os.Chmod(h.path("workspace"), 0o777)
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(h.path("run"), 0o755)
	d.openFor("s", nobody, dmCtx)
	return d, n
}
