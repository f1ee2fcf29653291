package egress

import (
	"strings"
	"testing"
)

// TestEgressCaptureProbesRefused: probes of the
// kernel capture's corners (all held, on both captures), each a Python
// program in a run; a line "HOLE ..." in the output is a break: TCP Fast
// Open, urgent data, the capture's and the run's own addresses, binding
// the capture's port, IP options, namespaces and raw sockets, non-DNS and
// oversized datagrams to port 53, DNS over TCP, many servers from one
// socket, one source port to two destinations.
func TestEgressCaptureProbesRefused(t *testing.T) {
	d, n := egressHomeNet(t)
	n.pyServer(t)
	dnsGot := n.udpCount(t, egressSrv+":53")
	tcp53 := n.listen(t, egressSrv+":53")
	tcp53Got := make(chan struct{}, 100)
	go func() {
		for {
			c, err := tcp53.Accept()
			if err != nil {
				return
			}
			tcp53Got <- struct{}{}
			c.Close()
		}
	}()
	cases := []struct{ name, code string }{
		{"TCP Fast Open: data in the SYN", pyRaw + `
import socket
MSG_FASTOPEN = 0x20000000
for dst, host in ((("` + egressSrv + `", 8000), "` + egressSrv + `"), (("web.test", 8000), "web.test")):
    a = socket.getaddrinfo(dst[0], dst[1], socket.AF_INET)[0][4]
    s = socket.socket()
    try:
        s.sendto(b"GET /private/secret.txt HTTP/1.0\r\nHost: " + host.encode() + b":8000\r\n\r\n", MSG_FASTOPEN, a)
        s.settimeout(5)
        got = readall(s)
    except Exception as e:
        got = b"<" + type(e).__name__.encode() + b">"
    print("HOLE tfo" if b"SECRET-DATA" in got else "held tfo", host, got[:60])
`},
		{"urgent data", pyRaw + `
import socket
s = socket.create_connection(("web.test", 8000), timeout=5)
s.send(b"GET /privat")
s.send(b"e", socket.MSG_OOB)
s.sendall(b"/secret.txt HTTP/1.0\r\nHost: web.test:8000\r\n\r\n")
got = readall(s)
print("HOLE oob" if b"SECRET-DATA" in got else "held oob", got[:60])
s = socket.create_connection(("web.test", 8000), timeout=5)
s.send(b"GET /pub/ok.txt HTTP/1.1\r\nHost: web.test:8000\r\n\r\n")
s.send(b"G", socket.MSG_OOB)
s.sendall(b"ET /private/secret.txt HTTP/1.0\r\nHost: web.test:8000\r\n\r\n")
got = readall(s)
print("HOLE oob2" if b"SECRET-DATA" in got else "held oob2", got[:60])
`},
		{"the run's own address and the capture's", pyRaw + `
import socket
for dst in (("198.19.0.2", 1), ("127.255.0.1", 1), ("127.0.0.1", 1), ("198.19.0.1", 1), ("198.19.0.1", 53), ("198.19.0.1", 80)):
    try:
        s = socket.create_connection(dst, timeout=3)
        s.sendall(b"GET /private/secret.txt HTTP/1.0\r\nHost: web.test:8000\r\n\r\n")
        got = readall(s)
    except Exception as e:
        got = b"<" + type(e).__name__.encode() + b">"
    print("HOLE own" if b"SECRET" in got or b"HTTP/1" in got else "held own", dst, got[:50])
`},
		{"binding the capture's address and port", `
import socket
for typ in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
    for addr in (("0.0.0.0", 1), ("127.255.0.1", 1), ("198.19.0.2", 1), ("0.0.0.0", 53), ("127.255.0.1", 53)):
        for opt in (socket.SO_REUSEADDR, socket.SO_REUSEPORT):
            s = socket.socket(socket.AF_INET, typ)
            s.setsockopt(socket.SOL_SOCKET, opt, 1)
            try:
                s.bind(addr)
                print("HOLE bind", typ, addr, opt)
            except Exception as e:
                print("held bind", typ, addr, opt, type(e).__name__)
# another port of the capture's address: the run's own loopback
s = socket.socket()
s.bind(("127.255.0.1", 8080)); s.listen(5)
c = socket.create_connection(("web.test", 8080), timeout=5)
c.sendall(b"GET /pub/ok.txt HTTP/1.0\r\nHost: web.test:8000\r\n\r\n")
s.settimeout(1)
try:
    s.accept()
    print("HOLE own listener took a captured connection")
except socket.timeout:
    print("held own listener")
print("unpriv", open("/proc/sys/net/ipv4/ip_unprivileged_port_start").read().strip())
`},
		{"IP options: source routes", pyRaw + `
import socket, struct
web = socket.gethostbyname("web.test")
def lsrr(*hops):
    body = b"".join(socket.inet_aton(h) for h in hops)
    opt = bytes([0x83, 3 + len(body), 4]) + body
    return opt + b"\x01" * (-len(opt) % 4)
for first, final, want in ((web, "` + egressSrv + `", "web"), ("` + egressSrv + `", web, "literal")):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, lsrr(first))
        s.connect((final, 8000))
        s.sendall(b"GET /private/secret.txt HTTP/1.0\r\nHost: web.test:8000\r\n\r\n")
        got = readall(s)
    except Exception as e:
        got = b"<" + type(e).__name__.encode() + b" " + str(e).encode() + b">"
    print("HOLE lsrr" if b"SECRET" in got else "held lsrr", want, got[:70])
for opt in (bytes([7, 7, 4, 0, 0, 0, 0, 1]), bytes([0x44, 8, 5, 0, 0, 0, 0, 0])):
    try:
        s = socket.socket(); s.settimeout(5)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, opt)
        s.connect(("web.test", 8000))
        s.sendall(b"GET /pub/ok.txt HTTP/1.0\r\nHost: web.test:8000\r\n\r\n")
        print("opt", opt[0], readall(s)[:20])
    except Exception as e:
        print("opt", opt[0], type(e).__name__, e)
`},
		{"namespaces and raw sockets", `
import ctypes, socket, os
libc = ctypes.CDLL(None, use_errno=True)
for flags, name in ((0x10000000, "user"), (0x40000000, "net"), (0x10000000 | 0x40000000, "user+net")):
    r = libc.unshare(flags)
    print("HOLE unshare" if r == 0 else "held unshare", name, os.strerror(ctypes.get_errno()))
    r = libc.syscall(56, flags | 17, 0, 0, 0, 0)  # clone
    if r == 0:
        os._exit(0)
    print("HOLE clone" if r > 0 else "held clone", name, os.strerror(ctypes.get_errno()))
for fam, typ, proto in ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP), (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP),
                        (socket.AF_INET, socket.SOCK_RAW, 255), (17, socket.SOCK_RAW, 0x300), (17, socket.SOCK_DGRAM, 0x300)):
    try:
        socket.socket(fam, typ, proto)
        print("HOLE raw", fam, typ, proto)
    except Exception as e:
        print("held raw", fam, typ, proto, type(e).__name__)
# nftables over netlink: list then delete table condfs
NETLINK_NETFILTER = 12
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    import struct
    NFNL_SUBSYS_NFTABLES = 10
    NFT_MSG_DELTABLE = 2
    name = b"condfs\x00"
    attr = struct.pack("=HH", 4 + len(name), 1) + name + b"\x00" * (-len(name) % 4)
    nfgen = struct.pack("=BBH", 2, 0, 0)
    def msg(typ, flags, payload, seq):
        return struct.pack("=IHHII", 16 + len(payload), typ, flags, seq, 0) + payload
    batch = msg(0x10, 1, struct.pack("=BBH", 0, 0, NFNL_SUBSYS_NFTABLES << 0), 1)
    body = msg((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_DELTABLE, 1 | 4, nfgen + attr, 2)
    end = msg(0x11, 1, struct.pack("=BBH", 0, 0, NFNL_SUBSYS_NFTABLES), 3)
    s.send(batch + body + end)
    s.settimeout(2)
    r = s.recv(4096)
    err = struct.unpack("=i", r[16:20])[0] if len(r) >= 20 else None
    print("held nft" if err and err < 0 else "HOLE? nft", err)
except Exception as e:
    print("held nft", type(e).__name__, e)
`},
		{"UDP 53 that is not DNS, and huge queries", `
import socket, struct
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(1)
srv = ("` + egressSrv + `", 53)
sent = 0
for p in (b"hello world", b"\x00" * 12, b"x" * 1400, b"y" * 60000, struct.pack(">HHHHHH", 9, 0x100, 1, 0, 0, 0) + b"\x03web\x04test\x00" + struct.pack(">HH", 1, 1) + b"z" * 30000,
          struct.pack(">HHHHHH", 10, 0x8100, 1, 0, 0, 0) + b"\x03web\x04test\x00" + struct.pack(">HH", 1, 1)):
    try:
        u.sendto(p, srv); sent += 1
    except Exception as e:
        print("send", len(p), type(e).__name__)
    try:
        r, a = u.recvfrom(70000)
        print("reply", len(p), len(r), a)
    except socket.timeout:
        print("no reply", len(p))
print("sent", sent)
`},
		{"DNS over TCP", pyRaw + `
import socket, struct
q = struct.pack(">HHHHHH", 7, 0x100, 1, 0, 0, 0) + b"\x03web\x04test\x00" + struct.pack(">HH", 1, 1)
for dst in (("` + egressSrv + `", 53), ("198.19.0.1", 53), ("8.8.8.8", 53)):
    try:
        s = socket.create_connection(dst, timeout=5)
        s.sendall(struct.pack(">H", len(q)) + q)
        got = readall(s)
    except Exception as e:
        got = b"<" + type(e).__name__.encode() + b">"
    print("tcp53", dst, got[:40])
`},
		{"the resolver asked at many servers", `
import socket, struct, time
servers = ["1.1.1.1", "9.9.9.9", "8.8.8.8", "` + egressSrv + `", "198.19.0.1", "203.0.113.7", "127.0.0.53"]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(1)
for i, s in enumerate(servers):
    q = struct.pack(">HHHHHH", 100 + i, 0x100, 1, 0, 0, 0) + b"\x03web\x04test\x00" + struct.pack(">HH", 1, 1)
    try:
        u.sendto(q, (s, 53))
    except Exception as e:
        print("send", s, type(e).__name__)
got = {}
while True:
    try:
        r, a = u.recvfrom(512)
    except socket.timeout:
        break
    got[struct.unpack(">H", r[:2])[0] - 100] = a[0]
for i, s in enumerate(servers):
    print("same-socket", s, "->", got.get(i, "NO REPLY"), "" if got.get(i, s) == s else "WRONG SOURCE")
for s in servers:
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.settimeout(1)
    try:
        c.connect((s, 53))
        c.send(struct.pack(">HHHHHH", 5, 0x100, 1, 0, 0, 0) + b"\x03web\x04test\x00" + struct.pack(">HH", 1, 1))
        print("connected", s, len(c.recv(512)))
    except Exception as e:
        print("connected", s, type(e).__name__)
`},
		{"one source port to two destinations", pyRaw + `
import socket
web = socket.gethostbyname("web.test")
def sock(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.settimeout(4)
    s.bind(("0.0.0.0", port))
    return s
a = sock(0)
port = a.getsockname()[1]
b = sock(port)
a.connect((web, 8000))
try:
    b.connect(("` + egressSrv + `", 8000))
    b.sendall(b"GET /private/secret.txt HTTP/1.0\r\nHost: ` + egressSrv + `:8000\r\n\r\n")
    gb = readall(b)
except Exception as e:
    gb = b"<" + type(e).__name__.encode() + b">"
a.sendall(b"GET /pub/ok.txt HTTP/1.0\r\nHost: web.test:8000\r\n\r\n")
ga = readall(a)
print("a(web.test)", ga[:40], "| b(literal)", gb[:60])
print("HOLE clash" if b"SECRET" in gb or b"SECRET" in ga else "held clash")
`},
	}
	for _, c := range cases {
		out := egressPy(t, d, c.code)
		t.Logf("%s:\n%s", c.name, out)
		if strings.Contains(out, "HOLE") || strings.Contains(out, "SECRET-DATA") {
			t.Errorf("HOLE %s", c.name)
		}
	}
	if g := dnsGot(); g != 0 {
		t.Errorf("HOLE %d datagrams reached the servers' port 53", g)
	}
	if len(tcp53Got) != 0 {
		t.Errorf("HOLE %d TCP connections reached the servers' port 53", len(tcp53Got))
	}
	var conn []string
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, `"msg":"connect"`) {
			conn = append(conn, l)
		}
	}
	t.Logf("audit:\n%s", strings.Join(conn, "\n"))
}
