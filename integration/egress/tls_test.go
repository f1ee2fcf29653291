package egress

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// helloScript builds TLS 1.3 client hellos by hand (hello: any server_name
// extensions; ch: one host name), so that a program can send a first hello
// naming one host and, after the server's HelloRetryRequest, a second one
// naming another.
const helloScript = `
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

// TestEgressSNICheckedOnRetriedHello: the SNI check reads the first client hello
// only. After a HelloRetryRequest (the client offered no key share the
// server takes), the client sends a second hello, relayed unread: an
// OpenSSL server takes that hello's SNI, and switches to the virtual host
// it names (SSL_set_SSL_CTX in the servername callback, as nginx and
// s_server do). A connection decided as https to api.test then serves
// other.test, which the policy denies.
func TestEgressSNICheckedOnRetriedHello(t *testing.T) {
	d, n := netHome(t)
	srvOut := tlsServer(t, n)
	got := egressPy(t, d, helloScript+`
retry("api.test", 8443, "api.test", "other.test")
`)
	checkRetry(t, got, srvOut, d.Log)
}

// TestEgressSNICheckedOnRetriedHelloUnprivileged: the same on the user-namespace
// path (a daemon run by uid 65534).
func TestEgressSNICheckedOnRetriedHelloUnprivileged(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	n := recordNet(t)
	srvOut := tlsServer(t, n)
	h := testenv.OpenHome(t, "-")
	h.Write("config/conditions.toml", egressRetryRules(h.Write("config/hosts", retryHosts)))
	h.Write("config/policy.yaml", egressPolicy)
	sock, logs := testenv.StartUnprivileged(t, h)
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", sock, "--session", "default", "--",
		"python3", "-c", helloScript+`
retry("api.test", 8443, "api.test", "other.test")
`)
	out, _ := cmd.CombinedOutput()
	checkRetry(t, string(out), srvOut, logs)
}

// tlsServer starts openssl s_server on upstreamSrv:8443: -cert for any
// SNI but -servername's, for which it switches to -cert2's context; it
// prints every SNI it reads. It returns its output so far.
func tlsServer(t *testing.T, n *egressNet) func() string {
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
	srv := exec.Command("ip", "netns", "exec", n.ns, "stdbuf", "-o0", "-e0", "openssl", "s_server", "-accept", upstreamSrv+":8443",
		"-cert", filepath.Join(dir, "api.pem"), "-key", filepath.Join(dir, "api.key"),
		"-servername", "other.test", "-cert2", filepath.Join(dir, "other.pem"), "-key2", filepath.Join(dir, "other.key"), "-tls1_3")
	out := &testenv.LogBuffer{}
	srv.Stdout, srv.Stderr = out, out
	stdin, _ := srv.StdinPipe() // s_server ends at its stdin's end: kept open
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); srv.Process.Kill(); srv.Wait() })
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", upstreamSrv+":8443"); err == nil {
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

func checkRetry(t *testing.T, run string, srvOut, logs func() string) {
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

// The tests here build their servers' network as egress_test.go's
// newEgressNet does, under names and addresses of their own (cfa9*,
// 10.239.0.0/24): newEgressNet removes every cfeg* network it finds, and
// so a test of another file run meanwhile took this file's servers away.
const upstreamSrv = "10.239.0.2"

const retryHosts = upstreamSrv + " web.test api.test echo.test other.test\n"

func egressRetryRules(hosts string) string {
	return strings.Replace(egressRules(hosts), `reach_private = ["10.231.0.0/24"]`, `reach_private = ["10.239.0.0/24"]`, 1)
}

func recordNet(t *testing.T) *egressNet { return newNetAt(t, "cfa9", "10.239.0") }

// netHome is egressHomeNet on recordNet: egressPolicy, session s in a
// DM, run by uid 65534.
func netHome(t *testing.T) (*testenv.Daemon, *egressNet) {
	t.Helper()
	n := recordNet(t)
	h := testenv.OpenHome(t, "-")
	h.Write("config/conditions.toml", egressRetryRules(h.Write("config/hosts", retryHosts)))
	h.Write("config/policy.yaml", egressPolicy)
	os.Chmod(h.Path("workspace"), 0o777)
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(h.Path("run"), 0o755)
	d.OpenFor("s", testenv.Nobody, testenv.DM)
	return d, n
}

// newNetAt makes a network namespace named prefix and the pid, joined to
// the host by a veth pair: the host's end subnet.1/24, the namespace's
// subnet.2/24 (the servers' address).
func newNetAt(t *testing.T, prefix, subnet string) *egressNet {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("the egress tests need iproute2's ip: %v", err)
	}
	n := &egressNet{ns: fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)}
	hostEnd, nsEnd := n.ns+"h", n.ns+"n"
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	// A test process killed before its cleanup (a timeout) leaves its
	// network, whose host end then takes this one's traffic: every
	// egress test failed with "connection refused". Remove all of them.
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
				exec.Command("ip", "link", "del", f[0]+"h").Run()
				exec.Command("ip", "netns", "del", f[0]).Run()
			}
		}
	}
	sh("netns", "add", n.ns)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", hostEnd).Run()
		exec.Command("ip", "netns", "del", n.ns).Run()
	})
	sh("link", "add", "name", hostEnd, "type", "veth", "peer", "name", nsEnd)
	sh("link", "set", nsEnd, "netns", n.ns)
	sh("addr", "add", subnet+".1/24", "dev", hostEnd)
	sh("link", "set", hostEnd, "up")
	sh("-n", n.ns, "addr", "add", subnet+".2/24", "dev", nsEnd)
	sh("-n", n.ns, "link", "set", nsEnd, "up")
	sh("-n", n.ns, "link", "set", "lo", "up")
	return n
}

// retryHello extends helloScript: records split, change cipher spec
// records, and one attempt per connection, direct or through the gateway's
// proxy (CONNECT).
const retryHello = helloScript + `
import time
def split(r, k):
    body = r[5:]
    step = (len(body) + k - 1) // k
    return [r[:3] + struct.pack(">H", len(body[i:i+step])) + body[i:i+step] for i in range(0, len(body), step)]
CCS = bytes([20, 3, 3, 0, 1, 1])
def go(name, pre, after, proxy=False):
    try:
        if proxy:
            s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
            s.sendall(b"CONNECT api.test:8443 HTTP/1.1\r\nHost: api.test:8443\r\n\r\n")
            h = b""
            while b"\r\n\r\n" not in h:
                b = s.recv(1)
                if not b: break
                h += b
            print(name, "proxy said", h.split(b"\r\n")[0], flush=True)
        else:
            s = socket.create_connection(("api.test", 8443), timeout=5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(pre)
        r = rec(s)
        print(name, "first answer", "hrr" if r and r[11:43] == HRR else repr(r)[:60], flush=True)
        for chunk, pause in after:
            s.sendall(chunk)
            time.sleep(pause)
        for i in range(3):
            r = rec(s)
            if not r: break
            print(name, "then record", r[:6].hex(), flush=True)
    except Exception as e:
        print(name, "ended", type(e).__name__, e, flush=True)
sid = os.urandom(32)
API = [[(0, "api.test")]]
OTHER = [[(0, "other.test")]]
def share(): return os.urandom(32)
`

// TestEgressRetriedHelloEvasionsRefused: the second client hello after a
// HelloRetryRequest, hidden from the guard (egress/flow.go helloGuard):
// preceded by change cipher spec records and split across records and TCP
// segments; pipelined with the first hello before the retry request; in
// upper case; in a second server_name entry or extension; after early
// data; and through the proxy's CONNECT. openssl s_server must never read
// other.test; a second hello naming api.test still goes through.
func TestEgressRetriedHelloEvasionsRefused(t *testing.T) {
	d, n := netHome(t)
	srvOut := tlsServer(t, n)
	out := egressPy(t, d, retryHello+`
first = hello(API, None, sid)
parts = split(hello(OTHER, share(), sid), 3)
go("ccs-split", first, [(CCS, 0.1), (CCS, 0.1), (CCS, 0.1), (parts[0][:7], 0.2), (parts[0][7:], 0.2), (parts[1], 0.2), (parts[2], 0.2)])
go("pipelined", first + CCS + hello(OTHER, share(), sid), [])
go("upper", first, [(hello([[(0, "OTHER.TEST")]], share(), sid), 0)])
go("two-entries", first, [(hello([[(0, "api.test"), (0, "other.test")]], share(), sid), 0)])
go("type1-first", first, [(hello([[(1, "other.test"), (0, "api.test")]], share(), sid), 0)])
go("two-extensions", first, [(hello([[(0, "api.test")], [(0, "other.test")]], share(), sid), 0)])
go("early-data", first + bytes([23, 3, 3, 0, 5]) + b"hello", [(hello(OTHER, share(), sid), 0)])
go("connect", first, [(CCS + hello(OTHER, share(), sid), 0)], proxy=True)
go("connect-split", first, [(b"".join(split(hello(OTHER, share(), sid), 4)), 0)], proxy=True)
go("control", first, [(CCS + hello(API, share(), sid), 0)])
go("control-proxy", first, [(hello(API, share(), sid), 0)], proxy=True)
`)
	time.Sleep(300 * time.Millisecond)
	srv := srvOut()
	t.Logf("run:\n%s\nserver:\n%s", out, srv)
	for _, c := range []string{"control", "control-proxy"} {
		if !strings.Contains(out, c+" then record 16") {
			t.Errorf("setup: a second hello naming api.test (%s) was not answered with a server hello:\n%s", c, testenv.Tail(d.Log(), 30))
		}
	}
	low := strings.ToLower(srv)
	if strings.Contains(low, "other.test") || strings.Contains(low, "switching server context") {
		t.Errorf("HOLE: a connection decided as https api.test:8443 made the server read SNI other.test (a second client hello the guard did not check)")
	}
}
