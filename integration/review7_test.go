package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The seventh review: stdio the daemon accepts (internal/stdiofd) and the
// bound on open files (fsys/files.go).

// atk7Exec is run inside the sandbox: it maps a descriptor PROT_EXEC
// (allowed by seccomp: file-backed, not writable) and calls it. The file
// holds tool42's bytes (mov eax,42; ret); Landlock does not govern mmap.
const atk7Exec = `
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

// TestAtk7StdinSocketPassesFDs: an AF_UNIX socket whose peer is not the
// daemon is accepted as stdio. Over it, a process outside the run sent
// the command descriptors (SCM_RIGHTS): a file on an exec mount, which the
// command mapped executable (tool42 returned 42) and /usr/lib/git-core/git,
// run through ld.so, though binaries lists neither. No socket is stdio now
// (TestAtk9CStdinBackChannel: SO_PASSRIGHTS off, the first fix, left the
// other way open): condfs run relays it through a pipe, and the command's
// stdin is not a socket.
func TestAtk7StdinSocketPassesFDs(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	inner := atk7Exec + `
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
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", outer,
		condfsBin, a.sock, a.h.path("workspace/bin/tool42"), inner)
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

// TestAtk7StdinNoexecRemount: the daemon decides a regular file by its
// mount's noexec once, when the run is asked. A caller with a user
// namespace mounts a tmpfs noexec, passes a file of it as stdin (accepted:
// not mappable then), and remounts it exec while the command runs: the
// command maps stdin executable.
func TestAtk7StdinNoexecRemount(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	dir := a.h.path("mnt/x")
	os.MkdirAll(dir, 0o755)
	chownTree(t, dir, nobody)
	inner := atk7Exec + `
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
cat %[1]s/out`, dir, a.h.path("workspace/bin/tool42"), condfsBin, a.sock)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-Urm", "sh", "-c", script)
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

// atk7Holder starts, as uid, a process that opens path n times and holds
// the files until its stdin closes. It returns the count opened (and the
// error that stopped it) and a function that ends it.
func atk7Holder(t *testing.T, uid int, path string, n int) (string, func()) {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(uid), "--clear-groups", "/usr/bin/python3", "-c", `
import os, sys, resource
s, h = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
fds, err = [], "none"
try:
    for i in range(int(sys.argv[2])):
        fds.append(os.open(sys.argv[1], os.O_RDONLY))
except OSError as e:
    err = e.strerror
print("held", len(fds), "err", err, flush=True)
sys.stdin.readline()
`, path, strconv.Itoa(n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	stop := func() { stdin.Close(); cmd.Wait() }
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	return strings.TrimSpace(line), stop
}

func atk7FDs(pid int) int {
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es)
}

// atk7Daemon: a root daemon whose RLIMIT_NOFILE is 2048 (a view's share
// 128, the room for all views about 1,500), 65534 admitted.
func atk7Daemon(t *testing.T, extra ...string) *daemon {
	h := openHome(t, runRules)
	h.t = t
	h.write("config/policy.yaml", runPolicy)
	h.write("memories/pub.md", "public\n")
	h.write("workspace/w.txt", "work\n")
	for _, p := range []string{"memories", "workspace"} {
		os.Chmod(h.path(p), 0o777)
	}
	os.MkdirAll(h.path("mnt"), 0o777)
	d := startDaemonUnder(t, h, []string{"prlimit", "--nofile=2048:2048", "setpriv", "--bounding-set=-sys_resource", "--"},
		append([]string{"--allow-uid", "65534", "--allow-uid", "1000", "--socket-mode", "0666"}, extra...)...)
	os.Chmod(filepath.Dir(d.socket), 0o755)
	return d
}

// atk7CloseWhileHeld opens sessions of uid 65534 in turn, holds n files of
// each through its mount, closes the session and then the files; then a
// fresh session holds up to fresh files. It returns what the fresh one
// held and how many descriptors the daemon holds more than at the start.
func atk7CloseWhileHeld(t *testing.T, d *daemon, n, fresh int) (got string, leaked int) {
	t.Helper()
	pid := d.cmd.Process.Pid
	base := atk7FDs(pid)
	for i := 0; i < 16; i++ {
		id := fmt.Sprintf("c%d", i)
		mnt := d.openFor(id, nobody, dmCtx)
		got, stop := atk7Holder(t, nobody, mnt+"/workspace/w.txt", n)
		d.call("session.close", map[string]any{"id": id}, nil)
		stop()
		time.Sleep(300 * time.Millisecond)
		t.Logf("cycle %d: %s; daemon fds %d (at start %d)", i, got, atk7FDs(pid), base)
	}
	time.Sleep(2 * time.Second)
	leaked = atk7FDs(pid) - base
	mnt := d.openFor("fresh", nobody, dmCtx)
	got, stop := atk7Holder(t, nobody, mnt+"/workspace/w.txt", fresh)
	stop()
	t.Logf("fresh session: %s; daemon fds now %d (%d more than at start)", got, atk7FDs(pid), leaked)
	return got, leaked
}

// TestAtk7ReleaseLostOnClose: a session closed while a local user holds
// files of its host mount open: the mount is detached, and when the user
// closes them the FUSE connection ends; RELEASEs still queued then are
// aborted by the kernel, so giveFile never runs (and the backing fds are
// never closed). Repeated, the daemon's room for open files is gone for
// good: every new view gets ENFILE.
func TestAtk7ReleaseLostOnClose(t *testing.T) {
	got, leaked := atk7CloseWhileHeld(t, atk7Daemon(t), 128, 1)
	if got != "held 1 err none" {
		t.Errorf("HOLE: after sessions were closed while files of their host mounts were open, a fresh session's first open fails (%s): the lost RELEASEs never gave their descriptors back (giveFile), %d daemon fds leaked", got, leaked)
	} else if leaked > 64 {
		t.Errorf("HOLE: sessions closed while files were open leaked %d daemon descriptors (RELEASE never seen)", leaked)
	}
}

// TestAtk7OneUidAllRoom: the bound is per view, and any allowed uid may
// open sessions of its own: one uid opening a dozen views, each at its
// share, takes the room of all views, and another user's session fails.
func TestAtk7OneUidAllRoom(t *testing.T) {
	d := atk7Daemon(t)
	victim := d.openFor("victim", 1000, dmCtx)
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	for i := 0; i < 13; i++ {
		id := fmt.Sprintf("a%d", i)
		mnt := d.home.path("mnt/" + id)
		os.MkdirAll(mnt, 0o755)
		os.Chown(mnt, nobody, nobody)
		out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "ctl", "--socket", d.socket,
			"open", id, mnt, "--context", "discord:dm").CombinedOutput()
		if err != nil {
			t.Fatalf("65534 opens session %s: %v %s", id, err, out)
		}
		got, stop := atk7Holder(t, nobody, mnt+"/workspace/w.txt", 200)
		stops = append(stops, stop)
		t.Logf("65534's session %s: %s", id, got)
	}
	got, stop := atk7Holder(t, 1000, victim+"/workspace/w.txt", 1)
	stop()
	t.Logf("uid 1000's session: %s", got)
	if got != "held 1 err none" {
		t.Errorf("HOLE: uid 65534 opened 13 sessions of its own and held its share in each: uid 1000's session cannot open a file (%s)", got)
	}
}

// TestAtk7RelayFileStdio: stdin, stdout and stderr regular files of an
// exec mount go through condfs run's relay. A command that writes much,
// leaves a background process holding stdout and exits must have all its
// output in the file, and condfs run must return at once; twice, the
// second run in the kept sandbox.
func TestAtk7RelayFileStdio(t *testing.T) {
	d, _ := runHome(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	in := filepath.Join(dir, "in")
	os.WriteFile(in, []byte(strings.Repeat("x", 1<<20)), 0o644)
	for round := 0; round < 2; round++ {
		out := filepath.Join(dir, fmt.Sprintf("out%d", round))
		line := fmt.Sprintf("exec %s run --socket %s --session s -- sh -c 'i=0; while [ $i -lt 3000 ]; do echo line$i; echo err$i >&2; i=$((i+1)); done; sleep 100 & exit 0' < %s > %s 2>&1",
			condfsBin, d.socket, in, out)
		cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", line)
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
