package integration

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"golang.org/x/sys/unix"
)

// The ninth review: the bound on open files (fsys/files.go), the stdio a
// run accepts, the run's reach toward its init, and the node's egress pool.

// atk9cRoot is a root daemon whose session "default" (65534, a DM) runs
// python3 and the workspace's bin/ (the files atk6Home makes).
func atk9cRoot(t *testing.T, extra ...string) (*daemon, string) {
	t.Helper()
	h := openHome(t, atk6Rules)
	h.t = t
	h.write("config/policy.yaml", runPolicy)
	h.write("memories/pub.md", "public\n")
	h.write("workspace/w.txt", "work\n")
	h.write("workspace/bin/tool42", "\xb8\x2a\x00\x00\x00\xc3")
	os.Chmod(h.path("workspace/bin/tool42"), 0o755)
	for _, p := range []string{"memories", "workspace"} {
		os.Chmod(h.path(p), 0o777)
	}
	os.MkdirAll(h.path("mnt"), 0o777)
	d := startDaemon(t, h, append([]string{"--allow-uid", "65534", "--socket-mode", "0666"}, extra...)...)
	os.Chmod(h.path("run"), 0o755)
	d.openFor("default", nobody, dmCtx)
	return d, h.path("workspace/bin/tool42")
}

// atk9cBackChannelOuter is the caller (65534): a socketpair end as the
// run's stdin; it waits for the command to send it a socket, and sends the
// command, over that socket, tool42 and git.
const atk9cBackChannelOuter = `
import socket, os, subprocess, sys
condfs, sock, tool, inner = sys.argv[1:5]
a, b = socket.socketpair()
p = subprocess.Popen([condfs, "run", "--socket", sock, "--session", "default", "--", "python3", "-c", inner],
    stdin=b, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
b.close()
a.settimeout(30)
try:
    msg, fds, fl, addr = socket.recv_fds(a, 16, 4)
    print("caller received", len(fds), "descriptors from the command", flush=True)
except OSError as e:
    print("caller recv:", e, flush=True)
    fds = []
if fds:
    c1 = socket.socket(fileno=fds[0])
    m = os.memfd_create("x", 0)
    os.write(m, open("/usr/bin/echo", "rb").read())
    files = [os.open(tool, os.O_RDONLY), os.open("/usr/lib/git-core/git", os.O_RDONLY), m]
    try:
        socket.send_fds(c1, [b"x"], files)
        print("caller sent the files over the command's socket", flush=True)
    except OSError as e:
        print("caller send refused:", e.strerror, flush=True)
        c1.send(b"x")
out, _ = p.communicate(timeout=60)
sys.stdout.write(out.decode(errors="replace"))
print("rc", p.returncode)
`

// atk9cBackChannelInner is the command: it makes a socketpair of its own
// (SO_PASSRIGHTS on, as every new socket), sends one end out through
// stdin (the caller's end takes descriptors), and receives on the other.
const atk9cBackChannelInner = atk7Exec + `
import socket
b = socket.socket(fileno=0)
c1, c2 = socket.socketpair()
try:
    socket.send_fds(b, [b"s"], [c1.fileno()])
    print("command sent a socket of its own out", flush=True)
except OSError as e:
    print("command send:", e.strerror, flush=True)
c1.close()
c2.settimeout(30)
try:
    msg, fds, fl, addr = socket.recv_fds(c2, 16, 4)
except OSError as e:
    print("recv", e.strerror, flush=True)
    fds = []
print("received", len(fds), "descriptors", flush=True)
if len(fds) >= 3:
    run(fds[0], "received")
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(fds[2], ["echo", "memfd-exec-ran"], {})
        except OSError as e:
            print("fexecve memfd:", e.strerror, flush=True)
            os._exit(1)
    os.waitpid(pid, 0)
    os.set_inheritable(fds[1], True)
    os.execv("/lib64/ld-linux-x86-64.so.2", ["ld.so", "/proc/self/fd/%d" % fds[1], "--version"])
`

func atk9cVerdict(t *testing.T, out, how string) {
	t.Helper()
	atk8Verdict(t, out, how)
	if strings.Contains(out, "memfd-exec-ran") {
		t.Errorf("HOLE: %s: the command received a memfd holding /usr/bin/echo and executed it (fexecve), not in binaries", how)
	}
	// Held now: no socket is stdio (condfs run relays it through a pipe).
	if !strings.Contains(out, "Socket operation on non-socket") {
		t.Errorf("the command's stdin was a socket: %s", out)
	}
}

// TestAtk9CStdinBackChannel: the daemon turns SO_PASSRIGHTS off on a Unix
// socket given as stdio, so its peer cannot send the command descriptors
// through it (TestAtk7StdinSocketPassesFDs). But the command may still
// SEND descriptors through it: it sends out one end of a socketpair of its
// own (which takes descriptors, as every new socket does), and the caller
// sends it a file of an exec mount over that one (tool42 returned 42, a
// memfd of echo ran). Unprivileged daemon. Fixed: no socket is stdio.
func TestAtk9CStdinBackChannel(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", atk9cBackChannelOuter,
		condfsBin, a.sock, a.h.path("workspace/bin/tool42"), atk9cBackChannelInner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	atk9cVerdict(t, string(out), "a socketpair end as stdin, the command sent a socket of its own out through it")
}

// TestAtk9CStdinBackChannelRoot: the same on a root daemon.
func TestAtk9CStdinBackChannelRoot(t *testing.T) {
	d, tool := atk9cRoot(t)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", atk9cBackChannelOuter,
		condfsBin, d.socket, tool, atk9cBackChannelInner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	atk9cVerdict(t, string(out), "root daemon: a socketpair end as stdin, the command sent a socket of its own out through it")
}

// TestAtk9CStdinInetSocket: with network = "none" the run has only a
// loopback of its own. An unconnected TCP socket of the host's network
// namespace given as stdin is accepted (only Unix sockets are looked at),
// and the command connected it to a host address (the host's loopback).
// Fixed: no socket is stdio.
func TestAtk9CStdinInetSocket(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	outer := `
import socket, subprocess, sys
condfs, sock, inner = sys.argv[1:4]
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4); l.settimeout(20)
port = l.getsockname()[1]
s = socket.socket()
p = subprocess.Popen([condfs, "run", "--socket", sock, "--session", "default", "--", "python3", "-c", inner, str(port)],
    stdin=s, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
s.close()
try:
    c, _ = l.accept(); c.settimeout(10)
    print("host listener got:", c.recv(64), flush=True)
except OSError as e:
    print("host listener:", e, flush=True)
out, _ = p.communicate(timeout=60)
sys.stdout.write(out.decode(errors="replace"))
print("rc", p.returncode)
`
	inner := `
import socket, sys
s = socket.socket(fileno=0)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    s.sendall(b"escaped-the-run-netns")
    print("connected to the host", flush=True)
except OSError as e:
    print("connect:", e, flush=True)
`
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", outer, condfsBin, a.sock, inner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	if strings.Contains(string(out), "escaped-the-run-netns") {
		t.Errorf("HOLE: network = \"none\", an unconnected TCP socket of the host's namespace as stdin: the command connected it to the host's loopback")
	}
}

// TestAtk9CInitSignals: the command toward its init (pid 1 of the run's
// PID namespace, a Go program: a SIGSEGV it did not raise itself crashes
// it): kill, pidfd_send_signal, a SIGIO owner (F_SETOWN, F_SETSIG SIGSEGV),
// pidfd_getfd, process_vm_readv, /proc/1/environ.
func TestAtk9CInitSignals(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	inner := `
import ctypes, fcntl, os, signal, socket, time
libc = ctypes.CDLL(None, use_errno=True)
def sc(*args):
    r = libc.syscall(*[ctypes.c_long(x) for x in args])
    return r, os.strerror(ctypes.get_errno()) if r < 0 else "ok"
print("kill SEGV", sc(62, 1, 11), flush=True)
r, e = sc(434, 1, 0)
print("pidfd_open(1)", r, e, flush=True)
if r >= 0:
    print("pidfd_send_signal SEGV", sc(424, r, 11, 0, 0), flush=True)
    for fd in range(0, 12):
        g, ge = sc(438, r, fd, 0)
        if g >= 0:
            print("pidfd_getfd got init fd", fd, os.readlink("/proc/self/fd/%d" % g), flush=True)
buf = ctypes.create_string_buffer(16)
class iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
l, rm = iov(ctypes.cast(buf, ctypes.c_void_p), 16), iov(0x400000, 16)
print("process_vm_readv", sc(310, 1, ctypes.addressof(l), 1, ctypes.addressof(rm), 1, 0), flush=True)
try:
    print("environ of init:", open("/proc/1/environ", "rb").read()[:40], flush=True)
except OSError as e:
    print("environ", e.strerror, flush=True)
x, y = socket.socketpair()
try:
    fcntl.fcntl(x, fcntl.F_SETOWN, 1)
    fcntl.fcntl(x, 10, signal.SIGSEGV)  # F_SETSIG
    fcntl.fcntl(x, fcntl.F_SETFL, fcntl.fcntl(x, fcntl.F_GETFL) | os.O_ASYNC)
    y.send(b"z")
    print("sigio armed to pid 1", flush=True)
except OSError as e:
    print("sigio", e.strerror, flush=True)
try:
    fcntl.fcntl(x, fcntl.F_SETOWN, 0)
    fcntl.fcntl(x, fcntl.F_SETOWN, -1)  # pgid 1
    y.send(b"z")
    print("sigio armed to pgrp 1", flush=True)
except OSError as e:
    print("sigio pgrp", e.strerror, flush=True)
time.sleep(1.5)
print("alive", flush=True)
print(open("/memories/pub.md").read(), end="", flush=True)
`
	out, code := a.run(t, "", "python3", "-c", inner)
	t.Logf("(%d) %s", code, out)
	if strings.Contains(out, "pidfd_getfd got init fd") {
		t.Errorf("HOLE: the command took a descriptor of its init (pidfd_getfd)")
	}
	if strings.Contains(out, "environ of init: b'") && !strings.Contains(out, "environ of init: b''") {
		t.Errorf("HOLE: the command read its init's environment")
	}
	if strings.Contains(out, "process_vm_readv (16") {
		t.Errorf("HOLE: the command read its init's memory")
	}
	if strings.Contains(out, "goroutine ") || !strings.Contains(out, "alive\npublic") || code != 0 {
		t.Errorf("HOLE: the command's signals crashed or stopped its init (%d)", code)
	}
	if o, c := a.run(t, "", "cat", "/memories/pub.md"); c != 0 || o != "public\n" {
		t.Errorf("after the attack the session's next run: %d %q\n%s", c, o, tail(a.logs(), 20))
	}
}

// TestAtk9CPerSessionReleaseLost: TestAtk7ReleaseLostOnClose held on the
// shared connection (the hub keeps serving a closed view's RELEASEs). With
// a connection per session the view's connection ends when its last file
// is closed after the session closed; RELEASEs the kernel aborts then never
// give back what takeFile took, and what an owner holds is kept for the
// daemon's life: repeated, the uid is at its bound for good.
func TestAtk9CPerSessionReleaseLost(t *testing.T) {
	d := atk7Daemon(t, "--connections=per-session")
	got, leaked := atk7CloseWhileHeld(t, d, 120, 120)
	for _, l := range strings.Split(d.log(), "\n") {
		if strings.Contains(l, "open files refused") || strings.Contains(l, "detached") {
			t.Logf("log: %.300s", l)
		}
	}
	if got != "held 120 err none" {
		t.Errorf("HOLE: per-session connections: after sessions were closed while files were open, a fresh session of the same uid opens only %q: the lost RELEASEs' counts stay on the uid for the daemon's life", got)
	} else if leaked > 64 {
		t.Errorf("HOLE: per-session connections: sessions closed while files were open leaked %d daemon descriptors", leaked)
	}
}

// TestAtk9CEgressSybilSessions: the node's pool is fair among sessions, and
// a uid may open as many sessions as it likes. uid 1000's one session holds
// 160 connections (under its own bound of 256, under a sixth of the node);
// uid 65534 opens eight sessions that each try to hold 256. Each session of
// 65534 that holds fewer cuts the session holding the most, until all hold
// about 1024/9: uid 1000's connections are cut though its uid holds far
// less than half of the node.
func TestAtk9CEgressSybilSessions(t *testing.T) {
	d := egressHomeUnbounded(t, "--allow-uid", "1000")
	d.openFor("victim", 1000, dmCtx)
	vin, vline := egressLiveAs(t, d, 1000, "victim", egressHogN(160)+egressHogAlive)
	t.Logf("uid 1000's session: %s", vline())
	var ins []io.WriteCloser
	for i := range 8 {
		id := fmt.Sprintf("sybil%d", i)
		d.openFor(id, nobody, dmCtx)
		in, line := egressLiveAs(t, d, nobody, id, egressHogN(256)+egressHogAlive)
		t.Logf("65534's session %s: %s", id, line())
		ins = append(ins, in)
	}
	var st struct {
		Egress struct {
			Connections int `json:"connections"`
			Max         int `json:"max_connections"`
		} `json:"egress"`
	}
	time.Sleep(2 * time.Second)
	d.call("status", map[string]any{}, &st)
	t.Logf("node: %d of %d connections", st.Egress.Connections, st.Egress.Max)
	vin.Write([]byte("\n"))
	got := vline()
	t.Logf("uid 1000's session after: %s", got)
	for _, in := range ins {
		in.Close()
	}
	if got != "alive 160" {
		t.Errorf("HOLE: uid 65534 opened 8 sessions of its own: uid 1000's only session, holding 160 of the node's %d connections, was cut (%s)", st.Egress.Max, got)
	}
}

// TestAtk9CEgressEatsReserve: the file budget leaves the rest of the daemon
// a reserve of an eighth of RLIMIT_NOFILE (at least 512), but the node's
// egress pool admits 1024 connections whatever that limit, each holding a
// descriptor of the daemon's (its upstream socket; with the kernel's
// capture the run's side too). On a daemon whose limit is 2048, uid
// 65534's runs hold the node's connections: does uid 1000's session still
// open a file, and root's control call still work?
func TestAtk9CEgressEatsReserve(t *testing.T) {
	n := newEgressNet(t)
	n.serve(t)
	h := openHome(t, "-")
	h.t = t
	hosts := h.write("config/hosts", egressHosts)
	h.write("config/conditions.toml", strings.Replace(egressRules(hosts), "connections = 8\n", "", 1))
	h.write("config/policy.yaml", egressPolicy)
	h.write("workspace/w.txt", "work\n")
	os.Chmod(h.path("workspace"), 0o777)
	os.MkdirAll(h.path("mnt"), 0o777)
	d := startDaemonUnder(t, h, []string{"prlimit", "--nofile=2048:2048", "setpriv", "--bounding-set=-sys_resource", "--"},
		"--allow-uid", "65534", "--allow-uid", "1000", "--socket-mode", "0666")
	os.Chmod(h.path("run"), 0o755)
	pid := d.cmd.Process.Pid
	victim := d.openFor("victim", 1000, dmCtx)
	base := atk7FDs(pid)
	var last func() string
	for i := range 4 {
		id := fmt.Sprintf("hog%d", i)
		d.openFor(id, nobody, dmCtx)
		_, line := egressLiveAs(t, d, nobody, id, egressHog)
		if i < 3 {
			t.Logf("65534's session %s: %s; daemon fds %d (base %d)", id, line(), atk7FDs(pid), base)
		}
		last = line
	}
	// While the last hog connects, uid 1000 opens a file of its session
	// again and again.
	failed := ""
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline) && failed == ""; {
		if got, stop := atk7Holder(t, 1000, victim+"/workspace/w.txt", 1); got != "held 1 err none" {
			failed = got
			stop()
		} else {
			stop()
		}
	}
	_ = last // hog3 may take minutes to finish connecting (the daemon is out of descriptors)
	t.Logf("65534's session hog3 connecting; daemon fds %d", atk7FDs(pid))
	if failed != "" {
		t.Errorf("HOLE: while uid 65534's runs made egress connections, uid 1000's session could not open a file: %s", failed)
	}
	time.Sleep(2 * time.Second)
	var st struct {
		Egress struct {
			Connections int `json:"connections"`
		} `json:"egress"`
	}
	if c, err := control.Dial(d.socket); err == nil {
		c.Call("status", map[string]any{}, &st)
		c.Close()
	}
	t.Logf("node connections %d; daemon fds %d (base %d)", st.Egress.Connections, atk7FDs(pid), base)
	atk8OthersServed(t, d, victim, "uid 65534's runs hold the node's egress connections")
	t.Logf("the attack's checks are done at %s; cleanup follows", time.Now().Format(time.TimeOnly))
	var emfile []string
	for _, l := range strings.Split(d.log(), "\n") {
		if strings.Contains(l, "too many open files") && len(emfile) < 6 {
			emfile = append(emfile, l)
		}
	}
	if len(emfile) > 0 {
		t.Errorf("HOLE: uid 65534's runs' egress connections ran the daemon out of descriptors (the file budget's reserve does not hold them):\n%s", strings.Join(emfile, "\n"))
	}
}

// TestAtk9CPerSessionReleaseLostUnpriv: TestAtk9CPerSessionReleaseLost on
// an unprivileged daemon (a connection per session, every view its own
// uid's): once the lost counts reach half the room, every session of the
// daemon is refused files for its life.
func TestAtk9CPerSessionReleaseLostUnpriv(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	var r unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &r)
	share := max(int(r.Max)/16, 64) - 8 // under a view's share (fsys/files.go)
	for i := 0; i < 12; i++ {
		id := fmt.Sprintf("c%d", i)
		mnt := a.h.path("mnt/" + id)
		os.MkdirAll(mnt, 0o755)
		chownTree(t, mnt, nobody)
		if err := a.call(t, "session.open", map[string]any{"id": id, "mount": mnt, "context": dmCtx, "owner": nobody}, nil); err != nil {
			t.Fatalf("open %s: %v", id, err)
		}
		got, stop := atk7Holder(t, nobody, mnt+"/workspace/w.txt", share)
		a.call(t, "session.close", map[string]any{"id": id}, nil)
		stop()
		time.Sleep(300 * time.Millisecond)
		t.Logf("cycle %d: %s", i, got)
	}
	time.Sleep(2 * time.Second)
	got, stop := atk7Holder(t, nobody, a.mnt+"/workspace/w.txt", 64)
	stop()
	t.Logf("the daemon's first session now: %s", got)
	if got != "held 64 err none" {
		t.Errorf("HOLE: unprivileged daemon: after sessions were closed while files were open, its other session cannot open a file (%s): the lost RELEASEs' counts are never given back", got)
	}
}
