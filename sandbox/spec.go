package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Spec is one run: the command, whom it runs as, what it sees and its limits.
// Prepare uses all but the Command fields (Argv, Env, Cwd, Allowed), which
// Begin takes; Start uses it whole.
type Spec struct {
	Argv []string
	Env  []string
	Cwd  string // inside the sandbox, under /workspace or /memories; default /workspace

	UID, GID uint32 // the session owner; on the UserNS path they must be the daemon's
	Groups   []uint32

	Workspace, Memories string // host paths bound at /workspace and /memories

	Binaries []string // [sandbox] binaries: host files, or directories ending in "/"
	Allowed  []string // those of Binaries allowed at start in the session's context

	Network string // "none" (own network namespace, lo up), "host" or "policy" (Link)
	Link    *Link  // Network "policy": the pair to the egress gateway
	// Trust, PEM certificates, is added to the run's system bundle
	// (TrustBundle: the host's and these): the egress gateway's CA.
	Trust []byte

	TmpSize int64 // bytes of /tmp and /dev/shm together; 0 = default
	Memory  int64 // bytes; 0 = no limit
	Pids    int   // 0 = no limit

	UserNS bool // build with CLONE_NEWUSER (a daemon that is not root)
}

// Exit is how a run ended. Code is what condfs run exits with: the command's
// status, or 128+N when signal N ended it.
type Exit struct {
	Code   int
	Signal int
	Reason string
}

// defaultTmpSize bounds /tmp and /dev/shm when Spec.TmpSize is 0.
const defaultTmpSize = 64 << 20

// binEntry is one file or directory the run may be allowed to execute,
// resolved by the daemon before the init starts.
type binEntry struct {
	Name   string // as listed in Spec.Binaries: the key of Allow
	Place  string // where it appears inside the sandbox (the name's directory resolved)
	Source string // the host file or directory it stands for (symlinks followed); "" for the view's
	Dir    bool
	View   bool // a file or directory of the view, found when allowed (viewbin.go)
}

// initSpec is what the daemon sends the init.
type initSpec struct {
	Spec     Spec
	Entries  []binEntry
	NoExec   []string // programs of /usr and the library directories to cover (programs.go)
	Rlimits  bool     // no cgroup holds the run: limit with rlimits
	Hostname string   // of the run's UTS namespace
}

// Command is what a prepared run starts: what differs between two runs of
// the same sandbox.
type Command struct {
	Argv    []string
	Env     []string
	Cwd     string   // inside the sandbox, under /workspace or /memories; default /workspace
	Allowed []string // those of Spec.Binaries allowed at start in the session's context
	// TTY gives the command a new terminal of the run's own devpts as its
	// stdio and controlling terminal, Rows x Cols (0: the kernel's
	// default); the init relays it to and from the stdio passed to Begin.
	TTY        bool
	Rows, Cols uint16
}

// command is the Command part of a Spec (what Start begins).
func (s *Spec) command() Command {
	return Command{Argv: s.Argv, Env: s.Env, Cwd: s.Cwd, Allowed: s.Allowed}
}

// validate checks the sandbox part of s (everything but the command).
func (s *Spec) validate() error {
	for _, d := range []struct{ what, p string }{{"workspace", s.Workspace}, {"memories", s.Memories}} {
		// Not looked at here: in the daemon these are its own FUSE
		// views, which a process that serves them must not use; the
		// init clones them and names the step that fails.
		if !filepath.IsAbs(d.p) {
			return fmt.Errorf("%s %q is not an absolute path", d.what, d.p)
		}
	}
	switch s.Network {
	case "":
		s.Network = "none"
	case "none", "host":
	case "policy":
		if err := s.Link.validate(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("network %q: want none, host or policy", s.Network)
	}
	if s.TmpSize < 0 || s.Memory < 0 || s.Pids < 0 {
		return errors.New("negative limit")
	}
	if s.TmpSize == 0 {
		s.TmpSize = defaultTmpSize
	}
	if s.UserNS {
		if s.UID != uint32(os.Geteuid()) || s.GID != uint32(os.Getegid()) {
			return fmt.Errorf("user namespace: the run's uid/gid %d/%d must be the daemon's %d/%d",
				s.UID, s.GID, os.Geteuid(), os.Getegid())
		}
		if len(s.Groups) > 0 {
			return errors.New("user namespace: supplementary groups cannot be set")
		}
	}
	return nil
}

// validate checks c against the binaries of its sandbox.
func (c *Command) validate(binaries []string) error {
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return errors.New("no command")
	}
	if c.Cwd == "" {
		c.Cwd = "/workspace"
	}
	cl := filepath.Clean(c.Cwd)
	if cl != c.Cwd || !(under(cl, "/workspace") || under(cl, "/memories")) {
		return fmt.Errorf("cwd %q is not a clean path under /workspace or /memories", c.Cwd)
	}
	for _, a := range c.Allowed {
		if !contains(binaries, a) {
			return fmt.Errorf("allowed %q is not in binaries", a)
		}
	}
	return nil
}

// resolveBinaries turns Spec.Binaries into entries. A name that does not
// exist on the host is left out: it is absent in the run, as if not allowed.
// A directory inside a bin directory stands for each file in it, so each gets
// its own place there; any other directory appears whole at its place.
func resolveBinaries(names []string) ([]binEntry, error) {
	var out []binEntry
	for _, n := range names {
		dir := strings.HasSuffix(n, "/")
		c := filepath.Clean(n)
		if !filepath.IsAbs(n) || c == "/" {
			return nil, fmt.Errorf("binary %q is not an absolute path", n)
		}
		if under(c, "/workspace") || under(c, "/memories") {
			if c == "/workspace" || c == "/memories" {
				return nil, fmt.Errorf("binary %q names a whole space of the view", n)
			}
			out = append(out, binEntry{Name: n, Place: c, Dir: dir, View: true})
			continue
		}
		src, err := filepath.EvalSymlinks(c)
		if err != nil {
			continue
		}
		fi, err := os.Stat(src)
		if err != nil {
			continue
		}
		if fi.IsDir() != dir {
			continue // a file listed as a directory or the reverse: nothing to allow
		}
		parent, err := filepath.EvalSymlinks(filepath.Dir(c))
		if err != nil {
			continue
		}
		place := filepath.Join(parent, filepath.Base(c))
		if !dir {
			if !fi.Mode().IsRegular() {
				continue
			}
			out = append(out, binEntry{Name: n, Place: place, Source: src})
			continue
		}
		if !inBinDir(src) {
			out = append(out, binEntry{Name: n, Place: place, Source: src, Dir: true})
			continue
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return nil, fmt.Errorf("binary %q: %w", n, err)
		}
		for _, e := range ents {
			p := filepath.Join(src, e.Name())
			s, err := filepath.EvalSymlinks(p)
			if err != nil {
				continue
			}
			if fi, err := os.Stat(s); err != nil || !fi.Mode().IsRegular() {
				continue
			}
			out = append(out, binEntry{Name: n, Place: p, Source: s})
		}
	}
	return out, nil
}

// binDirs are the directories that hold only the allowed binaries. /bin and
// /sbin count only where they are real directories (not usr-merged links).
var binDirs = []string{"/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin", "/sbin"}

func inBinDir(p string) bool {
	for _, d := range binDirs {
		if under(p, d) {
			return true
		}
	}
	return false
}

// under reports whether p is dir or beneath it (both clean).
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
