package integration

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestAttack2EgressSniff: request lines Python's http.server reads as a
// request that the gateway classified "tcp" (allowed for web.test), so the
// policy's http rules (GET only, nothing under /private) never applied:
// each was served /private/secret.txt (second attacker review). Now each
// is classified http and refused.
func TestAttack2EgressSniff(t *testing.T) {
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
		logs := d.log()
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, `"msg":"connect"`) && strings.Contains(l, "8000") {
				t.Log(l)
			}
		}
	}
}

// TestAttack2EgressNodeSlots: one session's runs took every one of the
// node's 1024 egress connections (4 runs at the per-run default of 256,
// each merely holding idle connections), and another session's run could
// open none. A session's runs now share one run's bound.
func TestAttack2EgressNodeSlots(t *testing.T) {
	d := egressHomeUnbounded(t)
	d.openFor("s", nobody, dmCtx)
	d.openFor("victim", nobody, dmCtx)
	for i := 0; i < 4; i++ {
		_, line := egressLive(t, d, "s", egressHog)
		t.Logf("session s, run %d: %s", i, line())
	}
	var st struct {
		Egress struct {
			Connections int `json:"connections"`
			Max         int `json:"max_connections"`
		} `json:"egress"`
	}
	d.call("status", map[string]any{}, &st)
	t.Logf("status.egress: %d of %d", st.Egress.Connections, st.Egress.Max)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", "victim", "--",
		"curl", "-sS", "--max-time", "10", "--noproxy", "*", "http://web.test/x")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "GET /x host=web.test") || st.Egress.Connections > 256 {
		t.Errorf("HOLE: one session's runs hold %d of the node's %d egress connections; another session's run: %s", st.Egress.Connections, st.Egress.Max, out)
	}
}

// TestAttack2EgressReachDuringDial: a reload that takes the servers'
// network out of reach_private while the gateway is dialling it: Recheck
// saw no dialled address yet and left the connection, which then carried
// data to an address reach_private no longer listed. The dialled upstream
// is now adopted under the lock Recheck excludes, its address checked
// again. The dial is held up by a full accept queue (SYNs dropped until
// the server accepts).
func TestAttack2EgressReachDuringDial(t *testing.T) {
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

	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", "s", "--",
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
	rules := strings.Replace(egressRules(d.home.path("config/hosts")), `reach_private = ["10.231.0.0/24"]`, `reach_private = []`, 1)
	d.home.write("config/conditions.toml", rules)
	d.call("config.reload", map[string]any{}, nil)
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
		t.Errorf("HOLE: a connection dialled across the reload carries data to an address reach_private no longer lists:\n%s\nafter: %s\n%s", out.String(), after, d.log())
	}
}

// TestAttackEgressHalfOpenFlood: a run that opens connections and drops
// them before their handshake ends (non-blocking connects to random
// addresses, closed in batches), then ends. On the netstack capture each
// abandoned handshake held a place of its session's and of the node's
// bound until gVisor gave it up, about two minutes later, after the run
// had ended; and the run's end, and so the daemon's SIGTERM, waited as
// long (2m05s, in the attacker's review). Both captures: the places are
// back once the run has ended, and the daemon stops at once.
func TestAttackEgressHalfOpenFlood(t *testing.T) {
	d, _ := egressHomeNet(t)
	out := egressPy(t, d, `
import socket, time, random
t0 = time.time(); n = 0; held = []
while time.time() - t0 < 4:
    for _ in range(100):
        s = socket.socket(); s.setblocking(False)
        a = "%d.%d.%d.%d" % (11 + random.randrange(100), random.randrange(256), random.randrange(256), random.randrange(1, 255))
        try:
            s.connect((a, 80))
        except (BlockingIOError, OSError):
            pass
        held.append(s); n += 1
    if len(held) > 400:
        for s in held[:200]: s.close()
        del held[:200]
print("flooded", n)
`)
	if !strings.Contains(out, "flooded") {
		t.Fatalf("the flood did not run:\n%s", out)
	}
	var st struct {
		Egress struct {
			Connections int `json:"connections"`
		} `json:"egress"`
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.call("status", map[string]any{}, &st)
		if st.Egress.Connections == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the node's egress places still held 5 s after the run ended", st.Egress.Connections)
		}
		time.Sleep(100 * time.Millisecond)
	}
	start := time.Now()
	d.stop()
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the daemon took %v to stop after the flood", el)
	}
}

// TestAttackEgressConntrackSources: DNS queries to random servers from
// 256 sockets bound to random addresses of 127/8. On the kernel capture
// each flow was tracked (its rewritten reply tuple told apart by the
// source address), and one run filled its namespace's conntrack table up
// to the host's nf_conntrack_max (229,162 entries in 15 s, 56 MB of kernel
// memory, in the attacker's review). What leaves for the gateway must now
// leave from the run's own address: these are refused before they are
// tracked.
func TestAttackEgressConntrackSources(t *testing.T) {
	d, _ := egressHomeNet(t)
	out := egressPy(t, d, `
import socket, struct, time, random
q = struct.pack(">HHHHHH", 1, 0x100, 1, 0, 0, 0) + b"\x03web\x04test\x00" + struct.pack(">HH", 1, 1)
socks = []
for i in range(256):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)
    s.bind(("127.%d.%d.%d" % (random.randrange(256), random.randrange(256), random.randrange(1, 255)), 0))
    socks.append(s)
t0 = time.time(); n = 0
while time.time() - t0 < 3:
    for s in socks:
        a = "%d.%d.%d.%d" % (11 + random.randrange(100), random.randrange(256), random.randrange(256), random.randrange(1, 255))
        n += 1
        try:
            s.sendto(q, (a, 53))
        except OSError:
            pass
        try:
            while True: s.recv(512)
        except OSError: pass
try:
    count = open("/proc/sys/net/netfilter/nf_conntrack_count").read().strip()
except OSError:
    count = "0"  # no conntrack in this namespace (the netstack capture)
print("tried", n, "tracked", count)
`)
	var tried, tracked int
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "tried %d tracked %d", &tried, &tracked); err != nil || tried < 1000 {
		t.Fatalf("the flood did not run: %v\n%s", err, out)
	}
	if tracked > 500 {
		t.Errorf("%d flows tracked in the run's namespace after %d queries from addresses of 127/8", tracked, tried)
	}
}
