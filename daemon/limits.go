package daemon

import (
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Resources one session holds, for DefaultMaxSessions. File descriptors:
// on a shared connection none (measured: 2,000 sessions, 0 more; the
// backing directories are shared by all views, the state file is opened
// for each write), so fdsPerSession is the room for its open files and
// transient ones, on average; a connection of its own adds the /dev/fuse fd
// and its dup. With a connection of its own, the OS threads go-fuse's
// blocking readers pin (measured: about three).
const (
	fdsPerSession       = 1
	fdsPerOwnConnection = 2
	threadsPerOwnConn   = 4
	reservedFDs         = 512  // sockets, config files, open files' fds
	reservedThreads     = 1000 // the runtime, socket handlers, FUSE handlers
	maxSessionsCap      = 100_000
)

// RaiseFileLimit raises the soft RLIMIT_NOFILE to the hard one: each
// session holds descriptors, and the soft default (often 1024) would cap a
// node at a few hundred sessions. Go itself raises it at start since 1.19;
// this also covers a limit lowered after that.
func RaiseFileLimit() {
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) != nil {
		return
	}
	// Root may raise the hard limit too, up to fs.nr_open.
	if want := nrOpen(); r.Max < want && unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: want, Max: want}) == nil {
		return
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		unix.Setrlimit(unix.RLIMIT_NOFILE, &r)
	}
}

// fileLimit is the daemon's soft RLIMIT_NOFILE (1024 when it cannot be
// read).
func fileLimit() uint64 {
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) != nil {
		return 1024
	}
	return r.Cur
}

// nrOpen is fs.nr_open (the most any process may hold), capped at 2^20.
func nrOpen() uint64 {
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return min(n, 1<<20)
}

// DefaultMaxSessions is the most sessions this process can hold without
// running out of file descriptors or, with a FUSE connection per session,
// of the Go runtime's threads (debug.SetMaxThreads, 10,000 by default;
// exhausting it kills the process). Beyond it session.open is refused.
func DefaultMaxSessions(hub bool) int {
	var r unix.Rlimit
	fds := uint64(1024)
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) == nil {
		fds = r.Cur
	}
	per := uint64(fdsPerSession)
	if !hub {
		per += fdsPerOwnConnection
	}
	n := maxSessionsCap
	if fds > reservedFDs {
		n = min(n, int((fds-reservedFDs)/per))
	} else {
		n = 1
	}
	if !hub {
		threads := debug.SetMaxThreads(10000)
		debug.SetMaxThreads(threads)
		n = min(n, max(1, (threads-reservedThreads)/threadsPerOwnConn))
	}
	return max(n, 1)
}

// FitThreadLimit lowers the Go runtime's thread limit (debug.SetMaxThreads,
// 10,000 by default) below the pids limit of the daemon's cgroup (systemd's
// TasksMax, the unit in deploy/ sets one), when that is lower: the runtime
// then stops the daemon with its own message before the kernel refuses a
// thread, and DefaultMaxSessions counts with the real limit. An eighth of
// the limit is left to the cgroup's other tasks. It returns the limit set,
// or 0 if it left it.
func FitThreadLimit() int {
	cg, _ := os.ReadFile("/proc/self/cgroup")
	pids := pidsLimit(string(cg), "/sys/fs/cgroup")
	if pids <= 0 {
		return 0
	}
	want := max(pids-pids/8, 1)
	cur := debug.SetMaxThreads(want)
	if cur <= want {
		debug.SetMaxThreads(cur)
		return 0
	}
	return want
}

// pidsLimit is the lowest pids.max on the way from the process's pids
// cgroup (cgroup v1 "pids", or v2) up to the root, read under root; 0 if
// none is set.
func pidsLimit(procCgroup, root string) int {
	var dirs []string
	for _, line := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || !strings.HasPrefix(f[2], "/") {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "pids" {
				dirs = append(dirs, path.Join(root, "pids", f[2]))
			}
		}
		if f[0] == "0" && f[1] == "" {
			dirs = append(dirs, path.Join(root, f[2]), path.Join(root, "unified", f[2]))
		}
	}
	limit := 0
	for _, dir := range dirs {
		for d := dir; strings.HasPrefix(d, root); d = path.Dir(d) {
			b, err := os.ReadFile(d + "/pids.max")
			if n, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && n > 0 && (limit == 0 || n < limit) {
				limit = n
			}
			if d == root {
				break
			}
		}
	}
	return limit
}
