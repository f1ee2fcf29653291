package views

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

	"github.com/condfs/condfs/fsys"
	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// waiterProc is an attacker "lock" process: n waiters for one lock.
type waiterProc struct {
	cmd    *exec.Cmd
	stdin  interface{ Close() error }
	lines  chan string // one per waiter whose lock call returned
	exited chan struct{}
}

// startWaiters starts n waiters for an exclusive lock of kind on p, as uid
// 65534, and returns once each has its descriptor open.
func startWaiters(t *testing.T, p, kind string, n int) *waiterProc {
	t.Helper()
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Attacker(), "lock", p, kind, strconv.Itoa(n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &waiterProc{cmd: cmd, stdin: stdin, lines: make(chan string, n+1), exited: make(chan struct{})}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "started" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("lock %s %s: %q", kind, p, sc.Text())
	}
	go func() {
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		cmd.Wait()
		close(w.exited)
	}()
	return w
}

// answered collects the lines that have come so far.
func (w *waiterProc) answered() []string {
	var out []string
	for {
		select {
		case l := <-w.lines:
			out = append(out, l)
		default:
			return out
		}
	}
}

// next waits for the next answer, up to 10 s.
func (w *waiterProc) next(t *testing.T, what string) string {
	t.Helper()
	select {
	case l := <-w.lines:
		return l
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer within 10s", what)
		return ""
	}
}

// waitFUSE waits until n of pid's threads wait for an answer from a FUSE
// daemon (their wchan), up to 10 s.
func waitFUSE(t *testing.T, pid, n int) {
	t.Helper()
	count := func() int {
		c := 0
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
		for _, p := range tasks {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), "request_wait_answer") || strings.Contains(string(b), "fuse") {
				c++
			}
		}
		return c
	}
	for deadline := time.Now().Add(10 * time.Second); count() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d threads of %d wait on the view after 10s", count(), n, pid)
		}
	}
}

// lockHome is a home with a file every uid may lock, in workspace/ (no
// rules) and in memories/private/ (DM only).
func lockHome(t *testing.T) *testenv.Home {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	for _, f := range []string{"workspace/lock", "memories/private/lock"} {
		h.Write(f, "x")
		os.Chmod(h.Path(f), 0o666)
	}
	os.Chmod(h.Path("memories/private"), 0o777)
	return h
}

// TestLockWaitersBounded: 300 waiters for a held lock (flock, F_SETLKW and
// F_OFD_SETLKW), as uid 65534, with the daemon in a pids cgroup of 100
// tasks. The daemon's threads stay few, it stays up, every other session
// answers, and waiters beyond the per-view bound get ENOLCK at once.
func TestLockWaitersBounded(t *testing.T) {
	h := lockHome(t)
	h.Write("memories/other.md", "other")
	join := testenv.PidsCgroup(t, 100)
	d := testenv.Start(t, h)
	pid := d.Cmd.Process.Pid
	join(pid)
	mnt := d.OpenFor("s", testenv.Nobody, testenv.Guild)
	other := d.Open("other", testenv.DM)
	p := mnt + "/workspace/lock"
	first, ask := testenv.ConverseAsNobody(t, "locker", p)
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	for _, kind := range []string{"flock", "ofd"} {
		if got := ask(kind + " w nb"); got != "ok" {
			t.Fatalf("holder %s: %s", kind, got)
		}
	}
	idle := testenv.ThreadsOf(pid)
	var ws []*waiterProc
	defer func() {
		// Release the holder first: without the fix, killed waiters wait
		// for it (D state), and so would this cleanup.
		ask("flock un")
		ask("ofd un")
		for _, w := range ws {
			w.cmd.Process.Kill()
			w.stdin.Close()
			<-w.exited
		}
	}()
	for _, kind := range []string{"flock", "posix", "ofd"} {
		ws = append(ws, startWaiters(t, p, kind, 100))
	}
	// Sample the daemon's threads while the waiters' requests arrive, until
	// the refused ones have all been answered and a second has passed.
	// The goal performance.md states for an idle daemon at any session
	// count, 64 + 4 × GOMAXPROCS, less the latter: waiters add nothing
	// lasting, only the requests being served at that moment.
	const bound = 64
	peak, refused := 0, 0
	settled := time.Time{}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n := testenv.ThreadsOf(pid)
		if n < 0 {
			t.Fatalf("the daemon died with %d waiters (peak %d threads)\n%s", 300, peak, testenv.Tail(d.Log(), 20))
		}
		peak = max(peak, n)
		for _, w := range ws {
			for _, l := range w.answered() {
				if l != "errno ENOLCK" {
					t.Fatalf("a waiter for a held lock answered %q", l)
				}
				refused++
			}
		}
		if refused >= 300-fsys.MaxLockWaitersPerView && settled.IsZero() {
			settled = time.Now()
		}
		if !settled.IsZero() && time.Since(settled) > time.Second {
			break
		}
	}
	t.Logf("daemon threads: %d idle, peak %d with 300 waiters; %d refused", idle, peak, refused)
	if peak > bound {
		t.Errorf("the daemon's threads grew to %d (idle %d) with 300 lock waiters; want at most %d", peak, idle, bound)
	}
	if refused != 300-fsys.MaxLockWaitersPerView {
		t.Errorf("%d waiters refused, want %d (all beyond the view's %d)", refused, 300-fsys.MaxLockWaitersPerView, fsys.MaxLockWaitersPerView)
	}
	// Every session still answers, this one too.
	if b, err := os.ReadFile(other + "/memories/other.md"); err != nil || string(b) != "other" {
		t.Fatalf("another session, with the waiters pending: %q, %v", b, err)
	}
	if out := testenv.AsNobody(t, "cat", mnt+"/workspace/lock"); out != `read "x"` {
		t.Fatalf("the waiters' session: %s", out)
	}
}

// TestLockWaitersKilled: waiters killed with SIGKILL while the lock is
// still held exit promptly: the daemon answers the kernel's interrupt,
// they do not sit in D state until the holder lets go. Their places are
// free again afterwards.
func TestLockWaitersKilled(t *testing.T) {
	h := lockHome(t)
	d := testenv.Start(t, h)
	mnt := d.OpenFor("s", testenv.Nobody, testenv.Guild)
	p := mnt + "/workspace/lock"
	first, ask := testenv.ConverseAsNobody(t, "locker", p)
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	for _, kind := range []string{"flock", "ofd"} {
		if got := ask(kind + " w nb"); got != "ok" {
			t.Fatalf("holder %s: %s", kind, got)
		}
	}
	n := fsys.MaxLockWaitersPerView / 3
	var ws []*waiterProc
	defer func() {
		ask("flock un")
		ask("ofd un")
		for _, w := range ws {
			w.cmd.Process.Kill()
			w.stdin.Close()
			<-w.exited
		}
	}()
	for _, kind := range []string{"flock", "posix", "ofd"} {
		ws = append(ws, startWaiters(t, p, kind, n))
	}
	for _, w := range ws {
		waitFUSE(t, w.cmd.Process.Pid, n)
	}
	time.Sleep(200 * time.Millisecond) // the last requests reach the daemon
	for _, w := range ws {
		if got := w.answered(); len(got) > 0 {
			t.Fatalf("waiters for a held lock answered %v", got)
		}
		w.cmd.Process.Kill()
	}
	for _, w := range ws {
		pid := w.cmd.Process.Pid
		for deadline := time.Now().Add(10 * time.Second); !testenv.Gone(pid); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("a killed waiter is still there 10s later, its threads in states %q", testenv.TaskStates(pid))
			}
		}
	}
	// The killed waiters' places are free: a full view's worth waits again.
	w := startWaiters(t, p, "flock", fsys.MaxLockWaitersPerView)
	ws = append(ws, w)
	waitFUSE(t, w.cmd.Process.Pid, fsys.MaxLockWaitersPerView)
	time.Sleep(200 * time.Millisecond)
	if got := w.answered(); len(got) > 0 {
		t.Fatalf("after the killed waiters, new ones answered %v", got)
	}
	// And they take the lock once it is released.
	ask("flock un")
	if got := w.next(t, "a waiter after the release"); got != "locked" {
		t.Fatalf("a waiter after the release: %s", got)
	}
}

// TestLockAfterSwitchDenied: a handle the context no longer allows takes,
// tests and waits for no lock (EACCES, as its reads); it may still release
// the locks it holds. A handle of a closed session takes none either.
func TestLockAfterSwitchDenied(t *testing.T) {
	h := lockHome(t)
	d := testenv.Start(t, h)
	mnt := d.OpenFor("s", testenv.Nobody, testenv.DM)
	first, ask := testenv.ConverseAsNobody(t, "locker", mnt+"/memories/private/lock")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	for _, c := range []string{"flock w nb", "ofd w nb"} {
		if got := ask(c); got != "ok" {
			t.Fatalf("%s in a DM: %s", c, got)
		}
	}
	d.SetContext("s", testenv.Guild)
	for _, c := range []string{"flock r nb", "flock w", "ofd r nb", "ofd w", "posix w nb", "posix w", "getlk"} {
		if got := ask(c); got != "errno EACCES" {
			t.Errorf("%s on a handle the context denies: %s", c, got)
		}
	}
	for _, c := range []string{"flock un", "ofd un"} {
		if got := ask(c); got != "ok" {
			t.Errorf("%s on a handle the context denies: %s", c, got)
		}
	}
	// The locks are gone from the backing file.
	fd, err := unix.Open(h.Path("memories/private/lock"), unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("flock after the denied handle released it: %v", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err != nil || lk.Type != unix.F_UNLCK {
		t.Errorf("an OFD lock is left after the denied handle released it: %+v, %v", lk, err)
	}
	unix.Flock(fd, unix.LOCK_UN)

	// A closed session's handles take no lock.
	first, ask = testenv.ConverseAsNobody(t, "locker", mnt+"/workspace/lock")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	d.Call("session.close", map[string]any{"id": "s"}, nil)
	for _, c := range []string{"flock w nb", "ofd w nb", "getlk"} {
		if got := ask(c); !strings.HasPrefix(got, "errno ") {
			t.Errorf("%s on a closed session's handle: %s", c, got)
		}
	}
}

// TestLockSemantics: through a view, for flock, POSIX and OFD locks, an
// exclusive lock excludes, shared locks share, a waiter gets the lock when
// its holder releases it, and a holder's exit releases what it held.
func TestLockSemantics(t *testing.T) {
	h := lockHome(t)
	d := testenv.Start(t, h)
	mnt := d.OpenFor("s", testenv.Nobody, testenv.Guild)
	p := mnt + "/workspace/lock"
	for _, kind := range []string{"flock", "posix", "ofd"} {
		t.Run(kind, func(t *testing.T) {
			first, holder := testenv.ConverseAsNobody(t, "locker", p)
			_, other := testenv.ConverseAsNobody(t, "locker", p)
			if first != "open" {
				t.Fatalf("open: %s", first)
			}
			if got := holder(kind + " r nb"); got != "ok" {
				t.Fatalf("shared: %s", got)
			}
			if got := other(kind + " r nb"); got != "ok" {
				t.Fatalf("a second shared lock: %s", got)
			}
			if got := other(kind + " un"); got != "ok" {
				t.Fatalf("unlock: %s", got)
			}
			if got := holder(kind + " w nb"); got != "ok" {
				t.Fatalf("exclusive: %s", got)
			}
			if got := other(kind + " w nb"); got != "errno EAGAIN" {
				t.Fatalf("a second exclusive lock while one is held: %s", got)
			}
			if kind != "flock" {
				if got := other("getlk"); got != "locked" {
					t.Fatalf("F_OFD_GETLK while held: %s", got)
				}
			}
			w := startWaiters(t, p, kind, 1)
			defer func() { w.cmd.Process.Kill(); w.stdin.Close(); <-w.exited }()
			waitFUSE(t, w.cmd.Process.Pid, 1)
			if got := w.answered(); len(got) > 0 {
				t.Fatalf("a waiter for a held lock answered %v", got)
			}
			if got := holder(kind + " un"); got != "ok" {
				t.Fatalf("release: %s", got)
			}
			if got := w.next(t, "the waiter after the release"); got != "locked" {
				t.Fatalf("the waiter after the release: %s", got)
			}
			if got := other(kind + " w nb"); got != "errno EAGAIN" {
				t.Fatalf("while the waiter holds it: %s", got)
			}
			// The waiter's exit releases its lock.
			w.stdin.Close()
			<-w.exited
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				got := other(kind + " w nb")
				if got == "ok" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the lock outlived its holder's exit: %s", got)
				}
			}
			other(kind + " un")
		})
	}
}
