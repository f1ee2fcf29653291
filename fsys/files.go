package fsys

import (
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Every open file of a view holds a descriptor of the daemon's (its
// backing file, reopened), which no caller's RLIMIT_NOFILE counts: one run
// that opened files until it could not took all of the daemon's, and every
// other session's opens, the control socket's accepts and new runs failed
// with it (TestRunOpenFilesCannotExhaustDaemon). So open files are bounded
// three times: a view holds at most perView of them, and the views of one
// owner together at most half of the room (EMFILE beyond, as a process's
// own limit answers: one uid opening sessions of its own filled the room,
// TestOneUidCannotTakeEveryViewsRoom); and all views together leave a reserve of the
// daemon's descriptors for everything else, the views' own FUSE
// connections included (ENFILE beyond, as the system's limit answers).
type fileBudget struct {
	open     atomic.Int64 // descriptors open files hold, in every view
	conns    atomic.Int64 // views with a FUSE connection of their own
	limit    int64        // the daemon's RLIMIT_NOFILE when the host was made
	reserved int64        // kept for other work (HostOptions.ReservedFDs)
	perView  int64

	mu      sync.Mutex
	byOwner map[uint32]*atomic.Int64 // what each owner's views hold
}

// Descriptors one view's own connection holds (/dev/fuse and its dup), and
// the part of the limit open files never take (sockets, config files, the
// sandbox's, the watcher's).
const (
	fdsPerConnection = 2
	minReservedFDs   = 512
)

func newFileBudget(reserved int64) *fileBudget {
	limit := int64(1024)
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) == nil && r.Cur < 1<<40 {
		limit = int64(r.Cur)
	}
	return &fileBudget{limit: limit, reserved: reserved, perView: max(limit/16, 64), byOwner: map[uint32]*atomic.Int64{}}
}

// owner is the count of what uid's views hold (kept for the daemon's
// life: one per owner uid).
func (b *fileBudget) owner(uid uint32) *atomic.Int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.byOwner[uid]
	if c == nil {
		c = &atomic.Int64{}
		b.byOwner[uid] = c
	}
	return c
}

// room is how many descriptors open files may hold in all views now.
func (b *fileBudget) room() int64 {
	return b.limit - max(b.limit/8, minReservedFDs) - b.reserved - fdsPerConnection*b.conns.Load()
}

// takeFile takes a descriptor for an open file of v; giveFile gives it
// back. Its errno is EMFILE when v holds its share, ENFILE when the
// daemon does.
func (v *View) takeFile() syscall.Errno {
	b, owner := v.host.files, v.handles.owner
	if v.handles.open.Add(1) > b.perView {
		v.handles.open.Add(-1)
		v.filesExhausted("a view's open files", b.perView)
		return syscall.EMFILE
	}
	if half := b.room() / 2; owner.Add(1) > half {
		owner.Add(-1)
		v.handles.open.Add(-1)
		v.filesExhausted("its owner's open files", half)
		return syscall.EMFILE
	}
	if b.open.Add(1) > b.room() {
		b.open.Add(-1)
		owner.Add(-1)
		v.handles.open.Add(-1)
		v.filesExhausted("all views' open files", b.room())
		return syscall.ENFILE
	}
	return 0
}

func (v *View) giveFile() {
	v.host.files.open.Add(-1)
	v.handles.owner.Add(-1)
	v.handles.open.Add(-1)
}

// filesExhausted logs, once per view, that it met a bound.
func (v *View) filesExhausted(what string, n int64) {
	if v.handles.warned.CompareAndSwap(false, true) {
		v.log.Warn("open files refused: at the bound of "+what, "bound", n)
	}
}
