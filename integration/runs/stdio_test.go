package runs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestRunRelayEndsWithTheCommand: condfs run relays sockets, regular files and devices
// through pipes (cmd/condfs/run.go relayStdio). A stdin socket whose peer
// never writes nor closes must not keep condfs run from returning once
// the command ended; 24 MiB from a regular file through the command to a
// regular file arrive whole; /dev/zero as stdin is relayed (not refused,
// not passed) and ends with the command.
func TestRunRelayEndsWithTheCommand(t *testing.T) {
	d, _ := testenv.RunHome(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	run := func(stdin, stdout *os.File, timeout time.Duration, args ...string) (int, string, time.Duration) {
		t.Helper()
		var errb strings.Builder
		cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), append([]string{"run", "--socket", d.Socket, "--session", "s", "--"}, args...)...)
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

// TestRelayedControlConnectionRefusedAsStdio: the daemon refused a connection to
// itself as a run's stdio (762294a: a second control connection passed as
// stdin let the command call context.set from inside the run,
// TestRunStdioIsAStreamOfItsOwn), later every socket. But condfs run now relays every
// socket it is given through a pipe (stdiofd.Relayed), a connection to the
// daemon included: the command's output is written into the caller's
// control connection, and the daemon serves it as the caller's requests.
// The session is in a guild; the command prints a context.set to a DM.
func TestRelayedControlConnectionRefusedAsStdio(t *testing.T) {
	d, _ := testenv.RunHome(t)
	d.SetContext("s", testenv.Guild)
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
	cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", caller, testenv.Condfs(), d.Socket)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	var now struct{ Atoms []string }
	d.Call("context.get", map[string]any{"session": "s"}, &now)
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

// The stdio the daemon accepts for a run (internal/stdiofd), what the
// command can be given to execute beyond its binaries (a process outside,
// the network) and its reach toward its init.

// execRules is run inside the sandbox: it maps a descriptor PROT_EXEC
// (allowed by seccomp: file-backed, not writable) and calls it. The file
// holds tool42's bytes (mov eax,42; ret); Landlock does not govern mmap.
const execRules = `
import ctypes, os, sys
def run(fd, what):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    a = libc.mmap(None, 4096, 5, 2, fd, 0)
    if a is None or a == ctypes.c_void_p(-1).value:
        print(what, "mmap refused errno", ctypes.get_errno(), flush=True)
        return
    print(what, "tool42 returned", ctypes.CFUNCTYPE(ctypes.c_int)(a)(), flush=True)
`

// TestStdinSocketPassesNoDescriptorsIn: an AF_UNIX socket whose peer is not the
// daemon is accepted as stdio. Over it, a process outside the run sent
// the command descriptors (SCM_RIGHTS): a file on an exec mount, which the
// command mapped executable (tool42 returned 42) and /usr/lib/git-core/git,
// run through ld.so, though binaries lists neither. No socket is stdio now
// (TestStdinSocketPassesNoDescriptorsOut: SO_PASSRIGHTS off, the first fix, left the
// other way open): condfs run relays it through a pipe, and the command's
// stdin is not a socket.
func TestStdinSocketPassesNoDescriptorsIn(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	inner := execRules + `
import socket
s = socket.socket(fileno=0)
try:
    s.setsockopt(socket.SOL_SOCKET, 83, 1)  # SO_PASSRIGHTS back on
    print("SO_PASSRIGHTS turned on", flush=True)
except OSError as e:
    print("SO_PASSRIGHTS", e.strerror, flush=True)
print("ready", flush=True)
msg, fds, fl, addr = socket.recv_fds(s, 16, 4)
print("received", len(fds), "descriptors", flush=True)
if fds:
    run(fds[0], "received")
    os.set_inheritable(fds[1], True)
    os.execv("/lib64/ld-linux-x86-64.so.2", ["ld.so", "/proc/self/fd/%d" % fds[1], "--version"])
`
	outer := `
import socket, os, subprocess, sys
condfs, sock, tool, inner = sys.argv[1:5]
a, b = socket.socketpair()
p = subprocess.Popen([condfs, "run", "--socket", sock, "--session", "default", "--", "python3", "-c", inner],
    stdin=b, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
b.close()
for line in p.stdout:
    sys.stdout.write(line.decode(errors="replace"))
    if line.startswith(b"ready"):
        break
fds = [os.open(tool, os.O_RDONLY), os.open("/usr/lib/git-core/git", os.O_RDONLY)]
try:
    socket.send_fds(a, [b"x"], fds)
    print("sent", flush=True)
except OSError as e:
    print("send refused:", e.strerror, flush=True)
    a.send(b"x")
out, _ = p.communicate(timeout=60)
sys.stdout.write(out.decode(errors="replace"))
print("rc", p.returncode)
`
	cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", outer,
		testenv.Condfs(), a.Socket, a.Home.Path("workspace/bin/tool42"), inner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	if strings.Contains(string(out), "SO_PASSRIGHTS turned on") {
		t.Errorf("HOLE: the command turned SO_PASSRIGHTS back on on its stdin")
	}
	if strings.Contains(string(out), "tool42 returned 42") {
		t.Errorf("HOLE: a socketpair end as stdin: the command received a file of an exec mount over it (SCM_RIGHTS) and ran its bytes mapped PROT_EXEC (tool42 returned 42), not in binaries")
	}
	if strings.Contains(string(out), "git version") {
		t.Errorf("HOLE: a socketpair end as stdin: the command received /usr/lib/git-core/git over it and ran it through ld.so, not in binaries")
	}
	if !strings.Contains(string(out), "Socket operation on non-socket") {
		t.Errorf("the command's stdin was a socket: %s", out)
	}
}

// TestStdinFileOfRemountedNoexecNeverMaps: the daemon decides a regular file by its
// mount's noexec once, when the run is asked. A caller with a user
// namespace mounts a tmpfs noexec, passes a file of it as stdin (accepted:
// not mappable then), and remounts it exec while the command runs: the
// command maps stdin executable.
func TestStdinFileOfRemountedNoexecNeverMaps(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	dir := a.Home.Path("mnt/x")
	os.MkdirAll(dir, 0o755)
	testenv.ChownTree(t, dir, testenv.Nobody)
	inner := execRules + `
import time
print("noexec at start", bool(os.fstatvfs(0).f_flag & os.ST_NOEXEC), flush=True)
time.sleep(4)
print("noexec now", bool(os.fstatvfs(0).f_flag & os.ST_NOEXEC), flush=True)
run(0, "stdin")
`
	script := fmt.Sprintf(`set -e
mount -t tmpfs -o noexec,mode=755 tmpfs %[1]s
cp %[2]s %[1]s/t
%[3]s run --socket %[4]s --session default -- python3 -c "$INNER" < %[1]s/t > %[1]s/out 2>&1 &
sleep 2
mount -o remount,bind,exec %[1]s && echo remounted exec
wait || true
cat %[1]s/out`, dir, a.Home.Path("workspace/bin/tool42"), testenv.Condfs(), a.Socket)
	cmd := testenv.CommandAs(testenv.Nobody, "unshare", "-Urm", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "INNER="+inner)
	out, err := cmd.CombinedOutput()
	t.Logf("%v\n%s", err, out)
	if !strings.Contains(string(out), "remounted exec") {
		// The attack needs an unprivileged user namespace, which the
		// machines CI runs on have.
		t.Fatalf("the attack did not get as far as the remount: %s", out)
	}
	if strings.Contains(string(out), "tool42 returned 42") {
		t.Errorf("HOLE: a file of a noexec mount the caller owns passed as stdin (accepted), the mount remounted exec while the run went on: the command ran its bytes mapped PROT_EXEC (tool42 returned 42)")
	}
}

// TestRelayedStdioFileGetsAllOutput: stdin, stdout and stderr regular files of an
// exec mount go through condfs run's relay. A command that writes much,
// leaves a background process holding stdout and exits must have all its
// output in the file, and condfs run must return at once; twice, the
// second run in the kept sandbox.
func TestRelayedStdioFileGetsAllOutput(t *testing.T) {
	d, _ := testenv.RunHome(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	in := filepath.Join(dir, "in")
	os.WriteFile(in, []byte(strings.Repeat("x", 1<<20)), 0o644)
	for round := 0; round < 2; round++ {
		out := filepath.Join(dir, fmt.Sprintf("out%d", round))
		line := fmt.Sprintf("exec %s run --socket %s --session s -- sh -c 'i=0; while [ $i -lt 3000 ]; do echo line$i; echo err$i >&2; i=$((i+1)); done; sleep 100 & exit 0' < %s > %s 2>&1",
			testenv.Condfs(), d.Socket, in, out)
		cmd := testenv.CommandAs(testenv.Nobody, "sh", "-c", line)
		start := time.Now()
		done := make(chan error, 1)
		cmd.Start()
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			b, _ := os.ReadFile(out)
			n := strings.Count(string(b), "\n")
			t.Logf("round %d: %v after %v, %d lines", round, err, time.Since(start), n)
			if !strings.Contains(string(b), "line2999\n") || !strings.Contains(string(b), "err2999\n") || n != 6000 {
				t.Errorf("HOLE: condfs run with file stdio lost output: %d lines of 6000", n)
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("HOLE: condfs run with file stdio did not return 20 s after its command exited")
		}
	}
}

// stdinRecv is run inside the sandbox after execRules: it receives
// descriptors on socket c and runs them (tool42 mapped PROT_EXEC, git
// through ld.so).
const stdinRecv = `
def take(c):
    try:
        msg, fds, fl, addr = socket.recv_fds(c, 16, 4)
    except OSError as e:
        print("recv", e.strerror, flush=True)
        return
    print("received", len(fds), "descriptors", flush=True)
    if len(fds) >= 2:
        run(fds[0], "received")
        os.set_inheritable(fds[1], True)
        os.execv("/lib64/ld-linux-x86-64.so.2", ["ld.so", "/proc/self/fd/%d" % fds[1], "--version"])
`

func stdinVerdict(t *testing.T, out, how string) {
	t.Helper()
	if strings.Contains(out, "tool42 returned 42") {
		t.Errorf("HOLE: %s: the command received a file of an exec mount (SCM_RIGHTS) and ran its bytes mapped PROT_EXEC (tool42 returned 42), not in binaries", how)
	}
	if strings.Contains(out, "git version") {
		t.Errorf("HOLE: %s: the command received /usr/lib/git-core/git and ran it through ld.so, not in binaries", how)
	}
}

// TestStdinListenerQueuePassesNoDescriptors: the daemon turns SO_PASSRIGHTS off on
// a Unix socket given as stdio, but a listening socket's connections
// already in its accept queue were made with the listener's flag as it
// was then (on). The caller connects to its own listener first, passes
// the listener as stdin; the command accepts the queued connection, whose
// SO_PASSRIGHTS is on, and the caller sends it files after the run began
// (tool42 returned 42). No socket is stdio now: condfs run relays it
// through a pipe (and the daemon refuses one passed by another client:
// TestRunStdioIsAStreamOfItsOwn).
func TestStdinListenerQueuePassesNoDescriptors(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	inner := execRules + `
import socket
` + stdinRecv + `
s = socket.socket(fileno=0)
c, _ = s.accept()
print("accepted, SO_PASSRIGHTS", c.getsockopt(socket.SOL_SOCKET, 83), flush=True)
print("ready", flush=True)
take(c)
`
	outer := `
import socket, os, subprocess, sys
condfs, sock, tool, inner = sys.argv[1:5]
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
l.bind("\0passrights-%d" % os.getpid())
l.listen(4)
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect(l.getsockname())
p = subprocess.Popen([condfs, "run", "--socket", sock, "--session", "default", "--", "python3", "-c", inner],
    stdin=l, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
l.close()
for line in p.stdout:
    sys.stdout.write(line.decode(errors="replace"))
    if line.startswith(b"ready") or line.startswith(b"condfs run"):
        break
fds = [os.open(tool, os.O_RDONLY), os.open("/usr/lib/git-core/git", os.O_RDONLY)]
try:
    socket.send_fds(c, [b"x"], fds)
    print("sent", flush=True)
except OSError as e:
    print("send refused:", e.strerror, flush=True)
    c.send(b"x")
out, _ = p.communicate(timeout=60)
sys.stdout.write(out.decode(errors="replace"))
print("rc", p.returncode)
`
	cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", outer,
		testenv.Condfs(), a.Socket, a.Home.Path("workspace/bin/tool42"), inner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	stdinVerdict(t, string(out), "a listening Unix socket as stdin, connected to before the run")
	if !strings.Contains(string(out), "Socket operation on non-socket") {
		t.Errorf("the command's stdin was a socket: %s", out)
	}
}

// rootRunHome: a root daemon (runHomeFiles: session "s" owned by 65534)
// whose runs may execute sh and python3, with more [sandbox] lines, and
// tool42 (mov eax,42; ret) in a directory of an exec mount outside.
func rootRunHome(t *testing.T, sandboxExtra string) (*testenv.Daemon, string) {
	t.Helper()
	rules := testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3"]
pids = 64
` + sandboxExtra
	d, _ := testenv.RunHomeFiles(t, rules, nil)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	tool := filepath.Join(dir, "tool42")
	if err := os.WriteFile(tool, []byte("\xb8\x2a\x00\x00\x00\xc3"), 0o755); err != nil {
		t.Fatal(err)
	}
	return d, tool
}

// TestHostNetworkAbstractSocketPassesNoDescriptors: with network "host" the run shares
// the host's abstract Unix socket namespace. The command connected a
// socket of its own (SO_PASSRIGHTS on by default: seccomp only refuses
// setting it) to an abstract name a process outside listened on, which
// sent it a file of an exec mount (tool42 returned 42). Landlock's scopes
// (ABI 6 on) now refuse the command abstract sockets made outside its
// domain.
func TestHostNetworkAbstractSocketPassesNoDescriptors(t *testing.T) {
	d, tool := rootRunHome(t, `network = "host"`+"\n")
	inner := execRules + `
import socket
` + stdinRecv + `
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    c.connect("\0" + sys.argv[1])
except OSError as e:
    print("connect", e.strerror, flush=True)
    sys.exit(0)
print("connected", flush=True)
take(c)
`
	outer := `
import socket, os, subprocess, sys
condfs, sock, tool, inner = sys.argv[1:5]
name = "hostnet-%d" % os.getpid()
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
l.bind("\0" + name)
l.listen(4)
l.settimeout(10)
p = subprocess.Popen([condfs, "run", "--socket", sock, "--session", "s", "--", "python3", "-c", inner, name],
    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
try:
    c, _ = l.accept()
    print("the command connected", flush=True)
    fds = [os.open(tool, os.O_RDONLY), os.open("/usr/lib/git-core/git", os.O_RDONLY)]
    try:
        socket.send_fds(c, [b"x"], fds)
        print("sent", flush=True)
    except OSError as e:
        print("send refused:", e.strerror, flush=True)
except OSError as e:
    print("accept:", e, flush=True)
out, _ = p.communicate(timeout=60)
sys.stdout.write(out.decode(errors="replace"))
print("rc", p.returncode)
`
	cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", outer,
		testenv.Condfs(), d.Socket, tool, inner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	stdinVerdict(t, string(out), `network "host": a socket the command made, connected to an abstract name outside`)
	if !strings.Contains(string(out), "connect Operation not permitted") {
		t.Errorf("the command's connect to an abstract name outside its domain was not refused: %s", out)
	}
	if !strings.Contains(string(out), "rc ") {
		t.Errorf("the attack did not run to its end: %s", out)
	}
}

// rootStdinHome is a root daemon whose session "default" (65534, a DM) runs
// python3 and the workspace's bin/ (the files StartUnprivHome makes).
func rootStdinHome(t *testing.T, extra ...string) (*testenv.Daemon, string) {
	t.Helper()
	h := testenv.OpenHome(t, testenv.UnprivRules)
	h.Write("config/policy.yaml", testenv.RunPolicy)
	h.Write("memories/pub.md", "public\n")
	h.Write("workspace/w.txt", "work\n")
	h.Write("workspace/bin/tool42", "\xb8\x2a\x00\x00\x00\xc3")
	os.Chmod(h.Path("workspace/bin/tool42"), 0o755)
	for _, p := range []string{"memories", "workspace"} {
		os.Chmod(h.Path(p), 0o777)
	}
	os.MkdirAll(h.Path("mnt"), 0o777)
	d := testenv.Start(t, h, append([]string{"--allow-uid", "65534", "--socket-mode", "0666"}, extra...)...)
	os.Chmod(h.Path("run"), 0o755)
	d.OpenFor("default", testenv.Nobody, testenv.DM)
	return d, h.Path("workspace/bin/tool42")
}

// backChannelOuter is the caller (65534): a socketpair end as the
// run's stdin; it waits for the command to send it a socket, and sends the
// command, over that socket, tool42 and git.
const backChannelOuter = `
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

// backChannelInner is the command: it makes a socketpair of its own
// (SO_PASSRIGHTS on, as every new socket), sends one end out through
// stdin (the caller's end takes descriptors), and receives on the other.
const backChannelInner = execRules + `
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

func backChannelVerdict(t *testing.T, out, how string) {
	t.Helper()
	stdinVerdict(t, out, how)
	if strings.Contains(out, "memfd-exec-ran") {
		t.Errorf("HOLE: %s: the command received a memfd holding /usr/bin/echo and executed it (fexecve), not in binaries", how)
	}
	// Held now: no socket is stdio (condfs run relays it through a pipe).
	if !strings.Contains(out, "Socket operation on non-socket") {
		t.Errorf("the command's stdin was a socket: %s", out)
	}
}

// TestStdinSocketPassesNoDescriptorsOut: the daemon turns SO_PASSRIGHTS off on a Unix
// socket given as stdio, so its peer cannot send the command descriptors
// through it (TestStdinSocketPassesNoDescriptorsIn). But the command may still
// SEND descriptors through it: it sends out one end of a socketpair of its
// own (which takes descriptors, as every new socket does), and the caller
// sends it a file of an exec mount over that one (tool42 returned 42, a
// memfd of echo ran). Unprivileged daemon. Fixed: no socket is stdio.
func TestStdinSocketPassesNoDescriptorsOut(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", backChannelOuter,
		testenv.Condfs(), a.Socket, a.Home.Path("workspace/bin/tool42"), backChannelInner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	backChannelVerdict(t, string(out), "a socketpair end as stdin, the command sent a socket of its own out through it")
}

// TestStdinSocketPassesNoDescriptorsOutRootDaemon: the same on a root daemon.
func TestStdinSocketPassesNoDescriptorsOutRootDaemon(t *testing.T) {
	d, tool := rootStdinHome(t)
	cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", backChannelOuter,
		testenv.Condfs(), d.Socket, tool, backChannelInner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	backChannelVerdict(t, string(out), "root daemon: a socketpair end as stdin, the command sent a socket of its own out through it")
}

// TestStdinInetSocketReachesNoNetwork: with network = "none" the run has only a
// loopback of its own. An unconnected TCP socket of the host's network
// namespace given as stdin is accepted (only Unix sockets are looked at),
// and the command connected it to a host address (the host's loopback).
// Fixed: no socket is stdio.
func TestStdinInetSocketReachesNoNetwork(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
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
	cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", outer, testenv.Condfs(), a.Socket, inner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	if strings.Contains(string(out), "escaped-the-run-netns") {
		t.Errorf("HOLE: network = \"none\", an unconnected TCP socket of the host's namespace as stdin: the command connected it to the host's loopback")
	}
}

// TestRunStdioIsAStreamOfItsOwn: what a client passes as a run's stdio is a stream of
// its own, never more. A second connection to the control socket passed as
// stdin let the command call context.set from inside the run (from a guild
// into a DM, then read the DM's private file); it is refused (125) with
// nothing run, as are a pidfd, an epoll
// instance, a memfd (Landlock does not govern its mount: fexecve), a
// regular file on a mount that allows execution and /dev/zero (the command
// could map them executable: TestStdinFileOnExecMountNeverExecutes), a socket (a Unix
// one carries descriptors both ways, an unconnected one connects where it
// was made: TestStdinSocketPassesNoDescriptorsOut, TestStdinInetSocketReachesNoNetwork), and a fourth descriptor beside the three.
func TestRunStdioIsAStreamOfItsOwn(t *testing.T) {
	d, _ := testenv.RunHome(t)
	d.SetContext("s", testenv.Guild)
	const script = `printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"context.set","params":{"session":"s","context":["discord:dm","discord:dm:7"]}}' >&0; sleep 0.3; echo ran > /workspace/ran; cat /memories/private/p.md`
	for _, kind := range []string{"ctl", "pidfd", "epoll", "memfd", "execfile", "zero", "unix", "tcp", "four"} {
		cmd := testenv.CommandAs(testenv.Nobody, testenv.Attacker(), "runstdio", d.Socket, "s", kind, script)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), `"code":-32010`) && !strings.Contains(string(out), "cannot be stdio") && !strings.Contains(string(out), "descriptors") {
			t.Errorf("%s as stdio: %s", kind, out)
		}
		if strings.Contains(string(out), "dm secret") {
			t.Errorf("%s as stdio: the command read the DM's file", kind)
		}
		if _, err := os.Stat(d.Home.Path("workspace/ran")); err == nil {
			t.Errorf("%s as stdio: the command ran", kind)
			os.Remove(d.Home.Path("workspace/ran"))
		}
	}
	var ctxNow struct{ Atoms []string }
	d.Call("context.get", map[string]any{"session": "s"}, &ctxNow)
	if slices.Contains(ctxNow.Atoms, "discord:dm") || len(ctxNow.Atoms) != len(testenv.Guild) {
		t.Errorf("the context was changed from inside a run: %v", ctxNow.Atoms)
	}
}

// TestStdinFileOnExecMountNeverExecutes: the command's stdin may be any regular file of
// the caller's (stdioOK refuses memfds because "the command could fexecve
// it"), and the caller's files lie on exec mounts: the host's /usr, and
// the host's view mount (fusermount3 mounts it exec). Landlock refuses
// execve of such a descriptor, but the ELF interpreter, which every run
// may execute, maps it through /proc/self/fd/0, and nothing refuses that
// mapping (its mount is not noexec; Landlock does not govern mmap). So a
// harness that feeds a workspace file as stdin (`condfs run ... < file`)
// lets the command run bytes the session wrote, and a host program runs
// although binaries does not list it.
func TestStdinFileOnExecMountNeverExecutes(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	// Run 1 (DM: cat allowed) writes a copy of git into the workspace.
	if out, code := a.Run(t, "", "sh", "-c", "cat /usr/lib/git-core/git > /workspace/g && echo copied"); code != 0 || !strings.Contains(out, "copied") {
		t.Fatalf("copy: %d %q", code, out)
	}
	// Control: from the run's own view it does not run (noexec).
	if out, code := a.Run(t, "", "sh", "-c", "/lib64/ld-linux-x86-64.so.2 /workspace/g --version"); strings.Contains(out, "git version") {
		t.Fatalf("control: git ran from the view in the run: %d %q", code, out)
	} else {
		t.Logf("control, the run's own /workspace/g (%d): %q", code, out)
	}
	for _, c := range []struct{ name, redir string }{
		{"a workspace file through the host's view mount", "< " + a.Mnt + "/workspace/g"},
		{"a host program", "< /usr/lib/git-core/git"},
	} {
		out, code := a.Run(t, c.redir, "sh", "-c", "/lib64/ld-linux-x86-64.so.2 /proc/self/fd/0 --version; echo st=$?")
		t.Logf("%s as stdin (%d): %q", c.name, code, out)
		if strings.Contains(out, "git version") {
			t.Errorf("HOLE: %s passed as stdin: the command ran git (not in binaries) through the ELF interpreter on /proc/self/fd/0", c.name)
		}
	}
	// execve itself: the file made executable through the host's view
	// mount (not listed: writable), then execve of /proc/self/fd/0
	// (Landlock grants execution beneath /workspace, which lists view
	// paths; the descriptor's mount is the host's, exec).
	if o, err := testenv.CommandAs(testenv.Nobody, "chmod", "755", a.Mnt+"/workspace/g").CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v %s", err, o)
	}
	out, code := a.Run(t, "< "+a.Mnt+"/workspace/g", "python3", "-c", "import os; os.execv('/proc/self/fd/0', ['git', '--version'])")
	t.Logf("execve of stdin (%d): %q", code, out)
	if strings.Contains(out, "git version") {
		t.Errorf("HOLE: a workspace file passed as stdin: the command execve'd it (git, not in binaries)")
	}
}

// TestStdinFileOnExecMountNeverExecutesUnlisted: as TestStdinFileOnExecMountNeverExecutes where no
// binaries entry names the view: the ELF interpreter's route does not
// depend on the listing.
func TestStdinFileOnExecMountNeverExecutesUnlisted(t *testing.T) {
	a := testenv.StartUnprivHome(t, strings.Replace(testenv.RunRules, `"/usr/bin/tr"]`, `"/usr/bin/tr", "/usr/bin/python3"]`, 1), nil)
	if out, code := a.Run(t, "", "sh", "-c", "cat /usr/lib/git-core/git > /workspace/g && echo copied"); code != 0 || !strings.Contains(out, "copied") {
		t.Fatalf("copy: %d %q", code, out)
	}
	out, code := a.Run(t, "< "+a.Mnt+"/workspace/g", "sh", "-c", "/lib64/ld-linux-x86-64.so.2 /proc/self/fd/0 --version; echo st=$?")
	t.Logf("ld.so on stdin (%d): %q", code, out)
	if strings.Contains(out, "git version") {
		t.Errorf("HOLE: a workspace file passed as stdin ran (git, not in binaries) through the ELF interpreter, no view path listed")
	}
}
