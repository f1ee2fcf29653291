package sandbox

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// expect runs script and checks its exit code and that its output is want.
func expect(t *testing.T, spec Spec, wantCode int, want string) string {
	t.Helper()
	out, errOut, ex := run(t, spec)
	if ex.Code != wantCode {
		t.Errorf("exit %+v, want code %d\nstdout: %s\nstderr: %s", ex, wantCode, out, errOut)
	}
	if want != "" && strings.TrimSpace(out) != want {
		t.Errorf("stdout:\n%s\nwant:\n%s\nstderr: %s", out, want, errOut)
	}
	return out + errOut
}

func TestHostNotThere(t *testing.T) {
	spec := testSpec(t, "")
	wd, _ := os.Getwd()
	exe, _ := os.Executable()
	paths := []string{"/home", "/root", "/run", "/var", "/srv", "/mnt", "/sys", "/opt", "/boot", "/media",
		"/work", "/old_root", "/farm", "/.dockerenv", spec.Workspace, spec.Memories, wd, exe, filepath.Dir(spec.Workspace),
		"/etc/shadow", "/etc/hostname", "/etc/resolv.conf", "/etc/ssh", "/dev/fuse", "/dev/sda", "/dev/kmsg", "/dev/mem", "/proc/1/root/work"}
	spec.Argv = []string{"/bin/sh", "-c", `for p in "$@"; do [ -e "$p" ] || [ -L "$p" ] && echo "PRESENT $p"; done; true`, "sh"}
	spec.Argv = append(spec.Argv, paths...)
	expect(t, spec, 0, "")
}

func TestEtcAndDev(t *testing.T) {
	expect(t, testSpec(t, "ls -A /etc"), 0, "alternatives\ngroup\nhosts\nld.so.cache\nlocaltime\nnsswitch.conf\npasswd\nssl")
	expect(t, testSpec(t, "ls -A /dev"), 0, "fd\nfull\nnull\nptmx\npts\nrandom\nshm\nstderr\nstdin\nstdout\ntty\nurandom\nzero")
	expect(t, testSpec(t, "cat /etc/passwd"), 0, "nobody:x:65534:65534::/workspace:/bin/sh")
	host := testSpec(t, "cat /etc/resolv.conf >/dev/null && echo ok")
	host.Network = "host"
	expect(t, host, 0, "ok")
	expect(t, testSpec(t, "echo x >/etc/passwd || echo ro; echo x > /usr/x || echo ro; echo x > /x || echo ro"), 0, "ro\nro\nro")
}

func TestOwnProcessesOnly(t *testing.T) {
	// Only builtins: the shell and its init are all there is (the init's
	// threads take the PIDs in between).
	out := expect(t, testSpec(t, "echo $$; echo /proc/[0-9]*"), 0, "")
	f := strings.Fields(out)
	if len(f) != 3 || f[1] != "/proc/1" || f[2] != "/proc/"+f[0] {
		t.Errorf("processes: %q", out)
	}
}

func TestNoNetworkButLoopback(t *testing.T) {
	out := expect(t, testSpec(t, "cat /proc/net/dev"), 0, "")
	var ifs []string
	for _, l := range strings.Split(out, "\n") {
		if name, _, ok := strings.Cut(l, ":"); ok && !strings.Contains(name, "|") {
			ifs = append(ifs, strings.TrimSpace(name))
		}
	}
	if len(ifs) != 1 || ifs[0] != "lo" {
		t.Errorf("interfaces %q, want only lo", ifs)
	}
	expect(t, testSpec(t, "cat /sys/class/net/eth0/address 2>/dev/null || echo none"), 0, "none")
}

func TestOnlyStdioDescriptors(t *testing.T) {
	// A descriptor of the daemon's that is not close-on-exec must not reach
	// the command either.
	fd, err := unix.Open("/etc/hostname", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	expect(t, testSpec(t, "ls /proc/$$/fd"), 0, "0\n1\n2")
}

func TestTmpPrivateAndNoexec(t *testing.T) {
	if err := os.WriteFile("/tmp/condfs-sandbox-host-file", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove("/tmp/condfs-sandbox-host-file")
	expect(t, testSpec(t, "ls -A /tmp /dev/shm"), 0, "/dev/shm:\n\n/tmp:")
	for _, dir := range []string{"/tmp", "/dev/shm", "/workspace", "/memories"} {
		out := expect(t, testSpec(t, fmt.Sprintf("cp /usr/bin/cat %[1]s/c && chmod 755 %[1]s/c && %[1]s/c /etc/hosts >/dev/null", dir)), 126, "")
		if !strings.Contains(out, "Permission denied") {
			t.Errorf("%s: %s", dir, out)
		}
	}
}

func TestNotAllowedIsAbsent(t *testing.T) {
	spec := testSpec(t, "ls /usr/bin")
	spec.Allowed = []string{"/bin/sh", "/usr/bin/ls"}
	expect(t, spec, 0, "ls\nsh")
	spec = testSpec(t, "wc /etc/hosts")
	out := expect(t, spec, 127, "")
	if !strings.Contains(out, "not found") {
		t.Errorf("got %q, want not found", out)
	}
	spec = testSpec(t, "/lib64/ld-linux-x86-64.so.2 /usr/bin/wc /etc/hosts")
	out = expect(t, spec, 127, "")
	if !strings.Contains(out, "No such file") {
		t.Errorf("got %q, want No such file", out)
	}
	// The loader itself still works for what is allowed.
	expect(t, testSpec(t, "/lib64/ld-linux-x86-64.so.2 /usr/bin/cat /etc/hosts >/dev/null && echo ok"), 0, "ok")
}

func TestIdentity(t *testing.T) {
	expect(t, testSpec(t, "id -u; id -g; id -G"), 0, "65534\n65534\n65534")
	expect(t, testSpec(t, "grep -q . /proc/self/status 2>/dev/null; while read k v; do case $k in Cap*|NoNewPrivs:) echo $k $v;; esac; done </proc/self/status"), 0,
		"CapInh: 0000000000000000\nCapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nCapAmb: 0000000000000000\nNoNewPrivs: 1")
}

func TestMountsNosuidNodev(t *testing.T) {
	out := expect(t, testSpec(t, "cat /proc/self/mountinfo"), 0, "")
	covers, _, err := hostPrograms.get()
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, c := range covers {
		covered[c] = true
	}
	var points []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			t.Fatalf("mountinfo line %q", l)
		}
		point, opts := f[4], ","+f[5]+","
		points = append(points, point)
		if !strings.Contains(opts, ",nosuid,") {
			t.Errorf("%s is not nosuid: %s", point, f[5])
		}
		isDev := point == "/dev" || (strings.HasPrefix(point, "/dev/") && point != "/dev/shm")
		if !isDev && !strings.Contains(opts, ",nodev,") {
			t.Errorf("%s is not nodev: %s", point, f[5])
		}
		if covered[point] && !strings.Contains(opts, ",noexec,") {
			t.Errorf("%s covers programs but is not noexec: %s", point, f[5])
		}
		writable := map[string]bool{"/tmp": true, "/dev/shm": true, "/workspace": true, "/memories": true, "/proc": true, "/dev/pts": true}
		if !strings.HasPrefix(point, "/dev/") || point == "/dev/shm" {
			if !writable[point] && !strings.Contains(opts, ",ro,") {
				t.Errorf("%s is writable: %s", point, f[5])
			}
		}
	}
	sort.Strings(points)
	want := []string{"/", "/dev", "/dev/full", "/dev/null", "/dev/pts", "/dev/random", "/dev/shm", "/dev/tty", "/dev/urandom", "/dev/zero",
		"/etc", "/etc/alternatives", "/etc/ssl/certs", "/memories", "/proc", "/tmp", "/usr", "/usr/bin",
		"/usr/bin/cat", "/usr/bin/chmod", "/usr/bin/cp", "/usr/bin/id", "/usr/bin/ls", "/usr/bin/sh", "/usr/bin/sleep", "/usr/bin/true",
		"/usr/local/bin", "/usr/sbin", "/workspace"}
	want = append(want, covers...)
	sort.Strings(want)
	if got := strings.Join(points, " "); got != strings.Join(want, " ") {
		t.Errorf("mount points:\n%s\nwant:\n%s", got, strings.Join(want, " "))
	}
}

func TestExitStatus(t *testing.T) {
	expect(t, testSpec(t, "exit 3"), 3, "")
	_, _, ex := run(t, testSpec(t, "kill -TERM $$"))
	if ex.Code != 143 || ex.Signal != int(syscall.SIGTERM) {
		t.Errorf("got %+v, want 143 by SIGTERM", ex)
	}
	// A command that cannot start is Start's error.
	spec := testSpec(t, "")
	spec.Argv = []string{"wc"}
	if _, err := Start(spec, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "exec") {
		t.Errorf("Start of a binary not allowed: %v", err)
	}
}

// session is a shell fed line by line, whose output is read up to markers.
type session struct {
	t   *testing.T
	r   *Run
	in  *os.File
	out *output
}

func startSession(t *testing.T, spec Spec) *session {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	spec.Argv = []string{"/bin/sh"}
	r, out, _ := start(t, spec, pr)
	pr.Close()
	s := &session{t: t, r: r, in: pw, out: out}
	t.Cleanup(func() { pw.Close(); r.Kill(); r.Wait() })
	return s
}

// do runs line and returns what it printed before "mark".
func (s *session) do(line string) string {
	s.t.Helper()
	mark := fmt.Sprintf("--%d--", time.Now().UnixNano())
	if _, err := fmt.Fprintf(s.in, "%s; echo %s\n", line, mark); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if o := s.out.String(); strings.Contains(o, mark) {
			o = o[:strings.Index(o, mark)]
			s.out.mu.Lock()
			s.out.buf.Reset()
			s.out.mu.Unlock()
			return strings.TrimSpace(o)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.t.Fatalf("no answer to %q: %q", line, s.out.String())
	return ""
}

func TestAllowLive(t *testing.T) {
	s := startSession(t, testSpec(t, ""))
	if got := s.do("cat /etc/hosts >/dev/null; echo rc=$?"); got != "rc=0" {
		t.Fatalf("before: %q", got)
	}
	without := []string{"/bin/sh", "/usr/bin/ls", "/usr/bin/id"}
	if err := s.r.Allow(without); err != nil {
		t.Fatal(err)
	}
	if got := s.do("cat /etc/hosts >/dev/null 2>&1; echo rc=$?; [ -e /usr/bin/cat ] || echo absent"); got != "rc=127\nabsent" {
		t.Errorf("after removal: %q", got)
	}
	if err := s.r.Allow(append(without, "/usr/bin/cat")); err != nil {
		t.Fatal(err)
	}
	if got := s.do("hash -r; cat /etc/hosts >/dev/null; echo rc=$?"); got != "rc=0" {
		t.Errorf("after adding back: %q", got)
	}
	// A name that is not in Binaries stays absent.
	if err := s.r.Allow(append(without, "/usr/bin/wc")); err != nil {
		t.Fatal(err)
	}
	if got := s.do("[ -e /usr/bin/wc ] || echo absent"); got != "absent" {
		t.Errorf("wc: %q", got)
	}
}

func TestSignalReachesCommand(t *testing.T) {
	spec := testSpec(t, "trap 'echo got INT; exit 7' INT; echo ready; while :; do sleep 0.05; done")
	r, out, _ := start(t, spec, nil)
	waitFor(t, out, "ready")
	if err := r.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	ex := r.Wait()
	<-out.done
	if ex.Code != 7 || !strings.Contains(out.String(), "got INT") {
		t.Errorf("exit %+v, out %q", ex, out.String())
	}

	r, out, _ = start(t, testSpec(t, "echo ready; exec sleep 100"), nil)
	waitFor(t, out, "ready")
	time.Sleep(50 * time.Millisecond) // the exec of sleep
	if err := r.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if ex := r.Wait(); ex.Code != 130 || ex.Signal != int(syscall.SIGINT) {
		t.Errorf("exit %+v, want 130", ex)
	}
}

func waitFor(t *testing.T, o *output, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(o.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", s, o.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pidNSMembers counts the host's processes in the PID namespace ns.
func pidNSMembers(t *testing.T, ns string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err == nil && l == ns {
			n++
		}
	}
	return n
}

// runPidNS is the PID namespace of the run, as its shell's printing of
// "ls -l /proc/$$/ns/pid" says (the init itself is not dumpable).
func runPidNS(t *testing.T, out string) string {
	t.Helper()
	i := strings.Index(out, "pid:[")
	if i < 0 {
		t.Fatalf("no pid namespace in %q", out)
	}
	j := strings.Index(out[i:], "]")
	return out[i : i+j+1]
}

const printNS = "ls -l /proc/$$/ns/pid; "

func TestKillEndsEveryProcess(t *testing.T) {
	r, out, _ := start(t, testSpec(t, printNS+"sleep 1000 & sleep 1000 & echo ready; wait"), nil)
	waitFor(t, out, "ready")
	ns := runPidNS(t, out.String())
	if n := pidNSMembers(t, ns); n < 4 {
		t.Fatalf("%d processes in the run, want init, sh and 2 sleeps", n)
	}
	r.Kill()
	if ex := r.Wait(); ex.Code != 137 || ex.Reason != "killed" {
		t.Errorf("exit %+v", ex)
	}
	if n := pidNSMembers(t, ns); n != 0 {
		t.Errorf("%d processes left after Kill", n)
	}
}

func TestForkBombBounded(t *testing.T) {
	// The shell execs its sleep: a fork of it would fail once the bomb holds
	// the bound, ending the command early (CI saw both of the races this
	// made: the command's exit reported before the kill, and the bomb
	// reaped before it was counted).
	spec := testSpec(t, printNS+"echo ready; f(){ f | f & }; f; exec sleep 1000")
	spec.Pids = 32
	spec.Memory = 256 << 20
	r, out, _ := start(t, spec, nil)
	waitFor(t, out, "ready")
	ns := runPidNS(t, out.String())
	if os.Geteuid() != 0 {
		// An ordinary user has no cgroup here: RLIMIT_NPROC bounds the uid.
		if r.cg != nil {
			t.Fatalf("cgroups %+v as uid %d", r.cg, os.Geteuid())
		}
		time.Sleep(time.Second)
		if n := pidNSMembers(t, ns); n > 32 || n < 3 {
			t.Errorf("%d processes, limit 32", n)
		}
		r.Kill()
		r.Wait()
		r.Gone()
		if n := pidNSMembers(t, ns); n != 0 {
			t.Errorf("%d processes left after Kill", n)
		}
		return
	}
	if r.cg == nil || len(r.cg.dirs) != 2 {
		t.Fatalf("cgroups %+v, want pids and memory (v1)", r.cg)
	}
	dirs := append([]string{}, r.cg.dirs...)
	pidsDir := dirs[0]
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(pidsDir, "pids.events"))
		if !strings.HasPrefix(string(b), "max 0") && len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pids limit never reached: %q", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := pidNSMembers(t, ns); n > 32 {
		t.Errorf("%d processes, limit 32", n)
	}
	// Gone waits for the init and the cgroups' removal, which may follow
	// Wait's report of the command's end.
	r.Kill()
	r.Wait()
	r.Gone()
	if n := pidNSMembers(t, ns); n != 0 {
		t.Errorf("%d processes left after Kill", n)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s not removed: %v", d, err)
		}
	}
}

func TestCwd(t *testing.T) {
	spec := testSpec(t, "pwd")
	if err := os.Mkdir(filepath.Join(spec.Workspace, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec.Cwd = "/workspace/src"
	expect(t, spec, 0, "/workspace/src")
	spec.Cwd = "/etc"
	if _, err := Start(spec, nil, nil, nil); err == nil {
		t.Error("cwd /etc accepted")
	}
	// A step that fails in the init is Start's error, naming the step.
	spec.Cwd = "/workspace/missing"
	if _, err := Start(spec, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "cwd: /workspace/missing") {
		t.Errorf("cwd missing: %v", err)
	}
}

// TestCondfsBinaryAsInit runs a command with the real daemon binary as the
// init, as the daemon does (cmd/condfsd dispatches "sandbox-init").
func TestCondfsBinaryAsInit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the root run covers it; the nested run as 65534 has no Go toolchain cache")
	}
	bin := filepath.Join(t.TempDir(), "condfsd")
	build := exec.Command("go", "build", "-o", bin, "github.com/condfs/condfs/cmd/condfsd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build condfsd: %v\n%s", err, out)
	}
	old := initPath
	initPath = bin
	defer func() { initPath = old }()
	expect(t, testSpec(t, "id -u; exit 5"), 5, "65534")
}

// TestConfined: the command runs under the seccomp filter and Landlock
// (sandbox/internal/confine): a program of a library directory, present in
// the run but not allowed, cannot be executed.
func TestConfined(t *testing.T) {
	expect(t, testSpec(t, "while read k v; do case $k in Seccomp:) echo $k $v;; esac; done </proc/self/status"), 0, "Seccomp: 2")
	var prog string
	filepath.WalkDir("/usr/lib", func(p string, d fs.DirEntry, err error) error {
		if err != nil || prog != "" || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil && fi.Mode()&0o111 != 0 {
			if f, err := os.Open(p); err == nil {
				b := make([]byte, 4)
				if n, _ := f.Read(b); n == 4 && string(b) == "\x7fELF" && !strings.Contains(p, ".so") {
					prog = p
				}
				f.Close()
			}
		}
		return nil
	})
	if prog == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no ELF program under /usr/lib: Landlock's refusal cannot be shown (CI machines have several)")
		}
		t.Skip("no ELF program under /usr/lib on this host")
	}
	out := expect(t, testSpec(t, prog+" --version"), 126, "")
	if !strings.Contains(out, "Permission denied") {
		t.Errorf("%s in a library directory: %q, want Permission denied", prog, out)
	}
}
