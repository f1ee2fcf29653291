package egress

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestEgress: network = "policy" as the run sees it, through the proxy and
// without it.
func TestEgress(t *testing.T) {
	d := egressHome(t)
	run := func(args ...string) (string, int) {
		t.Helper()
		return testenv.CondfsRun(t, d, "", append([]string{"--"}, args...)...)
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
	logs := d.Log()
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

// TestEgressRefusesEvasions: what a program that ignores the proxy, or speaks
// to it badly, reaches: nothing the policy did not decide.
func TestEgressRefusesEvasions(t *testing.T) {
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
		t.Log(d.Log())
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
		t.Fatalf("first line %q\n%s", l, d.Log())
	}
	egressOpen := func() int {
		var st struct {
			Egress struct {
				Network     string `json:"network"`
				Connections int    `json:"connections"`
				Stack       string `json:"stack"`
			} `json:"egress"`
		}
		d.Call("status", map[string]any{}, &st)
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
	d.SetContext("s", testenv.Guild)
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
	d.Within("the run's connections to be released", func() bool { return egressOpen() == 0 })
	if !strings.Contains(d.Log(), `"host":"echo.test","port":7000,"protocol":"tcp"`) || !strings.Contains(d.Log(), `"refused":"cut: the context or the policy changed"`) {
		t.Errorf("no cut in the audit log:\n%s", d.Log())
	}
}

// TestEgressUnprivilegedDaemon: network = "policy" on the user-namespace
// path (a daemon run by uid 65534): the same gateway, the same decisions.
func TestEgressUnprivilegedDaemon(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	n := newEgressNet(t)
	n.serve(t)
	h := testenv.OpenHome(t, "-")
	hosts := h.Write("config/hosts", egressHosts)
	h.Write("config/conditions.toml", egressRules(hosts))
	h.Write("config/policy.yaml", egressPolicy)
	sock, logs := testenv.StartUnprivileged(t, h)
	run := func(args ...string) (string, int) {
		cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), append([]string{"run", "--socket", sock, "--session", "default", "--"}, args...)...)
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

// familiesProbe tries every socket family a run might reach the world by;
// it prints "created NAME" for each it got. On a host with a virtio vsock
// device (these VMs), vsock also tells whether its port space is the
// host's.
const familiesProbe = `
import socket, errno
for fam, name in ((40, "vsock"), (30, "tipc"), (21, "rds"), (29, "can"), (31, "bluetooth"), (38, "alg"), (41, "kcm"), (42, "qipcrtr"), (43, "smc"), (44, "xdp"), (45, "mctp"), (4, "ipx"), (5, "appletalk"), (9, "x25"), (3, "ax25"), (36, "ieee802154"), (37, "caif"), (18, "ash"), (17, "packet"), (16, "netlink")):
    for typ in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
        try:
            socket.socket(fam, typ, 0)
            print("created", name)
            break
        except OSError:
            pass
    else:
        print("none", name)
try:
    s = socket.socket(40, socket.SOCK_STREAM)
    s.bind((socket.VMADDR_CID_ANY, 47123))
    print("vsock bind: own port space")
except OSError as e:
    print("vsock bind:", errno.errorcode[e.errno])
`

// checkFamilies fails t unless the probe's run created netlink sockets
// alone, and vsock answered EAFNOSUPPORT.
func checkFamilies(t *testing.T, out string) {
	t.Helper()
	if !strings.Contains(out, "none netlink") && !strings.Contains(out, "created netlink") {
		t.Fatalf("the probe did not finish:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "created ") && line != "created netlink" {
			t.Errorf("HOLE: %s", line)
		}
	}
	if !strings.Contains(out, "vsock bind: EAFNOSUPPORT") {
		t.Errorf("vsock: want EAFNOSUPPORT\n%s", out)
	}
}
