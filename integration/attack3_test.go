package integration

// Attacks on condfs run (the sandbox, its daemon side and the descriptors
// the control socket takes): each test here fails on the code it was
// written against and names the hole in its failure message.

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The notify helper: with CONDFS_ATTACK3_NOTIFY=SOCKET, it sends a run
// of "sleep 600" in session s as a notification (no id) with its stdio, and
// exits.
//
// The linger helper: the test binary re-executed as uid 65534 (before
// TestMain) with CONDFS_ATTACK3_LINGER=SOCKET,N sends N requests on one
// control connection, each with 3 descriptors of TCP sockets whose final
// close blocks (SO_LINGER of an hour, unsent data, a peer that never
// reads), keeping no copy of them. It prints "sent N" and holds the peers
// until stdin closes.
func init() {
	if sock := os.Getenv("CONDFS_ATTACK3_NOTIFY"); sock != "" {
		// A run request without an id (a notification), with this
		// process's stdio, then gone.
		c, err := net.Dial("unix", sock)
		if err != nil {
			fmt.Println("attack3 notify:", err)
			os.Exit(1)
		}
		line := `{"jsonrpc":"2.0","method":"run","params":{"session":"s","argv":["sleep","600"],"timeout_ms":1000}}` + "\n"
		if _, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte(line), syscall.UnixRights(0, 1, 2), nil); err != nil {
			fmt.Println("attack3 notify:", err)
			os.Exit(1)
		}
		time.Sleep(2 * time.Second) // the daemon has read it
		fmt.Println("sent")
		os.Exit(0)
	}
	spec := os.Getenv("CONDFS_ATTACK3_LINGER")
	if spec == "" {
		return
	}
	sock, ns, _ := strings.Cut(spec, ",")
	n, _ := strconv.Atoi(ns)
	if err := lingerAttack(sock, n); err != nil {
		fmt.Println("attack3 linger:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func lingerAttack(sock string, n int) error {
	ln, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	syscall.SetsockoptInt(ln, syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024)
	if err := syscall.Bind(ln, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return err
	}
	if err := syscall.Listen(ln, 128); err != nil {
		return err
	}
	sa, _ := syscall.Getsockname(ln)
	addr := &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: sa.(*syscall.SockaddrInet4).Port}
	var peers []int // accepted, never read
	blocking := func() (int, error) {
		c, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
		if err != nil {
			return -1, err
		}
		syscall.SetsockoptInt(c, syscall.SOL_SOCKET, syscall.SO_SNDBUF, 1024)
		if err := syscall.Connect(c, addr); err != nil {
			return -1, err
		}
		p, _, err := syscall.Accept(ln)
		if err != nil {
			return -1, err
		}
		peers = append(peers, p)
		syscall.SetNonblock(c, true)
		buf := make([]byte, 64<<10)
		for {
			if _, err := syscall.Write(c, buf); err != nil {
				break // EAGAIN: the peer's window and our buffer are full
			}
		}
		syscall.SetNonblock(c, false)
		if err := syscall.SetsockoptLinger(c, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 3600}); err != nil {
			return -1, err
		}
		return c, nil
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return err
	}
	uc := conn.(*net.UnixConn)
	r := bufio.NewReader(uc)
	for i := 0; i < n; i++ {
		var fds []int
		for j := 0; j < 3; j++ {
			c, err := blocking()
			if err != nil {
				return err
			}
			fds = append(fds, c)
		}
		line := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"status","params":{}}`+"\n", i+1)
		if _, _, err := uc.WriteMsgUnix([]byte(line), syscall.UnixRights(fds...), nil); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		for _, c := range fds {
			syscall.Close(c) // the daemon's copy is the last
		}
		if _, err := r.ReadString('\n'); err != nil {
			return fmt.Errorf("answer %d: %w", i, err)
		}
	}
	fmt.Println("sent", n)
	bufio.NewReader(os.Stdin).ReadString('\n')
	return nil
}

// copySelf copies the test binary where uid 65534 can run it.
func copySelf(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "attack3")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestAttack3LingeringDescriptorsThreads: uid 65534 sends status requests
// with 3 descriptors each whose close blocks (TCP sockets with SO_LINGER,
// unsent data and a peer that never reads: no privilege, no FUSE needed).
// The socket closes every descriptor a request did not take on a goroutine
// of its own (closeAsync), and each such close holds an OS thread for the
// linger time: the daemon's threads grow by 3 per request without bound,
// up to the Go runtime's 10,000-thread limit (fatal) or the unit's tasks
// limit, and every session goes with the daemon.
func TestAttack3LingeringDescriptorsThreads(t *testing.T) {
	h := openHome(t, privateRule)
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.socket), 0o755)
	pid := d.cmd.Process.Pid
	before := threadsOf(pid)
	const requests = 100
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", copySelf(t))
	cmd.Env = append(os.Environ(), fmt.Sprintf("CONDFS_ATTACK3_LINGER=%s,%d", d.socket, requests))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
	// With the closes bounded per uid, the attacker's own connection waits
	// once its closers are stuck: it may never finish sending. Either way,
	// after a while the daemon's threads must not have grown, and others
	// are served.
	sent := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		sent <- line
	}()
	select {
	case line := <-sent:
		if !strings.HasPrefix(line, "sent") {
			t.Fatalf("the attacker failed: %q", line)
		}
		time.Sleep(time.Second)
	case <-time.After(15 * time.Second):
	}
	var st map[string]any
	d.call("status", map[string]any{}, &st)
	after := threadsOf(pid)
	// The same bound as the other thread tests take for a loaded daemon
	// is generous here: an idle daemon answering status needs none.
	if grown := after - before; grown > 50 {
		t.Fatalf("the daemon's threads grew from %d to %d after %d requests carrying %d descriptors whose close blocks: every descriptor a request does not take is closed on a goroutine of its own, holding an OS thread for as long as the close blocks (unbounded; the Go runtime dies at 10,000)", before, after, requests, 3*requests)
	}
}

// attack3Rules: runRules' binaries and python3 (as in sandbox.md's example).
const attack3Rules = privateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/ls", "/usr/bin/cat", "/usr/bin/sleep", "/usr/bin/id", "/usr/bin/tr", "/usr/bin/python3"]
pids = 64
`

// attack3Home is runHome with attack3Rules and a copy of /usr/bin/wc (not
// allowed) in the session's workspace, as an agent could write one.
func attack3Home(t *testing.T) *daemon {
	t.Helper()
	h := openHome(t, attack3Rules)
	h.t = t
	h.write("config/policy.yaml", runPolicy)
	h.write("memories/pub.md", "public\n")
	wc, err := os.ReadFile("/usr/bin/wc")
	if err != nil {
		t.Fatal(err)
	}
	h.write("workspace/wc.copy", string(wc))
	for _, p := range []string{"memories", "workspace", "workspace/wc.copy"} {
		os.Chmod(h.path(p), 0o777)
	}
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.socket), 0o755)
	d.openFor("s", nobody, dmCtx)
	return d
}

// TestAttack3MemfdExec: a program the run may execute (python3) copies a
// program it may not (wc, written into the workspace) into a memfd and
// executes it: execveat of the memfd, or the dynamic loader given
// /proc/self/fd/N. A memfd lives on the kernel's internal shmem mount,
// which is not noexec, and Landlock does not govern files of internal
// mounts, so neither /tmp's noexec nor the Landlock exec rules stop it.
// sandbox.md: every other program cannot be executed, however it is
// reached, "by a copy made inside the run" included.
func TestAttack3MemfdExec(t *testing.T) {
	d := attack3Home(t)
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
		out, code := condfsRun(t, d, "", "--", "python3", "-c", load, how)
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

// TestAttack3RunNotification: a run sent as a notification (no "id") is
// built and started, but the server drops a notification's result, so the
// run's Takeover never runs: nothing watches its connection (the command
// outlives its client), its --timeout is never armed, it is never audited,
// and it is never taken off its session's runs, so session.close (and the
// daemon's shutdown) waits for it forever, with the view still mounted.
func TestAttack3RunNotification(t *testing.T) {
	d := attack3Home(t)
	hung := false
	t.Cleanup(func() {
		if hung {
			// The daemon cannot close the session: kill it and detach
			// what it left mounted.
			d.cmd.Process.Kill()
			<-d.exited
			for _, m := range mountsUnder(d.home.root) {
				syscall.Unmount(m, syscall.MNT_DETACH)
			}
		}
	})
	before := sleeps600()
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", copySelf(t))
	cmd.Env = append(os.Environ(), "CONDFS_ATTACK3_NOTIFY="+d.socket)
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
		d.client.Call("session.close", map[string]any{"id": "s"}, nil)
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		hung = true
		t.Fatalf("session.close has not returned after 20 s: the run sent as a notification was never taken off the session's runs, and closing waits for it forever (the view stays mounted: %v)", mountsUnder(d.home.root))
	}
}
