package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// initPath is the binary re-executed as the sandbox's init: the daemon's own.
var initPath = "/proc/self/exe"

// initArg is the hidden subcommand that makes a condfs binary the init.
const initArg = "sandbox-init"

// startTimeout bounds how long the init may take to build the root and
// start the command.
const startTimeout = 30 * time.Second

// allowTimeout bounds an Allow; an init that does not answer in time is
// killed, since its run may hold a binary it should no longer have.
const allowTimeout = 10 * time.Second

// Run is one sandbox: built by Prepare, its command started by Begin.
type Run struct {
	cmd  *exec.Cmd
	ch   *channel
	conn *os.File
	cg   *cgroups
	spec Spec
	// indexed is when the index of the host's programs it covers was
	// taken (programs.go).
	indexed time.Time
	link    *Ends     // Network "policy": the gateway's sockets, until taken
	net     io.Closer // what serves it (SetNet): closed with the run
	netGone bool      // the run has ended: SetNet closes at once

	mu      sync.Mutex // guards the fields below
	nextID  uint64
	pending map[uint64]chan string
	begun   bool
	exit    *Exit // from the init's exit message
	killed  bool
	closed  bool // the channel is gone: no ack will come

	started  chan message  // the init's answer to run: started or error
	exited   chan struct{} // closed when the init reports the command's exit
	readDone chan struct{} // closed when readLoop has read the channel to its end
	done     chan struct{} // closed when the init is reaped and the run cleaned up
	result   Exit
}

// Start builds the sandbox and starts spec's command in it, with stdin,
// stdout and stderr as its descriptors 0, 1 and 2 (nil: /dev/null). It
// returns once the command has started, or the step that failed.
func Start(spec Spec, stdin, stdout, stderr *os.File) (*Run, error) {
	c := spec.command()
	if err := c.validate(spec.Binaries); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	r, err := Prepare(spec)
	if err != nil {
		return nil, err
	}
	if err := r.Begin(c, stdin, stdout, stderr); err != nil {
		return nil, err
	}
	return r, nil
}

// Indexed is when the index of the host's programs this run's sandbox
// covers was taken, as status shows it (ProgramsIndex.Indexed).
func (r *Run) Indexed() string { return indexedString(r.indexed) }

// resolveHost is what the daemon learns of the host for a run: its
// binaries' entries and the programs to cover.
func resolveHost(binaries []string) ([]binEntry, []string, time.Time, error) {
	entries, err := resolveBinaries(binaries)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	noexec, at, err := hostPrograms.get()
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	return entries, noexec, at, nil
}

// Prepare builds the sandbox of spec (its Command fields are not used) and
// returns it waiting for its command: the root built, the init in its
// cgroups and confined as the command will be, spec.Allowed attached (Begin
// sets the command's own), nothing of the command running. A prepared run
// serves one command at a time: Begin it, Wait for it, then Again for
// another command, or Kill it.
func Prepare(spec Spec) (*Run, error) {
	spec.Argv, spec.Env, spec.Cwd = nil, nil, ""
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := (&Command{Argv: []string{"-"}, Allowed: spec.Allowed}).validate(spec.Binaries); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	entries, noexec, indexed, err := resolveHost(spec.Binaries)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: socketpair: %w", err)
	}
	conn := os.NewFile(uintptr(fds[0]), "sandbox-channel")
	initEnd := os.NewFile(uintptr(fds[1]), "sandbox-channel-init")

	// The init's own stdio is /dev/null until Begin hands it the command's.
	cmd := exec.Command(initPath, initArg)
	cmd.Args[0] = "condfs"
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{initEnd}
	cmd.SysProcAttr = sysProcAttr(&spec)
	if err := startOnSpawner(cmd); err != nil {
		conn.Close()
		initEnd.Close()
		return nil, fmt.Errorf("sandbox: start init: %w", err)
	}
	initEnd.Close()

	r := &Run{cmd: cmd, ch: newChannel(conn), conn: conn, spec: spec, indexed: indexed, pending: map[uint64]chan string{},
		started: make(chan message, 1), exited: make(chan struct{}), readDone: make(chan struct{}), done: make(chan struct{})}
	fail := func(err error) (*Run, error) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		conn.Close()
		r.cg.remove()
		return nil, fmt.Errorf("sandbox: %w", err)
	}

	// The init joins its cgroups before it learns what to build, so
	// nothing of the run ever runs outside them.
	rlimits := false
	r.cg, err = newCgroups(cmd.Process.Pid, spec.Pids, spec.Memory)
	if err != nil {
		if spec.Pids > 0 && spec.UID == 0 {
			return fail(fmt.Errorf("pids limit for a run as uid 0 needs a cgroup: %w", err))
		}
		rlimits = true
	}
	is := &initSpec{Spec: spec, Entries: entries, NoExec: noexec, Rlimits: rlimits, Hostname: "condfs"}
	if err := r.ch.send(message{Op: opSpec, Spec: is}); err != nil {
		return fail(err)
	}
	if err := r.awaitReady(); err != nil {
		return fail(err)
	}
	go r.readLoop()
	go r.waitLoop()
	return r, nil
}

// awaitReady waits for the init's first answer: ready (with the egress
// link's socket when the network is "policy"), or the step that failed.
func (r *Run) awaitReady() error {
	got := make(chan reply, 1)
	go func() {
		m, err := r.ch.recv()
		got <- reply{m, err}
	}()
	select {
	case rp := <-got:
		switch {
		case rp.err != nil:
			return fmt.Errorf("init: %w", initGone(rp.err))
		case rp.m.Op == opError:
			return fmt.Errorf("%s: %s", rp.m.Step, rp.m.Err)
		case rp.m.Op != opReady:
			return fmt.Errorf("init: unexpected %q", rp.m.Op)
		}
		fds := r.ch.takeFiles()
		if r.spec.Network != "policy" {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return nil
		}
		ends, err := newEnds(fds, rp.m.Err)
		if err != nil {
			return fmt.Errorf("init: %w", err)
		}
		r.link = ends
	case <-time.After(startTimeout):
		return errors.New("init: no answer")
	}
	return nil
}

type reply struct {
	m   message
	err error
}

// Begin starts c in the prepared run r, with stdin, stdout and stderr as
// its descriptors 0, 1 and 2 (nil: /dev/null), and with exactly c.Allowed
// attached before it starts. It returns once the command has started, or
// the step that failed; then the run is ended.
func (r *Run) Begin(c Command, stdin, stdout, stderr *os.File) error {
	if err := c.validate(r.spec.Binaries); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	r.mu.Lock()
	again := r.begun
	r.begun = true
	started := r.started
	r.mu.Unlock()
	if again {
		return errors.New("sandbox: this run has begun already")
	}
	fail := func(err error) error {
		r.Kill()
		r.Gone()
		return fmt.Errorf("sandbox: %w", err)
	}
	var fds []int
	for _, f := range []*os.File{stdin, stdout, stderr} {
		if f == nil {
			null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return fail(err)
			}
			defer null.Close()
			f = null
		}
		fds = append(fds, int(f.Fd()))
	}
	err := r.ch.sendFiles(message{Op: opRun, Cmd: &c}, fds)
	for _, f := range []*os.File{stdin, stdout, stderr} {
		runtime.KeepAlive(f)
	}
	if err != nil {
		return fail(err)
	}
	if err := r.await(started, opStarted); err != nil {
		return fail(err)
	}
	return nil
}

// await waits for the init's answer on started: want, or the step that
// failed, or the init's end, or startTimeout.
func (r *Run) await(started chan message, want string) error {
	select {
	case m := <-started:
		switch m.Op {
		case want:
			return nil
		case opError:
			if m.Step == "exec" && m.Errno != 0 {
				return &ExecError{Msg: m.Err, Errno: syscall.Errno(m.Errno)}
			}
			return fmt.Errorf("%s: %s", m.Step, m.Err)
		}
		return fmt.Errorf("init: unexpected %q", m.Op)
	case <-r.readDone:
		return fmt.Errorf("init: exited before it answered %s", want)
	case <-time.After(startTimeout):
		return errors.New("init: no answer")
	}
}

// ExecError is a command the run could not execute: absent there
// (ENOENT), or there and not executable (EACCES, ENOEXEC, ...). The run
// built, and ended without a command.
type ExecError struct {
	Msg   string
	Errno syscall.Errno
}

func (e *ExecError) Error() string { return "exec: " + e.Msg }

func (e *ExecError) Unwrap() error { return e.Errno }

func initGone(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("exited before it was ready")
	}
	return err
}

// sysProcAttr makes the init's namespaces. On the user-namespace path the
// daemon's uid and gid map to themselves, and the init keeps in the new
// namespace only the capabilities it needs to build the root.
func sysProcAttr(spec *Spec) *syscall.SysProcAttr {
	flags := uintptr(unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP)
	if spec.Network != "host" {
		flags |= unix.CLONE_NEWNET
	}
	a := &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	if spec.UserNS {
		a.Cloneflags |= unix.CLONE_NEWUSER
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: int(spec.UID), HostID: os.Geteuid(), Size: 1}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: int(spec.GID), HostID: os.Getegid(), Size: 1}}
		a.GidMappingsEnableSetgroups = false
		a.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_SETPCAP}
		if spec.Network == "policy" {
			// The netstack capture's packet socket; the kernel capture's
			// sockets at port 1, which no program of the run's takes.
			a.AmbientCaps = append(a.AmbientCaps, unix.CAP_NET_RAW, unix.CAP_NET_BIND_SERVICE)
		}
	}
	return a
}

// readLoop takes the init's messages after ready: acks and the exit status.
func (r *Run) readLoop() {
	defer close(r.readDone)
	for {
		m, err := r.ch.recv()
		for _, fd := range r.ch.takeFiles() {
			unix.Close(fd) // the init sends none
		}
		if err != nil {
			r.mu.Lock()
			r.closed = true
			for id, c := range r.pending {
				c <- "sandbox init is gone"
				delete(r.pending, id)
			}
			r.mu.Unlock()
			return
		}
		r.mu.Lock()
		switch m.Op {
		case opStarted, opError, opReady:
			select {
			case r.started <- m:
			default:
			}
		case opAck:
			if c, ok := r.pending[m.ID]; ok {
				c <- m.Err
				delete(r.pending, m.ID)
			}
		case opExit:
			if r.exit == nil {
				r.exit = &Exit{Code: m.Code, Signal: m.Signal}
				close(r.exited)
			}
		}
		r.mu.Unlock()
	}
}

// waitLoop reaps the init and removes the run's cgroups.
func (r *Run) waitLoop() {
	err := r.cmd.Wait()
	// The exit message precedes the init's exit: read it before deciding.
	// Only the init held the other end, so the channel ends with it.
	select {
	case <-r.readDone:
	case <-time.After(time.Second):
	}
	r.conn.Close()
	r.cg.remove()
	r.mu.Lock()
	link, nc := r.link, r.net
	r.link, r.net, r.netGone = nil, nil, true
	r.mu.Unlock()
	if link != nil {
		link.Close()
	}
	if nc != nil {
		nc.Close()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.killed:
		r.result = Exit{Code: 128 + int(syscall.SIGKILL), Signal: int(syscall.SIGKILL), Reason: "killed"}
	case r.exit != nil:
		r.result = *r.exit
	default:
		r.result = Exit{Code: 125, Reason: fmt.Sprintf("sandbox init failed: %v", err)}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				r.result = Exit{Code: 128 + int(ws.Signal()), Signal: int(ws.Signal()), Reason: "sandbox init killed"}
			}
		}
	}
	close(r.done)
}

// Allow makes exactly the listed binaries (names of Spec.Binaries) the run's
// executable ones, and returns once the init has bound and unbound them. A
// name not in Spec.Binaries stays absent. When the init cannot confirm, the
// run is killed: it must not keep a binary its context no longer allows.
func (r *Run) Allow(paths []string) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errors.New("sandbox: allow: the run has ended")
	}
	r.nextID++
	id := r.nextID
	c := make(chan string, 1)
	r.pending[id] = c
	r.mu.Unlock()
	if err := r.ch.send(message{Op: opAllow, ID: id, Paths: paths}); err != nil {
		r.Kill()
		return fmt.Errorf("sandbox: allow: %w; run killed", err)
	}
	select {
	case e := <-c:
		if e != "" {
			r.Kill()
			return fmt.Errorf("sandbox: allow: %s; run killed", e)
		}
		return nil
	case <-time.After(allowTimeout):
		r.Kill()
		return errors.New("sandbox: allow: the init did not answer; run killed")
	}
}

// Signal has the init send sig to the command.
func (r *Run) Signal(sig syscall.Signal) error {
	if err := r.ch.send(message{Op: opSignal, Sig: int(sig)}); err != nil {
		return fmt.Errorf("sandbox: signal: %w", err)
	}
	return nil
}

// Again readies r, whose command has ended, for another command: Begin
// may be called once more. Nothing of the last command is left: its
// processes were reaped before its exit was reported, its /tmp and
// /dev/shm are replaced by empty ones, and the next command forks from a
// newly confined thread in a new IPC namespace. The namespaces, the root,
// the cgroups and the view's clones stay. On an error the run is ended.
func (r *Run) Again() error {
	r.mu.Lock()
	if r.exit == nil || r.killed || r.closed {
		r.mu.Unlock()
		r.Kill()
		r.Gone()
		return errors.New("sandbox: again: the run's command has not ended, or the run has")
	}
	r.begun, r.exit = false, nil
	r.started, r.exited = make(chan message, 1), make(chan struct{})
	started := r.started
	r.mu.Unlock()
	fail := func(err error) error {
		r.Kill()
		r.Gone()
		return fmt.Errorf("sandbox: again: %w", err)
	}
	if err := r.ch.send(message{Op: opAgain}); err != nil {
		return fail(err)
	}
	if err := r.await(started, opReady); err != nil {
		return fail(err)
	}
	return nil
}

// Resize sets the size of the command's terminal (a Command with TTY;
// ignored otherwise).
func (r *Run) Resize(rows, cols uint16) error {
	if err := r.ch.send(message{Op: opResize, Rows: rows, Cols: cols}); err != nil {
		return fmt.Errorf("sandbox: resize: %w", err)
	}
	return nil
}

// Kill ends the run: SIGKILL to the init ends its PID namespace, so every
// process of the run dies.
func (r *Run) Kill() {
	r.mu.Lock()
	select {
	case <-r.done:
		r.mu.Unlock()
		return
	default:
	}
	r.killed = r.exit == nil
	r.mu.Unlock()
	_ = r.cmd.Process.Kill()
}

// Wait waits for the run to end and says how: for the command's exit once
// every process of the run is gone (the init has killed and reaped what the
// command left), or for the init's end. The init's own teardown may go on
// after it: Gone waits for that.
func (r *Run) Wait() Exit {
	r.mu.Lock()
	exited := r.exited
	r.mu.Unlock()
	select {
	case <-exited:
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.exit != nil {
			return *r.exit
		}
	case <-r.done:
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result
}

// Gone waits until the init is reaped and the run's cgroups are removed.
func (r *Run) Gone() { <-r.done }

// Ended reports whether the run is over (its init reaped).
func (r *Run) Ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// TakeLink hands over the sockets of the run's egress link (Network
// "policy"; nil otherwise, or when taken): the gateway serves them.
func (r *Run) TakeLink() *Ends {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.link
	r.link = nil
	return l
}

// SetNet ties c, what serves the run's link, to the run: closed once its
// init is reaped (at once when it is already).
func (r *Run) SetNet(c io.Closer) {
	r.mu.Lock()
	gone := r.netGone
	if !gone {
		r.net = c
	}
	r.mu.Unlock()
	if gone {
		c.Close()
	}
}

// Pid is the init's process id in the daemon's PID namespace.
func (r *Run) Pid() int { return r.cmd.Process.Pid }

// The init's Pdeathsig fires when the OS thread that forked it exits, not
// the process (the kernel's rule): a thread the Go runtime lets go (one a
// goroutine locked and left, as acting as a caller does) would kill a run
// at random. So every init is forked from one thread that never exits.
var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func startOnSpawner(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- spawnReq{cmd, done}
	return <-done
}
