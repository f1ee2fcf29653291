package confine

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The tests re-execute the test binary (TestMain, childEnv set) so that the
// confined thread belongs to a process of its own: the child locks its main
// thread, applies the confinement and starts the probe program from it.

const childEnv = "CONFINE_TEST_CHILD"

// childSpec is what the parent asks of the child.
type childSpec struct {
	Config Config
	// Cmd is run confined; Uid >= 0 switches to that uid and gid (os/exec
	// Credential) in the forked child.
	Cmd []string
	Uid int
	// Noexec, if set, is mounted as a noexec tmpfs (in a mount namespace
	// of the child's own) holding a copy of /usr/bin/true, before Apply.
	Noexec string
	// Threads checks the other threads instead of running Cmd.
	Threads string
}

var (
	probeDir  string // holds the probe binary; listed in ExecPaths
	probeFile string
	loaders   = []string{"/lib64/ld-linux-x86-64.so.2"}
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(child(spec))
	}
	if _, err := buildProbe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(probeDir)
	os.Exit(code)
}

func buildProbe() (int, error) {
	dir, err := os.MkdirTemp("", "confine-probe-")
	if err != nil {
		return 0, err
	}
	if err := os.Chmod(dir, 0o755); err != nil { // uid 65534 executes it
		return 0, err
	}
	probeDir, probeFile = dir, filepath.Join(dir, "probe")
	cmd := exec.Command("go", "build", "-o", probeFile, "./testdata/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("build probe: %v\n%s", err, out)
	}
	if r, err := filepath.EvalSymlinks(loaders[0]); err == nil && r != loaders[0] {
		loaders = append(loaders, r)
	}
	return 0, nil
}

// child runs in the re-executed test binary.
func child(specJSON string) int {
	var s childSpec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		fmt.Fprintln(os.Stderr, "child: spec:", err)
		return 100
	}
	if s.Noexec != "" {
		if err := mountNoexec(s.Noexec); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 100
		}
	}
	runtime.LockOSThread() // never unlocked: the confined thread dies with the goroutine
	rep, err := Apply(s.Config)
	line, _ := json.Marshal(map[string]any{"report": rep, "error": errString(err)})
	fmt.Printf("%s\n", line)
	if err != nil {
		return 101
	}
	if s.Threads != "" {
		return otherThread(s.Threads)
	}
	cmd := exec.Command(s.Cmd[0], s.Cmd[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if s.Uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(s.Uid), Gid: uint32(s.Uid)}}
	}
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		line, _ := json.Marshal(map[string]int{"start": errnoOf(err)})
		fmt.Printf("%s\n", line)
		return 102
	}
	return 0
}

func mountNoexec(dir string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount noexec tmpfs: %w", err)
	}
	return copyFile("/usr/bin/true", filepath.Join(dir, "true"))
}

// otherThread checks, from a thread other than the confined one, that
// nothing of the confinement reached it.
func otherThread(outside string) int {
	res := map[string]any{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // cannot be the confined thread, which the main goroutine holds
		res["status"] = threadStatus()
		res["write"] = errnoOf(os.WriteFile(filepath.Join(outside, "other-thread"), []byte("x"), 0o644))
		res["exec"] = errnoOf(exec.Command("/usr/bin/true").Run())
		res["unshare"] = errnoOf(unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS))
	}()
	<-done
	res["confined"] = threadStatus() // the main goroutine's, confined, thread
	line, _ := json.Marshal(res)
	fmt.Printf("%s\n", line)
	return 0
}

func threadStatus() map[string]string {
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && (k == "CapEff" || k == "CapBnd" || k == "NoNewPrivs" || k == "Seccomp") {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func errnoOf(err error) int {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return int(e)
	}
	return -1
}

// result is what one child run produced.
type result struct {
	Report Report
	Error  string
	Lines  []string // stdout after the report line
	Stderr string
	Code   int
}

func (r result) decode(t *testing.T, v any) {
	t.Helper()
	if len(r.Lines) == 0 {
		t.Fatalf("no output from the confined command (exit %d, stderr %q)", r.Code, r.Stderr)
	}
	if err := json.Unmarshal([]byte(r.Lines[len(r.Lines)-1]), v); err != nil {
		t.Fatalf("output %q: %v", r.Lines, err)
	}
}

func runChild(t *testing.T, s childSpec) result {
	t.Helper()
	spec, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// atexit_sleep_ms: a race-enabled child would wait a second at exit.
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec), "GORACE=atexit_sleep_ms=0")
	cmd.Stdin = nil
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if s.Noexec != "" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS}
	}
	err = cmd.Run()
	var r result
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	r.Stderr = stderr.String()
	sc := bufio.NewScanner(&stdout)
	if !sc.Scan() {
		t.Fatalf("child printed nothing (exit %d): %s", r.Code, r.Stderr)
	}
	var head struct {
		Report Report
		Error  string
	}
	if err := json.Unmarshal(sc.Bytes(), &head); err != nil {
		t.Fatalf("child report %q: %v (stderr %s)", sc.Text(), err, r.Stderr)
	}
	r.Report, r.Error = head.Report, head.Error
	for sc.Scan() {
		r.Lines = append(r.Lines, sc.Text())
	}
	return r
}

// requireLandlock fails in CI, where the kernel must have Landlock, and
// skips elsewhere.
func requireLandlock(t *testing.T) {
	t.Helper()
	if Probe().Landlock > 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("the kernel has no Landlock")
	}
	t.Skip("the kernel has no Landlock")
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("needs root")
	}
	t.Skip("needs root")
}

// sandboxDirs makes a writable directory, a directory outside every list
// and a file to read, under one world-traversable temporary directory.
func sandboxDirs(t *testing.T) (write, outside string) {
	t.Helper()
	base := t.TempDir()
	write, outside = filepath.Join(base, "write"), filepath.Join(base, "outside")
	for _, d := range []string{base, write, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return write, outside
}

func baseConfig(write string) Config {
	return Config{
		ExecPaths:       append([]string{probeDir}, loaders...),
		WritePaths:      []string{write, "/dev/null"},
		ReadPaths:       []string{"/"},
		RequireLandlock: Probe().Landlock > 0,
	}
}

func TestProbe(t *testing.T) {
	p := Probe()
	t.Logf("Probe on this machine: %+v", p)
	if !p.Seccomp || !p.NoNewPrivs {
		t.Errorf("Probe = %+v, want seccomp and no_new_privs", p)
	}
}

// TestRefusedSyscalls runs each refused syscall in a confined process. The
// same probe run unconfined shows which of them would otherwise succeed or
// fail differently (logged), so EPERM here is the confinement's doing.
func TestRefusedSyscalls(t *testing.T) {
	requireRoot(t)
	write, _ := sandboxDirs(t)
	out, err := exec.Command(probeFile, "refused").Output()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unconfined, as root: %s", out)

	r := runChild(t, childSpec{Config: baseConfig(write), Cmd: []string{probeFile, "refused"}, Uid: -1})
	if r.Error != "" || r.Code != 0 {
		t.Fatalf("exit %d, error %q, stderr %s", r.Code, r.Error, r.Stderr)
	}
	var got map[string]int
	r.decode(t, &got)
	for name, e := range got {
		want := unix.EPERM
		switch name {
		case "clone3", "x32_getpid":
			want = unix.ENOSYS
		case "socket_vsock", "socket_bluetooth", "socketpair_tipc":
			want = unix.EAFNOSUPPORT
		case "socket_inet", "socketpair_unix":
			want = 0 // the families a run may use
		case "vhangup":
			if e == -2 {
				continue // the probe has a controlling terminal and did not try
			}
		}
		if e != int(want) {
			t.Errorf("%s: errno %d (%v), want %v", name, e, syscall.Errno(e), want)
		}
	}
	names := []string{"ioctl_TIOCSTI", "ioctl_TIOCSTI_hi", "ioctl_TIOCLINUX", "clone_newuser", "clone3", "socket_vsock", "socket_inet"}
	for _, sc := range refusedEPERM {
		names = append(names, sc.name)
	}
	for _, name := range names {
		if _, ok := got[name]; !ok && !strings.HasPrefix(name, "ioctl") {
			t.Errorf("the probe did not try %s", name)
		}
	}
}

// TestI386Refused issues a real i386 syscall (int $0x80) from a confined
// process. Where the kernel has no i386 entry (int $0x80 faults unconfined
// too) the refusal is covered by TestFilterProgram alone.
func TestI386Refused(t *testing.T) {
	requireRoot(t)
	write, _ := sandboxDirs(t)
	if out, err := exec.Command(probeFile, "int80").Output(); err != nil {
		t.Logf("int $0x80 unconfined: %v; this kernel has no i386 syscall entry, see TestFilterProgram", err)
		return
	} else {
		t.Logf("unconfined: %s", out)
	}
	r := runChild(t, childSpec{Config: baseConfig(write), Cmd: []string{probeFile, "int80"}, Uid: -1})
	var got map[string]int
	r.decode(t, &got)
	if got["i386_getpid"] != int(unix.ENOSYS) {
		t.Errorf("i386 getpid: %v, want ENOSYS", got)
	}
}

type status map[string]string

func (s status) check(t *testing.T, uid string) {
	t.Helper()
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if s[k] != "0000000000000000" {
			t.Errorf("%s = %q, want 0", k, s[k])
		}
	}
	if s["NoNewPrivs"] != "1" || s["Seccomp"] != "2" {
		t.Errorf("NoNewPrivs %q Seccomp %q, want 1 and 2", s["NoNewPrivs"], s["Seccomp"])
	}
	if f := strings.Fields(s["Uid"]); len(f) != 4 || f[0] != uid || f[1] != uid || f[2] != uid || f[3] != uid {
		t.Errorf("Uid = %q, want %s", s["Uid"], uid)
	}
}

func TestCapabilities(t *testing.T) {
	requireRoot(t)
	write, _ := sandboxDirs(t)

	t.Run("KeepSetID then setuid 65534", func(t *testing.T) {
		c := baseConfig(write)
		c.KeepSetID = true
		r := runChild(t, childSpec{Config: c, Cmd: []string{probeFile, "status"}, Uid: 65534})
		var s status
		r.decode(t, &s)
		s.check(t, "65534")
		if !r.Report.NoNewPrivs || !r.Report.Seccomp || r.Report.Landlock != Probe().Landlock {
			t.Errorf("report %+v", r.Report)
		}
	})
	t.Run("as root", func(t *testing.T) {
		r := runChild(t, childSpec{Config: baseConfig(write), Cmd: []string{probeFile, "status"}, Uid: -1})
		var s status
		r.decode(t, &s)
		s.check(t, "0")
	})
	t.Run("KeepSetID then setuid 0", func(t *testing.T) {
		// The owner is root: setuid(0) keeps SETUID/SETGID until execve,
		// which grants root nothing with empty bounding and inheritable sets.
		c := baseConfig(write)
		c.KeepSetID = true
		r := runChild(t, childSpec{Config: c, Cmd: []string{probeFile, "status"}, Uid: 0})
		var s status
		r.decode(t, &s)
		s.check(t, "0")
	})
	t.Run("no setuid without KeepSetID", func(t *testing.T) {
		r := runChild(t, childSpec{Config: baseConfig(write), Cmd: []string{probeFile, "status"}, Uid: 65534})
		var got map[string]int
		r.decode(t, &got)
		if got["start"] != int(unix.EPERM) {
			t.Errorf("start as 65534 without KeepSetID: %v, want EPERM (exit %d, %s)", got, r.Code, r.Stderr)
		}
	})
}

func TestLandlock(t *testing.T) {
	requireRoot(t)
	requireLandlock(t)
	write, outside := sandboxDirs(t)
	if err := copyFile("/usr/bin/true", filepath.Join(outside, "true")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "data"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := baseConfig(write)
	c.ExecPaths = append(c.ExecPaths, "/usr/bin/true")
	probe := func(t *testing.T, uid int, args ...string) map[string]int {
		t.Helper()
		c := c
		c.KeepSetID = uid >= 0
		r := runChild(t, childSpec{Config: c, Cmd: append([]string{probeFile}, args...), Uid: uid})
		if r.Error != "" {
			t.Fatalf("Apply: %s", r.Error)
		}
		var got map[string]int
		r.decode(t, &got)
		return got
	}
	cases := []struct {
		args []string
		key  string
		want syscall.Errno
	}{
		{[]string{"exec", filepath.Join(outside, "true")}, "exec", unix.EACCES},
		{[]string{"exec", "/usr/bin/id"}, "exec", unix.EACCES},
		{[]string{"write", filepath.Join(outside, "new")}, "write", unix.EACCES},
		{[]string{"write", filepath.Join(outside, "data")}, "write", unix.EACCES},
		{[]string{"write", "/etc/condfs-confine-test"}, "write", unix.EACCES},
		{[]string{"write", filepath.Join(write, "new")}, "write", 0},
		{[]string{"write", "/dev/null"}, "write", 0},
		{[]string{"read", filepath.Join(outside, "data")}, "read", 0},
		{[]string{"read", "/etc/passwd"}, "read", 0},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			if got := probe(t, -1, c.args...); got[c.key] != int(c.want) {
				t.Errorf("%v, want %s %v", got, c.key, c.want)
			}
		})
	}
	t.Run("exec allowed dynamic program", func(t *testing.T) {
		r := runChild(t, childSpec{Config: c, Cmd: []string{probeFile, "exec", "/usr/bin/true"}, Uid: -1})
		if r.Code != 0 || len(r.Lines) != 0 {
			t.Errorf("exit %d, output %q, stderr %q", r.Code, r.Lines, r.Stderr)
		}
	})
	t.Run("ordinary work", func(t *testing.T) {
		got := probe(t, 65534, "allowed")
		want := map[string]int{"pipe": 0, "threads": 8, "fork_exec": 0, "ioctl_TCGETS": int(unix.ENOTTY)}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
			}
		}
	})
}

// TestLoaderOnCopy runs the dynamic loader on programs it may not execute.
// Landlock checks execve, not mappings: a copy in a writable place is
// stopped by the place being noexec (as every writable place in the
// sandbox is), and a readable program on an exec mount runs (the limit the
// package doc states; logged, since a future kernel may close it).
func TestLoaderOnCopy(t *testing.T) {
	requireRoot(t)
	requireLandlock(t)
	write, outside := sandboxDirs(t)
	noexec := filepath.Join(write, "noexec")
	if err := os.Mkdir(noexec, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile("/usr/bin/true", filepath.Join(outside, "true")); err != nil {
		t.Fatal(err)
	}
	c := baseConfig(write)

	r := runChild(t, childSpec{Config: c, Noexec: noexec, Cmd: []string{probeFile, "exec", filepath.Join(noexec, "true")}, Uid: -1})
	var got map[string]int
	r.decode(t, &got)
	if got["exec"] != int(unix.EACCES) {
		t.Errorf("exec of the copy: %v, want EACCES", got)
	}

	r = runChild(t, childSpec{Config: c, Noexec: noexec, Cmd: []string{loaders[0], filepath.Join(noexec, "true")}, Uid: -1})
	if r.Code == 0 || !strings.Contains(r.Stderr, "failed to map segment") {
		t.Errorf("loader on the copy in a noexec place: exit %d, stderr %q; want a refused mapping", r.Code, r.Stderr)
	}

	r = runChild(t, childSpec{Config: c, Cmd: []string{loaders[0], filepath.Join(outside, "true")}, Uid: -1})
	t.Logf("loader on a program outside ExecPaths on an exec mount: exit %d, stderr %q (Landlock does not restrict mappings)", r.Code, r.Stderr)
}

// TestOtherThreadsUnconfined applies on the main thread and checks that
// another thread of the same process keeps its capabilities, has neither
// no_new_privs nor seccomp, and may write and execute what the confined
// thread may not.
func TestOtherThreadsUnconfined(t *testing.T) {
	requireRoot(t)
	requireLandlock(t)
	write, outside := sandboxDirs(t)
	r := runChild(t, childSpec{Config: baseConfig(write), Threads: outside})
	if r.Error != "" || r.Code != 0 {
		t.Fatalf("exit %d, error %q, stderr %s", r.Code, r.Error, r.Stderr)
	}
	var got struct {
		Status, Confined map[string]string
		Write, Exec      int
		Unshare          int
	}
	r.decode(t, &got)
	if got.Status["NoNewPrivs"] != "0" || got.Status["Seccomp"] != "0" || got.Status["CapEff"] == "0000000000000000" || got.Status["CapBnd"] == "0000000000000000" {
		t.Errorf("other thread: %v, want unconfined", got.Status)
	}
	if got.Confined["NoNewPrivs"] != "1" || got.Confined["Seccomp"] != "2" || got.Confined["CapEff"] != "0000000000000000" || got.Confined["CapBnd"] != "0000000000000000" {
		t.Errorf("confined thread: %v", got.Confined)
	}
	if got.Write != 0 || got.Exec != 0 || got.Unshare != 0 {
		t.Errorf("other thread: write %d, exec %d, unshare %d; want 0", got.Write, got.Exec, got.Unshare)
	}
}

func TestApplyErrorNamesStep(t *testing.T) {
	requireRoot(t)
	requireLandlock(t)
	write, _ := sandboxDirs(t)
	c := baseConfig(write)
	c.ExecPaths = append(c.ExecPaths, "/nonexistent/condfs")
	r := runChild(t, childSpec{Config: c, Cmd: []string{probeFile, "true"}, Uid: -1})
	if !strings.Contains(r.Error, "landlock: rule for \"/nonexistent/condfs\"") || r.Code != 101 {
		t.Errorf("error %q, exit %d", r.Error, r.Code)
	}
}

// BenchmarkApply measures Apply on a fresh thread (the thread is then
// discarded); "thread" is the same without Apply, the baseline.
func BenchmarkApply(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	c := Config{ExecPaths: append([]string{"/usr/bin"}, loaders...), WritePaths: []string{dir, "/dev/null"}, ReadPaths: []string{"/"}, KeepSetID: true}
	for _, apply := range []bool{false, true} {
		name := "thread"
		if apply {
			name = "apply"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				errc := make(chan error)
				go func() {
					runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
					var err error
					if apply {
						_, err = Apply(c)
					}
					errc <- err
				}()
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
