package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

// The sixth review: view binaries (and the run around them) when the
// daemon is an ordinary user's (uid 65534) and builds its runs with user
// namespaces: the command, its init and the daemon share one uid, each
// session has a FUSE connection of its own (every context.set bumps its
// epoch), and fusermount3 made the host's view mount.

// atk6Rules: /workspace/bin/ runs in DMs only; sh, cat, python3 everywhere
// (cat in DMs only, as runRules says).
var atk6Rules = strings.Replace(runRules, `"/usr/bin/tr"]`, `"/usr/bin/tr", "/usr/bin/python3", "/workspace/bin/"]`, 1) + `
[exec."/workspace/bin/"]
when = "discord:dm"
action = "allow"
`

// atk6 is an unprivileged daemon's home.
type atk6 struct {
	h    *home
	sock string
	logs func() string
	mnt  string // the host's view mount of session "default"
}

// atk6Home starts condfs serve as 65534 (startUnprivDaemon: session
// "default" in a DM, mounted at mnt/v) with files made first.
func atk6Home(t *testing.T, rules string, files func(h *home)) *atk6 {
	t.Helper()
	requireUnprivilegedFUSE(t)
	h := openHome(t, rules)
	h.t = t
	h.write("config/policy.yaml", runPolicy)
	h.write("memories/private/p.md", "dm secret\n")
	h.write("memories/pub.md", "public\n")
	h.write("workspace/w.txt", "work\n")
	h.write("workspace/bin/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	h.write("workspace/bin/tool42", "\xb8\x2a\x00\x00\x00\xc3")
	echoELF, _ := os.ReadFile("/usr/bin/echo")
	h.write("workspace/bin/echo", string(echoELF))
	for _, p := range []string{"workspace/bin/hello.sh", "workspace/bin/tool42", "workspace/bin/echo"} {
		os.Chmod(h.path(p), 0o755)
	}
	if files != nil {
		files(h)
	}
	sock, logs := startUnprivDaemon(t, h)
	return &atk6{h: h, sock: sock, logs: logs, mnt: h.path("mnt/v")}
}

// run runs `condfs run` as 65534 in session "default" through sh, so that
// stdin may be redirected by the caller's shell (redir, "" for none).
func (a *atk6) run(t *testing.T, redir string, argv ...string) (string, int) {
	t.Helper()
	q := make([]string, len(argv))
	for i, s := range argv {
		q[i] = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	line := fmt.Sprintf("exec %s run --socket %s --session default -- %s %s", condfsBin, a.sock, strings.Join(q, " "), redir)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", line)
	out, _ := cmd.CombinedOutput()
	return string(out), cmd.ProcessState.ExitCode()
}

// shell starts `condfs run -- sh -c script` as 65534 in session "default".
func (a *atk6) shell(t *testing.T, script string) (*exec.Cmd, io.WriteCloser, chan string) {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", a.sock, "--session", "default", "--",
		"sh", "-c", script)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	return cmd, stdin, lines
}

// call makes a control call as root (admitted by every daemon).
func (a *atk6) call(t *testing.T, method string, params, out any) error {
	t.Helper()
	c, err := control.Dial(a.sock)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(method, params, out)
}

func (a *atk6) setContext(t *testing.T, atoms []string) {
	t.Helper()
	if err := a.call(t, "context.set", map[string]any{"session": "default", "context": atoms}, nil); err != nil {
		t.Fatalf("context.set: %v", err)
	}
}

// TestAtk6StdinExecMount: the command's stdin may be any regular file of
// the caller's (stdioOK refuses memfds because "the command could fexecve
// it"), and the caller's files lie on exec mounts: the host's /usr, and
// the host's view mount (fusermount3 mounts it exec). Landlock refuses
// execve of such a descriptor, but the ELF interpreter, which every run
// may execute, maps it through /proc/self/fd/0, and nothing refuses that
// mapping (its mount is not noexec; Landlock does not govern mmap). So a
// harness that feeds a workspace file as stdin (`condfs run ... < file`)
// lets the command run bytes the session wrote, and a host program runs
// although binaries does not list it.
func TestAtk6StdinExecMount(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	// Run 1 (DM: cat allowed) writes a copy of git into the workspace.
	if out, code := a.run(t, "", "sh", "-c", "cat /usr/lib/git-core/git > /workspace/g && echo copied"); code != 0 || !strings.Contains(out, "copied") {
		t.Fatalf("copy: %d %q", code, out)
	}
	// Control: from the run's own view it does not run (noexec).
	if out, code := a.run(t, "", "sh", "-c", "/lib64/ld-linux-x86-64.so.2 /workspace/g --version"); strings.Contains(out, "git version") {
		t.Fatalf("control: git ran from the view in the run: %d %q", code, out)
	} else {
		t.Logf("control, the run's own /workspace/g (%d): %q", code, out)
	}
	for _, c := range []struct{ name, redir string }{
		{"a workspace file through the host's view mount", "< " + a.mnt + "/workspace/g"},
		{"a host program", "< /usr/lib/git-core/git"},
	} {
		out, code := a.run(t, c.redir, "sh", "-c", "/lib64/ld-linux-x86-64.so.2 /proc/self/fd/0 --version; echo st=$?")
		t.Logf("%s as stdin (%d): %q", c.name, code, out)
		if strings.Contains(out, "git version") {
			t.Errorf("HOLE: %s passed as stdin: the command ran git (not in binaries) through the ELF interpreter on /proc/self/fd/0", c.name)
		}
	}
	// execve itself: the file made executable through the host's view
	// mount (not listed: writable), then execve of /proc/self/fd/0
	// (Landlock grants execution beneath /workspace, which lists view
	// paths; the descriptor's mount is the host's, exec).
	if o, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "chmod", "755", a.mnt+"/workspace/g").CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v %s", err, o)
	}
	out, code := a.run(t, "< "+a.mnt+"/workspace/g", "python3", "-c", "import os; os.execv('/proc/self/fd/0', ['git', '--version'])")
	t.Logf("execve of stdin (%d): %q", code, out)
	if strings.Contains(out, "git version") {
		t.Errorf("HOLE: a workspace file passed as stdin: the command execve'd it (git, not in binaries)")
	}
}

// TestAtk6StdinExecMountNoListing: as TestAtk6StdinExecMount where no
// binaries entry names the view: the ELF interpreter's route does not
// depend on the listing.
func TestAtk6StdinExecMountNoListing(t *testing.T) {
	a := atk6Home(t, strings.Replace(runRules, `"/usr/bin/tr"]`, `"/usr/bin/tr", "/usr/bin/python3"]`, 1), nil)
	if out, code := a.run(t, "", "sh", "-c", "cat /usr/lib/git-core/git > /workspace/g && echo copied"); code != 0 || !strings.Contains(out, "copied") {
		t.Fatalf("copy: %d %q", code, out)
	}
	out, code := a.run(t, "< "+a.mnt+"/workspace/g", "sh", "-c", "/lib64/ld-linux-x86-64.so.2 /proc/self/fd/0 --version; echo st=$?")
	t.Logf("ld.so on stdin (%d): %q", code, out)
	if strings.Contains(out, "git version") {
		t.Errorf("HOLE: a workspace file passed as stdin ran (git, not in binaries) through the ELF interpreter, no view path listed")
	}
}

// TestAtk6InitProc: on this path the init has the command's uid. Its
// /proc entries (its executable: the daemon's binary, on an exec host
// mount; its descriptors: the channel to the daemon) must stay closed.
func TestAtk6InitProc(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	out, code := a.run(t, "", "python3", "-c", `
import os
def tr(name, f):
    try:
        print(name, "OK", f(), flush=True)
    except OSError as e:
        print(name, e.strerror, flush=True)
tr("readlink exe", lambda: os.readlink("/proc/1/exe"))
tr("open exe", lambda: os.open("/proc/1/exe", os.O_RDONLY))
tr("list fd", lambda: os.listdir("/proc/1/fd"))
tr("open fd3", lambda: os.open("/proc/1/fd/3", os.O_RDWR))
tr("root", lambda: os.listdir("/proc/1/root"))
tr("cwd", lambda: os.listdir("/proc/1/cwd"))
tr("environ", lambda: open("/proc/1/environ","rb").read()[:40])
tr("mem", lambda: os.open("/proc/1/mem", os.O_RDONLY))
tr("map_files", lambda: os.listdir("/proc/1/map_files"))
tr("status", lambda: [l for l in open("/proc/1/status") if l.startswith(("Uid", "CapEff", "CapBnd"))])
tr("self caps", lambda: [l for l in open("/proc/self/status") if l.startswith(("Uid", "CapEff", "CapPrm", "CapAmb", "CapBnd", "NoNewPrivs", "Seccomp"))])
tr("uid_map", lambda: open("/proc/self/uid_map").read())
tr("pids", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
`)
	t.Logf("(%d)\n%s", code, out)
	for _, l := range strings.Split(out, "\n") {
		if (strings.HasPrefix(l, "open exe OK") || strings.HasPrefix(l, "open fd3 OK") || strings.HasPrefix(l, "list fd OK") ||
			strings.HasPrefix(l, "root OK") || strings.HasPrefix(l, "mem OK") || strings.HasPrefix(l, "environ OK")) && !strings.Contains(l, "'/'") {
			t.Errorf("HOLE: the init's /proc entry is open to the command: %s", l)
		}
	}
	// The ELF interpreter on the init's executable (the daemon's binary).
	o2, c2 := a.run(t, "", "sh", "-c", "/lib64/ld-linux-x86-64.so.2 /proc/1/exe --help; echo st=$?")
	t.Logf("ld.so /proc/1/exe (%d): %q", c2, o2)
	if strings.Contains(o2, "Usage") || strings.Contains(o2, "condfs") && !strings.Contains(o2, "cannot") {
		t.Errorf("HOLE: the daemon's binary ran in the run through /proc/1/exe")
	}
}

// TestAtk6SignalInit: the command may signal its init on this path. The
// init drops the signals that end a Go program by default; the ones the Go
// runtime turns into a crash when sent by kill (SIGSEGV, SIGBUS, SIGFPE,
// SIGABRT, SIGILL, SIGTRAP, SIGSYS) are tried one per run: the run may end,
// nothing else may (the daemon, the session's next run).
func TestAtk6SignalInit(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	for _, sig := range []string{"SEGV", "ABRT", "SYS", "TRAP", "XCPU", "ALRM", "TSTP", "CONT"} {
		out, code := a.run(t, "", "sh", "-c", "kill -"+sig+" 1; echo sent=$?; sleep 1; echo alive; cat /memories/pub.md")
		if len(out) > 600 {
			out = out[:600] + "..."
		}
		t.Logf("SIG%s (%d): %q", sig, code, out)
		if strings.Contains(out, "goroutine ") {
			t.Logf("SIG%s: the init's crash dump reached the command's stderr", sig)
		}
		if o, c := a.run(t, "", "cat", "/memories/pub.md"); c != 0 || o != "public\n" {
			t.Fatalf("after SIG%s the session's next run: %d %q\n%s", sig, c, o, tail(a.logs(), 20))
		}
	}
}

// TestAtk6StaleBindEpoch: a connection per session bumps its epoch at
// every context.set, so walking /workspace/bin during a switch between two
// DMs (both allow it) has the kernel detach the run's bind itself, still
// executable. A descriptor of tool42 opened through it is then mapped
// executable after the switch to a guild (which withdraws bin/).
func TestAtk6StaleBindEpoch(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	_, stdin, lines := a.shell(t, strings.Replace(vb2Script, "900", "300", 1))
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q\n%s", o, tail(a.logs(), 20))
	}
	for i := 0; i < 6; i++ {
		time.Sleep(100 * time.Millisecond)
		if i%2 == 0 {
			a.setContext(t, []string{"discord:dm", "discord:dm:8", "discord:channel:8"})
		} else {
			a.setContext(t, dmCtx)
		}
	}
	time.Sleep(300 * time.Millisecond)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "checked", 20*time.Second)
	t.Logf("after switches that keep it allowed:\n%s", o)
	a.setContext(t, guildCtx)
	io.WriteString(stdin, "go\n")
	o, _ = waitLine(t, lines, "end", 20*time.Second)
	t.Logf("after the switch to a guild:\n%s", o)
	for _, l := range strings.Split(a.logs(), "\n") {
		if strings.Contains(l, "binaries not updated") {
			t.Log(l)
		}
	}
	if strings.Contains(o, "called: 42") {
		t.Errorf("HOLE: tool42 (DMs only) mapped executable and called after the switch to a guild returned")
	}
}

// TestAtk6OpenFilesExhaustDaemon: each file a run opens through the view
// is a descriptor of the daemon's (the backing file, reopened). The run's
// processes inherit the daemon's hard RLIMIT_NOFILE: one run that opens as
// many files as it may leaves the daemon none, and every other session
// (and the control socket) fails while it holds them.
func TestAtk6OpenFilesExhaustDaemon(t *testing.T) {
	a := atk6Home(t, atk6Rules, nil)
	os.MkdirAll(a.h.path("mnt/other"), 0o755)
	chownTree(t, a.h.path("mnt/other"), nobody)
	if err := a.call(t, "session.open", map[string]any{"id": "other", "mount": a.h.path("mnt/other"), "context": dmCtx, "owner": nobody}, nil); err != nil {
		t.Fatalf("open other: %v", err)
	}
	readOther := func() (string, error) {
		out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", a.h.path("mnt/other/memories/pub.md")).CombinedOutput()
		return string(out), err
	}
	if o, err := readOther(); err != nil || o != "public\n" {
		t.Fatalf("other session before: %v %q", err, o)
	}
	_, stdin, lines := a.shell(t, `python3 -c '
import os, resource, sys
s, h = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
fds = []
try:
    while True:
        fds.append(os.open("/workspace/w.txt", os.O_RDONLY))
except OSError as e:
    print("held", len(fds), "of", h, "then", e.strerror, flush=True)
sys.stdin.readline()
' & python3 -c '
import os, resource, sys, time
time.sleep(2)
s, h = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
fds = []
try:
    while True:
        fds.append(os.open("/workspace/w.txt", os.O_RDONLY))
except OSError as e:
    print("second held", len(fds), "then", e.strerror, flush=True)
sys.stdin.readline()
'; wait; echo end`)
	o, ok := waitLine(t, lines, "second held", 120*time.Second)
	t.Logf("run: %s (ok %v)", o, ok)
	out, err := readOther()
	t.Logf("other session while the run holds them: %v %q", err, out)
	var st map[string]any
	cerr := a.call(t, "status", map[string]any{}, &st)
	t.Logf("status: %v", cerr)
	broken := err != nil || out != "public\n" || cerr != nil
	io.WriteString(stdin, "go\ngo\n")
	waitLine(t, lines, "end", 60*time.Second)
	for _, l := range strings.Split(a.logs(), "\n") {
		if strings.Contains(l, "too many open files") || strings.Contains(l, "EMFILE") {
			t.Log(tail(l, 1))
			break
		}
	}
	if broken {
		t.Errorf("HOLE: while one session's run holds files of its view open, another session's view fails (%v %q) / control: %v", err, out, cerr)
	}
}
