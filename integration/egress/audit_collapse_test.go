package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

// auditTally counts the audit records of msg in a daemon's log that keep
// (each JSON line for which it is true), and how many decisions they stand
// for: each record one, plus its "suppressed" count, plus the counts of
// the records a session's close writes for what was not yet told
// ("flushed").
func auditTally(t *testing.T, log, msg string, keep func(line string) bool) (records, decisions int) {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if !keep(line) {
			continue
		}
		var r struct {
			Msg                  string
			Suppressed, Unlisted int
			Flushed              bool
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			continue
		}
		switch {
		case r.Flushed:
			decisions += r.Suppressed + r.Unlisted
		case r.Msg == msg:
			records++
			decisions += 1 + r.Suppressed
		}
	}
	return records, decisions
}

// TestIdenticalAllowedDecisionsCollapse: identical allowed tool.decide
// calls of a session are written once a second, each record saying how
// many it stands for, and what is still untold when the session closes is
// written then: every one is counted, none itemised. A distinct decision
// (a denial, a decision made with another context) has its own record at
// once, during the flood.
func TestIdenticalAllowedDecisionsCollapse(t *testing.T) {
	d, _ := testenv.RunHome(t)
	c, err := control.Dial(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	allowed := map[string]any{"session": "s", "tool": "exec", "args": map[string]any{"argv": []string{"ls"}, "cwd": "/workspace"}}
	const n = 2000
	start := time.Now()
	for i := 0; i < n; i++ {
		var res struct{ Decision string }
		if err := c.Call("tool.decide", allowed, &res); err != nil || res.Decision != "allow" {
			t.Fatalf("call %d: %v %q", i, err, res.Decision)
		}
		if i == n/2 {
			var deny struct{ Decision string }
			c.Call("tool.decide", map[string]any{"session": "s", "tool": "exec", "args": map[string]any{"argv": []string{"forbidden"}, "cwd": "/workspace"}}, &deny)
			var other struct{ Decision string }
			c.Call("tool.decide", map[string]any{"context": testenv.Guild, "tool": "exec", "args": map[string]any{"argv": []string{"ls"}, "cwd": "/workspace"}}, &other)
			if deny.Decision != "deny" || other.Decision != "allow" {
				t.Fatalf("distinct decisions: %q %q", deny.Decision, other.Decision)
			}
			d.Within("the distinct decisions' records, during the flood", func() bool {
				return logHas(d.Log(), `"msg":"decide"`, `"session":"s"`, `"decision":"deny"`) &&
					logHas(d.Log(), `"msg":"decide"`, `"session":""`, `"decision":"allow"`)
			})
		}
	}
	took := time.Since(start)
	d.Call("session.close", map[string]any{"id": "s"}, nil)
	ofSession := func(l string) bool {
		return strings.Contains(l, `"session":"s"`) && strings.Contains(l, `"decision":"allow"`) &&
			strings.Contains(l, `"tool":"exec"`)
	}
	var records, decisions int
	d.Within("the session's counts are written", func() bool {
		records, decisions = auditTally(t, d.Log(), "decide", ofSession)
		return decisions >= n
	})
	if max := int(took/time.Second) + 2; records > max || decisions != n {
		t.Errorf("%d identical allowed decisions in %v: %d records standing for %d, want at most %d records for exactly %d",
			n, took.Round(time.Millisecond), records, decisions, max, n)
	}
	// Made without a session, they are remembered per uid, and what is
	// untold of them is written when the daemon closes.
	for i := 0; i < 3; i++ {
		c.Call("tool.decide", map[string]any{"context": testenv.Guild, "tool": "exec", "args": map[string]any{"argv": []string{"ls"}, "cwd": "/workspace"}}, nil)
	}
	d.Stop()
	if _, told := auditTally(t, d.Log(), "decide", func(l string) bool {
		return strings.Contains(l, `"session":""`) && strings.Contains(l, `"decision":"allow"`) && strings.Contains(l, `"tool":"exec"`)
	}); told != 4 {
		t.Errorf("4 allowed decisions made with a context: %d told once the daemon closed", told)
	}
}

// TestIdenticalAllowedRequestsCollapse: a run's identical allowed plain
// HTTP requests are written once a second, each record saying how many it
// stands for, and none goes uncounted once the session closes.
func TestIdenticalAllowedRequestsCollapse(t *testing.T) {
	d := egressHome(t)
	start := time.Now()
	out := egressPy(t, d, `
import urllib.request
n = 0
for i in range(200):
    urllib.request.urlopen("http://web.test/a", timeout=10).read()
    n += 1
print("fetched", n)
`)
	took := time.Since(start)
	if !strings.Contains(out, "fetched 200") {
		t.Fatalf("the run: %q", out)
	}
	d.Call("session.close", map[string]any{"id": "s"}, nil)
	ofRequests := func(l string) bool {
		return strings.Contains(l, `"session":"s"`) && strings.Contains(l, `"decision":"allow"`) && strings.Contains(l, `"method":"GET"`)
	}
	var records, decisions int
	d.Within("the session's counts are written", func() bool {
		records, decisions = auditTally(t, d.Log(), "connect", ofRequests)
		return decisions >= 200
	})
	if max := int(took/time.Second) + 2; records > max || decisions != 200 {
		t.Errorf("200 identical allowed requests in %v: %d records standing for %d, want at most %d records for exactly 200",
			took.Round(time.Millisecond), records, decisions, max)
	}
}

// logHas reports whether a line of log holds every one of parts.
func logHas(log string, parts ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// TestRequestCarryingASecretHasItsOwnRecord: a request into which the
// gateway put a secret is never collapsed into an identical request that
// carried none (nor the reverse): its record names the secret, at once.
func TestRequestCarryingASecretHasItsOwnRecord(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	// Each pair within a window of the other, on a loaded machine too.
	out, _ := testenv.CondfsRun(t, d, "", "--", "python3", "-c", `
import os, urllib.request
u = "https://api.test/same"
for i in range(5):
    urllib.request.urlopen(u, timeout=10).read()
    urllib.request.urlopen(urllib.request.Request(u, headers={"Authorization": "Bearer " + os.environ["GH_TOKEN"]}), timeout=10).read()
print("fetched")
`)
	if out != "fetched\n" {
		t.Fatalf("the requests: %q", out)
	}
	d.Call("session.close", map[string]any{"id": "s"}, nil)
	for _, with := range []bool{true, false} {
		keep := func(l string) bool {
			return strings.Contains(l, `"path":"/same"`) && strings.Contains(l, `"decision":"allow"`) && strings.Contains(l, `"secrets":["gh"]`) == with
		}
		var told int
		d.Within("the session's counts are written", func() bool {
			_, told = auditTally(t, d.Log(), "connect", keep)
			return told >= 5
		})
		if told != 5 {
			t.Errorf("5 requests with the secret %v: %d told by records that say so\n%s", with, told, d.Log())
		}
	}
}

// TestDecisionsOfOtherRolesOrContextsAreNotCollapsed: two allowed
// decisions whose roles and atoms, laid end to end, read the same (roles
// [default], atoms [a, b]; roles [default, a], atoms [b]) each have their
// own record: the roles and the context a reader sees are the decision's.
func TestDecisionsOfOtherRolesOrContextsAreNotCollapsed(t *testing.T) {
	d, _ := testenv.RunHome(t)
	c, err := control.Dial(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	call := func(atoms, roles []string) {
		var res struct{ Decision string }
		if err := c.Call("tool.decide", map[string]any{"context": atoms, "roles": roles, "tool": "exec",
			"args": map[string]any{"argv": []string{"ls"}, "cwd": "/workspace"}}, &res); err != nil || res.Decision != "allow" {
			t.Fatalf("%v %v: %v %q", atoms, roles, err, res.Decision)
		}
	}
	call([]string{"discord:channel:2", "discord:guild:1"}, []string{"default"})
	call([]string{"discord:guild:1"}, []string{"default", "discord:channel:2"})
	d.Within("a record of each", func() bool {
		return logHas(d.Log(), `"msg":"decide"`, `"atoms":["discord:channel:2","discord:guild:1"]`, `"roles":["default"]`) &&
			logHas(d.Log(), `"msg":"decide"`, `"atoms":["discord:guild:1"]`, `"roles":["default","discord:channel:2"]`)
	})
}

// TestDenialsInOtherContextsAreNotCollapsed: the same path denied in two
// contexts within a second has a record for each, each naming its own
// context.
func TestDenialsInOtherContextsAreNotCollapsed(t *testing.T) {
	d, _ := testenv.RunHome(t)
	other := []string{"discord:guild:9"}
	for _, ctx := range [][]string{testenv.Guild, other} {
		var ex struct{ Decision string }
		if err := d.Client.Call("path.check", map[string]any{"context": ctx, "space": "memories", "path": "/private/p.md"}, &ex); err != nil || ex.Decision != "deny" {
			t.Fatalf("%v: %v %q", ctx, err, ex.Decision)
		}
	}
	d.Within("a record of each", func() bool {
		return logHas(d.Log(), `"msg":"deny"`, `"path":"/private/p.md"`, `"atoms":["discord:channel:2","discord:guild:1"]`) &&
			logHas(d.Log(), `"msg":"deny"`, `"path":"/private/p.md"`, `"atoms":["discord:guild:9"]`)
	})
}

func egressHome(t *testing.T) *testenv.Daemon {
	t.Helper()
	d, _ := egressHomeNet(t)
	return d
}

// egressPy runs a Python program in the run and returns its output.
func egressPy(t *testing.T, d *testenv.Daemon, code string) string {
	t.Helper()
	out, _ := testenv.CondfsRun(t, d, "", "--", "python3", "-c", code)
	return out
}

// Inspected HTTPS (docs/sandbox.md, "Inspected HTTPS"): servers of the
// test's network with certificates of a test CA given as upstream_ca, one
// (bad.test) with a certificate of a CA nobody trusts.

const inspectSrv = "10.233.0.2"

// inspectValue is the secret's value: it must appear in no output, log or
// file a run can read; only the server sees it.
const inspectValue = "ghp_V4lue0fTheSecretNobodySees"

// testCA is a CA of the test's own.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf is a server certificate for names, signed by ca.
func (ca *testCA) leaf(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// numbered gives each connection l accepts an address of its own
// (ADDR#N): a client port the kernel gives again after a close names
// another connection, not the same one.
func numbered(l net.Listener) net.Listener { return &numberedListener{Listener: l} }

type numberedListener struct {
	net.Listener
	n atomic.Int64
}

func (l *numberedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return numberedConn{c, fmt.Sprintf("%s#%d", c.RemoteAddr(), l.n.Add(1))}, nil
}

type numberedConn struct {
	net.Conn
	addr string
}

func (c numberedConn) RemoteAddr() net.Addr { return numberedAddr(c.addr) }

type numberedAddr string

func (a numberedAddr) Network() string { return "tcp" }
func (a numberedAddr) String() string  { return string(a) }

// inspectServer records what its HTTPS servers read.
type inspectServer struct {
	mu   sync.Mutex
	seen []string // "host method uri auth=ok|none|other body=N"
	raw  strings.Builder
	from map[string]string // request URI to the address it came from
}

func (s *inspectServer) saw() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.seen, "\n")
}

// serve answers every request with what it read, the secret's value never
// (auth=ok when Authorization carried it, which only the server knows);
// /echo-headers answers the request's headers as response headers.
func (s *inspectServer) handler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	auth := "none"
	switch a := r.Header.Get("Authorization"); {
	case a == "Bearer "+inspectValue:
		auth = "ok"
	case a != "":
		auth = "other"
	}
	line := fmt.Sprintf("%s %s %s auth=%s body=%d", r.Host, r.Method, r.RequestURI, auth, len(body))
	s.mu.Lock()
	s.seen = append(s.seen, line)
	if s.from == nil {
		s.from = map[string]string{}
	}
	s.from[r.RequestURI] = r.RemoteAddr
	fmt.Fprintf(&s.raw, "%s %v %q\n", line, r.Header, body)
	s.mu.Unlock()
	if r.URL.Path == "/echo-headers" {
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
	}
	for _, p := range pathReadings(r.RequestURI) {
		if strings.HasPrefix(p, "/private") {
			fmt.Fprintf(w, "SECRET-DATA target=%s read=%s", r.RequestURI, p)
			return
		}
	}
	fmt.Fprintf(w, "seen %s", line)
}

// inspectRules: api.test, other.test and bad.test inspected; the secret
// gh goes to api.test in a DM.
func inspectRules(hosts, upstreamCA, secretFile string) string {
	return testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/curl", "/usr/bin/python3", "/usr/bin/cat", "/usr/bin/git", "/usr/lib/git-core/", "/usr/bin/node", "/usr/bin/env"]
network = "policy"
connections = 16
reach_private = ["10.233.0.0/24"]
hosts = "` + hosts + `"

[egress]
inspect = ["api.test", "other.test", "bad.test"]
upstream_ca = "` + upstreamCA + `"

[secrets.gh]
hosts = ["api.test"]
value = "file:` + secretFile + `"
env = "GH_TOKEN"
when = "discord:dm"
`
}

// inspectPolicy: GET and POST, nothing under /private; plain HTTP to
// web.test; tcp nowhere.
const inspectPolicy = `version: 1
roles:
  default:
    tools:
      exec: {mode: allow}
      connect:
        mode: allow
        constraints:
          - args.host in ["api.test", "other.test", "bad.test", "web.test"]
          - args.protocol in ["http", "https"]
          - args.method in ["GET", "POST"]
          - not startswith(args.path, "/private")
`

type inspectHome struct {
	d   *testenv.Daemon
	n   *egressNet
	srv *inspectServer
	ca  string // the daemon's CA key file
}

func newInspectHome(t *testing.T) *inspectHome {
	t.Helper()
	n := newNetAt(t, "cfin", "10.233.0")
	ca, rogue := newTestCA(t, "condfs test upstream CA"), newTestCA(t, "a CA nobody trusts")
	certs := map[string]tls.Certificate{"api.test": ca.leaf(t, "api.test"), "other.test": ca.leaf(t, "other.test"), "bad.test": rogue.leaf(t, "bad.test")}
	srv := &inspectServer{}
	conf := &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, ok := certs[h.ServerName]
		if !ok {
			return nil, fmt.Errorf("no certificate for %q", h.ServerName)
		}
		return &c, nil
	}}
	go http.Serve(tls.NewListener(numbered(n.listen(t, inspectSrv+":443")), conf), http.HandlerFunc(srv.handler))
	go http.Serve(numbered(n.listen(t, inspectSrv+":80")), http.HandlerFunc(srv.handler))
	h := testenv.OpenHome(t, "-")
	hosts := h.Write("config/hosts", inspectSrv+" api.test other.test bad.test web.test\n")
	caFile := h.Write("config/upstream-ca.pem", string(ca.pem))
	secret := h.Write("config/gh-token", inspectValue+"\n")
	os.Chmod(secret, 0o600)
	h.Write("config/conditions.toml", inspectRules(hosts, caFile, secret))
	h.Write("config/policy.yaml", inspectPolicy)
	os.Chmod(h.Path("workspace"), 0o777)
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(h.Path("run"), 0o755)
	d.OpenFor("s", testenv.Nobody, testenv.DM)
	return &inspectHome{d: d, n: n, srv: srv, ca: filepath.Join(h.Path("run"), "egress-ca.key")}
}

// pathReadings are the paths common servers read target as: nginx and Go
// (decode once, merge slashes, remove dot segments), Express (the raw
// path, dot segments removed) and Tomcat.
func pathReadings(target string) []string {
	p, _, _ := strings.Cut(target, "?")
	var out []string
	// nginx / Go: decode once, merge slashes, remove dot segments.
	dec := p
	if u, err := url.PathUnescape(p); err == nil {
		dec = u
	}
	merged := dec
	for strings.Contains(merged, "//") {
		merged = strings.ReplaceAll(merged, "//", "/")
	}
	out = append(out, path.Clean(merged), path.Clean(strings.ReplaceAll(merged, `\`, "/")))
	// Express: the raw path, dot segments removed.
	out = append(out, path.Clean(p))
	// Tomcat.
	out = append(out, tomcatPath(target))
	return out
}
