package fsys

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Acting as the caller. A root daemon serves views to other users, so every
// backing call runs with the requesting process's fsuid, fsgid and
// supplementary groups: the kernel then answers exactly as it would answer
// that process natively (modes, POSIX ACLs, immutable flags, LSMs), and files
// it creates are the caller's. The switch is per thread: the goroutine locks
// its OS thread, sets the thread's credentials with raw syscalls (never the
// syscall package's process-wide wrappers), and restores them before the
// thread is released. Changing fsuid away from 0 also clears the filesystem
// capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN, CAP_MKNOD, ...) from
// the thread's effective set; the others (CAP_SYS_ADMIN, CAP_SETFCAP) stay,
// which is why ioctl is refused and privileged xattr namespaces are filtered.

// daemonCreds are the credentials every thread is restored to.
type daemonCreds struct {
	uid, gid int
	groups   []uint32
}

var self = func() daemonCreds {
	gs, _ := unix.Getgroups()
	d := daemonCreds{uid: os.Geteuid(), gid: os.Getegid()}
	for _, g := range gs {
		d.groups = append(d.groups, uint32(g))
	}
	return d
}()

// Switching costs six credential syscalls (about 15 µs on the machines we
// measure), so threads keep a caller's credentials between requests: the
// first switch pins the goroutine to its thread (a LockOSThread undone
// only by unpin, before a request waits), and the next request on that goroutine switches
// only if its caller differs. A pinned thread runs no other goroutine, and
// dies with its goroutine (the runtime ends a thread whose goroutine exits
// locked), so a caller's credentials never reach code that is not a view's
// request. The invariant that makes this safe: a thread whose fsuid is not
// the daemon's is pinned, and threadCreds holds its credentials; a thread
// whose fsuid is the daemon's has the daemon's credentials throughout, and
// (outside a root request on it, which sets the caller's back) its
// goroutine is not pinned: unpin can then end a pin by looking at the
// thread's fsuid.

// credKey names a set of credentials.
type credKey struct {
	uid, gid uint32
	groups   string // the groups, as their bytes
}

// threadSet maps a pinned thread's id to its credentials, and says whether
// its goroutine is between requests (idle). An entry is trusted only while
// the thread's fsuid is not the daemon's (a thread that died and whose id
// was reused starts with the daemon's fsuid), so losing entries is safe:
// the thread is then switched again (and two hosts in one process, as in
// the unit tests, each switching what the other did not record, stay
// correct). At most maxIdle entries are idle: a request that ends
// beyond that gives its pin up (keep). A goroutine that exits pinned
// (go-fuse ends readers beyond its limit) ends its thread and leaves its
// entry behind; such entries are found (tgkill) and dropped when the idle
// ones reach the limit.
type threadSet struct {
	maxIdle int // maxIdlePins when the host was made
	mu      sync.Mutex
	m       map[int]pinnedThread
	idle    int       // entries with idle set
	pruned  time.Time // when dead threads' entries were last looked for
}

type pinnedThread struct {
	key  credKey
	idle bool
}

// pruneEvery limits how often keep looks for dead threads (a tgkill each
// of up to maxIdle).
const pruneEvery = 50 * time.Millisecond

func (ts *threadSet) record(tid int, k credKey) {
	ts.mu.Lock()
	if ts.m == nil {
		ts.m = map[int]pinnedThread{}
	}
	if ts.m[tid].idle {
		ts.idle--
	}
	ts.m[tid] = pinnedThread{key: k}
	ts.mu.Unlock()
}

func (ts *threadSet) forget(tid int) {
	ts.mu.Lock()
	if e, ok := ts.m[tid]; ok {
		if e.idle {
			ts.idle--
		}
		delete(ts.m, tid)
	}
	ts.mu.Unlock()
}

// key returns a pinned thread's credentials, marking it busy (a request
// runs on it).
func (ts *threadSet) key(tid int) (credKey, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	e, ok := ts.m[tid]
	if ok && e.idle {
		e.idle = false
		ts.m[tid] = e
		ts.idle--
	}
	return e.key, ok
}

// keep reports whether the current (pinned) thread may keep its caller's
// credentials and pin after its request, marking it idle if so.
func (ts *threadSet) keep(tid int) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	e, ok := ts.m[tid]
	if !ok {
		return false
	}
	if ts.idle >= ts.maxIdle {
		if now := time.Now(); now.Sub(ts.pruned) >= pruneEvery {
			ts.pruned = now
			pid := unix.Getpid()
			for t, e := range ts.m {
				if e.idle && unix.Tgkill(pid, t, 0) == unix.ESRCH {
					delete(ts.m, t)
					ts.idle--
				}
			}
		}
		if ts.idle >= ts.maxIdle {
			return false
		}
	}
	if !e.idle {
		e.idle = true
		ts.m[tid] = e
		ts.idle++
	}
	return true
}

// asCaller is what become did on the current thread; restore ends it. The
// zero value did nothing.
type asCaller struct {
	switched bool          // the thread acts as a caller (not the daemon)
	back     *credKey      // restore sets these credentials again (a root request on a pinned thread)
	view     *View         // holds a place among the requests acting (acting.go)
	remount  *sync.RWMutex // held shared while the request runs (View.Remount)
	threads  *threadSet    // where the thread's credentials are recorded
}

// become admits the request's caller, takes a place among the requests
// acting at once (acting.go) and, in a daemon that can, makes the current
// thread act with the caller's credentials. A request with no caller is the
// daemon's own (tests, notifications) and runs as the daemon, with no place.
func (v *View) become(ctx context.Context) (asCaller, syscall.Errno) {
	if v.closed.Load() {
		// An unmounted view's nodes may outlive it in a hub, or through a
		// lazily detached mount: they do nothing.
		return asCaller{}, syscall.EIO
	}
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return asCaller{}, 0
	}
	if !v.admits(c.Uid) {
		return asCaller{}, syscall.EACCES
	}
	v.enterActing()
	if v.isStaged {
		v.remountMu.RLock()
	}
	a, errno := v.switchTo(c)
	if errno != 0 {
		if v.isStaged {
			v.remountMu.RUnlock()
		}
		v.leaveActing()
		return asCaller{}, errno
	}
	a.view, a.threads = v, &v.host.threads
	if v.isStaged {
		a.remount = &v.remountMu
	}
	return a, 0
}

// switchTo makes the current thread act as c (become, holding a place).
func (v *View) switchTo(c *fuse.Caller) (asCaller, syscall.Errno) {
	if !v.caller.switchCreds {
		return asCaller{}, 0
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread() // the pin, if any, is a second lock
	cur, _ := unix.SetfsuidRetUid(-1)
	clean := cur == self.uid
	if c.Uid == 0 {
		// Root calling a root daemon has the daemon's authority natively.
		if clean {
			return asCaller{}, 0
		}
		// A pinned thread: act as the daemon for this request only.
		tid := unix.Gettid()
		k, known := v.host.threads.key(tid)
		if err := setThreadCreds(self.uid, self.gid, self.groups); err != nil {
			panicRestore(err)
		}
		if !known {
			// Its credentials are unknown: it stays the daemon's, and so
			// is pinned no longer (a later become pins it again).
			runtime.UnlockOSThread() // the pin
			return asCaller{}, 0
		}
		return asCaller{back: &k}, 0
	}
	groups, err := v.caller.groups.of(c.Pid, c.Uid, c.Gid)
	if err != nil {
		// Without the caller's groups we cannot act as it: fail closed.
		v.log.Warn("caller's groups unknown; refusing", "pid", c.Pid, "uid", c.Uid, "err", err)
		return asCaller{}, syscall.EACCES
	}
	want := credKey{uid: c.Uid, gid: c.Gid, groups: groupsKey(groups)}
	tid := unix.Gettid()
	if !clean {
		if k, ok := v.host.threads.key(tid); ok && k == want {
			return asCaller{switched: true}, 0
		}
	} else {
		runtime.LockOSThread() // the pin: undone only by unpin
	}
	if err := setThreadCreds(int(c.Uid), int(c.Gid), groups); err != nil {
		// The thread is pinned; leave it no caller's authority.
		if rerr := setThreadCreds(self.uid, self.gid, self.groups); rerr != nil {
			panicRestore(rerr)
		}
		v.host.threads.forget(tid)
		runtime.UnlockOSThread() // the pin
		v.log.Error("switch to caller's credentials", "uid", c.Uid, "err", err)
		return asCaller{}, syscall.EIO
	}
	v.host.threads.record(tid, want)
	return asCaller{switched: true}, 0
}

// unpin gives the current thread the daemon's credentials back and ends
// the pin a caller's credentials put on its goroutine, if any: a request
// about to wait (for a place among those acting, or a blocking lock) then
// holds no OS thread while it waits. The next become switches again.
func (ts *threadSet) unpin() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cur, _ := unix.SetfsuidRetUid(-1); cur == self.uid {
		return // not pinned
	}
	if err := setThreadCreds(self.uid, self.gid, self.groups); err != nil {
		panicRestore(err)
	}
	ts.forget(unix.Gettid())
	runtime.UnlockOSThread() // the pin
}

// restore ends what become did: a root request on a pinned thread has the
// thread's caller credentials set back; the place is given back; and a
// pinned thread keeps its caller's credentials for the next request only
// while few others do (keepPin), so that goroutines between requests hold
// few threads whatever they wait on next.
func (a asCaller) restore() {
	if a.back != nil {
		if err := setThreadCreds(int(a.back.uid), int(a.back.gid), keyGroups(a.back.groups)); err != nil {
			panicRestore(err)
		}
	}
	if a.remount != nil {
		a.remount.RUnlock()
	}
	if a.view != nil {
		a.view.leaveActing()
	}
	if (a.switched || a.back != nil) && !a.threads.keep(unix.Gettid()) {
		a.threads.unpin()
	}
}

func groupsKey(groups []uint32) string {
	if len(groups) == 0 {
		return ""
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(&groups[0])), len(groups)*4))
}

func keyGroups(k string) []uint32 {
	out := make([]uint32, len(k)/4)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), len(k)), k)
	return out
}

// panicRestore stops the daemon when a thread's credentials cannot be set:
// nothing may run with credentials we do not know. Views then answer
// ENOTCONN (fail closed) and a supervisor restarts the daemon.
func panicRestore(err error) {
	panic(fmt.Sprintf("condfs: cannot set a thread's credentials: %v", err))
}

// setThreadCreds sets the calling thread's groups, fsgid and fsuid, in that
// order (setgroups needs CAP_SETGID, which the fsuid change does not drop,
// but doing it first keeps the order the same both ways).
func setThreadCreds(uid, gid int, groups []uint32) error {
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	// setfsgid and setfsuid report nothing on failure; the fsuid, which
	// decides the capabilities too, is read back.
	unix.SetfsgidRetGid(gid)
	unix.SetfsuidRetUid(uid)
	if got, _ := unix.SetfsuidRetUid(-1); got != uid {
		return fmt.Errorf("setfsuid(%d): thread has %d", uid, got)
	}
	return nil
}

// groupCache remembers callers' supplementary groups, read from
// /proc/PID/status (FUSE requests carry uid, gid and pid, not groups).
// Reading the file costs more than the operation, so an entry is kept for a
// short time, keyed by pid with the uid and gid it was read for: a reused
// pid with other ids misses. A process that drops groups is served with its
// old ones for at most groupTTL.
type groupCache struct {
	mu      sync.Mutex
	entries map[uint32]groupEntry
}

type groupEntry struct {
	uid, gid uint32
	groups   []uint32
	at       time.Time
}

const (
	groupTTL        = time.Second
	groupCacheLimit = 4096
)

func (g *groupCache) of(pid, uid, gid uint32) ([]uint32, error) {
	now := time.Now()
	g.mu.Lock()
	if e, ok := g.entries[pid]; ok && e.uid == uid && e.gid == gid && now.Sub(e.at) < groupTTL {
		g.mu.Unlock()
		return e.groups, nil
	}
	g.mu.Unlock()
	groups, err := readGroups(pid, uid)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	if g.entries == nil || len(g.entries) >= groupCacheLimit {
		g.entries = map[uint32]groupEntry{}
	}
	g.entries[pid] = groupEntry{uid: uid, gid: gid, groups: groups, at: now}
	g.mu.Unlock()
	return groups, nil
}

// readGroups reads the Groups: line of /proc/PID/status, checking that the
// process still has the fsuid the request came with (a pid reused by another
// user's process must not lend its groups).
func readGroups(pid, uid uint32) ([]uint32, error) {
	if pid == 0 {
		return nil, fmt.Errorf("request without a pid")
	}
	data, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/status")
	if err != nil {
		return nil, err
	}
	var groups []uint32
	sawUID, sawGroups := false, false
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		switch {
		case bytes.HasPrefix(line, []byte("Uid:")):
			// real, effective, saved, filesystem
			f := bytes.Fields(line[4:])
			if len(f) != 4 || string(f[3]) != strconv.FormatUint(uint64(uid), 10) {
				return nil, fmt.Errorf("pid %d no longer has fsuid %d", pid, uid)
			}
			sawUID = true
		case bytes.HasPrefix(line, []byte("Groups:")):
			for _, f := range bytes.Fields(line[7:]) {
				n, err := strconv.ParseUint(string(f), 10, 32)
				if err != nil {
					return nil, fmt.Errorf("pid %d: bad group %q", pid, f)
				}
				groups = append(groups, uint32(n))
			}
			sawGroups = true
		}
	}
	if !sawUID || !sawGroups {
		return nil, fmt.Errorf("pid %d: no Uid or Groups line", pid)
	}
	return groups, nil
}
