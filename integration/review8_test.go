package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

// The eighth review: what the command of a run can be given to execute
// beyond its binaries (stdio, a process outside, the network), and the
// bounds on the daemon's descriptors.

// atk8Recv is run inside the sandbox after atk7Exec: it receives
// descriptors on socket c and runs them (tool42 mapped PROT_EXEC, git
// through ld.so).
const atk8Recv = `
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

func atk8Verdict(t *testing.T, out, how string) {
	t.Helper()
	if strings.Contains(out, "tool42 returned 42") {
		t.Errorf("HOLE: %s: the command received a file of an exec mount (SCM_RIGHTS) and ran its bytes mapped PROT_EXEC (tool42 returned 42), not in binaries", how)
	}
	if strings.Contains(out, "git version") {
		t.Errorf("HOLE: %s: the command received /usr/lib/git-core/git and ran it through ld.so, not in binaries", how)
	}
}

// TestAtk8PreconnectedListenerStdin: the daemon turns SO_PASSRIGHTS off on
// a Unix socket given as stdio, but a listening socket's connections
// already in its accept queue were made with the listener's flag as it
// was then (on). The caller connects to its own listener first, passes
// the listener as stdin; the command accepts the queued connection, whose
// SO_PASSRIGHTS is on, and the caller sends it files after the run began
// (tool42 returned 42). No socket is stdio now: condfs run relays it
// through a pipe (and the daemon refuses one passed by another client:
// TestAttackRunStdio).
func TestAtk8PreconnectedListenerStdin(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	inner := atk7Exec + `
import socket
` + atk8Recv + `
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
l.bind("\0atk8-%d" % os.getpid())
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
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", outer,
		condfsBin, a.sock, a.h.path("workspace/bin/tool42"), inner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	atk8Verdict(t, string(out), "a listening Unix socket as stdin, connected to before the run")
	if !strings.Contains(string(out), "Socket operation on non-socket") {
		t.Errorf("the command's stdin was a socket: %s", out)
	}
}

// atk8RootHome: a root daemon (runHomeFiles: session "s" owned by 65534)
// whose runs may execute sh and python3, with more [sandbox] lines, and
// tool42 (mov eax,42; ret) in a directory of an exec mount outside.
func atk8RootHome(t *testing.T, sandboxExtra string) (*daemon, string) {
	t.Helper()
	rules := privateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3"]
pids = 64
` + sandboxExtra
	d, _ := runHomeFiles(t, rules, nil)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	tool := filepath.Join(dir, "tool42")
	if err := os.WriteFile(tool, []byte("\xb8\x2a\x00\x00\x00\xc3"), 0o755); err != nil {
		t.Fatal(err)
	}
	return d, tool
}

// TestAtk8HostNetworkAbstractSocket: with network "host" the run shares
// the host's abstract Unix socket namespace. The command connected a
// socket of its own (SO_PASSRIGHTS on by default: seccomp only refuses
// setting it) to an abstract name a process outside listened on, which
// sent it a file of an exec mount (tool42 returned 42). Landlock's scopes
// (ABI 6 on) now refuse the command abstract sockets made outside its
// domain.
func TestAtk8HostNetworkAbstractSocket(t *testing.T) {
	d, tool := atk8RootHome(t, `network = "host"`+"\n")
	inner := atk7Exec + `
import socket
` + atk8Recv + `
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
name = "atk8host-%d" % os.getpid()
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
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", outer,
		condfsBin, d.socket, tool, inner)
	out, _ := cmd.CombinedOutput()
	t.Logf("%s", out)
	atk8Verdict(t, string(out), `network "host": a socket the command made, connected to an abstract name outside`)
	if !strings.Contains(string(out), "connect Operation not permitted") {
		t.Errorf("the command's connect to an abstract name outside its domain was not refused: %s", out)
	}
	if !strings.Contains(string(out), "rc ") {
		t.Errorf("the attack did not run to its end: %s", out)
	}
}

// TestAtk8RunsEatReserve: the files one uid's views may hold are half the
// room, and the reserve (an eighth of RLIMIT_NOFILE, at least 512) is all
// that is left for the rest of the daemon; runs hold descriptors the file
// budget does not count (their connection, the init's channel, pidfd,
// cgroups, stdio). One uid holds its half of the files and starts as many
// runs as its connections allow: does another uid's view, or root's
// control call, still work?
func TestAtk8RunsEatReserve(t *testing.T) {
	d := atk7Daemon(t)
	pid := d.cmd.Process.Pid
	victim := d.openFor("victim", 1000, dmCtx)
	base := atk7FDs(pid)
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	for i := 0; i < 6; i++ {
		id := fmt.Sprintf("a%d", i)
		mnt := d.openFor(id, nobody, dmCtx)
		got, stop := atk7Holder(t, nobody, mnt+"/workspace/w.txt", 128)
		stops = append(stops, stop)
		t.Logf("65534's session %s: %s", id, got)
	}
	t.Logf("daemon fds with the files held: %d (base %d)", atk7FDs(pid), base)
	var runs []*exec.Cmd
	defer func() {
		for _, c := range runs {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for i := 0; i < 120; i++ {
		c := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket,
			"--session", fmt.Sprintf("a%d", i%6), "--", "sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, c)
		if i%20 == 19 {
			time.Sleep(time.Second)
			t.Logf("%d runs: daemon fds %d", i+1, atk7FDs(pid))
		}
	}
	time.Sleep(3 * time.Second)
	t.Logf("daemon fds with the runs: %d", atk7FDs(pid))
	atk8OthersServed(t, d, victim, "uid 65534 held its half of the files and started 120 runs")
}

// atk8OthersServed: while the attack holds, uid 1000's session (mounted at
// victim) opens a file and root's control call is answered.
func atk8OthersServed(t *testing.T, d *daemon, victim, attack string) {
	t.Helper()
	got, stop := atk7Holder(t, 1000, victim+"/workspace/w.txt", 1)
	stop()
	t.Logf("uid 1000's session: %s", got)
	var err error
	if c, derr := control.Dial(d.socket); derr != nil {
		err = derr
	} else {
		err = c.Call("status", nil, nil)
		c.Close()
	}
	t.Logf("root's status: %v", err)
	if got != "held 1 err none" {
		t.Errorf("HOLE: %s: uid 1000's session cannot open a file (%s)", attack, got)
	}
	if err != nil {
		t.Errorf("HOLE: %s: root's control call fails: %v", attack, err)
	}
}
