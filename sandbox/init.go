package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// initChannelFd is the init's end of the socketpair (Start's ExtraFiles[0]).
const initChannelFd = 3

// exitInitFailed is the init's status when it fails before the command runs.
const exitInitFailed = 125

// stepError names the step of building the sandbox that failed.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func step(name string, err error) error {
	if err == nil {
		return nil
	}
	return &stepError{name, err}
}

// InitMain is the sandbox's init: cmd/condfsd calls it first thing when its
// first argument is "sandbox-init". It never returns.
func InitMain() {
	// Only Start's init is PID 1 of its own namespace: anything else (a
	// user typing "condfsd sandbox-init") must not remount the host's tree.
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "condfs sandbox-init: only the daemon starts a sandbox's init")
		os.Exit(exitInitFailed)
	}
	if len(os.Args) > 2 && os.Args[2] == "probe" {
		os.Exit(0) // Available: the namespaces could be made
	}
	os.Exit(initMain())
}

func initMain() int {
	// Signals that would end a Go program by default are taken and dropped:
	// the command may signal its init on the user-namespace path, and only
	// the daemon (by the channel, or SIGKILL) decides when the run ends.
	// Handled (not ignored) signals are reset for the command by execve.
	drop := make(chan os.Signal, 8)
	signal.Notify(drop, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGPIPE)
	go func() {
		for range drop {
		}
	}()

	unix.CloseOnExec(initChannelFd)
	conn := os.NewFile(initChannelFd, "sandbox-channel")
	if conn == nil {
		return exitInitFailed
	}
	ch := newChannel(conn)
	fail := func(err error) int { return initFailed(ch, err) }
	is, err := readSpec(ch)
	if err != nil {
		return fail(err)
	}
	al, err := buildRoot(is)
	if err != nil {
		return fail(err)
	}
	var link []int // the gateway's sockets, handed over with the first ready
	var fallback string
	if is.Spec.Network == "policy" {
		if link, fallback, err = netUp(is.Spec.Link); err != nil {
			return fail(step("egress link", err))
		}
	}
	if err := closeOnExecAll(); err != nil {
		return fail(step("descriptors", err))
	}
	d := &dispatcher{ch: ch, al: al, cmds: make(chan message, 1)}
	rules := al.execRules()
	for first := true; ; first = false {
		if !first {
			// Another command of the same sandbox: nothing of the last
			// one is left (its processes were reaped before its exit
			// was reported); its /tmp and /dev/shm go too.
			if err := newTmp(is.Spec.TmpSize); err != nil {
				return fail(step("/tmp", err))
			}
		}
		// The thread that will fork the command is confined now, while
		// the sandbox waits: a prepared run's command only has to be
		// forked. Its own IPC namespace, new for each command, keeps no
		// SysV object of the last one.
		fk, err := newForker(is.Spec, rules)
		if err != nil {
			return fail(err)
		}
		if err := sendReady(ch, &link, fallback); err != nil {
			return exitInitFailed // the daemon is gone: Pdeathsig ends us anyway
		}
		fallback = ""
		if first {
			go d.loop()
		}
		// Prepared: wait for the command.
		m, ok := <-d.cmds
		if !ok {
			return exitInitFailed // the daemon dropped the run before its command
		}
		code, sig, err := d.runCommand(fk, m, is)
		if err != nil {
			return fail(err)
		}
		if err := ch.send(message{Op: opExit, Code: code, Signal: sig}); err != nil {
			return code
		}
		// The daemon asks for another command (again) or ends the run.
		if m, ok = <-d.cmds; !ok || m.Op != opAgain {
			return code
		}
	}
}

// sendReady answers ready, handing over the egress link's sockets (and
// why the kernel capture was not built, when it was not) with the first
// one, and closing the init's copies: the command must never hold them.
func sendReady(ch *channel, link *[]int, fallback string) error {
	err := ch.sendFiles(message{Op: opReady, Err: fallback}, *link)
	for _, fd := range *link {
		unix.Close(fd)
	}
	*link = nil
	return err
}

// initFailed tells the daemon which step of the init failed, and how.
func initFailed(ch *channel, err error) int {
	m := message{Op: opError, Step: "init", Err: err.Error()}
	var se *stepError
	if errors.As(err, &se) {
		m.Step, m.Err = se.step, se.err.Error()
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		m.Errno = int(errno)
	}
	_ = ch.send(m)
	return exitInitFailed
}

// readSpec reads the sandbox's description, the daemon's first message.
func readSpec(ch *channel) (*initSpec, error) {
	m, err := ch.recv()
	if err != nil {
		return nil, step("read spec", err)
	}
	if m.Op != opSpec || m.Spec == nil {
		return nil, step("read spec", fmt.Errorf("unexpected %q", m.Op))
	}
	return m.Spec, nil
}

// dispatcher reads the daemon's messages once the sandbox is ready: it
// applies allow, signal and resize at once, and hands run and again to the
// init's main loop.
type dispatcher struct {
	ch   *channel
	al   *allowState
	cmds chan message // run (its descriptors in Fds) and again

	mu  sync.Mutex // guards the command's pid and terminal
	pid int        // 0 between commands
	pt  *pty
}

// runCommand starts m's command on fk and waits until it and every other
// process of the namespace are gone.
func (d *dispatcher) runCommand(fk *forker, m message, is *initSpec) (code, sig int, err error) {
	spec, c, err := takeCommand(m, is.Spec)
	if err != nil {
		return 0, 0, err
	}
	if err := d.al.set(spec.Allowed, false); err != nil {
		return 0, 0, step("binaries", err)
	}
	var pt *pty
	stdio := []uintptr{0, 1, 2}
	if c.TTY {
		if pt, err = openPTY(spec, c.Rows, c.Cols); err != nil {
			return 0, 0, step("tty", err)
		}
		stdio = []uintptr{uintptr(pt.slave), uintptr(pt.slave), uintptr(pt.slave)}
	}
	pid, err := startCommand(fk, spec, stdio)
	if err != nil {
		return 0, 0, err
	}
	if pt != nil {
		if err := pt.relay(); err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			return 0, 0, step("tty", err)
		}
	}
	if is.Rlimits {
		// RLIMIT_NPROC goes on the command only: set on the init, it
		// kept the init's Go runtime from making the threads it needs
		// once a fork bomb reached it, and the init died.
		if err := setNproc(pid, spec); err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			return 0, 0, step("rlimits", err)
		}
		if err := setAS(pid, spec); err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			return 0, 0, step("rlimits", err)
		}
	}
	d.mu.Lock()
	d.pid, d.pt = pid, pt
	d.mu.Unlock()
	if err := d.ch.send(message{Op: opStarted}); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		os.Exit(exitInitFailed)
	}
	code, sig = reap(pid)
	d.mu.Lock()
	d.pid, d.pt = 0, nil
	d.mu.Unlock()
	// Whatever the command left running dies now, and is reaped, before
	// the daemon hears of the exit: when condfs run returns, no process of
	// the run is left. (The kernel would kill them when the init exits,
	// but only after tearing down its namespaces, which takes longer.)
	reapAll()
	if pt != nil {
		pt.finish()
	}
	for i := 0; i < 3; i++ {
		// The caller's stdio is not kept for the next command.
		if null, err := unix.Open("/dev/null", unix.O_RDWR, 0); err == nil {
			_ = unix.Dup3(null, i, 0)
			unix.Close(null)
		}
	}
	return code, sig, nil
}

// reapAll kills every other process of the namespace and reaps them until
// none is left; the kill is repeated before each wait, so none that a
// dying process was forking at the time is missed.
func reapAll() {
	for {
		_ = unix.Kill(-1, unix.SIGKILL)
		var ws unix.WaitStatus
		_, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return // ECHILD: none left
		}
	}
}

// takeCommand reads the run message: the command, and the three
// descriptors it carried (m.fds), which become the init's (and so the
// command's) 0, 1 and 2.
func takeCommand(m message, spec Spec) (Spec, Command, error) {
	fds := m.fds
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if m.Op != opRun || m.Cmd == nil {
		return spec, Command{}, step("read command", fmt.Errorf("unexpected %q", m.Op))
	}
	if len(fds) != 3 {
		return spec, Command{}, step("read command", fmt.Errorf("%d descriptors passed, want stdin, stdout and stderr", len(fds)))
	}
	c := *m.Cmd
	if err := c.validate(spec.Binaries); err != nil {
		return spec, c, step("read command", err)
	}
	for i, fd := range fds {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return spec, c, step("stdio", err)
		}
	}
	spec.Argv, spec.Env, spec.Cwd, spec.Allowed = c.Argv, c.Env, c.Cwd, c.Allowed
	return spec, c, nil
}

// loop applies the daemon's requests until the channel closes. A daemon
// that is gone can no longer revoke binaries: the run ends.
func (d *dispatcher) loop() {
	for {
		m, err := d.ch.recv()
		m.fds = d.ch.takeFiles()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintf(os.Stderr, "condfs sandbox-init: channel: %v\n", err)
			}
			os.Exit(128 + int(unix.SIGKILL))
		}
		if m.Op != opRun {
			for _, fd := range m.fds {
				unix.Close(fd) // only a run carries descriptors
			}
			m.fds = nil
		}
		switch m.Op {
		case opRun, opAgain:
			select {
			case d.cmds <- m:
			default:
				// One at a time: the daemon sends the next only once
				// this one is answered.
				fmt.Fprintf(os.Stderr, "condfs sandbox-init: %s out of turn\n", m.Op)
				os.Exit(128 + int(unix.SIGKILL))
			}
		case opAllow:
			e := ""
			if err := d.al.set(m.Paths, true); err != nil {
				e = err.Error()
			}
			if err := d.ch.send(message{Op: opAck, ID: m.ID, Err: e}); err != nil || e != "" {
				// Either the daemon cannot learn of it or it will kill us:
				// end the run now rather than keep a stale binary.
				os.Exit(128 + int(unix.SIGKILL))
			}
		case opSignal:
			d.mu.Lock()
			if d.pid > 0 && m.Sig > 0 && m.Sig < 65 {
				_ = unix.Kill(d.pid, unix.Signal(m.Sig))
			}
			d.mu.Unlock()
		case opResize:
			d.mu.Lock()
			if d.pt != nil {
				_ = d.pt.resize(m.Rows, m.Cols)
			}
			d.mu.Unlock()
		}
	}
}

// reap is PID 1's loop: it reaps every process of the run until the command
// itself ends, and returns the command's status (128+N for signal N).
// Whatever the command left running dies with the init.
func reap(pid int) (code, sig int) {
	for {
		var ws unix.WaitStatus
		p, err := unix.Wait4(-1, &ws, 0, nil)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return exitInitFailed, 0
		}
		if p != pid {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus(), 0
		case ws.Signaled():
			return 128 + int(ws.Signal()), int(ws.Signal())
		}
	}
}

// forker is a locked thread that confineHook has confined, waiting to
// fork the command. The thread is never unlocked, so it dies with its
// goroutine and its confinement never serves other goroutines.
type forker struct {
	reqs chan forkReq
}

type forkReq struct {
	path string
	argv []string
	attr *syscall.ProcAttr
	res  chan forkRes
}

type forkRes struct {
	pid int
	err error
}

func newForker(spec Spec, rules []string) (*forker, error) {
	fk := &forker{reqs: make(chan forkReq)}
	confined := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWIPC); err != nil {
			confined <- step("ipc namespace", err)
			return
		}
		if err := confineHook(spec, rules); err != nil {
			confined <- step("confine", err)
			return
		}
		confined <- nil
		r := <-fk.reqs
		pid, err := syscall.ForkExec(r.path, r.argv, r.attr)
		r.res <- forkRes{pid, err}
	}()
	if err := <-confined; err != nil {
		return nil, err
	}
	return fk, nil
}

// startCommand looks the command up as its owner and forks it on fk,
// with stdio as its 0, 1 and 2 (with a terminal, its controlling one).
func startCommand(fk *forker, spec Spec, stdio []uintptr) (int, error) {
	// A name is looked up as the owner (PATH may name the view, which
	// admits its owner, not root). The cwd is checked by the child's
	// chdir, made as the owner too; only a failure asks which it was.
	path := spec.Argv[0]
	if !strings.Contains(path, "/") {
		if err := asOwner(spec, func() error {
			var err error
			path, err = lookPath(spec.Argv[0], spec.Env)
			return err
		}); err != nil {
			return 0, step("exec", err)
		}
	}
	attr := &syscall.ProcAttr{
		Dir:   spec.Cwd,
		Env:   spec.Env,
		Files: stdio,
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	if stdio[0] != 0 {
		attr.Sys.Setctty, attr.Sys.Ctty = true, 0 // Ctty is the child's fd
	}
	if !spec.UserNS {
		attr.Sys.Credential = &syscall.Credential{Uid: spec.UID, Gid: spec.GID, Groups: spec.Groups}
	}
	res := make(chan forkRes, 1)
	fk.reqs <- forkReq{path, spec.Argv, attr, res}
	r := <-res
	if r.err != nil {
		if err := asOwner(spec, func() error {
			if fi, err := os.Stat(spec.Cwd); err != nil || !fi.IsDir() {
				return fmt.Errorf("%s is not a directory of the run", spec.Cwd)
			}
			return nil
		}); err != nil {
			return 0, step("cwd", err)
		}
		return 0, step("exec", fmt.Errorf("%s: %w", path, r.err))
	}
	return r.pid, nil
}

// lookPath finds name as the command's PATH would.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, os.ErrNotExist)
}

// closeOnExecAll marks every descriptor but 0, 1 and 2 close-on-exec, so
// nothing the init inherited by mistake reaches the command.
func closeOnExecAll() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		var fd int
		if _, err := fmt.Sscanf(e.Name(), "%d", &fd); err != nil || fd <= 2 {
			continue
		}
		unix.CloseOnExec(fd)
	}
	return nil
}

// setNproc bounds the command's processes where no cgroup holds the run,
// once it is forked (its first instants are not bounded, as for setAS).
// RLIMIT_NPROC counts every process of the uid (in the run's user
// namespace on that path, the init's threads included).
func setNproc(pid int, spec Spec) error {
	if spec.Pids == 0 {
		return nil
	}
	l := &unix.Rlimit{Cur: uint64(spec.Pids), Max: uint64(spec.Pids)}
	if err := unix.Prlimit(pid, unix.RLIMIT_NPROC, l, nil); err != nil {
		return fmt.Errorf("RLIMIT_NPROC: %w", err)
	}
	return nil
}

// setAS bounds the command's address space where no cgroup holds the run.
// It is set on the command once it runs (the init's own Go runtime could not
// live under it), so the command's first instants are not bounded.
func setAS(pid int, spec Spec) error {
	if spec.Memory == 0 {
		return nil
	}
	l := &unix.Rlimit{Cur: uint64(spec.Memory), Max: uint64(spec.Memory)}
	if err := unix.Prlimit(pid, unix.RLIMIT_AS, l, nil); err != nil {
		return fmt.Errorf("RLIMIT_AS: %w", err)
	}
	return nil
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 1<<20))
}
