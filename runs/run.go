package runs

// The run method. The client's connection is the run's lifeline: it
// brings the client's stdio (SCM_RIGHTS), carries the signals it forwards,
// and its end kills the run.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/stdiofd"
	"github.com/condfs/condfs/sandbox"
	"golang.org/x/sys/unix"
)

type runParams struct {
	Session   string   `json:"session"`
	Roles     []string `json:"roles"`
	Argv      []string `json:"argv"`
	Cwd       string   `json:"cwd"`
	Env       []string `json:"env"`
	TimeoutMS int64    `json:"timeout_ms"`
	Lang      string   `json:"lang"`
	Term      string   `json:"term"`
	TTY       bool     `json:"tty"`
	Rows      uint16   `json:"rows"`
	Cols      uint16   `json:"cols"`
}

// runError: 125 unless a code says otherwise.
func runError(format string, a ...any) *control.Error {
	return control.Errorf(control.CodeRefused, format, a...)
}

// Run is the run method (docs/control.md): it decides and starts the
// command, then serves it on the caller's connection until it ends.
func (n *Node) Run(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	files, all := control.TakeFiles(ctx)
	keep := false
	defer func() {
		if !keep {
			// On the client's uid's closers: a descriptor's last close
			// may block as long as the client likes.
			control.Release(ctx, files)
		}
	}()
	var p runParams
	if err := control.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	s, cerr := n.cfg.Lookup(ctx, p.Session)
	if cerr != nil {
		return nil, cerr
	}
	if cerr := runStdio(files, all); cerr != nil {
		return nil, cerr
	}
	if len(p.Argv) == 0 || p.Argv[0] == "" {
		return nil, runError("no command")
	}
	if len(p.Argv) > 4096 {
		return nil, runError("over 4096 arguments")
	}
	env, cerr := runEnv(s.id, p)
	if cerr != nil {
		return nil, cerr
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/workspace"
	}
	cfg := n.cfg.Conditions()
	set := s.view.Context()
	if err := checkCwd(cfg, set, cwd); err != nil {
		return nil, err
	}
	sb := cfg.Sandbox()
	if sb == nil {
		return nil, runError("conditions.toml has no [sandbox] table: no binaries are allowed, so nothing can run")
	}
	if err := n.decideRun(ctx, s.id, p.Roles, p.Argv, cwd); err != nil {
		return nil, err
	}
	allowed := allowedBinaries(cfg, set, sb.Binaries())
	if err := commandAllowed(p.Argv[0], env, allowed); err != nil {
		return nil, err
	}
	var trust []byte
	var placeholders map[string]string
	if sb.Network() == acl.NetworkPolicy {
		ca, err := n.egressCA()
		if err != nil {
			return nil, runError("cannot start the egress gateway: %v", err)
		}
		trust = ca.CertPEM()
		env = trustEnv(proxyEnv(env))
		if env, placeholders, err = secretEnv(env, cfg); err != nil {
			return nil, runError("%v", err)
		}
	}
	spec := n.runSpec(s, sb, p.Argv, env, cwd, allowed)
	spec.Trust = trust
	cmd := sandbox.Command{Argv: p.Argv, Env: env, Cwd: cwd, TTY: p.TTY, Rows: p.Rows, Cols: p.Cols}
	a, cerr := n.beginRun(s, spec, sb.Binaries(), cmd, files, p.Roles, placeholders)
	if cerr != nil {
		return nil, cerr
	}
	// The init has its own copies. Let go of ours now: a caller reading
	// the command's output through a pipe sees its end only once every
	// copy is closed.
	control.Release(ctx, files)
	keep = true
	start := time.Now()
	return control.Takeover(func(ctx context.Context, st *control.Stream) {
		stopReader := serveRun(st, a, time.Duration(p.TimeoutMS)*time.Millisecond)
		exit := a.box.r.Wait()
		a.mu.Lock()
		reason := a.reason
		a.mu.Unlock()
		code, msg := exitOf(exit.Code, reason)
		n.cfg.AuditRun(Ended{Session: s.id, Atoms: set.Atoms(), Argv: p.Argv, Cwd: cwd, Exit: code, Reason: reason, Took: time.Since(start)})
		st.Respond(map[string]any{"exit": code, "message": msg}, nil)
		stopReader()
		n.endRun(s, a, spec, reason == "")
	}), nil
}

// runStdio checks the descriptors passed with a run: exactly the caller's
// stdin, stdout and stderr, each of a kind a command may be given.
func runStdio(files []*os.File, all bool) *control.Error {
	if len(files) != 3 || !all {
		return runError("run needs exactly the caller's stdin, stdout and stderr passed with the request (SCM_RIGHTS); got %d descriptors or more", len(files))
	}
	for i, f := range files {
		if err := stdioOK(f); err != nil {
			return runError("descriptor %d: %v", i, err)
		}
	}
	return nil
}

// exitOf is the status a run reports, and what condfs run says of it: the
// command's own, unless condfs ended it (a timeout, the session closed).
func exitOf(code int, reason string) (int, string) {
	switch reason {
	case "timeout":
		return 124, "the run timed out; every process of it was killed"
	case "closed":
		return 137, "the session was closed; every process of the run was killed"
	}
	return code, ""
}

// runEnv is the command's environment (sandbox.md): not inherited.
func runEnv(session string, p runParams) ([]string, *control.Error) {
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "CONDFS_SESSION=" + session}
	if p.Lang != "" {
		env = append(env, "LANG="+p.Lang)
	}
	if p.Term != "" {
		env = append(env, "TERM="+p.Term)
	}
	for _, e := range p.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsRune(e, 0) {
			return nil, runError("--env %q: want NAME=VALUE", e)
		}
		env = append(env, e)
	}
	return env, nil
}

// decideRun: the run is first a tool call, exec with {"argv","cwd"}; only
// allow runs (126 otherwise).
func (n *Node) decideRun(ctx context.Context, session string, roles, argv []string, cwd string) *control.Error {
	decideParams, _ := json.Marshal(map[string]any{"session": session, "roles": roles, "tool": "exec",
		"args": map[string]any{"argv": argv, "cwd": cwd}})
	res, derr := n.cfg.Decide(ctx, decideParams)
	if derr != nil {
		return derr
	}
	dec, _ := json.Marshal(res)
	var decision struct {
		Decision string   `json:"decision"`
		Reasons  []string `json:"reasons"`
	}
	if err := json.Unmarshal(dec, &decision); err != nil {
		return control.Errorf(control.CodeRunDenied, "exec %v: the decision cannot be read: %v", argv, err)
	}
	switch decision.Decision {
	case "allow":
		return nil
	case "approval_required":
		return control.Errorf(control.CodeRunDenied, "the policy requires an approval for exec %v; ask for it before calling condfs run", argv)
	default:
		return control.Errorf(control.CodeRunDenied, "the policy denies exec %v: %s", argv, strings.Join(decision.Reasons, "; "))
	}
}

// runSpec is the sandbox of s's run as the daemon builds it.
func (n *Node) runSpec(s *Session, sb *acl.Sandbox, argv, env []string, cwd string, allowed []string) sandbox.Spec {
	spec := sandbox.Spec{
		Argv: argv, Env: env, Cwd: cwd,
		UID: s.owner, GID: s.owner,
		Workspace: s.view.Mountpoint() + "/workspace", Memories: s.view.Mountpoint() + "/memories",
		Binaries: sb.Binaries(), Allowed: allowed,
		Network: string(sb.Network()), TmpSize: sb.TmpSize(), Memory: sb.Memory(), Pids: sb.Pids(),
		UserNS: os.Geteuid() != 0,
	}
	if sb.Network() == acl.NetworkPolicy {
		spec.Link = n.egressLink()
	}
	if spec.UserNS {
		// A daemon that is not root serves its own uid only, and runs as
		// it: its ids map to themselves, groups stay as they are.
		spec.UID, spec.GID = uint32(os.Geteuid()), uint32(os.Getegid())
	} else if gid, groups, err := userGroups(s.owner); err == nil {
		spec.GID, spec.Groups = gid, groups
	}
	return spec
}

// beginRun starts cmd in the session's kept sandbox, or a new one, with
// files as its stdio and the binaries its context allows as it begins.
func (n *Node) beginRun(s *Session, spec sandbox.Spec, binaries []string, cmd sandbox.Command, files []*os.File, roles []string, placeholders map[string]string) (*activeRun, *control.Error) {
	b := n.warm.take(s, warmKey(spec, sandbox.Probe().Programs.Indexed))
	if b != nil {
		n.warm.warmStarts.Add(1)
	} else {
		n.warm.coldStarts.Add(1)
		r, err := sandbox.Prepare(spec)
		if err != nil {
			return nil, runError("cannot build the sandbox: %v", err)
		}
		b = &box{r: r}
	}
	if err := n.gateway(s, b); err != nil {
		b.end()
		return nil, runError("cannot start the egress gateway: %v", err)
	}
	if gw := b.gw; gw != nil {
		// A kept sandbox's next command may have other roles; nothing of
		// the last one's is left open (endRun), and whatever is is
		// decided again as this command's.
		gw.SetDecider(n.connectDecider(s, roles))
		gw.SetSecrets(placeholders)
		gw.Recheck()
	}
	a := &activeRun{box: b, binaries: binaries, inRow: n.warm.inRow(s)}
	// Every change of a run's allowlist is made under its session's
	// switch lock (context.set, reload), so the last one made is the
	// newest context's: the command begins with what is in force now.
	var err error
	s.switchMu.Lock()
	added := s.add(a)
	if added {
		cmd.Allowed = allowedBinaries(n.cfg.Conditions(), s.view.Context(), binaries)
		err = b.r.Begin(cmd, files[0], files[1], files[2])
	}
	s.switchMu.Unlock()
	if !added {
		b.end()
		return nil, runError("session %q is closing", s.id)
	}
	if err != nil {
		s.remove(a)
		// The command was found nowhere in the run, or may not be
		// executed there (a file of the view it does not allow).
		if ee := (*sandbox.ExecError)(nil); errors.As(err, &ee) {
			if ee.Errno == syscall.ENOENT {
				return nil, control.Errorf(control.CodeRunNotFound, "%s: command not found", cmd.Argv[0])
			}
			return nil, control.Errorf(control.CodeRunDenied, "%s: this run may not execute it (%v)", cmd.Argv[0], ee.Errno)
		}
		return nil, runError("cannot build the sandbox: %v", err)
	}
	return a, nil
}

// endRun keeps a's sandbox for its session's next run (reusable: its
// command ended by itself) or ends it. Either way the run leaves its
// session only then: the session's runs are over when their namespaces
// are, or when the pool, which session.close empties before it unmounts
// the view, holds them.
func (n *Node) endRun(s *Session, a *activeRun, spec sandbox.Spec, reusable bool) {
	if a.inRow && reusable {
		// The command's processes are gone; what they left queued must
		// not go on flowing while the sandbox waits, unchecked by the
		// switches and reloads that check the session's runs
		// (TestEgressSwitchCutsKeptSandboxConnections).
		if a.box.gw != nil {
			a.box.gw.CutAll("cut: the run's command ended")
		}
		n.warm.keep(s, warmKey(spec, a.box.r.Indexed()), a.box)
	} else {
		a.box.end()
	}
	s.remove(a)
}

// serveRun relays the client's signals (and its terminal's size) until
// the command ends (and stopReader is called), and ends
// the run when the client goes or the timeout passes.
func serveRun(st *control.Stream, a *activeRun, timeout time.Duration) (stopReader func()) {
	done := make(chan struct{})
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() { a.end("timeout") })
		defer timer.Stop()
	}
	go func() {
		defer close(done)
		for {
			line, tooLong, err := control.ReadLine(st.R, 4096, true)
			if err != nil || tooLong {
				return
			}
			var m struct {
				Method string `json:"method"`
				Params struct {
					Signal int    `json:"signal"`
					Rows   uint16 `json:"rows"`
					Cols   uint16 `json:"cols"`
				} `json:"params"`
			}
			if json.Unmarshal(line, &m) != nil {
				continue
			}
			switch m.Method {
			case "run.signal":
				switch sig := syscall.Signal(m.Params.Signal); sig {
				case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
					a.box.r.Signal(sig)
				}
			case "run.resize":
				if m.Params.Rows > 0 && m.Params.Cols > 0 {
					a.box.r.Resize(m.Params.Rows, m.Params.Cols)
				}
			}
		}
	}()
	exited := make(chan struct{})
	go func() { a.box.r.Wait(); close(exited) }()
	select {
	case <-exited:
		// The reader stops once the run is answered (not before: that
		// is one more wakeup between the exit and the answer).
		return func() {
			st.Conn.SetReadDeadline(time.Now())
			<-done
		}
	case <-done:
		// The client is gone (or sent what cannot be read): nothing
		// outlives the run's caller.
		a.end("gone")
		<-exited
	}
	return func() {}
}

// stdioOK refuses a descriptor that would hand the command more than a
// stream of the caller's: only a pipe, a terminal or /dev/null may be
// stdio, never a directory, an O_PATH descriptor, an anonymous inode (a
// pidfd, an epoll or io_uring instance, an eventfd), a regular file or
// another device (the command could map it executable: condfs run passes a
// pipe in its place), or a socket (a Unix socket carries descriptors both
// ways, an unconnected one connects where it was made, and a connection to
// this daemon passed as stdin gave the command the caller's whole control
// authority: condfs run relays it through a pipe too).
func stdioOK(f *os.File) error {
	fd := int(f.Fd())
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if fl&unix.O_PATH != 0 {
		return errors.New("an O_PATH descriptor cannot be stdio")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFCHR, unix.S_IFIFO:
	case unix.S_IFDIR:
		return errors.New("a directory cannot be stdio")
	case unix.S_IFSOCK:
		return errors.New("a socket cannot be stdio; pass it through a pipe")
	default:
		return fmt.Errorf("a descriptor of type %#o cannot be stdio", st.Mode&unix.S_IFMT)
	}
	// Anonymous inodes may show a file type of their own (pidfs files
	// are S_IFREG): their /proc name says what they are.
	name, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	switch {
	case err != nil:
		return fmt.Errorf("what the descriptor is: %w", err)
	case strings.HasPrefix(name, "anon_inode:") || strings.HasPrefix(name, "pidfd:"):
		return fmt.Errorf("%s cannot be stdio", name)
	case st.Mode&unix.S_IFMT == unix.S_IFREG && (!strings.HasPrefix(name, "/") || internalFile(name)):
		// A memfd lives on a mount Landlock does not govern: given as
		// stdio, the command could execve it (fexecve).
		return fmt.Errorf("%s (a file of no filesystem's tree) cannot be stdio", name)
	}
	if r, err := stdiofd.Relayed(fd); err != nil {
		return err
	} else if r {
		// The command could map it executable, or execute it, through
		// its own mount (internal/stdiofd): condfs run passes a pipe.
		return fmt.Errorf("%s (a regular file, or a device) cannot be stdio; pass it through a pipe", name)
	}
	return nil
}

// internalFile: a /proc fd name of a file on a kernel-internal mount.
func internalFile(name string) bool {
	for _, p := range []string{"/memfd:", "/secretmem", "/dmabuf:", "/SYSV"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// checkCwd: the working directory is /workspace or /memories or below, and
// the rules show it.
func checkCwd(cfg *acl.Config, set cctx.Set, cwd string) *control.Error {
	if !path.IsAbs(cwd) || path.Clean(cwd) != cwd || strings.ContainsRune(cwd, 0) {
		return runError("--cwd %q: want a clean absolute path under /workspace or /memories", cwd)
	}
	var space acl.Space
	var rel string
	switch {
	case cwd == "/workspace" || strings.HasPrefix(cwd, "/workspace/"):
		space, rel = acl.Workspace, strings.TrimPrefix(cwd, "/workspace")
	case cwd == "/memories" || strings.HasPrefix(cwd, "/memories/"):
		space, rel = acl.Memories, strings.TrimPrefix(cwd, "/memories")
	default:
		return runError("--cwd %q is outside /workspace and /memories", cwd)
	}
	if rel == "" {
		return nil
	}
	ex, err := cfg.ExplainView(space, rel+"/", set)
	if err != nil || ex.Decision != "allow" {
		return runError("--cwd %q is not in the session's view", cwd)
	}
	return nil
}

// commandAllowed: 126 for a command the run may not execute, 127 for one
// that exists nowhere. A bare name is looked up on the PATH the command
// gets (the last PATH of env, as the sandbox looks it up); a name is
// compared with the listed ones where the run shows it (hostPlace).
func commandAllowed(cmd string, env, allowed []string) *control.Error {
	var candidates []string
	if strings.Contains(cmd, "/") {
		candidates = []string{path.Clean(cmd)}
	} else {
		search := ""
		for _, e := range env {
			if v, ok := strings.CutPrefix(e, "PATH="); ok {
				search = v
			}
		}
		for _, dir := range filepath.SplitList(search) {
			if path.IsAbs(dir) {
				candidates = append(candidates, path.Join(dir, cmd))
			}
		}
	}
	for _, c := range candidates {
		if inView(c) {
			return nil // decided inside, by the view and the exec rules
		}
		if slices.ContainsFunc(allowed, func(a string) bool { return reaches(c, a) }) {
			return nil
		}
	}
	if slices.ContainsFunc(candidates, func(c string) bool { _, err := os.Stat(c); return err == nil }) {
		return control.Errorf(control.CodeRunDenied, "%s: this run may not execute it (not in [sandbox] binaries, or denied by the exec rules in this context)", cmd)
	}
	return control.Errorf(control.CodeRunNotFound, "%s: command not found", cmd)
}

// userGroups reads uid's primary group and supplementary groups from
// /etc/passwd and /etc/group (the daemon's host files).
func userGroups(uid uint32) (uint32, []uint32, error) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	var name string
	gid := int64(-1)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 4 && fields[2] == fmt.Sprint(uid) {
			name = fields[0]
			fmt.Sscan(fields[3], &gid)
			break
		}
	}
	if gid < 0 {
		return 0, nil, fmt.Errorf("uid %d not in /etc/passwd", uid)
	}
	groups := []uint32{uint32(gid)}
	g, err := os.Open("/etc/group")
	if err == nil {
		defer g.Close()
		sc := bufio.NewScanner(g)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ":")
			if len(fields) >= 4 && slices.Contains(strings.Split(fields[3], ","), name) {
				var n uint32
				if _, err := fmt.Sscan(fields[2], &n); err == nil && !slices.Contains(groups, n) {
					groups = append(groups, n)
				}
			}
		}
	}
	return uint32(gid), groups, nil
}
