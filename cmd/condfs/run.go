package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/cli"
	"github.com/condfs/condfs/internal/stdiofd"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// rawTerminal puts our terminal, when stdin is one, in raw mode: every key
// goes on (the command's terminal does the line editing and makes the
// signals). It notes the terminal's size in params, and returns what
// gives the terminal back as it was (idempotent).
func rawTerminal(params map[string]any) (restore func(), err error) {
	t, err := unix.IoctlGetTermios(0, unix.TCGETS)
	if err != nil {
		return func() {}, nil // not a terminal: nothing to set
	}
	if ws, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ); err == nil {
		params["rows"], params["cols"] = ws.Row, ws.Col
	}
	raw := *t
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(0, unix.TCSETS, &raw); err != nil {
		return func() {}, err
	}
	var once sync.Once
	return func() { once.Do(func() { unix.IoctlSetTermios(0, unix.TCSETS, t) }) }, nil
}

// forwardSignals passes SIGINT, SIGTERM, SIGHUP and SIGQUIT (and, with a
// sized terminal, its size on SIGWINCH) to the run on c until stop.
func forwardSignals(c *net.UnixConn, sized bool) (stop func()) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if sized {
		signal.Notify(sigs, syscall.SIGWINCH)
	}
	go func() {
		for s := range sigs {
			var m map[string]any
			if s == syscall.SIGWINCH {
				ws, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ)
				if err != nil {
					continue
				}
				m = map[string]any{"jsonrpc": "2.0", "method": "run.resize", "params": map[string]any{"rows": ws.Row, "cols": ws.Col}}
			} else {
				m = map[string]any{"jsonrpc": "2.0", "method": "run.signal", "params": map[string]any{"signal": int(s.(syscall.Signal))}}
			}
			line, _ := json.Marshal(m)
			c.Write(append(line, '\n'))
		}
	}()
	return func() { signal.Stop(sigs) }
}

// Exit statuses of condfs run besides the command's own (sandbox.md).
const (
	exitRunTimeout  = 124
	exitRunFailed   = 125
	exitRunDenied   = 126
	exitRunNotFound = 127
)

const runUsage = `Usage: condfs run [--socket PATH] --session ID [--role R]... [--cwd DIR] [--env NAME=VALUE]... [--timeout DURATION] [--tty] -- COMMAND [ARG]...

Runs COMMAND in a sandbox whose only memories/ and workspace/ are the session's
live view, which may execute only the binaries the session's context allows
([sandbox] and [exec."..."] in conditions.toml). Stdio is passed through and
SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on; nothing outlives the run.
With --tty the command gets a terminal of its own, relayed to and from this
one (put in raw mode while it runs, its size followed).
Exit status: the command's (128+N for signal N), 124 timeout, 125 condfs could
not run it, 126 denied or not executable, 127 not found.

Flags:
`

func runRun(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, runUsage); fs.PrintDefaults() }
	socket := fs.String("socket", cli.EnvOr("CONDFS_SOCKET", cli.DefaultSocket()), "control socket path (env CONDFS_SOCKET)")
	session := fs.String("session", "", "the session whose authority the command runs under (required)")
	roles := fs.StringArray("role", nil, "the caller's role for the policy's exec decision (repeatable)")
	cwd := fs.String("cwd", "/workspace", "working directory inside the sandbox, under /workspace or /memories")
	env := fs.StringArray("env", nil, "NAME=VALUE added to the command's environment (repeatable)")
	timeout := fs.Duration("timeout", 0, "kill every process of the run after this long (exit 124); 0: none")
	tty := fs.Bool("tty", false, "give the command a terminal of its own, relayed to and from stdin and stdout")
	fail := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "condfs run: "+format+"\n", a...)
		return cli.Exit(exitRunFailed)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return cli.Exit(exitRunFailed)
	}
	argv := fs.Args()
	switch {
	case *session == "":
		return fail("--session is required")
	case len(argv) == 0:
		return fail("no command: condfs run --session ID -- COMMAND [ARG]...")
	case *timeout < 0:
		return fail("--timeout must not be negative")
	}
	for _, e := range *env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fail("--env %q: want NAME=VALUE", e)
		}
	}
	conn, err := net.DialTimeout("unix", *socket, 5*time.Second)
	if err != nil {
		return fail("the daemon at %s is unreachable: %v", *socket, err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	params := map[string]any{
		"session": *session, "roles": *roles, "argv": argv, "cwd": *cwd, "env": *env,
		"timeout_ms": timeout.Milliseconds(), "lang": os.Getenv("LANG"), "term": os.Getenv("TERM"),
	}
	restore := func() {}
	if *tty {
		params["tty"] = true
		var err error
		if restore, err = rawTerminal(params); err != nil {
			return fail("put the terminal in raw mode: %v", err)
		}
		defer restore()
	}
	req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "run", "params": params})
	// Our stdio goes with the request: the command reads and writes it
	// directly, except what the daemon refuses (a regular file or device
	// it could map executable, a socket): a pipe goes in its place, copied
	// here; never a connection to the daemon itself.
	relay, err := relayStdio(c)
	if err != nil {
		return fail("the command's stdio: %v", err)
	}
	_, _, err = c.WriteMsgUnix(append(req, '\n'), unix.UnixRights(relay.fds[:]...), nil)
	relay.sent()
	if err != nil {
		return fail("send the request: %v", err)
	}
	_, sized := params["rows"]
	defer forwardSignals(c, sized)()
	line, err := bufio.NewReader(c).ReadBytes('\n')
	restore()
	if err != nil {
		return fail("the daemon closed the connection before the command ended: %v", err)
	}
	// Every process of the run is gone: the output copies end once they
	// have written what it wrote.
	relay.out.Wait()
	return runAnswer(line, stderr)
}

// stdioRelay is the stdio sent with a run: ours, or in place of each of
// ours that internal/stdiofd says is relayed, a pipe's end, the other end
// copied to or from ours by a goroutine.
type stdioRelay struct {
	fds   [3]int
	pipes []int // the ends sent, closed once sent
	out   sync.WaitGroup
}

func relayStdio(c *net.UnixConn) (*stdioRelay, error) {
	r := &stdioRelay{fds: [3]int{0, 1, 2}}
	daemon := peerPID(c)
	for i, ours := range []*os.File{os.Stdin, os.Stdout, os.Stderr} {
		if m, err := stdiofd.Relayed(i); err != nil || !m {
			continue // the daemon says what is wrong with it
		}
		if toDaemon(i, daemon) {
			// Relayed, the command's writes would be requests on the
			// caller's own connection: context.set from inside the run
			// (TestRelayedControlConnectionRefusedAsStdio).
			r.sent()
			return nil, fmt.Errorf("descriptor %d is a connection to condfs itself, which cannot be stdio", i)
		}
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			r.sent()
			return nil, err
		}
		// The command's end stays blocking; ours is polled (the two ends
		// are two open files, each with its own flags).
		mine, theirs := p[1], p[0]
		if i > 0 {
			mine, theirs = p[0], p[1]
		}
		_ = unix.SetNonblock(mine, true)
		pipe := os.NewFile(uintptr(mine), "stdio pipe")
		r.fds[i] = theirs
		r.pipes = append(r.pipes, theirs)
		if i == 0 {
			// Ends with our stdin, or when the run's last reader goes
			// (EPIPE).
			go func() { _, _ = io.Copy(pipe, ours); pipe.Close() }()
			continue
		}
		r.out.Add(1)
		go func() {
			defer r.out.Done()
			_, _ = io.Copy(ours, pipe)
			pipe.Close()
		}()
	}
	return r, nil
}

// peerPID is the pid of c's peer, the daemon (0: not known, or not in our
// PID namespace).
func peerPID(c *net.UnixConn) int {
	pid := 0
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid = int(cred.Pid)
			}
		})
	}
	return pid
}

// toDaemon reports whether fd is a Unix socket whose peer is process pid.
func toDaemon(fd, pid int) bool {
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	return pid > 0 && err == nil && int(cred.Pid) == pid
}

// sent closes our copies of the pipe ends the daemon now holds.
func (r *stdioRelay) sent() {
	for _, fd := range r.pipes {
		unix.Close(fd)
	}
	r.pipes = nil
}

// runAnswer turns the daemon's answer into condfs run's exit status.
func runAnswer(line []byte, stderr io.Writer) error {
	fail := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "condfs run: "+format+"\n", a...)
		return cli.Exit(exitRunFailed)
	}
	var resp struct {
		Result *struct {
			Exit    int    `json:"exit"`
			Message string `json:"message"`
		} `json:"result"`
		Error *control.Error `json:"error"`
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return fail("an answer it cannot read: %v", err)
	}
	if resp.Error != nil {
		code := exitRunFailed
		switch resp.Error.Code {
		case control.CodeRunDenied:
			code = exitRunDenied
		case control.CodeRunNotFound:
			code = exitRunNotFound
		}
		fmt.Fprintf(stderr, "condfs run: %s\n", resp.Error.Message)
		return cli.Exit(code)
	}
	if resp.Result == nil {
		return fail("an answer with neither a result nor an error")
	}
	if resp.Result.Message != "" {
		fmt.Fprintf(stderr, "condfs run: %s\n", resp.Result.Message)
	}
	if resp.Result.Exit == 0 {
		return nil
	}
	return cli.Exit(resp.Result.Exit)
}
