package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/cli"
	"github.com/condfs/condfs/mcpproxy"
)

// runMCP is `condfs mcp proxy`: an MCP stdio gateway that decides every
// tools/call through the daemon (package mcpproxy).
func runMCP(args []string, stdout, stderr io.Writer) error {
	if len(args) == 1 && args[0] == reapCommand {
		return runReaper(os.Stdin)
	}
	if len(args) == 0 || args[0] != "proxy" {
		fmt.Fprintln(stderr, "condfs mcp: usage: condfs mcp proxy [--socket S] (--session ID | --context ATOM...) [--role R]... -- SERVER_COMMAND [ARGS...]")
		return cli.Exit(cli.ExitUsage)
	}
	fs := cli.NewFlags("mcp proxy",
		"condfs mcp proxy [--socket S] (--session ID | --context ATOM...) [--role R]... -- SERVER_COMMAND [ARGS...]",
		`Sit between an MCP client (on stdin/stdout) and a stdio MCP server (started with
SERVER_COMMAND), relaying every message, and decide each tools/call through the
daemon: allowed calls go on, denied ones are answered with a tool error and never
reach the server, calls that need approval are put to the user (elicitation) when
the client can ask. tools/list leaves out the tools the roles can never call.`, stderr)
	socket := fs.String("socket", cli.EnvOr("CONDFS_SOCKET", cli.DefaultSocket()), "control socket path (env CONDFS_SOCKET)")
	session := fs.String("session", "", "the condfs session whose context when() tests")
	atoms := fs.StringArray("context", nil, "the context, when there is no session: an atom (repeat) or a JSON description")
	roles := fs.StringArray("role", nil, "a caller role; repeat")
	grace := fs.Duration("grace", 5*time.Second, "how long the server may take to exit after the client closes")
	checkpoint := fs.Bool("checkpoint", false, "make a checkpoint of --session before each allowed tools/call (docs/changes.md)")
	if err := cli.ParseFlags(fs, args[1:]); err != nil {
		return err
	}
	cmdArgs := fs.Args()
	if len(cmdArgs) == 0 {
		return cli.UsageErr(stderr, fs, "give the server command after --")
	}
	if (*session == "") == (len(*atoms) == 0) {
		return cli.UsageErr(stderr, fs, "give --session or --context (one of them)")
	}
	if *checkpoint && *session == "" {
		return cli.UsageErr(stderr, fs, "--checkpoint needs --session: checkpoints are a session's")
	}
	var ctxAtoms []string
	if len(*atoms) > 0 {
		set, err := cli.ParseContext(*atoms)
		if err != nil {
			return cli.UsageErr(stderr, fs, "--context: %v", err)
		}
		ctxAtoms = set.Atoms()
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	server := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	server.Stderr = stderr
	// The server dies with the gateway, however the gateway ends (SIGKILL
	// included): a parent-death signal, which startServer keeps tied to
	// the gateway's life. It leads a process group of its own, and what
	// it starts (npx, uvx and shell wrappers start the real server as
	// their child) is signalled with it, and killed when the gateway ends
	// (by the reaper, when the gateway is killed).
	server.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	reaper, err := startReaper()
	if err != nil {
		fmt.Fprintf(stderr, "condfs mcp proxy: %v\n", err)
		return cli.Exit(cli.ExitFail)
	}
	defer reaper.Close()
	sin, err := server.StdinPipe()
	if err != nil {
		return fmt.Errorf("the server's input: %w", err)
	}
	// The server's output is a pipe of ours, not StdoutPipe's: Wait must
	// not close it while what the server wrote before it exited is still
	// being relayed.
	sout, soutW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("the server's output: %w", err)
	}
	defer sout.Close()
	server.Stdout = soutW
	exited, err := startServer(server)
	soutW.Close()
	if err != nil {
		fmt.Fprintf(stderr, "condfs mcp proxy: start %s: %v\n", cmdArgs[0], err)
		return cli.Exit(cli.ExitFail)
	}
	if _, err := fmt.Fprintf(reaper, "%d\n", server.Process.Pid); err != nil {
		exited.reap(server)
		fmt.Fprintf(stderr, "condfs mcp proxy: the reaper: %v\n", err)
		return cli.Exit(cli.ExitFail)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	var stopping sync.Once
	stopIt := func() { stopping.Do(func() { go stopServer(server, exited.done, *grace) }) }
	go func() {
		// Once the server has exited, what it wrote is relayed for at most
		// grace more (a process it left behind may hold its output open).
		<-exited.done
		select {
		case <-time.After(*grace):
			cancelRun()
		case <-runCtx.Done():
		}
	}()
	d := &socketDecider{socket: *socket, session: *session, atoms: ctxAtoms, roles: *roles}
	defer d.close()
	// When the client is gone, the server's input is closed and the grace
	// steps start: nothing waits for a server that ignores the end of its
	// input.
	opts := mcpproxy.Options{Decider: d, Logger: logger, ClientGone: stopIt, DecideTimeout: decideTimeout}
	if *checkpoint {
		opts.Checkpoint = d.Checkpoint
	}
	// A server that reads nothing more holds the relay in a write to it,
	// and the relay never reads the end of the client's input: the hang-up
	// itself starts the grace steps, once Run would have (a client that
	// closed while the relay was well has had ClientGone called by then).
	go onHangup(0, func() { time.AfterFunc(decideTimeout+2*time.Second, stopIt) })
	runErr := mcpproxy.Run(runCtx, opts, os.Stdin, stdout, sin, sout)
	sin.Close() // a signal ended the relay: the server's input ends too
	stopIt()
	<-exited.done
	waitErr := exited.reap(server)
	// The group is gone: the reaper has nothing to kill.
	io.WriteString(reaper, reapDone+"\n")
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		logger.Warn("relay ended", "err", runErr)
	}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		if code := ee.ExitCode(); code > 0 {
			return cli.Exit(code)
		}
		return cli.Exit(cli.ExitFail)
	}
	return nil
}

// decideTimeout bounds one decision by the daemon.
const decideTimeout = 5 * time.Second

// onHangup calls then once the writer of fd has closed its end (a pipe's
// POLLHUP, a socket's POLLRDHUP), whether or not what it wrote has been
// read. It returns if fd cannot be polled.
func onHangup(fd int, then func()) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(fds, -1)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil || fds[0].Revents&unix.POLLNVAL != 0:
			return
		case n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0:
			then()
			return
		}
	}
}

// serverExit is closed (done) once the server has exited; it is reaped
// (reap) only once its process group has been killed: until then the
// server is a zombie, and its pid, which names the group, cannot be
// another process's.
type serverExit struct {
	done chan struct{}
}

// reap kills what is left of the server's process group and reaps the
// server, returning Wait's error.
func (e *serverExit) reap(server *exec.Cmd) error {
	syscall.Kill(-server.Process.Pid, syscall.SIGKILL)
	return server.Wait()
}

// startServer starts the server from a goroutine locked to its OS thread
// until the server has exited. A parent-death signal fires when the
// thread that forked the child exits, not the process: the Go runtime
// ends a thread whose goroutine exits locked (as acting as another user
// does elsewhere), and would kill the server at random; this thread lives
// while the server does, then is unlocked and kept.
func startServer(server *exec.Cmd) (*serverExit, error) {
	exited := &serverExit{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := server.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		var info unix.Siginfo
		for {
			// Exited, not reaped (WNOWAIT).
			err := unix.Waitid(unix.P_PID, server.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if err != unix.EINTR {
				break
			}
		}
		close(exited.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// stopServer ends the server once the relay has: its output has ended, or
// the client went away (its input is closed now). It gets grace to exit,
// then SIGTERM and grace again, then SIGKILL.
func stopServer(server *exec.Cmd, exited <-chan struct{}, grace time.Duration) {
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t := time.NewTimer(grace)
		select {
		case <-exited:
			t.Stop()
			return
		case <-t.C:
		}
		// The whole group: the leader is alive, or a zombie not reaped.
		syscall.Kill(-server.Process.Pid, sig.(syscall.Signal))
	}
}

// The reaper (condfsd mcp reap, internal) kills the server's process
// group when the gateway dies without doing it: it reads the group's id
// on its input, then waits for the input to end; a gateway that ends as
// it should writes reapDone first, having killed the group itself.
const (
	reapCommand = "reap"
	reapDone    = "done"
)

// startReaper starts the reaper; the gateway holds the only writer of its
// input (close-on-exec: the server never has it).
func startReaper() (*os.File, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot name condfsd for the reaper: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("the reaper's input: %w", err)
	}
	defer r.Close()
	reaper := exec.Command(self, "mcp", reapCommand)
	reaper.Stdin = r
	// Its own group: neither a signal to the gateway's (a terminal's ^C)
	// nor one to the server's reaches it.
	reaper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := reaper.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start the reaper: %w", err)
	}
	go reaper.Wait()
	return w, nil
}

// runReaper is the reaper: once its input ends, it kills the process
// group named on it, unless reapDone followed.
func runReaper(in io.Reader) error {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	data, _ := io.ReadAll(io.LimitReader(in, 64))
	f := strings.Fields(string(data))
	if len(f) != 1 {
		return nil // nothing started, or reapDone
	}
	if pgid, err := strconv.Atoi(f[0]); err == nil && pgid > 1 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return nil
}

// socketDecider decides through the daemon, over one connection (made
// again if it breaks).
type socketDecider struct {
	socket, session string
	atoms, roles    []string

	mu sync.Mutex
	c  *control.Client
}

func (d *socketDecider) call(ctx context.Context, method string, params, out any) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for attempt := 0; ; attempt++ {
		if d.c == nil {
			c, err := control.DialTimeout(d.socket, 2*time.Second)
			if err != nil {
				return fmt.Errorf("the daemon at %s is unreachable: %w", d.socket, err)
			}
			d.c = c
		}
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(5 * time.Second)
		}
		d.c.SetDeadline(deadline)
		err := d.c.Call(method, params, out)
		var ce *control.Error
		if err == nil || (errors.As(err, &ce) && !d.c.Broken()) {
			return err
		}
		// A broken connection (or one whose answer is late: it must never
		// be read as another call's) is dropped; one more try on a new one.
		d.c.Close()
		d.c = nil
		if attempt > 0 {
			return err
		}
	}
}

func (d *socketDecider) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c != nil {
		d.c.Close()
	}
}

func (d *socketDecider) Decide(ctx context.Context, tool string, args json.RawMessage) (string, []string, error) {
	p := map[string]any{"tool": tool, "args": args}
	if d.session != "" {
		p["session"] = d.session
	} else {
		p["context"] = d.atoms
	}
	if len(d.roles) > 0 {
		p["roles"] = d.roles
	}
	var res struct {
		Decision string   `json:"decision"`
		Reasons  []string `json:"reasons"`
	}
	if err := d.call(ctx, "tool.decide", p, &res); err != nil {
		return "", nil, err
	}
	return res.Decision, res.Reasons, nil
}

// Checkpoint makes a checkpoint of the session before a call to tool,
// named mcp-TOOL-RANDOM (the tool's name cut to what a name may hold).
func (d *socketDecider) Checkpoint(ctx context.Context, tool string) error {
	return d.call(ctx, "checkpoint.create", map[string]any{"session": d.session, "name": checkpointName(tool)}, nil)
}

func checkpointName(tool string) string {
	var b strings.Builder
	b.WriteString("mcp-")
	for _, c := range []byte(tool) {
		if b.Len() >= 4+40 {
			break
		}
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	var r [4]byte
	rand.Read(r[:])
	b.WriteString("-" + hex.EncodeToString(r[:]))
	return b.String()
}

func (d *socketDecider) Callable(ctx context.Context, tools []string) ([]string, error) {
	var res struct {
		Callable []string `json:"callable"`
	}
	if err := d.call(ctx, "tools.callable", map[string]any{"roles": d.roles, "tools": tools}, &res); err != nil {
		return nil, err
	}
	return res.Callable, nil
}
