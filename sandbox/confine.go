package sandbox

import (
	"os"
	"slices"
	"strings"

	"github.com/condfs/condfs/sandbox/internal/confine"
)

// confineHook confines the calling OS thread just before it forks the
// command, so the command inherits it. It runs on a locked thread that is
// never reused.
var confineHook = fullConfine

// interpreters are the ELF interpreters dynamic programs name: each must be
// executable for them to start.
var interpreters = []string{"/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-x86-64.so.2"}

// fullConfine is confine.Apply for the run, inside its new root: execution
// only in the bin directories, of binaries listed outside them (rules, from
// allowState.execRules), and of the ELF interpreter; writes only under the
// view, /tmp and /dev/shm (and the terminal devices); capabilities,
// no_new_privs and seccomp as confine documents. Landlock is required
// wherever the kernel has it.
func fullConfine(spec Spec, rules []string) error {
	var exec []string
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	for _, d := range binDirs {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			exec = append(exec, d)
		}
	}
	for _, b := range spec.Binaries {
		b = strings.TrimSuffix(b, "/")
		if space, _, ok := splitView(b); ok {
			// The view's names come and go with the context, and a
			// Landlock rule cannot follow them: the space is executable
			// to Landlock, and only the binds of allowed view paths
			// are mounts without noexec there (viewbin.go).
			if !slices.Contains(exec, space) {
				exec = append(exec, space)
			}
		}
	}
	for _, r := range rules {
		if exists(r) {
			exec = append(exec, r)
		}
	}
	for _, i := range interpreters {
		if exists(i) {
			exec = append(exec, i)
		}
	}
	// The view's two spaces are mounts the init made, so they are never
	// looked at here: this thread acts as the init (root on the root
	// path), and the view admits its owner, not root. A stat of a space
	// whose cached attributes had gone stale (any change in it, by the
	// previous command or a file tool, makes them so) asked the daemon,
	// was refused, and left the space out of the write rules: every
	// write, create, truncate, symlink and remove of the command in the
	// view failed with Landlock's EACCES, which the daemon never sees.
	write := []string{"/workspace", "/memories"}
	for _, w := range []string{"/tmp", "/dev/shm", "/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/pts", "/dev/ptmx"} {
		if exists(w) {
			write = append(write, w)
		}
	}
	_, err := confine.Apply(confine.Config{
		ExecPaths: exec, WritePaths: write, ReadPaths: []string{"/"},
		RequireLandlock: confine.Probe().Landlock > 0,
		KeepSetID:       !spec.UserNS,
	})
	return err
}
