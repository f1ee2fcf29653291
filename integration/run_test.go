package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runRules: private/ only in DMs; cat only in DMs; sh, ls, sleep, echo
// everywhere.
const runRules = privateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/ls", "/usr/bin/cat", "/usr/bin/sleep", "/usr/bin/id", "/usr/bin/tr"]
pids = 64

[exec."/usr/bin/cat"]
when = "discord:dm"
action = "allow"
`

const runPolicy = `version: 1
roles:
  default:
    tools:
      exec:
        mode: allow
        constraints: ['every(args.argv, . != "forbidden")']
`

// runHome is an open home with a session "s" owned by 65534 in a DM, on a
// daemon that admits 65534 to its socket.
func runHome(t *testing.T) (*daemon, string) {
	t.Helper()
	return runHomeWith(t, runRules)
}

// runHomeWith is runHome with other rules.
func runHomeWith(t *testing.T, rules string) (*daemon, string) {
	t.Helper()
	return runHomeFiles(t, rules, nil)
}

// runHomeFiles is runHomeWith, with files made in the backing tree by
// files (if set) before the daemon starts.
func runHomeFiles(t *testing.T, rules string, files func(h *home)) (*daemon, string) {
	t.Helper()
	h := openHome(t, rules)
	h.t = t
	h.write("config/policy.yaml", runPolicy)
	h.write("memories/private/p.md", "dm secret\n")
	h.write("memories/pub.md", "public\n")
	h.write("workspace/w.txt", "work\n")
	for _, p := range []string{"memories", "memories/private", "workspace"} {
		os.Chmod(h.path(p), 0o777)
	}
	if files != nil {
		files(h)
	}
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.socket), 0o755)
	mnt := d.openFor("s", nobody, dmCtx)
	return d, mnt
}

// condfsRun runs `condfs run` as uid 65534 and returns its output and
// exit status.
func condfsRun(t *testing.T, d *daemon, stdin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", "s"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, _ := cmd.CombinedOutput()
	return string(out), cmd.ProcessState.ExitCode()
}

// TestRun: condfs run as the session's owner: the view's files as its
// context shows them, the binaries its context allows, the policy's exec
// decision, and the exit statuses of sandbox.md.
func TestRun(t *testing.T) {
	d, _ := runHome(t)
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
		out, code := condfsRun(t, d, "", c.args...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d %q, want %d with %q", c.name, code, out, c.code, c.want)
		}
	}
	var other struct{}
	d.call("session.open", map[string]any{"id": "root-s", "mount": d.home.path("mnt/root-s"), "context": dmCtx}, &other)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", "root-s", "--", "id")
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
	d.call("status", map[string]any{}, &st)
	if st.Sandbox.Build != "namespaces (root)" || !st.Sandbox.Seccomp {
		t.Errorf("status sandbox: %+v", st.Sandbox)
	}
	if out, code := condfsRun(t, d, "", "--session", "nope", "--", "id"); code != 125 || !strings.Contains(out, `unknown session "nope"`) {
		t.Errorf("unknown session: exit %d %q", code, out)
	}
	// In a guild the private file is gone and cat may not run.
	d.setContext("s", guildCtx)
	if out, code := condfsRun(t, d, "", "--cwd", "/memories/private", "--", "ls"); code != 125 || !strings.Contains(out, "not in the session's view") {
		t.Errorf("a --cwd the context hides: exit %d %q", code, out)
	}
	if out, code := condfsRun(t, d, "", "--", "ls", "/memories"); code != 0 || strings.Contains(out, "private") {
		t.Errorf("guild: ls /memories: exit %d %q", code, out)
	}
	if out, code := condfsRun(t, d, "", "--", "cat", "/memories/pub.md"); code != 126 {
		t.Errorf("guild: cat: exit %d %q, want 126", code, out)
	}
}

// runShell starts, as uid 65534, a shell run of session "s" that runs each
// line it is asked and answers one line: its output and exit status.
func runShell(t *testing.T, d *daemon) (*exec.Cmd, io.WriteCloser, func(string) string) {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", "s", "--",
		"sh", "-c", `while read line; do out=$(eval "$line" 2>&1 | tr -d '\n'); echo "$out [$?]"; done`)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	return cmd, stdin, func(line string) string {
		t.Helper()
		fmt.Fprintln(stdin, line)
		if !lines.Scan() {
			t.Fatal("the run ended")
		}
		return lines.Text()
	}
}

// TestRunLive: a context switch changes what a running command sees (the
// DM's private file) and may execute (cat, allowed only in DMs) before
// context.set returns, and session.close ends its runs.
func TestRunLive(t *testing.T) {
	d, _ := runHome(t)
	cmd, _, ask := runShell(t, d)
	// One shell, running throughout: what it sees and may execute follow
	// the session's context as each context.set returns.
	for i, c := range []struct {
		ctx        []string
		line, want string
		absent     string
	}{
		{dmCtx, "cat /memories/private/p.md", "dm secret", ""},
		{guildCtx, "ls /memories", "pub.md", "private"},
		{guildCtx, "cat /memories/pub.md", "not found", "public"},
		{dmCtx, "cat /memories/private/p.md", "dm secret", ""},
	} {
		if i > 0 {
			d.setContext("s", c.ctx)
		}
		got := ask(c.line)
		if !strings.Contains(got, c.want) || (c.absent != "" && strings.Contains(got, c.absent)) {
			t.Fatalf("step %d, %s: %q, want %q without %q", i, c.line, got, c.want, c.absent)
		}
	}
	// session.close kills the run (137) before the view goes.
	d.call("session.close", map[string]any{"id": "s"}, nil)
	if code := waitExit(t, cmd, "the run outlived its session"); code != 137 {
		t.Fatalf("after session.close: exit %d, want 137", code)
	}
}

// TestAttackRunLoader: a program of a library directory runs neither by
// execve nor through the ELF interpreter (which every dynamic program needs
// executable) unless the context allows it, live in a running shell: git,
// listed and allowed only in DMs, and git-http-push, not listed. Before the
// runs' noexec covers, the interpreter ran both in any context, and execve
// ran git in any context too (Landlock let every listed binary run).
func TestAttackRunLoader(t *testing.T) {
	const git, push, ld = "/usr/lib/git-core/git", "/usr/lib/git-core/git-http-push", "/lib64/ld-linux-x86-64.so.2"
	for _, p := range []string{git, push, ld} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v (the CI machines have git)", p, err)
		}
	}
	d, _ := runHomeWith(t, privateRule+`
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
		{dmCtx, git + " --version", ok},
		{dmCtx, ld + " " + git + " --version", ok},
		{dmCtx, ld + " " + push, unmapped},
		{guildCtx, git + " --version", denied},
		{guildCtx, ld + " " + git + " --version", unmapped},
		{guildCtx, push, denied},
		{guildCtx, ld + " " + push, unmapped},
		{dmCtx, ld + " " + git + " --version", ok},
	} {
		if i > 0 {
			d.setContext("s", c.ctx)
		}
		if got := ask(c.line); !strings.Contains(got, c.want) {
			t.Errorf("step %d, %s: %q, want %q", i, c.line, got, c.want)
		}
	}
	d.call("status", map[string]any{}, &st)
	if st.Sandbox.Programs.Covers == 0 || st.Sandbox.Programs.Indexed == "" {
		t.Errorf("status sandbox.programs: %+v", st.Sandbox.Programs)
	}
}

// TestRunClientGone: when condfs run dies, the command and what it started
// die too.
func TestRunClientGone(t *testing.T) {
	d, mnt := runHome(t)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", "s", "--",
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
	d.within("the run's sleeps start", func() bool { return sleeping() == 2 })
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	d.within("the run's processes end with its client", func() bool { return sleeping() == 0 })
	_ = mnt
}

// TestRunUnprivilegedDaemon: condfs serve as an ordinary user (uid 65534)
// builds its runs with user namespaces; what a run sees and may execute
// follows the session's context as with a root daemon.
func TestRunUnprivilegedDaemon(t *testing.T) {
	requireUnprivilegedFUSE(t)
	h := openHome(t, limitRules)
	h.write("config/policy.yaml", runPolicy)
	h.write("memories/private/p.md", "dm secret\n")
	h.write("memories/pub.md", "public\n")
	// Made before the daemon starts: a view learns of changes made in its
	// backing tree behind it only after a while (its entry TTL here).
	h.write("workspace/bin/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	h.write("workspace/hello.sh", "#!/bin/sh\necho hello-from-view\n")
	for _, p := range []string{"workspace/bin/hello.sh", "workspace/hello.sh"} {
		os.Chmod(h.path(p), 0o755)
	}
	sock, logs := startUnprivDaemon(t, h)
	run := func(args ...string) (string, int) {
		cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", sock, "--session", "default", "--"}, args...)...)
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
	// the run may not execute on this path either (TestAttackRunLoader).
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
	tty := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", sock, "--session", "default", "--tty", "--",
		"sh", "-c", "[ -t 0 ] && [ -t 1 ] && ls -1 /dev/pts")
	if out, _ := tty.CombinedOutput(); tty.ProcessState.ExitCode() != 0 || string(out) != "0\r\nptmx\r\n" {
		t.Fatalf("--tty: exit %d %q", tty.ProcessState.ExitCode(), out)
	}
	setpriv := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "ctl", "--socket", sock, "context", "default", `{"kind":"discord","guild_id":"1","channel_id":"2"}`)
	if out, err := setpriv.CombinedOutput(); err != nil {
		t.Fatalf("context set: %v %s", err, out)
	}
	if out, code := run("ls", "/memories"); code != 0 || strings.Contains(out, "private") {
		t.Fatalf("guild ls: exit %d %q", code, out)
	}
	if out, code := run("cat", "/memories/pub.md"); code != 126 {
		t.Fatalf("guild cat: exit %d %q, want 126", code, out)
	}
}

// startUnprivDaemon starts condfs serve on h as uid 65534 with its default
// session in a DM, and returns its socket and its log.
func startUnprivDaemon(t *testing.T, h *home) (string, func() string) {
	t.Helper()
	os.MkdirAll(h.path("run"), 0o755)
	os.MkdirAll(h.path("mnt/v"), 0o755)
	chownTree(t, h.root, nobody)
	sock := h.path("run/condfs.sock")
	serve := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		condfsBin, "serve", "--root", h.root, "--socket", sock, "--mount", h.path("mnt/v"),
		"--context", "discord:dm", "--context", "discord:dm:7", "--log-level", "debug")
	serve.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + h.root}
	logs := syncBuilder{b: &strings.Builder{}, mu: make(chan struct{}, 1)}
	serve.Stdout, serve.Stderr = logs, logs
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { serve.Wait(); close(exited) }()
	t.Cleanup(func() {
		serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			serve.Process.Kill()
		}
	})
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 500 {
			t.Fatalf("no socket:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return sock, logs.String
}

// TestAttackRunStdio: what a client passes as a run's stdio is a stream of
// its own, never more. A second connection to the control socket passed as
// stdin let the command call context.set from inside the run (from a guild
// into a DM, then read the DM's private file): found by an attacker's
// review, now refused (125) with nothing run, as are a pidfd, an epoll
// instance, a memfd (Landlock does not govern its mount: fexecve), a
// regular file on a mount that allows execution and /dev/zero (the command
// could map them executable: TestAtk6StdinExecMount), a socket (a Unix
// one carries descriptors both ways, an unconnected one connects where it
// was made: TestAtk9CStdin*), and a fourth descriptor beside the three.
func TestAttackRunStdio(t *testing.T) {
	d, _ := runHome(t)
	d.setContext("s", guildCtx)
	const script = `printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"context.set","params":{"session":"s","context":["discord:dm","discord:dm:7"]}}' >&0; sleep 0.3; echo ran > /workspace/ran; cat /memories/private/p.md`
	for _, kind := range []string{"ctl", "pidfd", "epoll", "memfd", "execfile", "zero", "unix", "tcp", "four"} {
		cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", attackerBin, "runstdio", d.socket, "s", kind, script)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), `"code":-32010`) && !strings.Contains(string(out), "cannot be stdio") && !strings.Contains(string(out), "descriptors") {
			t.Errorf("%s as stdio: %s", kind, out)
		}
		if strings.Contains(string(out), "dm secret") {
			t.Errorf("%s as stdio: the command read the DM's file", kind)
		}
		if _, err := os.Stat(d.home.path("workspace/ran")); err == nil {
			t.Errorf("%s as stdio: the command ran", kind)
			os.Remove(d.home.path("workspace/ran"))
		}
	}
	var ctxNow struct{ Atoms []string }
	d.call("context.get", map[string]any{"session": "s"}, &ctxNow)
	if slices.Contains(ctxNow.Atoms, "discord:dm") || len(ctxNow.Atoms) != len(guildCtx) {
		t.Errorf("the context was changed from inside a run: %v", ctxNow.Atoms)
	}
}
