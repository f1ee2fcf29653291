package fsys

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// A remount moves the view's open files onto the new mount. Left on the
// mount it was opened on, a descriptor would go on working there, but
// wrongly: each mount of a layer has inodes of its own, so a lock held on
// the old mount's inode excludes nothing opened on the new one (two sqlite
// processes, one from before a remount, corrupt their database), and the
// old mount never sees a rename made through the new one, so the file's
// name there is not known and the descriptor is refused (spacePathSeen).
//
// Moving a handle opens the file again on the new mount, by the name the
// old mount gives it, only if that name holds the same file there (the
// same inode, as the view names it across mounts, canonDev, and the same
// change time: sameFile); with the same
// access mode and status flags, at the same offset, holding the same
// locks (read from /proc/self/fdinfo: the kernel's own list of the locks
// the open file description holds), and puts it in place of the old
// description with dup3, so the handle's descriptor number never changes
// under a call. The view is held back while this runs (remountMu): no
// lock request, and no write of a caller other than root, runs at the
// same time; a read that does (it holds only the handle's fdMu shared) is
// served whole by either mount, and both show the same content.
//
// A handle that cannot be moved stays where it is, as before: a file the
// remount's edit removed from the layer (a commit, a discard, a rollback
// that made it anew) has no name left on the old mount (its link count is
// 0), and reads and writes the inode it opened; one whose name holds
// another file now is decided as spacePathSeen says.

// moveHandles moves the open files of space sp that are on a mount of b
// other than its current one (b's root was just swapped) onto it, and
// counts those moved and those left where they are.
//
// A node whose open file stays behind is not the node of what its number
// names on the new mount: the file the remount took out of the layer has
// no name there, and a backing file of the same number (overlayfs numbers a
// copy as the backing file it came from on the mount it was copied up on)
// may be shown at another. go-fuse would give that file the same node, and
// the kernel one page cache: the kept file's reads, refused by the daemon,
// would be answered from the other file's pages. Such a number's later
// nodes get a generation of their own.
func (v *View) moveHandles(sp space, b *backing) (moved, kept int) {
	for _, h := range v.handles.all() {
		if h.node.space != sp {
			continue
		}
		switch h.moveTo(b) {
		case handleMoved:
			moved++
		case handleKept:
			kept++
			v.renumbered.bump(h.node.StableAttr())
		}
	}
	return moved, kept
}

// renumbered counts, per inode number (StableAttr.Ino), how often a node of
// it was left holding a file on a detached mount.
type renumbered struct {
	n atomic.Int32 // entries in m: a view with none pays one load
	m sync.Map     // uint64 → uint64
}

// bump makes the number's next nodes differ from a (and from every node
// it had before).
func (r *renumbered) bump(a fs.StableAttr) {
	g := r.of(a.Ino) + 1
	if _, loaded := r.m.Swap(a.Ino, g); !loaded {
		r.n.Add(1)
	}
}

// of is the number's generation offset (0 for most).
func (r *renumbered) of(ino uint64) uint64 {
	if r.n.Load() == 0 {
		return 0
	}
	g, _ := r.m.Load(ino)
	n, _ := g.(uint64)
	return n
}

const (
	handleStays = iota // on the current mount already, or released
	handleMoved
	handleKept // could not be moved
)

// moveTo moves h onto b's current mount.
func (h *fileHandle) moveTo(b *backing) int {
	h.fdMu.Lock()
	defer h.fdMu.Unlock()
	if h.released || !b.pastMount(h.fd) {
		return handleStays
	}
	p, _, unlinked, ok := b.spacePathSeen(h.fd, "")
	if !ok || unlinked {
		return handleKept
	}
	fd, err := b.openAgain(h.fd, p)
	if err != nil {
		h.node.view.log.Debug("remount: an open file stays on the old mount", "path", p, "err", err)
		return handleKept
	}
	defer unix.Close(fd)
	if err := unix.Dup3(fd, h.fd, unix.O_CLOEXEC); err != nil {
		return handleKept
	}
	h.mu.Lock()
	h.last = p
	h.mu.Unlock()
	return handleMoved
}

// errMoved: the name the old mount gives a file holds another one on the
// new mount.
var errMoved = errors.New("the name holds another file on the new mount")

// openAgain opens the file at p on b's current mount as old is open: the
// same access mode and status flags, offset and locks. p must hold the
// file old is open on (sameFile), checked before it is opened: opened for
// writing, a backing file would be copied up into the layer.
func (b *backing) openAgain(old int, p string) (int, error) {
	info, err := readFDInfo(old)
	if err != nil {
		return -1, err
	}
	st, err := b.identify(old)
	if err != nil {
		return -1, err
	}
	pfd, err := b.open(p, unix.O_PATH, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if at, err := b.identify(pfd); err != nil || !sameFile(st, at) {
		return -1, errMoved
	}
	fd, err := reopen(pfd, info.flags)
	if err != nil {
		return -1, err
	}
	if at, err := b.identify(fd); err != nil || !sameFile(st, at) {
		unix.Close(fd)
		return -1, errMoved
	}
	for _, lk := range info.locks {
		if err := lk.take(fd); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("take its lock again: %w", err)
		}
	}
	if _, err := unix.Seek(fd, info.pos, 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// fileID is what tells a regular file of a merged backing from another
// across its mounts.
type fileID struct {
	dev, ino     uint64
	btime, ctime unix.StatxTimestamp
	hasBtime     bool
	regular      bool
}

// identify reads fd's fileID (its device as the view names it).
func (b *backing) identify(fd int) (fileID, error) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW,
		unix.STATX_TYPE|unix.STATX_INO|unix.STATX_CTIME|unix.STATX_BTIME, &stx); err != nil {
		return fileID{}, err
	}
	return fileID{dev: b.canonDev(unix.Mkdev(stx.Dev_major, stx.Dev_minor)), ino: stx.Ino,
		btime: stx.Btime, ctime: stx.Ctime, hasBtime: stx.Mask&unix.STATX_BTIME != 0,
		regular: stx.Mode&unix.S_IFMT == unix.S_IFREG}, nil
}

// sameFile: a and b are one regular file. Both are read from the real
// file (the layer's, or the backing tree's), with the view held back. A
// file overlayfs copied up during a mount keeps, on that mount, the
// number of the backing file it came from, and has its own (its upper
// inode's) on the next: the birth time, with the change time, is then
// what tells the copy (born at its copy-up) from any other file, the
// backing file it came from included. Otherwise the number and the change
// time do.
func sameFile(a, b fileID) bool {
	if !a.regular || !b.regular || a.dev != b.dev || a.ctime != b.ctime {
		return false
	}
	return a.ino == b.ino || a.hasBtime && b.hasBtime && a.btime == b.btime
}

// fdInfo is what /proc/self/fdinfo tells of an open file description.
type fdInfo struct {
	pos   int64
	flags int // the access mode and the status flags kept by a reopen
	locks []heldLock
}

// keptFlags are the flags an open file description is opened again with.
const keptFlags = unix.O_ACCMODE | unix.O_APPEND | unix.O_NONBLOCK | unix.O_DIRECT | unix.O_NOATIME | unix.O_SYNC | unix.O_DSYNC | unix.O_LARGEFILE

// heldLock is a lock an open file description holds: a flock(2) lock, or
// an OFD record lock from start to end (end < 0: to the end of file).
// go-fuse takes POSIX locks as OFD locks of the handle's descriptor.
type heldLock struct {
	flock      bool
	write      bool
	start, end int64
}

func (l heldLock) take(fd int) error {
	if l.flock {
		op := unix.LOCK_SH
		if l.write {
			op = unix.LOCK_EX
		}
		return unix.Flock(fd, op|unix.LOCK_NB)
	}
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0, Start: l.start}
	if l.write {
		lk.Type = unix.F_WRLCK
	}
	if l.end >= 0 {
		lk.Len = l.end - l.start + 1
	}
	return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
}

// readFDInfo reads fd's entry in /proc/self/fdinfo. A lock of a kind a
// view's descriptor never holds (a process-owned POSIX lock, a lease), or
// a line it cannot read, is an error: the description is not opened again
// without it.
func readFDInfo(fd int) (fdInfo, error) {
	var info fdInfo
	data, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return info, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	seen := 0
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case "pos":
			info.pos, err = strconv.ParseInt(val, 10, 64)
			seen |= 1
		case "flags":
			var fl int64
			fl, err = strconv.ParseInt(val, 8, 64)
			info.flags = int(fl) & keptFlags
			seen |= 2
		case "lock":
			var lk heldLock
			lk, err = parseLock(val)
			info.locks = append(info.locks, lk)
		}
		if err != nil {
			return info, fmt.Errorf("fdinfo %q: %w", sc.Text(), err)
		}
	}
	if seen != 3 {
		return info, fmt.Errorf("fdinfo of %d has no pos or flags", fd)
	}
	return info, nil
}

// parseLock reads a lock line of fdinfo (fs/locks.c, lock_get_status):
// "1: OFDLCK ADVISORY  WRITE -1 fe:00:123 10 14", "1: FLOCK  ADVISORY
// WRITE 3033 fe:00:123 0 EOF".
func parseLock(s string) (heldLock, error) {
	f := strings.Fields(s)
	if len(f) != 8 || f[2] != "ADVISORY" {
		return heldLock{}, errors.New("not a lock line")
	}
	var lk heldLock
	switch f[1] {
	case "FLOCK":
		lk.flock = true
	case "OFDLCK":
	default:
		return heldLock{}, fmt.Errorf("a %s lock", f[1])
	}
	switch f[3] {
	case "WRITE":
		lk.write = true
	case "READ":
	default:
		return heldLock{}, fmt.Errorf("a %s lock", f[3])
	}
	var err error
	if lk.start, err = strconv.ParseInt(f[6], 10, 64); err != nil {
		return heldLock{}, err
	}
	lk.end = -1
	if f[7] != "EOF" {
		if lk.end, err = strconv.ParseInt(f[7], 10, 64); err != nil {
			return heldLock{}, err
		}
	}
	return lk, nil
}
