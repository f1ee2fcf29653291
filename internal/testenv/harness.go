package testenv

import (
	"bufio"
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

// Home is an agent home directory: config, blocks, memories, workspace,
// and mnt for the views.
type Home struct {
	t    testing.TB
	Root string
}

// NewHome makes a home whose config holds conditions and policy ("-"
// leaves the file out).
func NewHome(t testing.TB, conditions, policy string) *Home {
	t.Helper()
	h := &Home{t: t, Root: t.TempDir()}
	for _, d := range []string{"config", "blocks/conditional", "memories", "workspace", "mnt"} {
		if err := os.MkdirAll(filepath.Join(h.Root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if conditions != "-" {
		h.Write("config/conditions.toml", conditions)
	}
	if policy != "-" {
		h.Write("config/policy.yaml", policy)
	}
	return h
}

// Path is rel's path in the home.
func (h *Home) Path(rel string) string { return filepath.Join(h.Root, rel) }

// Write writes text to rel, making its directories, and returns its path.
func (h *Home) Write(rel, text string) string {
	h.t.Helper()
	p := h.Path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return p
}

// Daemon is a running condfs serve.
type Daemon struct {
	t      testing.TB
	Home   *Home
	Cmd    *exec.Cmd
	Socket string
	logs   LogBuffer
	exited chan struct{}
	Client *control.Client
}

// LogBuffer collects a process's output for a test to read while it runs.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is what was written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start starts condfs serve on h with extra flags, as root, and waits for
// its socket. The daemon is stopped, and checked to leave nothing mounted,
// when the test ends.
func Start(t testing.TB, h *Home, extra ...string) *Daemon {
	t.Helper()
	return StartUnder(t, h, nil, extra...)
}

// StartUnder starts condfs serve through a wrapper command that execs it
// (prlimit, setpriv), so that the daemon keeps the wrapper's pid.
func StartUnder(t testing.TB, h *Home, wrapper []string, extra ...string) *Daemon {
	t.Helper()
	RequireFUSE(t)
	return serve(t, h, wrapper, extra...)
}

// Serve starts condfs serve on h for decisions only (tool.decide,
// path.check): it mounts no view, so it needs neither root nor FUSE.
func Serve(t testing.TB, h *Home, extra ...string) *Daemon {
	t.Helper()
	return serve(t, h, nil, extra...)
}

// serve starts the daemon and waits for its socket.
//
// CONDFS_TEST_CONNECTIONS and CONDFS_TEST_EGRESS_CAPTURE set
// --connections and --egress-capture: make test runs the no-stale and the
// egress tests again on each kind.
func serve(t testing.TB, h *Home, wrapper []string, extra ...string) *Daemon {
	t.Helper()
	d := &Daemon{t: t, Home: h, Socket: filepath.Join(h.Root, "run", "condfs.sock"), exited: make(chan struct{})}
	args := []string{"serve", "--root", h.Root, "--socket", d.Socket, "--log-level", "debug"}
	if c := os.Getenv("CONDFS_TEST_CONNECTIONS"); c != "" {
		args = append(args, "--connections="+c)
	}
	if c := os.Getenv("CONDFS_TEST_EGRESS_CAPTURE"); c != "" {
		args = append(args, "--egress-capture="+c)
	}
	args = append(args, extra...)
	args = append([]string{Condfs()}, args...)
	args = append(wrapper, args...)
	d.Cmd = exec.Command(args[0], args[1:]...)
	d.Cmd.Stdout, d.Cmd.Stderr = &d.logs, &d.logs
	if err := d.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.Cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := control.Dial(d.Socket)
		if err == nil {
			d.Client = c
			break
		}
		select {
		case <-d.exited:
			t.Fatalf("condfs serve exited: %v\n%s", d.Cmd.ProcessState, d.Log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket never appeared: %v\n%s", err, d.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { d.Stop() })
	return d
}

// Stop sends SIGTERM, waits, and checks that the daemon exits 0 and
// leaves no view mounted and no socket behind.
func (d *Daemon) Stop() {
	d.t.Helper()
	select {
	case <-d.exited:
		return
	default:
	}
	if d.Client != nil {
		d.Client.Close()
	}
	d.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		d.Cmd.Process.Kill()
		<-d.exited
		d.t.Errorf("daemon did not stop on SIGTERM")
	}
	if code := d.Cmd.ProcessState.ExitCode(); code != 0 {
		d.t.Errorf("daemon exited with %d\n%s", code, d.Log())
	}
	if m := MountsUnder(d.Home.Root); len(m) > 0 {
		d.t.Errorf("views still mounted after shutdown: %v", m)
	}
	if _, err := os.Stat(d.Socket); !os.IsNotExist(err) {
		d.t.Errorf("socket left behind after shutdown: %v", err)
	}
}

// Exited is closed when the daemon's process has ended.
func (d *Daemon) Exited() <-chan struct{} { return d.exited }

// Log is what the daemon has written so far.
func (d *Daemon) Log() string { return d.logs.String() }

// Call makes one control call, failing the test on error.
func (d *Daemon) Call(method string, params, out any) {
	d.t.Helper()
	if err := d.Client.Call(method, params, out); err != nil {
		d.t.Fatalf("%s: %v\ndaemon log:\n%s", method, err, Tail(d.Log(), 20))
	}
}

// CallErr makes a call that must fail with the given JSON-RPC code.
func (d *Daemon) CallErr(method string, params any, code int) *control.Error {
	d.t.Helper()
	err := d.Client.Call(method, params, nil)
	rpcErr, ok := err.(*control.Error)
	if !ok || rpcErr.Code != code {
		d.t.Fatalf("%s %v: error %v, want code %d", method, params, err, code)
	}
	return rpcErr
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Open opens session id, served to root, mounted at mnt/id in the home,
// and returns its mountpoint.
func (d *Daemon) Open(id string, context any) string {
	d.t.Helper()
	mnt := d.Home.Path("mnt/" + id)
	d.Call("session.open", map[string]any{"id": id, "mount": mnt, "context": context}, nil)
	return mnt
}

// OpenFor opens a session served to uid owner.
func (d *Daemon) OpenFor(id string, owner int, context any) string {
	d.t.Helper()
	mnt := d.Home.Path("mnt/" + id)
	d.Call("session.open", map[string]any{"id": id, "mount": mnt, "context": context, "owner": owner}, nil)
	return mnt
}

// SetContext switches session id to context.
func (d *Daemon) SetContext(id string, context any) {
	d.t.Helper()
	d.Call("context.set", map[string]any{"session": id, "context": context}, nil)
}

// MountsUnder lists condfs mounts below dir, from /proc/self/mountinfo.
func MountsUnder(dir string) []string {
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

// Within waits up to 3 s for ok: a change made behind the view's back (the
// backing tree, another process) reaches it through the daemon's watches
// within moments, however long its caches last.
func (d *Daemon) Within(what string, ok func() bool) {
	d.t.Helper()
	for deadline := time.Now().Add(3 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			d.t.Fatalf("%s: not seen through the view within 3s\n%s", what, d.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Repeat calls f in n goroutines, each with its index, over and over until
// the returned stop is called; stop waits for them.
func Repeat(n int, f func(i int)) (stop func()) {
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

// HomeAt is a home already made at root.
func HomeAt(t testing.TB, root string) *Home { return &Home{t: t, Root: root} }
