package integration

// Second-round attacks on the fixes for the MCP gateway, connection slots
// and lock waiters: each test here fails on the code it was written
// against and names the hole in its failure message.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The load helper: the test binary re-executed as uid 65534 (before
// TestMain) with CONDFS_ATTACK2_LOAD=OP,DIR,THREADS,SECONDS runs THREADS
// threads that repeat OP on the view's directory DIR:
//   - readdir: open DIR, list it, close it;
//   - setxattr: set user.x on DIR/f (uid 65534's file);
//   - fsync: create DIR/tN, write 4 KiB, fsync, close;
//   - read: read 1 MiB of DIR/big with O_DIRECT (each read reaches the
//     daemon) at a thread's offset;
//   - write: write 1 MiB into DIR/big with O_DIRECT at a thread's offset.
func init() {
	spec := os.Getenv("CONDFS_ATTACK2_LOAD")
	if spec == "" {
		return
	}
	f := strings.Split(spec, ",")
	op, dir := f[0], f[1]
	n, _ := strconv.Atoi(f[2])
	secs, _ := strconv.Atoi(f[3])
	end := time.Now().Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	var errs sync.Map
	var ops atomic.Int64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20+4096)
			// O_DIRECT wants an aligned buffer.
			off := 4096 - int(uintptr(unsafe.Pointer(&buf[0]))&4095)
			mib := buf[off : off+1<<20]
			for time.Now().Before(end) {
				var err error
				switch op {
				case "readdir":
					var fd int
					if fd, err = syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0); err == nil {
						_, err = syscall.ReadDirent(fd, buf)
						syscall.Close(fd)
					}
				case "setxattr":
					err = syscall.Setxattr(dir+"/f", "user.x", []byte(strconv.Itoa(i)), 0)
				case "fsync":
					var fd int
					if fd, err = syscall.Open(fmt.Sprintf("%s/t%d", dir, i), syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, 0o600); err == nil {
						if _, err = syscall.Write(fd, buf[:4096]); err == nil {
							err = syscall.Fsync(fd)
						}
						syscall.Close(fd)
					}
				case "read", "write":
					flags := syscall.O_RDONLY
					if op == "write" {
						flags = syscall.O_WRONLY
					}
					var fd int
					if fd, err = syscall.Open(dir+"/big", flags|syscall.O_DIRECT, 0); err == nil {
						at := int64(i%8) << 20
						if op == "read" {
							_, err = syscall.Pread(fd, mib, at)
						} else {
							_, err = syscall.Pwrite(fd, mib, at)
						}
						syscall.Close(fd)
					}
				}
				if err != nil {
					errs.Store(err.Error(), true)
				} else {
					ops.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	errs.Range(func(k, _ any) bool { fmt.Println("errno", k); return true })
	fmt.Println("done", ops.Load(), "ops")
	os.Exit(0)
}

// TestAttack2ReaddirThreads: uid 65534 lists its own view's workspace/
// from 400 threads at once. Each FUSE request acts as its caller on a
// thread pinned to the serving goroutine, and concurrent directory
// requests wait with that thread held, so the daemon's threads grow with
// the attacker's (800 listing threads: 811 daemon threads; 2,000: 1,316),
// not "within a backing syscall's time". In a pids cgroup of 200 tasks
// (the shipped unit caps tasks too) the daemon dies and every session
// with it. The bound asserted is performance.md's (33 threads on 2 cores).
func TestAttack2ReaddirThreads(t *testing.T) { threadsUnderLoad(t, "readdir") }

// TestAttack2SetxattrThreads: the same with setxattr on one file (172
// daemon threads for 400 attacker threads before the fix).
func TestAttack2SetxattrThreads(t *testing.T) { threadsUnderLoad(t, "setxattr") }

// TestAttack2FsyncThreads: the same with create, write and fsync of a file
// per thread (86 daemon threads before).
func TestAttack2FsyncThreads(t *testing.T) { threadsUnderLoad(t, "fsync") }

// TestAttack2BigReadThreads and TestAttack2BigWriteThreads: the same with
// 1 MiB direct reads and writes of one file (86 daemon threads before).
func TestAttack2BigReadThreads(t *testing.T)  { threadsUnderLoad(t, "read") }
func TestAttack2BigWriteThreads(t *testing.T) { threadsUnderLoad(t, "write") }

// threadsUnderLoad runs op from 400 threads of uid 65534 in its own view's
// workspace/ for 6 s, with the daemon in a pids cgroup of 200 tasks, and
// fails if the daemon dies, if another session stops answering, or if the
// daemon's threads ever exceed the bound.
func threadsUnderLoad(t *testing.T, op string) {
	h := openHome(t, privateRule)
	os.Chmod(h.path("workspace"), 0o777)
	for i := 0; i < 50; i++ {
		h.write(fmt.Sprintf("workspace/f%02d", i), "x")
	}
	h.write("workspace/f", "x")
	h.write("workspace/big", strings.Repeat("x", 8<<20))
	for _, f := range []string{"workspace/f", "workspace/big"} {
		os.Chown(h.path(f), 65534, 65534)
	}
	h.write("memories/other.md", "other")
	join := pidsCgroup(t, 200)
	d := startDaemon(t, h)
	pid := d.cmd.Process.Pid
	join(pid)
	mnt := d.openFor("s", nobody, guildCtx)
	other := d.open("other", dmCtx)
	t.Cleanup(func() {
		// A daemon that died leaves its views dead (ENOTCONN).
		if threadsOf(pid) < 0 {
			for _, m := range mountsUnder(h.root) {
				syscall.Unmount(m, syscall.MNT_DETACH)
			}
		}
	})

	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", copySelf(t))
	cmd.Env = append(os.Environ(), "CONDFS_ATTACK2_LOAD="+op+","+mnt+"/workspace,400,6")
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	defer func() { cmd.Process.Kill(); <-done }()

	// performance.md's bound: the runtime's own and an idle daemon's
	// (10), MaxActing places (4 x GOMAXPROCS + 8), the goroutines that keep
	// a caller's credentials between requests and go-fuse's readers of
	// the one connection (clamp(GOMAXPROCS, 2, 16) + 2 and + 1).
	procs := runtime.GOMAXPROCS(0)
	readers := min(max(procs, 2), 16)
	bound := 10 + 4*procs + 8 + readers + 2 + readers + 1
	peak := 0
	for sampling := true; sampling; {
		select {
		case <-done:
			sampling = false
		case <-time.After(20 * time.Millisecond):
		}
		n := threadsOf(pid)
		if n < 0 {
			why := ""
			for _, l := range strings.Split(d.log(), "\n") {
				if strings.Contains(l, "fatal") || strings.Contains(l, "pthread_create") || strings.HasPrefix(l, "runtime:") {
					why += l + "\n"
				}
			}
			t.Fatalf("the daemon died while uid 65534 ran %s on its view from 400 threads (peak %d threads seen; pids.max 200): every session is gone\n%s", op, peak, why)
		}
		peak = max(peak, n)
	}
	if _, err := os.ReadFile(other + "/memories/other.md"); err != nil {
		t.Fatalf("another session no longer answers after uid 65534's %s load: %v", op, err)
	}
	t.Logf("%s: peak %d daemon threads; attacker: %s", op, peak, strings.TrimSpace(out.String()))
	if !strings.Contains(out.String(), "done") || strings.Contains(out.String(), "done 0 ops") {
		t.Fatalf("the attacker's %s load did not run: %s", op, out.String())
	}
	if peak > bound {
		t.Fatalf("uid 65534 running %s on its view from 400 threads grew the daemon to %d OS threads (bound %d): threads follow the attacker's threads, so a local user can exhaust the daemon's pids limit and end every session", op, peak, bound)
	}
}

// TestAttack2ToolsListIDUnfiltered: the gateway remembers a tools/list by
// its id as re-encoded ("2.5"), but the official Go SDK reads a numeric id
// as a float64 and answers with int64(id) ("2"). The answer then matches
// no listing in flight and passes unfiltered: the client sees the tools
// its roles can never call (the listing of the "secret" tool the policy
// denies), though a listing that cannot be filtered must list none.
func TestAttack2ToolsListIDUnfiltered(t *testing.T) {
	dir := t.TempDir()
	server := filepath.Join(dir, "testserver")
	if out, err := exec.Command("go", "build", "-o", server, "../mcpproxy/internal/testserver").CombinedOutput(); err != nil {
		t.Fatalf("build testserver: %v\n%s", err, out)
	}
	h := newHome(t, "-", `version: 1
roles:
  default:
    tools:
      echo: {mode: allow}
      secret: {mode: deny}
`)
	d := startDaemon(t, h)
	cmd := exec.Command(condfsBin, "mcp", "proxy", "--socket", d.socket, "--context", "tui", "--", server)
	cmd.Env = append(os.Environ(), "CALL_LOG="+filepath.Join(dir, "calls"))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	io.WriteString(stdin, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":1,"method":"tools/list"}
{"jsonrpc":"2.0","id":2.5,"method":"tools/list"}
`)
	listed := map[string][]string{}
	deadline := time.After(20 * time.Second)
	for len(listed) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the proxy ended; listings so far: %v", listed)
			}
			var m struct {
				ID     json.RawMessage `json:"id"`
				Result struct {
					Tools []struct {
						Name string `json:"name"`
					} `json:"tools"`
				} `json:"result"`
			}
			if json.Unmarshal([]byte(l), &m) != nil || string(m.ID) == "0" {
				continue
			}
			var names []string
			for _, tool := range m.Result.Tools {
				names = append(names, tool.Name)
			}
			listed[string(m.ID)] = names
		case <-deadline:
			t.Fatalf("no answer to both listings; so far: %v", listed)
		}
	}
	if !slices.Contains(listed["1"], "echo") || slices.Contains(listed["1"], "secret") {
		t.Fatalf("the plain listing (id 1) is not filtered as expected: %v", listed["1"])
	}
	for id, names := range listed {
		if slices.Contains(names, "secret") {
			t.Fatalf("a tools/list sent with id 2.5 was answered with id %s and passed unfiltered: the client sees %v, the denied tool \"secret\" among them", id, names)
		}
	}
}
