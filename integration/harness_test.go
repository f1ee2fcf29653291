// Package integration drives the real condfs binary: a daemon process,
// its control socket, and the FUSE views it mounts, as root. The test
// process only uses the views, never serves them: a Go process that both
// serves and uses a FUSE mount can deadlock in its own runtime.
//
// In CI (CI=true) a test that cannot mount fails; elsewhere it skips with
// a loud reason.
package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

var condfsBin, attackerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "condfs-it")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The client and, beside it, the daemon binary it executes.
	condfsBin = filepath.Join(dir, "condfs")
	out, err := exec.Command("go", "build", "-race", "-tags", "condfstest", "-o", dir+"/", "../cmd/condfs", "../cmd/condfsd").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build condfs: %v\n%s", err, out)
		os.Exit(1)
	}
	attackerBin = filepath.Join(dir, "attacker")
	if out, err := exec.Command("go", "build", "-o", attackerBin, "./attacker").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build attacker: %v\n%s", err, out)
		os.Exit(1)
	}
	// Unprivileged attackers run both binaries.
	os.Chmod(dir, 0o755)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireFUSE fails in CI and skips elsewhere when views cannot be mounted.
func requireFUSE(t testing.TB) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "integration tests need root to mount FUSE views"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse: " + err.Error()
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", why)
	}
	t.Skipf("SKIPPING FUSE TEST: %s (in CI this fails)", why)
}

// home is an agent home directory: config, blocks, memories, workspace.
type home struct {
	t    testing.TB
	root string
}

func newHome(t testing.TB, conditions, policy string) *home {
	t.Helper()
	h := &home{t: t, root: t.TempDir()}
	for _, d := range []string{"config", "blocks/conditional", "memories", "workspace", "mnt"} {
		if err := os.MkdirAll(filepath.Join(h.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if conditions != "-" {
		h.write("config/conditions.toml", conditions)
	}
	if policy != "-" {
		h.write("config/policy.yaml", policy)
	}
	return h
}

func (h *home) path(rel string) string { return filepath.Join(h.root, rel) }

func (h *home) write(rel, text string) string {
	h.t.Helper()
	p := h.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return p
}

// daemon is a running condfs serve.
type daemon struct {
	t      testing.TB
	home   *home
	cmd    *exec.Cmd
	socket string
	logs   syncBuilder
	exited chan struct{}
	client *control.Client
}

type syncBuilder struct {
	b  *strings.Builder
	mu chan struct{}
}

func (s syncBuilder) Write(p []byte) (int, error) {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.Write(p)
}

// startDaemon starts condfs serve on h and waits for its socket.
func startDaemon(t testing.TB, h *home, extra ...string) *daemon {
	t.Helper()
	return startDaemonUnder(t, h, nil, extra...)
}

// startDaemonUnder starts condfs serve through a wrapper command that
// execs it (prlimit, setpriv), so that the daemon keeps the wrapper's pid.
func startDaemonUnder(t testing.TB, h *home, wrapper []string, extra ...string) *daemon {
	t.Helper()
	requireFUSE(t)
	d := &daemon{t: t, home: h, socket: filepath.Join(h.root, "run", "condfs.sock"), exited: make(chan struct{})}
	d.logs = syncBuilder{b: &strings.Builder{}, mu: make(chan struct{}, 1)}
	args := []string{"serve", "--root", h.root, "--socket", d.socket, "--log-level", "debug"}
	if c := os.Getenv("CONDFS_TEST_CONNECTIONS"); c != "" {
		// make test runs the no-stale tests on both kinds of connection.
		args = append(args, "--connections="+c)
	}
	if c := os.Getenv("CONDFS_TEST_EGRESS_CAPTURE"); c != "" {
		// make test runs the egress tests on both captures.
		args = append(args, "--egress-capture="+c)
	}
	args = append(args, extra...)
	args = append([]string{condfsBin}, args...)
	args = append(wrapper, args...)
	d.cmd = exec.Command(args[0], args[1:]...)
	lw := d.logs
	d.cmd.Stdout, d.cmd.Stderr = lw, lw
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := control.Dial(d.socket)
		if err == nil {
			d.client = c
			break
		}
		select {
		case <-d.exited:
			t.Fatalf("condfs serve exited: %v\n%s", d.cmd.ProcessState, lw.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket never appeared: %v\n%s", err, lw.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { d.stop() })
	return d
}

func (s syncBuilder) String() string {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.String()
}

// stop sends SIGTERM, waits, and checks that no view stays mounted.
func (d *daemon) stop() {
	d.t.Helper()
	select {
	case <-d.exited:
		return
	default:
	}
	if d.client != nil {
		d.client.Close()
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		d.t.Errorf("daemon did not stop on SIGTERM")
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		d.t.Errorf("daemon exited with %d\n%s", code, d.log())
	}
	if m := mountsUnder(d.home.root); len(m) > 0 {
		d.t.Errorf("views still mounted after shutdown: %v", m)
	}
	if _, err := os.Stat(d.socket); !os.IsNotExist(err) {
		d.t.Errorf("socket left behind after shutdown: %v", err)
	}
}

func (d *daemon) log() string {
	return d.logs.String()
}

// call makes one control call, failing the test on error.
func (d *daemon) call(method string, params, out any) {
	d.t.Helper()
	if err := d.client.Call(method, params, out); err != nil {
		d.t.Fatalf("%s: %v\ndaemon log:\n%s", method, err, tail(d.log(), 20))
	}
}

// callErr makes a call that must fail with the given JSON-RPC code.
func (d *daemon) callErr(method string, params any, code int) *control.Error {
	d.t.Helper()
	err := d.client.Call(method, params, nil)
	rpcErr, ok := err.(*control.Error)
	if !ok || rpcErr.Code != code {
		d.t.Fatalf("%s %v: error %v, want code %d", method, params, err, code)
	}
	return rpcErr
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// open opens a session mounted under the home and returns its mountpoint.
func (d *daemon) open(id string, context any) string {
	d.t.Helper()
	mnt := d.home.path("mnt/" + id)
	var res struct {
		Atoms []string `json:"atoms"`
	}
	d.call("session.open", map[string]any{"id": id, "mount": mnt, "context": context}, &res)
	return mnt
}

func (d *daemon) setContext(id string, context any) {
	d.t.Helper()
	d.call("context.set", map[string]any{"session": id, "context": context}, nil)
}

// mountsUnder lists condfs mounts below dir, from /proc/self/mountinfo.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir) && strings.Contains(sc.Text(), "condfs") {
			out = append(out, fields[4])
		}
	}
	return out
}

// within waits up to 3 s for ok: a change made behind the view's back (the
// backing tree, another process) reaches it through the daemon's watches
// within moments, however long its caches last.
func (d *daemon) within(what string, ok func() bool) {
	d.t.Helper()
	for deadline := time.Now().Add(3 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			d.t.Fatalf("%s: not seen through the view within 3s\n%s", what, d.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// repeat calls f in n goroutines, each with its index, over and over until
// the returned stop is called; stop waits for them.
func repeat(n int, f func(i int)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				f(i)
			}
		}()
	}
	return sync.OnceFunc(func() { close(done); wg.Wait() })
}
