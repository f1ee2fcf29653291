package integration

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
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// egressNet is a network namespace of the test's own holding its servers,
// reached from the host (where the daemon dials) by a veth pair:
// 10.231.0.1 on the host's end, 10.231.0.2 on the servers'.
type egressNet struct {
	ns string
}

const egressSrv = "10.231.0.2"

func newEgressNet(t *testing.T) *egressNet { return newNetAt(t, "cfeg", "10.231.0") }

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
	return privateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/curl", "/usr/bin/python3", "/usr/bin/cat"]
network = "policy"
connections = 8
reach_private = ["10.231.0.0/24"]
hosts = "` + hosts + `"
`
}

// egressPolicy: web.test by plain HTTP, GET only and nothing under
// /private; api.test by HTTPS only in a DM; echo.test by TCP only in a DM;
// loop.test and meta.test allowed by name (their addresses are refused).
const egressPolicy = `version: 1
roles:
  default:
    tools:
      exec: {mode: allow}
      connect:
        mode: allow
        constraints:
          - args.host in ["web.test", "api.test", "echo.test", "loop.test", "meta.test"]
          - args.protocol != "http" or args.method == "GET"
          - args.protocol != "http" or not startswith(args.path, "/private")
          - args.host != "api.test" or (args.protocol == "https" and when("discord:dm"))
          - args.host != "echo.test" or when("discord:dm")
`

const egressHosts = egressSrv + " web.test api.test echo.test other.test\n127.0.0.1 loop.test\n169.254.169.254 meta.test\n"

func egressHome(t *testing.T) *daemon {
	t.Helper()
	d, _ := egressHomeNet(t)
	return d
}

func egressHomeNet(t *testing.T) (*daemon, *egressNet) {
	t.Helper()
	n := newEgressNet(t)
	n.serve(t)
	h := openHome(t, "-")
	h.t = t
	hosts := h.write("config/hosts", egressHosts)
	h.write("config/conditions.toml", egressRules(hosts))
	h.write("config/policy.yaml", egressPolicy)
	os.Chmod(h.path("workspace"), 0o777)
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(h.path("run"), 0o755)
	d.openFor("s", nobody, dmCtx)
	return d, n
}

// TestEgress: network = "policy" as the run sees it, through the proxy and
// without it.
func TestEgress(t *testing.T) {
	d := egressHome(t)
	run := func(args ...string) (string, int) {
		t.Helper()
		return condfsRun(t, d, "", append([]string{"--"}, args...)...)
	}
	curl := func(args ...string) (string, int) {
		t.Helper()
		return run(append([]string{"curl", "-sS", "--max-time", "10"}, args...)...)
	}
	cases := []struct {
		name string
		args []string
		want string // in the output
		ok   bool
	}{
		{"proxy: allowed GET", []string{"http://web.test/a/./b/../c?x=1"}, "GET /a/c?x=1 host=web.test", true},
		{"proxy: denied path", []string{"http://web.test/private/k"}, "403", true},
		{"proxy: denied method", []string{"-X", "POST", "http://web.test/a"}, "403", true},
		{"proxy: denied name", []string{"http://other.test/"}, "403", true},
		{"direct: allowed GET", []string{"--noproxy", "*", "http://web.test/%7Ex"}, "GET /~x host=web.test", true},
		{"direct: denied path, encoded", []string{"--noproxy", "*", "http://web.test/%70rivate/k"}, "403", true},
		{"direct: Host names another host", []string{"--noproxy", "*", "-H", "Host: other.test", "http://web.test/a"}, "400", true},
		{"proxy: CONNECT https", []string{"-k", "https://api.test/v1"}, "api /v1", true},
		{"direct: https", []string{"-k", "--noproxy", "*", "https://api.test/v2"}, "api /v2", true},
		{"direct: SNI names another host", []string{"-k", "--noproxy", "*", "--connect-to", "api.test:443:web.test:443", "https://api.test/"}, "", false},
		{"proxy: loopback by name", []string{"http://loop.test/"}, "403", true},
		{"direct: metadata by name", []string{"--noproxy", "*", "http://meta.test/latest/meta-data/"}, "403", true},
		{"proxy: CONNECT to a denied name", []string{"-k", "https://other.test/"}, "403", false},
	}
	for _, c := range cases {
		out, code := curl(append([]string{"-i"}, c.args...)...)
		if !strings.Contains(out, c.want) || (code == 0) != c.ok {
			t.Errorf("%s: exit %d, want %v, %q not in\n%s", c.name, code, c.ok, c.want, out)
		}
	}
	if out, code := run("/bin/sh", "-c", noCapsScript); code != 0 || strings.TrimSpace(out) != noCaps {
		t.Errorf("the command's capabilities: exit %d\n%s\nwant\n%s", code, out, noCaps)
	}
	logs := d.log()
	for _, want := range []string{
		`"host":"web.test","port":443,"protocol":"https","decision":"deny","reasons":["the client hello names \"api.test\", not \"web.test\""]`,
		`"host":"loop.test","port":80,"protocol":"http","method":"GET","path":"/","addr":"127.0.0.1","decision":"allow","reasons":[],"refused":"loop.test resolves to 127.0.0.1, a local, private or reserved address (127.0.0.0/8), which reach_private does not list"`,
		`"addr":"169.254.169.254","decision":"allow","reasons":[],"refused":"meta.test resolves to 169.254.169.254`,
		`"host":"web.test","port":80,"protocol":"http","method":"GET","path":"/private/k","decision":"deny"`,
		`"host":"other.test","port":443,"protocol":"https","decision":"deny"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %s in the audit log", want)
		}
	}
	if t.Failed() {
		t.Log(logs)
	}
}

// noCapsScript prints the command's capability sets and no_new_privs; a
// run of network "policy" gets its init extra capabilities (the capture's
// sockets), and none of them may reach the command.
const noCapsScript = `while read k v; do case $k in Cap*|NoNewPrivs:) echo $k $v;; esac; done </proc/self/status`

const noCaps = "CapInh: 0000000000000000\nCapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nCapAmb: 0000000000000000\nNoNewPrivs: 1"

// egressLive starts a Python program in a run of session, as uid 65534,
// that the test talks to: its stdin, and a reader of its output's lines
// ("" at its end). The run is ended with the test.
func egressLive(t *testing.T, d *daemon, session, code string) (io.WriteCloser, func() string) {
	t.Helper()
	return egressLiveAs(t, d, nobody, session, code)
}

// egressLiveAs is egressLive as uid.
func egressLiveAs(t *testing.T, d *daemon, uid int, session, code string) (io.WriteCloser, func() string) {
	t.Helper()
	u := strconv.Itoa(uid)
	cmd := exec.Command("setpriv", "--reuid="+u, "--regid="+u, "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", session, "--",
		"python3", "-u", "-c", code)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	rd := bufio.NewReader(stdout)
	return stdin, func() string {
		l, _ := rd.ReadString('\n')
		return strings.TrimSpace(l)
	}
}

// egressPy runs a Python program in the run and returns its output.
func egressPy(t *testing.T, d *daemon, code string) string {
	t.Helper()
	out, _ := condfsRun(t, d, "", "--", "python3", "-c", code)
	return out
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

// TestEgressAttacks: what a program that ignores the proxy, or speaks
// to it badly, reaches: nothing the policy did not decide.
func TestEgressAttacks(t *testing.T) {
	d, n := egressHomeNet(t)
	dnsGot := n.udpCount(t, egressSrv+":53")
	udpGot := n.udpCount(t, egressSrv+":9999")
	cases := []struct{ name, code, want string }{
		{"a literal address the policy does not name", `
import socket
s = socket.create_connection(("` + egressSrv + `", 80), timeout=5)
s.sendall(b"GET / HTTP/1.1\r\nHost: ` + egressSrv + `\r\n\r\n")
try:
    print("got", s.recv(100))
except Exception as e:
    print("refused", type(e).__name__)
`, "403 Forbidden"},
		{"DNS exfiltration: a TXT query with long labels, to the servers' own resolver", `
import socket, struct
name = b"".join(bytes([63]) + b"s" * 63 for _ in range(3)) + b"\x04exfl\x04test\x00"
q = struct.pack(">HHHHHH", 7, 0x100, 1, 0, 0, 0) + name + struct.pack(">HH", 16, 1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(3)
u.sendto(q, ("` + egressSrv + `", 53))
r = u.recv(4096)
print("answers", struct.unpack(">H", r[6:8])[0])
`, "answers 0"},
		{"UDP other than DNS", `
import socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(1)
try:
    for i in range(5):
        u.sendto(b"x" * 100, ("` + egressSrv + `", 9999))
    u.recv(10)
except socket.timeout:
    print("no answer")  # the netstack capture drops it
except PermissionError:
    print("no answer")  # the kernel capture refuses it
`, "no answer"},
		{"ICMP and raw sockets", `
import socket
for kind in (socket.SOCK_RAW, socket.SOCK_DGRAM):
    try:
        s = socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP)
        s.settimeout(1)
        s.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", ("` + egressSrv + `", 0))
        print("reply", s.recv(100))
    except Exception as e:
        print("none", type(e).__name__)
`, "none"},
		{"other families and protocols: IPv6, v4-mapped, the capture's own socket, UDP-Lite", `
import socket, struct
srv = "` + egressSrv + `"
q = struct.pack(">HHHHHH", 7, 0x100, 1, 0, 0, 0) + b"\x03web\x04test\x00" + struct.pack(">HH", 1, 1)
def v6():
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(("2001:db8::1", 80))
    return True
def mapped():
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(("::ffff:" + srv, 80))
    s.sendall(b"GET / HTTP/1.1\r\nHost: " + srv.encode() + b"\r\n\r\n")
    return not s.recv(100).startswith(b"HTTP/1.1 403 Forbidden")
def capture():
    s = socket.create_connection(("127.255.0.1", 1), timeout=3)
    s.sendall(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
    return s.recv(100) != b""
def udplite():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136)
    u.settimeout(1)
    u.sendto(q, (srv, 53))
    return u.recv(100) != b""
for name, f in (("v6", v6), ("mapped", mapped), ("capture", capture), ("udplite", udplite)):
    try:
        print("escaped" if f() else "held", name)
    except Exception as e:
        print("held", name)
`, "held v6\nheld mapped\nheld capture\nheld udplite"},
		{"a malformed proxy request", `
import socket
s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
s.sendall(b"GARBAGE\r\n\r\n")
print(s.recv(100).split(b"\r\n")[0].decode())
`, "HTTP/1.1 400 Bad Request"},
		{"a proxy request whose Host names another host", `
import socket
s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
s.sendall(b"GET http://web.test/a HTTP/1.1\r\nHost: other.test\r\n\r\n")
print(s.recv(100).split(b"\r\n")[0].decode())
`, "HTTP/1.1 400 Bad Request"},
		{"a request smuggled in a folded header", `
import socket
s = socket.create_connection(("web.test", 80), timeout=5)
s.sendall(b"GET /a HTTP/1.1\r\nHost: web.test\r\nX: y\r\n Transfer-Encoding: chunked\r\n\r\n")
print(s.recv(100).split(b"\r\n")[0].decode())
`, "HTTP/1.1 400 Bad Request"},
		{"a second request on a kept-alive connection, denied", `
import socket
s = socket.create_connection(("web.test", 80), timeout=5)
s.sendall(b"GET /a HTTP/1.1\r\nHost: web.test\r\n\r\nGET /private/x HTTP/1.1\r\nHost: web.test\r\n\r\n")
got = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    got += b
print(got.decode())
`, "403 Forbidden"},
		{"a CONNECT whose client hello names another host", `
import socket, ssl
s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
s.sendall(b"CONNECT web.test:443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n")
print(s.recv(100).split(b"\r\n")[0].decode())
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:
    t = ctx.wrap_socket(s, server_hostname="api.test")
    print("handshake", t.version())
except Exception as e:
    print("refused", type(e).__name__)
`, "HTTP/1.1 200 Connection established\nrefused"},
		{"the connection limit", `
import socket
ok = 0
conns = []
for i in range(12):
    try:
        c = socket.create_connection(("echo.test", 7000), timeout=5)
        conns.append(c)
        if c.recv(7) == b"banner\n":
            ok += 1
    except Exception:
        pass
print("banners", ok)
`, "banners 8"},
	}
	for _, c := range cases {
		if out := egressPy(t, d, c.code); !strings.Contains(out, c.want) {
			t.Errorf("%s: %q not in\n%s", c.name, c.want, out)
		}
	}
	if g := dnsGot(); g != 0 {
		t.Errorf("%d DNS queries reached the servers' resolver", g)
	}
	if g := udpGot(); g != 0 {
		t.Errorf("%d datagrams reached the servers", g)
	}
	if t.Failed() {
		t.Log(d.log())
	}
}

// egressStack is the capture the tests' runs get: the kernel's on this
// project's machines (nftables NAT built in), unless
// CONDFS_TEST_EGRESS_CAPTURE names one.
func egressStack() string {
	if c := os.Getenv("CONDFS_TEST_EGRESS_CAPTURE"); c != "" {
		return c
	}
	return "kernel"
}

// TestEgressCut: a context switch cuts an open connection the new context
// denies before it returns; one it allows stays.
func TestEgressCut(t *testing.T) {
	d, _ := egressHomeNet(t)
	stdin, line := egressLive(t, d, "s", `
import socket, sys, time
e = socket.create_connection(("echo.test", 7000), timeout=30)
w = socket.create_connection(("web.test", 80), timeout=30)
print(e.recv(7).decode().strip(), flush=True)
sys.stdin.readline()
try:
    e.sendall(b"ping")
    got = e.recv(4)
    print("echo", got, flush=True)
except Exception as x:
    print("echo cut", type(x).__name__, flush=True)
w.sendall(b"GET /still HTTP/1.1\r\nHost: web.test\r\n\r\n")
print("web", w.recv(4096).split(b"\r\n")[0].decode(), flush=True)
`)
	if l := line(); l != "banner" {
		t.Fatalf("first line %q\n%s", l, d.log())
	}
	egressOpen := func() int {
		var st struct {
			Egress struct {
				Network     string `json:"network"`
				Connections int    `json:"connections"`
				Stack       string `json:"stack"`
			} `json:"egress"`
		}
		d.call("status", map[string]any{}, &st)
		if st.Egress.Network != "policy" {
			t.Errorf("status.egress.network %q", st.Egress.Network)
		}
		if want := egressStack(); st.Egress.Stack != want {
			t.Errorf("status.egress.stack %q, want %q", st.Egress.Stack, want)
		}
		return st.Egress.Connections
	}
	if n := egressOpen(); n != 2 {
		t.Errorf("status.egress.connections %d with two open", n)
	}
	d.setContext("s", guildCtx)
	io.WriteString(stdin, "go\n")
	if l := line(); !strings.HasPrefix(l, "echo cut") && l != "echo b''" {
		t.Errorf("the echo connection after the switch: %q", l)
	}
	if l := line(); l != "web HTTP/1.1 200 OK" {
		t.Errorf("the web connection after the switch: %q", l)
	}
	if l := line(); l != "" {
		t.Errorf("more output: %q", l)
	}
	d.within("the run's connections to be released", func() bool { return egressOpen() == 0 })
	if !strings.Contains(d.log(), `"host":"echo.test","port":7000,"protocol":"tcp"`) || !strings.Contains(d.log(), `"refused":"cut: the context or the policy changed"`) {
		t.Errorf("no cut in the audit log:\n%s", d.log())
	}
}

// TestEgressUnprivilegedDaemon: network = "policy" on the user-namespace
// path (a daemon run by uid 65534): the same gateway, the same decisions.
func TestEgressUnprivilegedDaemon(t *testing.T) {
	requireUnprivilegedFUSE(t)
	n := newEgressNet(t)
	n.serve(t)
	h := openHome(t, "-")
	h.t = t
	hosts := h.write("config/hosts", egressHosts)
	h.write("config/conditions.toml", egressRules(hosts))
	h.write("config/policy.yaml", egressPolicy)
	sock, logs := startUnprivDaemon(t, h)
	run := func(args ...string) (string, int) {
		cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", sock, "--session", "default", "--"}, args...)...)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"curl", "-sS", "--max-time", "10", "http://web.test/x"}, "GET /x host=web.test"},
		{[]string{"curl", "-sS", "--max-time", "10", "--noproxy", "*", "http://web.test/y"}, "GET /y host=web.test"},
		{[]string{"curl", "-sS", "--max-time", "10", "-i", "--noproxy", "*", "http://web.test/private/z"}, "403 Forbidden"},
		{[]string{"curl", "-sS", "--max-time", "10", "-k", "https://api.test/v"}, "api /v"},
	} {
		if out, _ := run(c.args...); !strings.Contains(out, c.want) {
			t.Errorf("%v: %q not in\n%s", c.args, c.want, out)
		}
	}
	// The seccomp filter's socket families hold on this path too.
	out, _ := run("python3", "-c", familiesProbe)
	checkFamilies(t, out)
	// The init of this path holds capabilities in its namespace (to
	// build the root and the capture); the command holds none.
	if out, code := run("/bin/sh", "-c", noCapsScript); code != 0 || strings.TrimSpace(out) != noCaps {
		t.Errorf("the command's capabilities: exit %d\n%s\nwant\n%s", code, out, noCaps)
	}
	if t.Failed() {
		t.Log(logs())
	}
}
