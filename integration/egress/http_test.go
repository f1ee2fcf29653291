package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

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

// TestEgressParamSegmentPathDecided: a segment that is only ";" parameters.
// normalPath refuses a dot segment with parameters ("..;") and a path
// starting with "//", but "/;x/private/secret.txt" is neither: it is
// decided as is (not under /private) and forwarded as is; a server that
// drops path parameters and merges slashes (Tomcat) reads
// /private/secret.txt.
func TestEgressParamSegmentPathDecided(t *testing.T) {
	d, n := netHome(t)
	go http.Serve(n.listen(t, upstreamSrv+":8200"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		t.Errorf("setup: an allowed request was not served:\n%s\n%s", out, d.Log())
	}
}

// byteRecorder is a server in the servers' namespace that keeps every byte
// it reads and reads requests with net/http's parser: for /switch it
// answers 101 and then reads raw; otherwise 200 (the body read).
type byteRecorder struct {
	mu   sync.Mutex
	raw  strings.Builder
	reqs []string
}

func (a *byteRecorder) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.raw.Write(p)
}

func (a *byteRecorder) serve(l net.Listener) {
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

// TestEgressFramingDesyncRefused: HTTP/1.1 framing and target tricks that would make
// the server read a request (under /private, or to another host, or with
// another method) the gateway did not decide. The server keeps every byte
// it reads: none of them may name /private or other.test, and every
// request it reads is a GET.
func TestEgressFramingDesyncRefused(t *testing.T) {
	d, n := netHome(t)
	rec := &byteRecorder{}
	go rec.serve(n.listen(t, upstreamSrv+":8300"))
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
		t.Fatalf("setup: no request reached the server\n%s", d.Log())
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

// TestEgressPathFormsDecidedAsTheServerReads: request targets whose decided (normalised)
// path is not under /private, but which a server that decodes once, merges
// slashes, drops path parameters or removes dot segments reads under
// /private. The server answers SECRET-DATA for any such reading of what it
// receives.
func TestEgressPathFormsDecidedAsTheServerReads(t *testing.T) {
	d, n := netHome(t)
	go http.Serve(n.listen(t, upstreamSrv+":8310"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range pathReadings(r.RequestURI) {
			if strings.HasPrefix(p, "/private") {
				fmt.Fprintf(w, "SECRET-DATA target=%s read=%s", r.RequestURI, p)
				return
			}
		}
		fmt.Fprintf(w, "public target=%s", r.RequestURI)
	}))
	code := pyRaw + `
import sys
for t in sys.argv[1:]:
    for how in ("direct", "proxy"):
        tt = t
        if how == "proxy" and t.startswith("/"):
            tt = "http://web.test:8310" + t
        try:
            if how == "proxy":
                s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
            else:
                s = socket.create_connection(("web.test", 8310), timeout=5)
            s.sendall(("GET %s HTTP/1.1\r\nHost: web.test:8310\r\nConnection: close\r\n\r\n" % tt).encode())
            got = readall(s)
            print(how, t, got.split(b"\r\n")[0].decode(), got[got.find(b"\r\n\r\n")+4:][:120].decode(errors="replace"), flush=True)
        except Exception as e:
            print(how, t, "error", type(e).__name__, flush=True)
`
	out, _ := testenv.CondfsRun(t, d, "", append([]string{"--", "python3", "-c", code}, append(pathFormTargets("web.test:8310"), "/pub/ok")...)...)
	t.Logf("%s", out)
	if !strings.Contains(out, "direct /pub/ok HTTP/1.1 200 OK public") || !strings.Contains(out, "proxy /pub/ok HTTP/1.1 200 OK public") {
		t.Errorf("setup: an allowed path was not served:\n%s", testenv.Tail(d.Log(), 20))
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "SECRET-DATA") {
			t.Errorf("HOLE: a path decided as not under /private was read under /private by a common server: %s", l)
		}
	}
}
