package fsys

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// fileHandle is an open regular file. Every read, write, attribute and
// lock call that reaches the daemon decides again (a lock's release
// excepted, node_locks.go), for the path the file has now in
// the backing tree (found from its fd, so renames through any view count),
// in the session's current context.
//
// Every file uses the page cache, ruled or not, so that shared mmap works
// everywhere: when a context switch, a reload or a rename through any view
// makes an open file denied, its cached pages (mmap'd ones included) are
// dropped before the call returns (revoke), so the next read or page fault
// comes here and fails (a fault with SIGBUS). Closed files' pages stay
// cached, but reaching them takes an OPEN, which is decided here. There is
// no kernel passthrough: a passthrough handle can never be cut off.
type fileHandle struct {
	node  *node
	fd    int
	lf    *fs.LoopbackFile // read, write, locks, seek, allocate on fd
	ruled bool
	// writable: opened for writing, which a path a run may execute
	// (decision.readOnly) never is.
	writable bool

	// fdMu keeps fd open while decide reads it: revoke may decide a
	// handle it listed just before RELEASE closed it, and the fd's number
	// may belong to another open by then.
	fdMu     sync.RWMutex
	released bool

	// moves counts the renames that may have moved the file (revokeMoved).
	moves atomic.Uint64

	// A handle decides again (finding its path from its fd) only after
	// an event that can change its decision: a switch or reload of its
	// view (its authority.changes), a rename that may have moved it (moves). Between
	// events its last decision stands; a change made directly in the
	// backing tree, not through a view, is seen at the next event.
	mu     sync.Mutex
	last   string // the last path seen, for a file that has lost its name
	gen    uint64 // authority.changes when vis was decided
	seen   uint64 // moves when vis was decided
	cached bool
	vis    bool
}

var (
	_ fs.FileReader    = (*fileHandle)(nil)
	_ fs.FileWriter    = (*fileHandle)(nil)
	_ fs.FileFlusher   = (*fileHandle)(nil)
	_ fs.FileFsyncer   = (*fileHandle)(nil)
	_ fs.FileReleaser  = (*fileHandle)(nil)
	_ fs.FileGetattrer = (*fileHandle)(nil)
	_ fs.FileSetattrer = (*fileHandle)(nil)
	_ fs.FileLseeker   = (*fileHandle)(nil)
	_ fs.FileAllocater = (*fileHandle)(nil)
	_ fs.FileGetlker   = (*fileHandle)(nil)
	_ fs.FileSetlker   = (*fileHandle)(nil)
	_ fs.FileSetlkwer  = (*fileHandle)(nil)
)

// newHandle wraps an fd opened on n for t, holding a descriptor of the
// view's (takeFile) that Release gives back, and registers it for
// revocation. A switch, reload or rename that began after t was decided may
// have looked for open files (revoke) before this one was registered: the
// handle is then decided again, and the kernel drops the file's cached
// pages at open (no FOPEN_KEEP_CACHE), so nothing cached under the old
// decision is read through it.
func (n *node) newHandle(fd int, t *target, flags uint32) (*fileHandle, uint32, syscall.Errno) {
	h := &fileHandle{node: n, fd: fd, lf: fs.NewLoopbackFile(fd).(*fs.LoopbackFile), ruled: t.ruled, last: t.path,
		writable: flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0}
	if h.writable {
		n.writers.Add(1)
	}
	n.view.handles.add(h)
	if n.view.generation() != t.gen {
		if !h.decide(true) {
			h.Release(context.Background())
			return nil, 0, syscall.EACCES
		}
		return h, 0, 0
	}
	return h, fuse.FOPEN_KEEP_CACHE, 0
}

// decide re-decides the handle in the current context. A file that lost its
// name keeps the authority of its last one; a file moved out of its space,
// or one that has gained a second name in a space with rules (the other may
// be protected, as the view's hiding rules say), has none.
func (h *fileHandle) decide(audit bool) bool {
	v := h.node.view
	if v.closed.Load() {
		return false
	}
	// The counts are read before the snapshot: a decision made while an
	// event happens is kept under the older count, so the next call
	// decides again.
	g, m := v.authz.changes.Load(), h.moves.Load()
	h.mu.Lock()
	if h.cached && h.gen == g && h.seen == m {
		vis, p := h.vis, h.last
		h.mu.Unlock()
		if !vis && audit {
			v.auditDeny(v.Context(), h.node.space, p, opIO.String())
		}
		return vis
	}
	h.mu.Unlock()
	b := h.node.backing()
	h.fdMu.RLock()
	if h.released {
		h.fdMu.RUnlock()
		return false
	}
	h.mu.Lock()
	seen := h.last
	h.mu.Unlock()
	p, nlink, unlinked, ok := b.spacePathSeen(h.fd, seen)
	h.fdMu.RUnlock()
	h.mu.Lock()
	switch {
	case ok && !unlinked:
		h.last = p
	case ok && unlinked:
		p = h.last
	}
	h.mu.Unlock()
	d := v.decision()
	vis := d.handle(h.node.space, p, nlink, ok, h.writable || h.node.writers.Load() > 0)
	h.mu.Lock()
	h.gen, h.seen, h.cached, h.vis = g, m, true, vis
	h.mu.Unlock()
	if !vis && audit {
		v.auditDeny(d.atoms, h.node.space, p, opIO.String())
	}
	return vis
}

// Read reads into buf here, holding a place among the requests acting
// (acting.go), rather than handing go-fuse the fd to read (or splice) from
// when it writes the reply, which no bound would cover.
func (h *fileHandle) Read(ctx context.Context, buf []byte, off int64) (res fuse.ReadResult, errno syscall.Errno) {
	h.node.view.stats.reads.Add(1)
	if !h.decide(true) {
		return nil, syscall.EACCES
	}
	errno = h.node.view.acts(func() syscall.Errno {
		return h.withFD(func(fd int) syscall.Errno {
			for {
				n, err := unix.Pread(fd, buf, off)
				if err == unix.EINTR {
					continue
				}
				if err != nil {
					return errnoOf(err)
				}
				res = fuse.ReadResultData(buf[:n])
				return 0
			}
		})
	})
	return res, errno
}

// withFD runs f on h's fd unless h was released (EBADF): never on a number
// closed since, maybe another open's by then.
func (h *fileHandle) withFD(f func(fd int) syscall.Errno) syscall.Errno {
	h.fdMu.RLock()
	defer h.fdMu.RUnlock()
	if h.released {
		return syscall.EBADF
	}
	return f(h.fd)
}

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (n uint32, errno syscall.Errno) {
	if !h.decide(true) {
		return 0, syscall.EACCES
	}
	rec, p, errno := h.writing()
	if errno != 0 {
		return 0, errno
	}
	errno = h.change(ctx, func() (errno syscall.Errno) {
		n, errno = h.lf.Write(ctx, data, off)
		return errno
	})
	h.wrote(rec, p)
	return n, errno
}

// Flush answers ENOSYS, which tells the kernel to send no FLUSH again on
// this connection: a round trip saved on every close(2). Nothing is lost:
// writes reach the backing file as they are made (no write-back cache),
// and POSIX locks, held as OFD locks on the handle's fd (go-fuse), go when
// RELEASE closes it, as they did when FLUSH only closed a dup.
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno { return syscall.ENOSYS }

// Release closes the handle's fd through lf, which owns it: an os.File
// left open closes its number again when collected, by then maybe another
// open's.
func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	return h.node.view.acts(func() syscall.Errno { return h.release(ctx) })
}

// release gives back what h holds, once: at RELEASE, or when its view's
// own connection ends, whose queued RELEASEs the kernel drops (a session
// closed while its files were open kept its owner's count of open files
// taken for good: TestLostReleasesReturnTheirRoomPerSession).
func (h *fileHandle) release(ctx context.Context) syscall.Errno {
	h.fdMu.Lock()
	defer h.fdMu.Unlock()
	if h.released {
		return 0
	}
	h.released = true
	v := h.node.view
	v.handles.remove(h)
	if h.writable {
		h.node.writers.Add(-1)
	}
	defer v.giveFile()
	return h.lf.Release(ctx)
}

func (h *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.node.view.acts(func() syscall.Errno { return h.lf.Fsync(ctx, flags) })
}

func (h *fileHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	if !h.decide(false) {
		return syscall.EACCES
	}
	var st unix.Stat_t
	fstat := func(fd int) syscall.Errno { return errnoOf(unix.Fstat(fd, &st)) }
	if errno := h.node.view.acts(func() syscall.Errno { return h.withFD(fstat) }); errno != 0 {
		return errno
	}
	out.FromStat(toSyscall(&st))
	if ttl := h.node.attrTTL(false, h.ruled); ttl > 0 {
		out.SetTimeout(ttl)
	}
	return 0
}

// Setattr through a handle (ftruncate, fchmod, futimens) runs as the
// caller: the kernel checks ownership against the caller, not the daemon.
func (h *fileHandle) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	a, errno := h.node.view.become(ctx)
	if errno != 0 {
		return errno
	}
	defer a.restore()
	if !h.decide(true) {
		return syscall.EACCES
	}
	h.mu.Lock()
	p := h.last
	h.mu.Unlock()
	if d := h.node.view.decision(); d.readOnly(h.node.space, p) {
		// fchmod and futimens work through a read-only descriptor.
		h.node.view.auditDeny(d.atoms, h.node.space, p, opMutate.String())
		return syscall.EROFS
	}
	rec, p, errno := h.writing()
	if errno != 0 {
		return errno
	}
	defer h.wrote(rec, p)
	var st unix.Stat_t
	errno = h.withFD(func(fd int) syscall.Errno {
		if errno := setattrFD(fd, in, false); errno != 0 {
			return errno
		}
		return errnoOf(unix.Fstat(fd, &st))
	})
	if errno != 0 {
		return errno
	}
	out.FromStat(toSyscall(&st))
	return 0
}

func (h *fileHandle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if !h.decide(true) {
		return 0, syscall.EACCES
	}
	var n uint64
	errno := h.node.view.acts(func() (errno syscall.Errno) {
		n, errno = h.lf.Lseek(ctx, off, whence)
		return errno
	})
	return n, errno
}

func (h *fileHandle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if !h.decide(true) {
		return syscall.EACCES
	}
	if b := h.node.backing(); b != nil && b.merged {
		// One call would reserve any number of blocks in the state
		// directory, with KEEP_SIZE counted by no file's size: a staged
		// layer holds only what is written (posix_fallocate then writes).
		return syscall.EOPNOTSUPP
	}
	rec, p, errno := h.writing()
	if errno != 0 {
		return errno
	}
	defer h.wrote(rec, p)
	return h.change(ctx, func() syscall.Errno { return h.lf.Allocate(ctx, off, size, mode) })
}

var _ = (fs.NodeOpener)((*node)(nil))

// openFlags are the access flags a view passes on to the backing open:
// never create, never a controlling terminal; O_NOFOLLOW is the opener's
// business (a reopen through /proc/self/fd must follow that magic link).
func openFlags(flags uint32) int {
	return int(flags &^ (syscall.O_CREAT | syscall.O_EXCL | syscall.O_NOCTTY | syscall.O_NOFOLLOW | fuse.FMODE_EXEC))
}

// Open opens the file the node stands for. Only regular files are opened:
// a FIFO would block the daemon, a device would run its driver for the
// caller.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	op := opLookup
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		op = opMutate
	}
	var fh *fileHandle
	var fflags uint32
	errno := n.leased(ctx, func() syscall.Errno {
		t, errno := n.enter(ctx, op, "")
		if errno != 0 {
			return errno
		}
		defer t.leave()
		fh, fflags, errno = n.openEntry(&t, flags)
		return errno
	})
	if errno != 0 {
		return nil, 0, errno
	}
	return fh, fflags, 0
}

// leased runs op, which opens a backing file without blocking, and while
// it answers EAGAIN (someone holds a lease on the file, and the kernel has
// begun to break it) waits for the break without an acting place: open(2)
// would wait in break_lease for /proc/sys/fs/lease-break-time (45 s)
// holding the place, and any uid may take a lease on its own files, so 16
// leased files would hold every place of the daemon. A holder that takes
// a new lease at each break (a blocked open(2) would have kept it from
// that) is waited for no longer than a break takes: then EAGAIN.
func (n *node) leased(ctx context.Context, op func() syscall.Errno) syscall.Errno {
	errno := op()
	if errno != syscall.EAGAIN {
		return errno
	}
	return n.view.waitRetry(ctx, syscall.EAGAIN, time.Now().Add(leaseBreakTime()), op)
}

// leaseBreakTime is how long the kernel lets a lease holder take to
// release (/proc/sys/fs/lease-break-time; 45 s when it cannot be read).
func leaseBreakTime() time.Duration {
	b, err := os.ReadFile("/proc/sys/fs/lease-break-time")
	if err != nil {
		return 45 * time.Second
	}
	s, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || s < 0 {
		return 45 * time.Second
	}
	return time.Duration(s) * time.Second
}

// openEntry opens a resolved regular file with real access flags, through
// its O_PATH fd (the same inode), and wraps it.
func (n *node) openEntry(t *target, flags uint32) (*fileHandle, uint32, syscall.Errno) {
	if t.st.Mode&unix.S_IFMT != unix.S_IFREG {
		n.view.auditDeny(t.d.atoms, n.space, t.path, "open of a special file")
		return nil, 0, syscall.EACCES
	}
	// overlayfs copies a file into a staged layer when it is opened for
	// writing: the layer notes what the backing tree held then, so that a
	// commit finds another writer's later change a conflict, whether or
	// not the session wrote.
	if flags&syscall.O_TRUNC != 0 || flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 && t.b.merged {
		rec, errno := n.view.changing(n.space, t.path)
		if errno != 0 {
			return nil, 0, errno
		}
		defer changed(rec, n.space, t.path)
	}
	if errno := n.view.takeFile(); errno != 0 {
		return nil, 0, errno
	}
	fd, errno := n.reopenChecked(t, flags)
	if errno != 0 {
		n.view.giveFile()
		return nil, 0, errno
	}
	return n.newHandle(fd, t, flags)
}

// reopenChecked opens t's file with flags for a handle, unless a hard link
// made since prepare hides it or a handle from before its listing writes
// it.
func (n *node) reopenChecked(t *target, flags uint32) (int, syscall.Errno) {
	// O_NONBLOCK: a lease being broken answers EAGAIN (leased); on a
	// regular file it changes nothing else.
	fd, err := reopen(t.fd, openFlags(flags)|unix.O_NONBLOCK)
	if err != nil {
		return -1, errnoOf(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, errnoOf(err)
	}
	// A hard link made since prepare must not open a protected file, nor
	// a handle read a file a run may execute while one writes it.
	if t.d.hides(n.space, t.path, &st, nil) {
		unix.Close(fd)
		return -1, syscall.EACCES
	}
	if n.writers.Load() > 0 && t.d.readOnly(n.space, t.path) {
		n.view.auditDeny(t.d.atoms, n.space, t.path, "open while a handle from before its listing writes it")
		unix.Close(fd)
		return -1, syscall.EACCES
	}
	return fd, 0
}
