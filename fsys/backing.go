package fsys

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// backing is one space's real directory. Every path in it is reached
// beneath its root with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), never
// by joining strings: a symlink that another process swaps into the tree
// makes the resolution fail instead of leading out.
type backing struct {
	dir  string
	real string // the root's absolute path as the kernel names it
	// above: the directory whose ancestors a native walk crosses (real,
	// or the backing tree a staged layer is merged over).
	above string
	// merged: a staged layer merged over a backing tree by overlayfs,
	// which reports to inotify only what is changed through it: its
	// directories are watched in the backing tree (above), node.watch.
	merged bool
	// lowerDev: a merged backing's backing tree's device (linkFS).
	lowerDev uint64
	// gens and curMnt: a merged backing's mounts (remount.go);
	// remounting: a remount may have detached the current one.
	gens       atomic.Pointer[mergedGens]
	curMnt     atomic.Uint64
	remounting atomic.Bool
	fd         int // O_PATH directory fd of the root (a merged one's is repointed by Remount)
	dev        uint64
	root       unix.Stat_t
	key        backingKey
	// local: a filesystem whose attributes the kernel always has current
	// (statName answers from one statx); others are asked again.
	local bool
	set   *backingSet // the host's set it is shared in
	refs  int         // views using it; guarded by set.mu
}

// backingKey names a directory as the kernel does: the same inode through
// the same mount (a bind mount elsewhere may differ in its flags).
type backingKey struct{ dev, ino, mnt uint64 }

// openBacking opens the backing directory dir, or takes a copy of root
// (when positive), a descriptor of the directory dir names.
func openBacking(dir string, root int) (*backing, error) {
	var fd int
	var err error
	if root > 0 {
		fd, err = unix.FcntlInt(uintptr(root), unix.F_DUPFD_CLOEXEC, 0)
	} else {
		fd, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open backing directory %s: %w", dir, err)
	}
	b := &backing{dir: dir, fd: fd}
	if err := unix.Fstat(fd, &b.root); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat backing directory %s: %w", dir, err)
	}
	b.dev = b.root.Dev
	b.key = backingKey{dev: b.root.Dev, ino: b.root.Ino}
	var stx unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx) == nil && stx.Mask&unix.STATX_MNT_ID != 0 {
		b.key.mnt = stx.Mnt_id
	}
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) == nil {
		b.local = localFS(int64(sfs.Type))
	}
	real, err := os.Readlink(procPath(fd))
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("resolve backing directory %s: %w", dir, err)
	}
	b.real, b.above = real, real
	return b, nil
}

// localFS reports the filesystems whose statx with AT_STATX_DONT_SYNC
// gives the same attributes as one without: they have no server to ask.
func localFS(magic int64) bool {
	switch magic {
	case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC, unix.TMPFS_MAGIC,
		unix.F2FS_SUPER_MAGIC, unix.OVERLAYFS_SUPER_MAGIC,
		0x2fc12fc1, // zfs
		0xca451a4e: // bcachefs
		return true
	}
	return false
}

// statName stats name beneath dirfd, a directory of b, never asking
// another filesystem mounted on it: any user may mount a FUSE filesystem on
// a directory of its own (fusermount3 is setuid), and a stat of a
// mountpoint is answered by the mounted filesystem's server; one that
// never answers would hold a daemon thread, its view's listing and every
// reload after it forever. AT_STATX_DONT_SYNC answers from
// what the kernel has, the mount id tells a mountpoint (refused with
// EXDEV, as openat2 with RESOLVE_NO_XDEV refuses it), and a name of b's
// own filesystem is stated again, in full, where that has a server.
func (b *backing) statName(dirfd int, name string, st *unix.Stat_t) error {
	var stx unix.Statx_t
	const flags = unix.AT_SYMLINK_NOFOLLOW | unix.AT_STATX_DONT_SYNC | unix.AT_NO_AUTOMOUNT
	if err := unix.Statx(dirfd, name, flags, unix.STATX_BASIC_STATS|unix.STATX_MNT_ID, &stx); err != nil {
		return err
	}
	if b.key.mnt != 0 && stx.Mask&unix.STATX_MNT_ID != 0 && !b.ownMount(stx.Mnt_id) {
		return unix.EXDEV
	}
	if !b.local || stx.Mask&unix.STATX_BASIC_STATS != unix.STATX_BASIC_STATS {
		err := unix.Fstatat(dirfd, name, st, unix.AT_SYMLINK_NOFOLLOW)
		st.Dev = b.canonDev(st.Dev)
		return err
	}
	*st = unix.Stat_t{
		Dev: b.canonDev(unix.Mkdev(stx.Dev_major, stx.Dev_minor)), Ino: stx.Ino, Nlink: uint64(stx.Nlink),
		Mode: uint32(stx.Mode), Uid: stx.Uid, Gid: stx.Gid, Rdev: unix.Mkdev(stx.Rdev_major, stx.Rdev_minor),
		Size: int64(stx.Size), Blksize: int64(stx.Blksize), Blocks: int64(stx.Blocks),
		Atim: unix.Timespec{Sec: stx.Atime.Sec, Nsec: int64(stx.Atime.Nsec)},
		Mtim: unix.Timespec{Sec: stx.Mtime.Sec, Nsec: int64(stx.Mtime.Nsec)},
		Ctim: unix.Timespec{Sec: stx.Ctime.Sec, Nsec: int64(stx.Ctime.Nsec)},
	}
	return nil
}

// ancestorsSearchable checks, as the current thread's credentials, that
// the directories above the root may be searched: the view starts below
// them, but a native walk would cross them.
func (b *backing) ancestorsSearchable() error {
	parent := filepath.Dir(b.above)
	return unix.Faccessat2(unix.AT_FDCWD, parent, unix.X_OK, unix.AT_EACCESS)
}

// spacePath names what fd is open on now, as a canonical path in this
// space, whatever renames happened since it was opened (through any view or
// in the backing tree), and gives its link count. unlinked reports a file
// with no name left (p is then empty); ok is false when the file has left
// the space or cannot be named (the name it was opened by is gone but
// another remains: which one is not known, so nothing is assumed).
func (b *backing) spacePath(fd int) (p string, nlink uint64, unlinked, ok bool) {
	return b.spacePathSeen(fd, "")
}

// spacePathSeen is spacePath for a descriptor the view last saw under the
// name seen ("" for none): a descriptor of a detached mount (pastMount)
// whose name there is not the file's any more has the name seen, where
// the current mount has the same file there.
func (b *backing) spacePathSeen(fd int, seen string) (p string, nlink uint64, unlinked, ok bool) {
	var st unix.Stat_t
	if err := b.fstat(fd, &st); err != nil {
		return "", 0, false, false
	}
	if st.Nlink == 0 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", 0, true, true
	}
	var buf [unix.PathMax]byte
	n, err := unix.Readlink(procPath(fd), buf[:])
	if err != nil || n >= len(buf) {
		return "", 0, false, false
	}
	abs := string(buf[:n])
	var rel string
	past := false
	switch {
	case b.merged && b.real != "/":
		// The mount fd is on says how its name reads: the current one,
		// attached at the merged directory, names it beneath b.real; any
		// other of the layer's (detached by a remount) from its own root.
		// The text alone cannot tell (a detached mount's name may begin
		// with b.real's), nor can the mount while a remount replaces it
		// (detached before the root is swapped): the name is then read
		// as the current mount's only if that mount holds the file there.
		mnt, own := b.mountOf(fd)
		if !own || !strings.HasPrefix(abs, "/") {
			return "", 0, false, false
		}
		beneath, under := "", false
		switch {
		case abs == b.real:
			beneath, under = "/", true
		case strings.HasPrefix(abs, b.real+"/"):
			beneath, under = abs[len(b.real):], true
		}
		cur := mnt == b.curMnt.Load()
		switch {
		case cur && under && !b.remounting.Load():
			rel = beneath
		case cur && under && b.isAt(beneath, &st, fd):
			rel = beneath
		default:
			rel, past = abs, true
		}
	case abs == b.real:
		rel = "/"
	case b.real == "/" && strings.HasPrefix(abs, "/"):
		// A merged root attached nowhere (an unprivileged daemon's
		// layer) is "/" too: what a mount before it holds is named from
		// that mount's root, as a detached mount's is.
		rel, past = abs, b.pastMount(fd)
	case strings.HasPrefix(abs, b.real) && len(abs) > len(b.real) && abs[len(b.real)] == '/':
		rel = abs[len(b.real):]
	default:
		return "", 0, false, false
	}
	if strings.HasSuffix(abs, " (deleted)") && !b.isAt(rel, &st, fd) {
		// The name it was opened by is gone (a file may really be called
		// so: only the inode at that path can tell).
		if st.Nlink == 0 {
			return "", 0, true, true
		}
		return "", 0, false, false
	}
	if past && !b.isAt(rel, &st, fd) {
		// A detached mount never sees a rename made through the current
		// one (a node looked up before the remount opens through it
		// still): the name it gives is the file's only if the current
		// mount has the same file there, and so is the name the view
		// last saw; else which name it has now is not known, and nothing
		// is assumed.
		if seen == "" || !b.isAt(seen, &st, fd) {
			return "", 0, false, false
		}
		rel = seen
	}
	return rel, uint64(st.Nlink), false, true
}

// isAt reports whether rel names the inode st stands for, looked up
// beneath the root and never across a mount: an lstat of the absolute
// path would cross a FUSE mount a user made on a directory above a file
// it named "f (deleted)", and every revocation (each reload, switch and
// rename) would hang on its server.
//
// st is of the file open on fd: a merged backing's copy of a backing file
// has another number on a mount after the one it was copied up on, and is
// then known by its birth time (sameFile).
func (b *backing) isAt(rel string, st *unix.Stat_t, fd int) bool {
	at, err := b.open(rel, unix.O_PATH, 0)
	if err != nil {
		return false
	}
	defer unix.Close(at)
	var ast unix.Stat_t
	if b.fstat(at, &ast) != nil {
		return false
	}
	if ast.Dev == st.Dev && ast.Ino == st.Ino {
		return true
	}
	if !b.merged {
		return false
	}
	x, err := b.identify(fd)
	if err != nil {
		return false
	}
	y, err := b.identify(at)
	return err == nil && sameFile(x, y)
}

// linkFS names the filesystem whose link counts b's files have, by its
// device and a directory on it, for the link watch: b's own, or a merged
// backing's backing tree. What the session has not changed in the layer is
// the backing tree's inode there, with its link count (index=off, no
// hard-link index), and nothing links a file of the layer: Link refuses
// (EXDEV), and the layer's own directory is the daemon's.
func (b *backing) linkFS() (dev uint64, dir string) {
	if b.merged {
		return b.lowerDev, b.above
	}
	return b.dev, b.real
}

// backingSet holds a host's open backing directories, shared by every view
// over the same directory: a session then costs no descriptor of its own,
// and a node holds thousands. Its lock guards the map alone: a directory
// is opened, and named, before it is taken, so a backing that hangs in open
// or stat blocks only the view that names it.
type backingSet struct {
	mu sync.Mutex
	m  map[backingKey]*backing
}

// acquire is openBacking, sharing the open directory when another view
// already has the same one; release gives it back.
func (s *backingSet) acquire(dir string) (*backing, error) { return s.acquireOver(dir, 0, "") }

// acquireOver is acquire for a directory merged over the directory over
// (when set): callers' search permission is checked above over. root,
// when positive, is a descriptor of dir (openBacking).
func (s *backingSet) acquireOver(dir string, root int, over string) (*backing, error) {
	b, err := openBacking(dir, root)
	if err != nil {
		return nil, err
	}
	if over != "" {
		abs, err := filepath.Abs(over)
		if err != nil {
			unix.Close(b.fd)
			return nil, fmt.Errorf("backing directory %s: %w", over, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(abs, &st); err != nil {
			unix.Close(b.fd)
			return nil, fmt.Errorf("backing directory %s: %w", over, err)
		}
		b.above, b.merged, b.lowerDev = abs, true, st.Dev
		b.initGens()
		b.curMnt.Store(b.key.mnt)
	}
	s.mu.Lock()
	if old, ok := s.m[b.key]; ok {
		old.refs++
		s.mu.Unlock()
		unix.Close(b.fd)
		return old, nil
	}
	if s.m == nil {
		s.m = map[backingKey]*backing{}
	}
	b.set, b.refs = s, 1
	s.m[b.key] = b
	s.mu.Unlock()
	return b, nil
}

func (b *backing) release() {
	s := b.set
	s.mu.Lock()
	if b.refs--; b.refs > 0 {
		s.mu.Unlock()
		return
	}
	if s.m[b.key] == b {
		delete(s.m, b.key)
	}
	s.mu.Unlock()
	unix.Close(b.fd)
}

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// open opens rel (a canonical space path, "/" for the root) beneath the
// root, never following a symlink: one on the way fails with ELOOP, and so
// does one as the last component, unless flags has O_PATH, which then
// opens the link itself (what prepare uses to see a symlink).
func (b *backing) open(rel string, flags int, mode uint32) (int, error) {
	p := strings.TrimPrefix(rel, "/")
	if p == "" {
		p = "."
	}
	for {
		fd, err := unix.Openat2(b.fd, p, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
			Mode:    uint64(mode),
			Resolve: resolveFlags,
		})
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			// The kernel asks to retry a resolution that raced with a
			// rename; RESOLVE_BENEATH refuses to guess.
			continue
		}
		return fd, err
	}
}

// openDir opens the directory rel as an O_PATH fd (the root's own fd is
// duplicated so that callers can always close what they get).
func (b *backing) openDir(rel string) (int, error) {
	return b.open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
}

func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// reopen opens the inode an O_PATH fd stands for, with real access flags,
// through /proc/self/fd: the same inode, never whatever now has its name.
// The kernel checks the current thread's credentials against it.
func reopen(pathFD int, flags int) (int, error) {
	for {
		fd, err := unix.Open(procPath(pathFD), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// split returns the parent path and the last name of a canonical path.
func split(p string) (dir, name string) {
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return "/", p[i+1:]
	}
	return p[:i], p[i+1:]
}

// join joins a canonical directory path and a name.
func join(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(unix.Errno); ok {
		return e
	}
	if pe, ok := err.(*os.PathError); ok {
		if e, ok := pe.Err.(unix.Errno); ok {
			return e
		}
	}
	return unix.EIO
}
