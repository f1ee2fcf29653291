package runs

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// The notify helper: with CONDFS_TEST_NOTIFY_RUN=SOCKET, it sends a run
// of "sleep 600" in session s as a notification (no id) with its stdio, and
// exits.
//
// The linger helper: the test binary re-executed as uid 65534 (before
// TestMain) with CONDFS_TEST_LINGER=SOCKET,N sends N requests on one
// control connection, each with 3 descriptors of TCP sockets whose final
// close blocks (SO_LINGER of an hour, unsent data, a peer that never
// reads), keeping no copy of them. It prints "sent N" and holds the peers
// until stdin closes.
func init() {
	if sock := os.Getenv("CONDFS_TEST_NOTIFY_RUN"); sock != "" {
		// A run request without an id (a notification), with this
		// process's stdio, then gone.
		c, err := net.Dial("unix", sock)
		if err != nil {
			fmt.Println("notify:", err)
			os.Exit(1)
		}
		line := `{"jsonrpc":"2.0","method":"run","params":{"session":"s","argv":["sleep","600"],"timeout_ms":1000}}` + "\n"
		if _, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte(line), syscall.UnixRights(0, 1, 2), nil); err != nil {
			fmt.Println("notify:", err)
			os.Exit(1)
		}
		time.Sleep(2 * time.Second) // the daemon has read it
		fmt.Println("sent")
		os.Exit(0)
	}
}

// loaderRules: runRules' binaries and python3 (as in sandbox.md's example).
const loaderRules = testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/ls", "/usr/bin/cat", "/usr/bin/sleep", "/usr/bin/id", "/usr/bin/tr", "/usr/bin/python3"]
pids = 64
`

// loaderHome is runHome with loaderRules and a copy of /usr/bin/wc (not
// allowed) in the session's workspace, as an agent could write one.
func loaderHome(t *testing.T) *testenv.Daemon {
	t.Helper()
	h := testenv.OpenHome(t, loaderRules)
	h.Write("config/policy.yaml", testenv.RunPolicy)
	h.Write("memories/pub.md", "public\n")
	wc, err := os.ReadFile("/usr/bin/wc")
	if err != nil {
		t.Fatal(err)
	}
	h.Write("workspace/wc.copy", string(wc))
	for _, p := range []string{"memories", "workspace", "workspace/wc.copy"} {
		os.Chmod(h.Path(p), 0o777)
	}
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	d.OpenFor("s", testenv.Nobody, testenv.DM)
	return d
}

// TestMemfdCopyOfForbiddenProgramNeverRuns: a program the run may execute (python3) copies a
// program it may not (wc, written into the workspace) into a memfd and
// executes it: execveat of the memfd, or the dynamic loader given
// /proc/self/fd/N. A memfd lives on the kernel's internal shmem mount,
// which is not noexec, and Landlock does not govern files of internal
// mounts, so neither /tmp's noexec nor the Landlock exec rules stop it.
// sandbox.md: every other program cannot be executed, however it is
// reached, "by a copy made inside the run" included.
func TestMemfdCopyOfForbiddenProgramNeverRuns(t *testing.T) {
	d := loaderHome(t)
	load := `import os, sys
fd = os.memfd_create("x", 0)
os.write(fd, open("/workspace/wc.copy", "rb").read())
os.set_inheritable(fd, True)
if sys.argv[1] == "execveat":
    os.execve(fd, ["wc", "/memories/pub.md"], {})
else:
    os.execv("/lib64/ld-linux-x86-64.so.2", ["ld.so", "/proc/self/fd/%d" % fd, "/memories/pub.md"])
`
	for _, how := range []string{"execveat", "ld.so"} {
		out, code := testenv.CondfsRun(t, d, "", "--", "python3", "-c", load, how)
		// wc's answer for pub.md ("public\n"): 1 line, 1 word, 7 bytes.
		if strings.Contains(out, " 1 7 /memories/pub.md") {
			t.Errorf("%s: a copy of wc, not in [sandbox] binaries, ran from a memfd (exit %d): %q", how, code, out)
		}
	}
}

// sleeps600 counts the processes running "sleep 600".
func sleeps600() int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == "sleep\x00600\x00" {
			n++
		}
	}
	return n
}

// TestRunSentAsNotificationIsRefused: a run sent as a notification (no "id") is
// built and started, but the server drops a notification's result, so the
// run's Takeover never runs: nothing watches its connection (the command
// outlives its client), its --timeout is never armed, it is never audited,
// and it is never taken off its session's runs, so session.close (and the
// daemon's shutdown) waits for it forever, with the view still mounted.
func TestRunSentAsNotificationIsRefused(t *testing.T) {
	d := loaderHome(t)
	hung := false
	t.Cleanup(func() {
		if hung {
			// The daemon cannot close the session: kill it and detach
			// what it left mounted.
			d.Cmd.Process.Kill()
			<-d.Exited()
			for _, m := range testenv.MountsUnder(d.Home.Root) {
				syscall.Unmount(m, syscall.MNT_DETACH)
			}
		}
	})
	before := sleeps600()
	cmd := testenv.CommandAs(testenv.Nobody, testenv.CopySelf(t))
	cmd.Env = append(os.Environ(), "CONDFS_TEST_NOTIFY_RUN="+d.Socket)
	// Its stdio goes to the run: a file, not a pipe the test would wait on.
	outPath := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(outPath), 0o777)
	os.Chmod(outPath, 0o666)
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	f.Close()
	if out, _ := os.ReadFile(outPath); err != nil || !strings.Contains(string(out), "sent") {
		t.Fatalf("the attacker: %v %s", err, out)
	}
	// The client is gone and the 1 s timeout has passed.
	time.Sleep(3 * time.Second)
	if n := sleeps600() - before; n > 0 {
		t.Errorf("a run sent as a notification outlives its client and its --timeout: %d sleep 600 still running after the client exited", n)
	}
	closed := make(chan struct{})
	go func() {
		d.Client.Call("session.close", map[string]any{"id": "s"}, nil)
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		hung = true
		t.Fatalf("session.close has not returned after 20 s: the run sent as a notification was never taken off the session's runs, and closing waits for it forever (the view stays mounted: %v)", testenv.MountsUnder(d.Home.Root))
	}
}

// TestRun: condfs run as the session's owner: the view's files as its
// context shows them, the binaries its context allows, the policy's exec
// decision, and the exit statuses of sandbox.md.
func TestRun(t *testing.T) {
	d, _ := testenv.RunHome(t)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"DM reads its file", []string{"--", "cat", "/memories/private/p.md"}, 0, "dm secret"},
		{"uid", []string{"--", "id", "-u"}, 0, "65534"},
		{"cwd", []string{"--cwd", "/memories", "--", "ls"}, 0, "private"},
		{"exit status", []string{"--", "sh", "-c", "exit 3"}, 3, ""},
		{"killed by a signal", []string{"--", "sh", "-c", "kill -TERM $$"}, 143, ""},
		{"policy denies", []string{"--", "ls", "forbidden"}, 126, "denies"},
		{"not allowed", []string{"--", "wc", "/etc/hosts"}, 126, "may not execute"},
		{"nowhere", []string{"--", "no-such-program-anywhere"}, 127, "not found"},
		// A file of the view never runs (the view is noexec in a run);
		// one that is not there is not found. Both were 125, "cannot
		// build the sandbox".
		{"a file of the view", []string{"--", "/workspace/w.txt"}, 126, "may not execute"},
		{"nothing in the view", []string{"--", "/workspace/nope"}, 127, "not found"},
		{"cwd outside", []string{"--cwd", "/etc", "--", "ls"}, 125, "outside"},
		{"empty command", []string{}, 125, "no command"},
		{"timeout", []string{"--timeout", "300ms", "--", "sleep", "30"}, 124, "timed out"},
		{"backing not there", []string{"--", "ls", "/tmp/condfs-it"}, 2, ""},
	} {
		out, code := testenv.CondfsRun(t, d, "", c.args...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d %q, want %d with %q", c.name, code, out, c.code, c.want)
		}
	}
	var other struct{}
	d.Call("session.open", map[string]any{"id": "root-s", "mount": d.Home.Path("mnt/root-s"), "context": testenv.DM}, &other)
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", d.Socket, "--session", "root-s", "--", "id")
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 125 || !strings.Contains(string(out), "another user") {
		t.Errorf("another uid's session: exit %d %q", cmd.ProcessState.ExitCode(), out)
	}
	// status says what runs get here.
	var st struct {
		Sandbox struct {
			Build    string `json:"build"`
			Landlock int    `json:"landlock_abi"`
			Seccomp  bool   `json:"seccomp"`
		} `json:"sandbox"`
	}
	d.Call("status", map[string]any{}, &st)
	if st.Sandbox.Build != "namespaces (root)" || !st.Sandbox.Seccomp {
		t.Errorf("status sandbox: %+v", st.Sandbox)
	}
	if out, code := testenv.CondfsRun(t, d, "", "--session", "nope", "--", "id"); code != 125 || !strings.Contains(out, `unknown session "nope"`) {
		t.Errorf("unknown session: exit %d %q", code, out)
	}
	// In a guild the private file is gone and cat may not run.
	d.SetContext("s", testenv.Guild)
	if out, code := testenv.CondfsRun(t, d, "", "--cwd", "/memories/private", "--", "ls"); code != 125 || !strings.Contains(out, "not in the session's view") {
		t.Errorf("a --cwd the context hides: exit %d %q", code, out)
	}
	if out, code := testenv.CondfsRun(t, d, "", "--", "ls", "/memories"); code != 0 || strings.Contains(out, "private") {
		t.Errorf("guild: ls /memories: exit %d %q", code, out)
	}
	if out, code := testenv.CondfsRun(t, d, "", "--", "cat", "/memories/pub.md"); code != 126 {
		t.Errorf("guild: cat: exit %d %q, want 126", code, out)
	}
}

// TestRunLive: a context switch changes what a running command sees (the
// DM's private file) and may execute (cat, allowed only in DMs) before
// context.set returns, and session.close ends its runs.
func TestRunLive(t *testing.T) {
	d, _ := testenv.RunHome(t)
	cmd, _, ask := runShell(t, d)
	// One shell, running throughout: what it sees and may execute follow
	// the session's context as each context.set returns.
	for i, c := range []struct {
		ctx        []string
		line, want string
		absent     string
	}{
		{testenv.DM, "cat /memories/private/p.md", "dm secret", ""},
		{testenv.Guild, "ls /memories", "pub.md", "private"},
		{testenv.Guild, "cat /memories/pub.md", "not found", "public"},
		{testenv.DM, "cat /memories/private/p.md", "dm secret", ""},
	} {
		if i > 0 {
			d.SetContext("s", c.ctx)
		}
		got := ask(c.line)
		if !strings.Contains(got, c.want) || (c.absent != "" && strings.Contains(got, c.absent)) {
			t.Fatalf("step %d, %s: %q, want %q without %q", i, c.line, got, c.want, c.absent)
		}
	}
	// session.close kills the run (137) before the view goes.
	d.Call("session.close", map[string]any{"id": "s"}, nil)
	if code := waitExit(t, cmd, "the run outlived its session"); code != 137 {
		t.Fatalf("after session.close: exit %d, want 137", code)
	}
}

// TestLibraryProgramRunsNotThroughLoader: a program of a library directory runs neither by
// execve nor through the ELF interpreter (which every dynamic program needs
// executable) unless the context allows it, live in a running shell: git,
// listed and allowed only in DMs, and git-http-push, not listed. Before the
// runs' noexec covers, the interpreter ran both in any context, and execve
// ran git in any context too (Landlock let every listed binary run).
func TestLibraryProgramRunsNotThroughLoader(t *testing.T) {
	const git, push, ld = "/usr/lib/git-core/git", "/usr/lib/git-core/git-http-push", "/lib64/ld-linux-x86-64.so.2"
	for _, p := range []string{git, push, ld} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v (the CI machines have git)", p, err)
		}
	}
	d, _ := testenv.RunHomeWith(t, testenv.PrivateRule+`
[sandbox]
binaries = ["/bin/sh", "/usr/bin/tr", "`+git+`"]

[exec."`+git+`"]
when = "discord:dm"
action = "allow"
`)
	var st struct {
		Sandbox struct {
			Programs struct {
				Covers  int    `json:"covers"`
				Indexed string `json:"indexed"`
			} `json:"programs"`
		} `json:"sandbox"`
	}
	cmd, stdin, ask := runShell(t, d)
	defer func() { stdin.Close(); cmd.Wait() }()
	const ok, denied, unmapped = "git version", "Permission denied", "failed to map segment"
	for i, c := range []struct {
		ctx        []string
		line, want string
	}{
		{testenv.DM, git + " --version", ok},
		{testenv.DM, ld + " " + git + " --version", ok},
		{testenv.DM, ld + " " + push, unmapped},
		{testenv.Guild, git + " --version", denied},
		{testenv.Guild, ld + " " + git + " --version", unmapped},
		{testenv.Guild, push, denied},
		{testenv.Guild, ld + " " + push, unmapped},
		{testenv.DM, ld + " " + git + " --version", ok},
	} {
		if i > 0 {
			d.SetContext("s", c.ctx)
		}
		if got := ask(c.line); !strings.Contains(got, c.want) {
			t.Errorf("step %d, %s: %q, want %q", i, c.line, got, c.want)
		}
	}
	d.Call("status", map[string]any{}, &st)
	if st.Sandbox.Programs.Covers == 0 || st.Sandbox.Programs.Indexed == "" {
		t.Errorf("status sandbox.programs: %+v", st.Sandbox.Programs)
	}
}

// TestRunClientGone: when condfs run dies, the command and what it started
// die too.
func TestRunClientGone(t *testing.T) {
	d, mnt := testenv.RunHome(t)
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", d.Socket, "--session", "s", "--",
		"sh", "-c", `sleep 60 & sleep 61`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sleeping := func() int {
		n := 0
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err == nil && (string(b) == "sleep\x0060\x00" || string(b) == "sleep\x0061\x00") {
				n++
			}
		}
		return n
	}
	d.Within("the run's sleeps start", func() bool { return sleeping() == 2 })
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	d.Within("the run's processes end with its client", func() bool { return sleeping() == 0 })
	_ = mnt
}

// TestRunUnprivilegedDaemon: condfs serve as an ordinary user (uid 65534)
// builds its runs with user namespaces; what a run sees and may execute
// follows the session's context as with a root daemon.
func TestRunUnprivilegedDaemon(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	h := testenv.OpenHome(t, limitRules)
	h.Write("config/policy.yaml", testenv.RunPolicy)
	h.Write("memories/private/p.md", "dm secret\n")
	h.Write("memories/pub.md", "public\n")
	// Made before the daemon starts: a view learns of changes made in its
	// backing tree behind it only after a while (its entry TTL here).
	h.Write("workspace/bin/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	h.Write("workspace/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	for _, p := range []string{"workspace/bin/hello.sh", "workspace/hello.sh"} {
		os.Chmod(h.Path(p), 0o755)
	}
	sock, logs := testenv.StartUnprivileged(t, h)
	run := func(args ...string) (string, int) {
		cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), append([]string{"run", "--socket", sock, "--session", "default", "--"}, args...)...)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	if out, code := run("cat", "/memories/private/p.md"); code != 0 || out != "dm secret\n" {
		t.Fatalf("DM: exit %d %q\n%s", code, out, logs())
	}
	if out, code := run("id", "-u"); code != 0 || strings.TrimSpace(out) != "65534" {
		t.Fatalf("id: exit %d %q", code, out)
	}
	// No cgroup for an ordinary user here: memory and /tmp are bounded
	// all the same (RLIMIT_AS; the tmpfs's size).
	if out, code := run("python3", "-c", "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('kept')"); code == 0 || strings.Contains(out, "kept") {
		t.Fatalf("256 MiB under a 64 MiB limit: exit %d %q", code, out)
	}
	if out, code := run("python3", "-c", "open('/tmp/a', 'wb').write(b'x' * (2 << 20))"); code == 0 || !strings.Contains(out, "No space left") {
		t.Fatalf("2 MiB in /tmp under 1 MiB: exit %d %q", code, out)
	}
	// The ELF interpreter maps no program of a library directory that
	// the run may not execute on this path either (TestLibraryProgramRunsNotThroughLoader).
	if out, code := run("sh", "-c", "/lib64/ld-linux-x86-64.so.2 /usr/lib/git-core/git-http-push"); code == 0 || !strings.Contains(out, "failed to map segment") {
		t.Fatalf("a library directory's program through the interpreter: exit %d %q", code, out)
	}
	// A listed directory of the view runs; the rest of the view does not
	// (TestRunViewBinaries), on this path too.
	if out, code := run("/workspace/bin/hello.sh"); code != 0 || out != "hello-from-view\n" {
		t.Fatalf("a listed view binary: exit %d %q", code, out)
	}
	if out, code := run("sh", "-c", "/workspace/hello.sh; echo x > /workspace/bin/w"); code == 0 || !strings.Contains(out, "Permission denied") || !strings.Contains(out, "Read-only") {
		t.Fatalf("an unlisted view file, a write to a listed one: exit %d %q", code, out)
	}
	// --tty: a terminal of the run's own devpts on this path too.
	tty := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", sock, "--session", "default", "--tty", "--",
		"sh", "-c", "[ -t 0 ] && [ -t 1 ] && ls -1 /dev/pts")
	if out, _ := tty.CombinedOutput(); tty.ProcessState.ExitCode() != 0 || string(out) != "0\r\nptmx\r\n" {
		t.Fatalf("--tty: exit %d %q", tty.ProcessState.ExitCode(), out)
	}
	ctl := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "ctl", "--socket", sock, "context", "default", `{"kind":"discord","guild_id":"1","channel_id":"2"}`)
	if out, err := ctl.CombinedOutput(); err != nil {
		t.Fatalf("context set: %v %s", err, out)
	}
	if out, code := run("ls", "/memories"); code != 0 || strings.Contains(out, "private") {
		t.Fatalf("guild ls: exit %d %q", code, out)
	}
	if out, code := run("cat", "/memories/pub.md"); code != 126 {
		t.Fatalf("guild cat: exit %d %q, want 126", code, out)
	}
}

// waitExit waits (at most 20 s, then kills it and fails with what) for
// cmd, and returns its exit status.
func waitExit(t *testing.T, cmd *exec.Cmd, what string) int {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal(what)
	}
	return cmd.ProcessState.ExitCode()
}
