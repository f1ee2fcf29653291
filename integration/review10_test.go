package integration

// The tenth review: bypass attempts on the fixes of the ninth. Each test
// passes when condfs behaves as docs/sandbox.md says; a hole makes its test
// fail with "HOLE".

import (
	"bufio"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// atk10Hello extends atk9Hello: records split, change cipher spec
// records, and one attempt per connection, direct or through the gateway's
// proxy (CONNECT).
const atk10Hello = atk9Hello + `
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

// TestAtk10EgressTLSRetryEvasions: the second client hello after a
// HelloRetryRequest, hidden from the guard (egress/flow.go helloGuard):
// preceded by change cipher spec records and split across records and TCP
// segments; pipelined with the first hello before the retry request; in
// upper case; in a second server_name entry or extension; after early
// data; and through the proxy's CONNECT. openssl s_server must never read
// other.test; a second hello naming api.test still goes through.
func TestAtk10EgressTLSRetryEvasions(t *testing.T) {
	d, n := atk9HomeNet(t)
	srvOut := atk9SServer(t, n)
	out := egressPy(t, d, atk10Hello+`
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
			t.Errorf("setup: a second hello naming api.test (%s) was not answered with a server hello:\n%s", c, tail(d.log(), 30))
		}
	}
	low := strings.ToLower(srv)
	if strings.Contains(low, "other.test") || strings.Contains(low, "switching server context") {
		t.Errorf("HOLE: a connection decided as https api.test:8443 made the server read SNI other.test (a second client hello the guard did not check)")
	}
}

// TestAtk10EgressPathForms: request targets whose decided (normalised)
// path is not under /private, but which a server that decodes once, merges
// slashes, drops path parameters or removes dot segments reads under
// /private. The server answers SECRET-DATA for any such reading of what it
// receives.
func TestAtk10EgressPathForms(t *testing.T) {
	d, n := atk9HomeNet(t)
	go http.Serve(n.listen(t, atk9Srv+":8310"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	out, _ := condfsRun(t, d, "", append([]string{"--", "python3", "-c", code}, append(pathFormTargets("web.test:8310"), "/pub/ok")...)...)
	t.Logf("%s", out)
	if !strings.Contains(out, "direct /pub/ok HTTP/1.1 200 OK public") || !strings.Contains(out, "proxy /pub/ok HTTP/1.1 200 OK public") {
		t.Errorf("setup: an allowed path was not served:\n%s", tail(d.log(), 20))
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "SECRET-DATA") {
			t.Errorf("HOLE: a path decided as not under /private was read under /private by a common server: %s", l)
		}
	}
}

// TestAtk10RunRelay: condfs run relays sockets, regular files and devices
// through pipes (cmd/condfs/run.go relayStdio). A stdin socket whose peer
// never writes nor closes must not keep condfs run from returning once
// the command ended; 24 MiB from a regular file through the command to a
// regular file arrive whole; /dev/zero as stdin is relayed (not refused,
// not passed) and ends with the command.
func TestAtk10RunRelay(t *testing.T) {
	d, _ := runHome(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	run := func(stdin, stdout *os.File, timeout time.Duration, args ...string) (int, string, time.Duration) {
		t.Helper()
		var errb strings.Builder
		cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", "s", "--"}, args...)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, &errb
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(timeout):
			cmd.Process.Kill()
			<-done
			return -1, errb.String(), time.Since(start)
		}
		return cmd.ProcessState.ExitCode(), errb.String(), time.Since(start)
	}

	// A stdin socket that never ends.
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(sp[0]), "ours"), os.NewFile(uintptr(sp[1]), "theirs")
	defer ours.Close()
	outPath := filepath.Join(dir, "out1")
	of, _ := os.Create(outPath)
	code, msg, took := run(theirs, of, 30*time.Second, "sh", "-c", "echo ended")
	theirs.Close()
	of.Close()
	got, _ := os.ReadFile(outPath)
	t.Logf("endless socket stdin: exit %d in %v, out %q, %s", code, took, got, msg)
	if code != 0 || strings.TrimSpace(string(got)) != "ended" {
		t.Errorf("HOLE?: condfs run with a stdin socket that never ends did not return once its command ended (exit %d after %v, out %q): %s", code, took, got, msg)
	}

	// 24 MiB through the command, regular file to regular file.
	inPath := filepath.Join(dir, "in")
	big := make([]byte, 24<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>11)
	}
	os.WriteFile(inPath, big, 0o644)
	in, _ := os.Open(inPath)
	outPath = filepath.Join(dir, "out2")
	of, _ = os.Create(outPath)
	code, msg, took = run(in, of, 60*time.Second, "cat")
	in.Close()
	of.Close()
	got, _ = os.ReadFile(outPath)
	t.Logf("24 MiB file to file: exit %d in %v, %d bytes out, %s", code, took, len(got), msg)
	if code != 0 || string(got) != string(big) {
		t.Errorf("relay: 24 MiB through cat arrived as %d bytes (exit %d): %s", len(got), code, msg)
	}

	// /dev/zero as stdin: relayed, and the relay ends with the command.
	z, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	outPath = filepath.Join(dir, "out3")
	of, _ = os.Create(outPath)
	code, msg, took = run(z, of, 30*time.Second, "sh", "-c", "ls -l /proc/self/fd/0; echo ended")
	z.Close()
	of.Close()
	got, _ = os.ReadFile(outPath)
	t.Logf("/dev/zero stdin: exit %d in %v, out %q, %s", code, took, got, msg)
	if code != 0 || !strings.Contains(string(got), "ended") || !strings.Contains(string(got), "pipe:") {
		t.Errorf("relay: /dev/zero as stdin was not relayed through a pipe, or condfs run did not end with its command (exit %d, out %q): %s", code, got, msg)
	}
}

// TestAtk10CloseWhileBusy: fsys closeBacking releases a view's handles
// when its own connection ends (per-session connections). Here the
// session is closed while its owner's threads hammer its files with pread,
// fstat, ftruncate and fchmod, and open and close more: a release racing a
// request in flight would close an fd those requests still use, whose
// number another view's open (a canary file opened and read in a loop
// through another session) may have taken by then. The canary must keep
// its content and mode, and the uid must get its whole share of files in a
// fresh session at the end.
func TestAtk10CloseWhileBusy(t *testing.T) {
	for _, conns := range []string{"per-session", "shared"} {
		t.Run(conns, func(t *testing.T) { atk10CloseWhileBusy(t, conns) })
	}
}

func atk10CloseWhileBusy(t *testing.T, conns string) {
	h := openHome(t, runRules)
	h.t = t
	h.write("config/policy.yaml", runPolicy)
	h.write("workspace/w.txt", "work\n")
	canary := h.write("workspace/canary.txt", "CANARY-CONTENT-0123456789\n")
	os.Chmod(canary, 0o644)
	os.Chmod(h.path("workspace"), 0o777)
	os.MkdirAll(h.path("mnt"), 0o777)
	d := startDaemonUnder(t, h, []string{"prlimit", "--nofile=2048:2048", "setpriv", "--bounding-set=-sys_resource", "--"},
		"--allow-uid", "65534", "--socket-mode", "0666", "--connections="+conns)
	vmnt := d.openFor("victim", nobody, dmCtx)
	reader := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", `
import os, sys, time
end = time.time() + float(sys.argv[2])
n = bad = 0
while time.time() < end:
    try:
        fd = os.open(sys.argv[1], os.O_RDONLY)
        b = os.pread(fd, 100, 0)
        os.close(fd)
        n += 1
        if b != b"CANARY-CONTENT-0123456789\n":
            bad += 1
            print("canary read", repr(b), flush=True)
    except OSError as e:
        pass
print("canary reads", n, "bad", bad, flush=True)
`, vmnt+"/workspace/canary.txt", "180")
	var rout strings.Builder
	reader.Stdout, reader.Stderr = &rout, &rout
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { reader.Process.Kill(); reader.Wait() }()
	const busy = `
import os, sys, threading, time
d = sys.argv[1]
mine = os.path.join(d, "mine-%s.txt" % sys.argv[2])
with open(mine, "w") as f:
    f.write("x" * 4096)
fds = [os.open(mine, os.O_RDWR) for _ in range(32)]
print("ready", flush=True)
stop = time.time() + 6
ok, bad = [0], [0]
def work(i):
    k = 0
    while time.time() < stop:
        fd = fds[(i * 7 + k) % len(fds)]
        k += 1
        for op in (lambda: os.pread(fd, 4096, 0), lambda: os.fstat(fd), lambda: os.ftruncate(fd, 5),
                   lambda: os.fchmod(fd, 0o600), lambda: os.close(os.open(mine, os.O_RDONLY))):
            try:
                op()
                ok[0] += 1
            except OSError:
                bad[0] += 1
ts = [threading.Thread(target=work, args=(i,)) for i in range(12)]
for x in ts: x.start()
for x in ts: x.join()
print("ops ok", ok[0], "failed", bad[0], flush=True)
`
	for i := 0; i < 6; i++ {
		id := fmt.Sprintf("b%d", i)
		mnt := d.openFor(id, nobody, dmCtx)
		cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", busy, mnt+"/workspace", strconv.Itoa(i))
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(stdout)
		line, _ := br.ReadString('\n')
		time.Sleep(500 * time.Millisecond)
		d.call("session.close", map[string]any{"id": id}, nil)
		done := make(chan struct{})
		go func() { l, _ := br.ReadString('\n'); line += " " + l; cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("cycle %d: the busy process did not end", i)
		}
		t.Logf("cycle %d: %s", i, strings.TrimSpace(line))
	}
	reader.Process.Signal(unix.SIGTERM)
	time.Sleep(time.Second)
	st, err := os.Stat(canary)
	b, _ := os.ReadFile(canary)
	if err != nil || string(b) != "CANARY-CONTENT-0123456789\n" || st.Mode().Perm() != 0o644 {
		t.Errorf("HOLE: another session's file changed while closed sessions' handles were released: %q mode %v", b, st.Mode())
	}
	if strings.Contains(rout.String(), "canary read") {
		t.Errorf("HOLE: the canary session read other bytes: %s", rout.String())
	}
	time.Sleep(2 * time.Second)
	mnt := d.openFor("fresh", nobody, dmCtx)
	got, stop := atk7Holder(t, nobody, mnt+"/workspace/w.txt", 120)
	stop()
	t.Logf("fresh session: %s; canary reader: %s", got, rout.String())
	if got != "held 120 err none" {
		t.Errorf("HOLE: after sessions were closed while busy, a fresh session of the uid opens only %q", got)
	}
	if strings.Contains(d.log(), "panic") {
		t.Errorf("the daemon panicked:\n%s", tail(d.log(), 40))
	}
}

// TestAtk10RelayedControlConnection: the daemon refused a connection to
// itself as a run's stdio (762294a: a second control connection passed as
// stdin let the command call context.set from inside the run,
// TestAttackRunStdio), later every socket. But condfs run now relays every
// socket it is given through a pipe (stdiofd.Relayed), a connection to the
// daemon included: the command's output is written into the caller's
// control connection, and the daemon serves it as the caller's requests.
// The session is in a guild; the command prints a context.set to a DM.
func TestAtk10RelayedControlConnection(t *testing.T) {
	d, _ := runHome(t)
	d.setContext("s", guildCtx)
	const caller = `
import socket, subprocess, sys, json
condfs, sock = sys.argv[1:3]
c = socket.socket(socket.AF_UNIX)
c.connect(sock)
req = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "context.set", "params": {"session": "s", "context": ["discord:dm", "discord:dm:7"]}})
p = subprocess.run([condfs, "run", "--socket", sock, "--session", "s", "--", "sh", "-c", "printf '%s\\n' '" + req + "'; sleep 1; cat /memories/private/p.md"],
    stdout=c, stderr=subprocess.PIPE, timeout=60)
print("condfs run:", p.returncode, p.stderr.decode().strip(), flush=True)
c.settimeout(3)
got = b""
try:
    while True:
        b = c.recv(4096)
        if not b: break
        got += b
except Exception as e:
    pass
print("the control connection answered:", got.decode(errors="replace"), flush=True)
`
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", caller, condfsBin, d.socket)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	var now struct{ Atoms []string }
	d.call("context.get", map[string]any{"session": "s"}, &now)
	t.Logf("context after: %v", now.Atoms)
	for _, a := range now.Atoms {
		if a == "discord:dm" {
			t.Errorf("HOLE: condfs run relayed the caller's control connection given as stdout: the command set its session's context from a guild to a DM (context.set from inside the run)")
			break
		}
	}
	if !strings.Contains(string(out), "condfs run:") {
		t.Errorf("setup: the caller did not run: %s", out)
	}
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
