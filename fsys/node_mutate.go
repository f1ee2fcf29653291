package fsys

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var (
	_ fs.NodeCreater       = (*node)(nil)
	_ fs.NodeMkdirer       = (*node)(nil)
	_ fs.NodeMknoder       = (*node)(nil)
	_ fs.NodeSymlinker     = (*node)(nil)
	_ fs.NodeUnlinker      = (*node)(nil)
	_ fs.NodeRmdirer       = (*node)(nil)
	_ fs.NodeRenamer       = (*node)(nil)
	_ fs.NodeLinker        = (*node)(nil)
	_ fs.NodeSetattrer     = (*node)(nil)
	_ fs.NodeGetxattrer    = (*node)(nil)
	_ fs.NodeSetxattrer    = (*node)(nil)
	_ fs.NodeListxattrer   = (*node)(nil)
	_ fs.NodeRemovexattrer = (*node)(nil)
)

// Every mutation runs as the caller (become), so new entries belong to the
// caller because the caller made them, and the kernel refuses what the
// caller could not do natively.

// made finishes a create-like operation: the new entry's attributes and
// its inode.
func (n *node) made(ctx context.Context, t *target, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var st unix.Stat_t
	if err := t.b.statName(t.dirfd, t.name, &st); err != nil {
		return nil, errnoOf(err)
	}
	return n.newChild(ctx, &st, t.path, t.ruled, out), 0
}

// Create makes a new file with O_EXCL: it never opens an existing file it
// did not create. A name that appeared since the kernel's lookup is opened
// as an open(2) without O_CREAT would open it (through the rules and the
// hiding rules), unless the caller asked for O_EXCL.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	t, errno := n.enter(ctx, opCreate, name)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	defer t.leave()
	rec, errno := n.view.changing(n.space, t.path)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	// The descriptor is taken before the file is made: a refusal leaves
	// nothing behind.
	if errno := n.view.takeFile(); errno != 0 {
		return nil, nil, 0, errno
	}
	fd, err := unix.Openat(t.dirfd, name, openFlags(flags)|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		n.view.giveFile() // openEntry takes its own below
	}
	if err == unix.EEXIST && flags&syscall.O_EXCL == 0 {
		e, errno := n.prepare(t.as, opLookup, name)
		if errno != 0 {
			// There is something, and the view hides it: creating over
			// a hidden name is a denial, whatever is there.
			return nil, nil, 0, syscall.EACCES
		}
		defer e.close()
		ch := n.newChild(ctx, &e.st, e.path, e.ruled, out)
		fh, fflags, errno := ch.Operations().(*node).openEntry(&e, flags&^syscall.O_CREAT)
		if errno != 0 {
			return nil, nil, 0, errno
		}
		return ch, fh, fflags, 0
	}
	if err != nil {
		return nil, nil, 0, errnoOf(err)
	}
	changed(rec, n.space, t.path)
	ch, errno := n.made(ctx, &t, out)
	if errno != 0 {
		unix.Close(fd)
		n.view.giveFile()
		return nil, nil, 0, errno
	}
	fh, fflags, errno := ch.Operations().(*node).newHandle(fd, &t, flags)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, fh, fflags, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, errno := n.enter(ctx, opCreate, name)
	if errno != 0 {
		return nil, errno
	}
	defer t.leave()
	rec, errno := n.view.changing(n.space, t.path)
	if errno != 0 {
		return nil, errno
	}
	defer changed(rec, n.space, t.path)
	if err := unix.Mkdirat(t.dirfd, name, mode); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, &t, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, errno := n.enter(ctx, opCreate, name)
	if errno != 0 {
		return nil, errno
	}
	defer t.leave()
	rec, errno := n.view.changing(n.space, t.path)
	if errno != 0 {
		return nil, errno
	}
	defer changed(rec, n.space, t.path)
	if err := unix.Mknodat(t.dirfd, name, mode, int(rdev)); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, &t, out)
}

func (n *node) Symlink(ctx context.Context, link, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, errno := n.enter(ctx, opCreate, name)
	if errno != 0 {
		return nil, errno
	}
	defer t.leave()
	if escapes(t.path, link) {
		// It would be hidden at once: refuse rather than make an entry
		// that cannot be seen.
		n.view.auditDeny(t.d.atoms, n.space, t.path, "symlink out of the space")
		return nil, syscall.EACCES
	}
	rec, errno := n.view.changing(n.space, t.path)
	if errno != 0 {
		return nil, errno
	}
	defer changed(rec, n.space, t.path)
	if err := unix.Symlinkat(link, t.dirfd, name); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, &t, out)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, name, 0)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, name, unix.AT_REMOVEDIR)
}

func (n *node) remove(ctx context.Context, name string, flags int) syscall.Errno {
	t, errno := n.enter(ctx, opMutate, name)
	if errno != 0 {
		return errno
	}
	defer t.leave()
	rec, errno := n.view.changing(n.space, t.path)
	if errno != 0 {
		return errno
	}
	defer changed(rec, n.space, t.path)
	return errnoOf(unix.Unlinkat(t.dirfd, name, flags))
}

// Rename moves a name. Both names are decided (either side of an exchange
// as a create: EACCES when denied), and a directory that holds a ruled path
// never moves, since its protected paths would walk out from under their
// rules; with RENAME_EXCHANGE that holds for both sides. Open handles on
// moved files are decided again before the rename is answered, in every
// view (revokeMoved).
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok || np.space != n.space || np.view != n.view {
		return syscall.EXDEV
	}
	a, errno := n.view.become(ctx)
	if errno != 0 {
		return errno
	}
	renamed, dev := false, uint64(0) // set once the rename is done, on filesystem dev
	defer func() {
		// After restore: revoking waits for the kernel to drop pages,
		// which may wait for READs in flight, so no place among the
		// requests acting may be held then (acting.go).
		if renamed {
			n.view.host.revokeMoved(dev)
		}
	}()
	defer a.restore()
	exchange := flags&unix.RENAME_EXCHANGE != 0
	srcOp, dstOp := opMutate, opCreate
	if exchange {
		srcOp, dstOp = opExchange, opExchange
	}
	src, errno := n.prepare(a, srcOp, name)
	if errno != 0 {
		return errno
	}
	defer src.close()
	dst, errno := np.prepare(a, dstOp, newName)
	if errno != 0 {
		return errno
	}
	defer dst.close()
	d := src.d
	if (src.isDir() || (exchange && dst.isDir())) && (d.holdsReadOnly(n.space, src.path) || d.holdsReadOnly(n.space, dst.path)) {
		n.view.auditDeny(d.atoms, n.space, src.path, "rename of a directory holding paths a run may execute")
		return syscall.EROFS
	}
	ruledUnder := d.holdsRuled(n.space, src.path) || d.holdsRuled(n.space, dst.path)
	if ruledUnder && (src.isDir() || (exchange && dst.isDir())) {
		n.view.auditDeny(d.atoms, n.space, src.path, "rename of a directory holding ruled paths")
		return syscall.EACCES
	}
	dirMoves := src.isDir() || (exchange && dst.isDir())
	rec, errno := n.view.renaming(n.space, src.path, dst.path, dirMoves, exchange)
	if errno != 0 {
		return errno
	}
	if err := unix.Renameat2(src.dirfd, name, dst.dirfd, newName, uint(flags)); err != nil {
		return errnoOf(err)
	}
	noteRenamed(rec, n.space, src.path, dst.path, dirMoves, exchange)
	n.view.renamed(&src.st, src.b, np, newName)
	if exchange {
		n.view.renamed(&dst.st, dst.b, n, name)
	}
	n.view.host.renames.Add(1)
	renamed, dev = true, src.b.dev
	if (src.isDir() || (exchange && dst.isDir())) && d.ruledSpace(n.space) {
		// The names below the directory moved with it: a switch decides
		// again whether it can change their listings (the epoch), and the
		// cached ones go after this request, since the kernel holds the
		// directories' locks until then.
		n.view.cache.lists.epoch.Add(1)
		go n.view.dropListings(nil)
	}
	return 0
}

// Link makes a hard link. In a space with rules it is refused: the new name
// would show a file whose other name may be protected. The source is the
// inode the node stands for, linked through /proc/self/fd (linkat with
// AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH, which the caller lacks).
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	tn, ok := target.(*node)
	if !ok || tn.space != n.space || tn.view != n.view {
		return nil, syscall.EXDEV
	}
	if b := n.backing(); b != nil && b.merged {
		// A staged layer is committed path by path: a second name of a
		// file would be a copy (docs/changes.md).
		return nil, syscall.EXDEV
	}
	a, errno := n.view.become(ctx)
	if errno != 0 {
		return nil, errno
	}
	defer a.restore()
	t, errno := n.prepare(a, opCreate, name)
	if errno != 0 {
		return nil, errno
	}
	defer t.close()
	if t.d.hidesLinked(n.space) {
		n.view.auditDeny(t.d.atoms, n.space, t.path, "link")
		return nil, syscall.EPERM
	}
	src, errno := tn.prepare(a, opLookup, "")
	if errno != 0 {
		return nil, errno
	}
	defer src.close()
	if src.d.readOnly(n.space, src.path) {
		// A second name of a file a run may execute would write it.
		n.view.auditDeny(src.d.atoms, n.space, src.path, "link")
		return nil, syscall.EROFS
	}
	rec, errno := n.view.changing(n.space, t.path)
	if errno != 0 {
		return nil, errno
	}
	defer changed(rec, n.space, t.path)
	if err := unix.Linkat(unix.AT_FDCWD, procPath(src.fd), t.dirfd, name, unix.AT_SYMLINK_FOLLOW); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, &t, out)
}

// Setattr changes the inode the node stands for: mode and owner through its
// O_PATH fd, size through a write open of the same inode, times by
// /proc/self/fd (a symlink's through its parent, after checking it is still
// the same inode).
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fh, ok := f.(*fileHandle); ok {
		return fh.Setattr(ctx, in, out)
	}
	// A truncate opens the file: a lease on it is waited for as an
	// open's is (leased); nothing has changed when it answers EAGAIN.
	return n.leased(ctx, func() syscall.Errno { return n.setattrPath(ctx, in, out) })
}

// setattrPath is Setattr without a handle.
func (n *node) setattrPath(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	t, errno := n.enter(ctx, opMutate, "")
	if errno != 0 {
		return errno
	}
	defer t.leave()
	rec, errno := n.view.changing(n.space, t.path)
	if errno != 0 {
		return errno
	}
	defer changed(rec, n.space, t.path)
	isLink := t.st.Mode&unix.S_IFMT == unix.S_IFLNK
	if _, ok := in.GetSize(); ok {
		if t.st.Mode&unix.S_IFMT != unix.S_IFREG {
			if t.isDir() {
				return syscall.EISDIR
			}
			return syscall.EINVAL
		}
		wfd, err := reopen(t.fd, unix.O_WRONLY|unix.O_NONBLOCK)
		if err != nil {
			return errnoOf(err)
		}
		errno := setattrFD(wfd, in, false)
		unix.Close(wfd)
		if errno != 0 {
			return errno
		}
	} else if isLink {
		if _, ok := in.GetMode(); ok {
			return syscall.EOPNOTSUPP
		}
		if errno := n.setattrLink(&t, in); errno != 0 {
			return errno
		}
	} else if errno := setattrFD(t.fd, in, true); errno != 0 {
		return errno
	}
	var st unix.Stat_t
	if err := t.b.fstat(t.fd, &st); err != nil {
		return errnoOf(err)
	}
	out.FromStat(toSyscall(&st))
	return 0
}

// setattrLink sets a symlink's owner and times by its parent and name.
func (n *node) setattrLink(t *target, in *fuse.SetAttrIn) syscall.Errno {
	dir, name := split(t.path)
	dirfd, err := t.b.openDir(dir)
	if err != nil {
		return errnoOf(err)
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	if err := t.b.statName(dirfd, name, &st); err != nil {
		return errnoOf(err)
	}
	if st.Dev != n.dev || st.Ino != n.ino {
		return syscall.ESTALE
	}
	if uid, gid, ok := owner(in); ok {
		if err := unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errnoOf(err)
		}
	}
	if ts, ok := times(in); ok {
		if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errnoOf(err)
		}
	}
	return 0
}

// setattrFD applies in to an fd: an open file, or (pathFD) an O_PATH fd,
// reached through /proc/self/fd where the call needs a real file.
func setattrFD(fd int, in *fuse.SetAttrIn, pathFD bool) syscall.Errno {
	if m, ok := in.GetMode(); ok {
		var err error
		if pathFD {
			err = unix.Fchmodat(unix.AT_FDCWD, procPath(fd), m&07777, 0)
		} else {
			err = unix.Fchmod(fd, m&07777)
		}
		if err != nil {
			return errnoOf(err)
		}
	}
	if uid, gid, ok := owner(in); ok {
		if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
			return errnoOf(err)
		}
	}
	if sz, ok := in.GetSize(); ok {
		if pathFD {
			return syscall.EINVAL
		}
		if err := unix.Ftruncate(fd, int64(sz)); err != nil {
			return errnoOf(err)
		}
	}
	if ts, ok := times(in); ok {
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(fd), ts, 0); err != nil {
			return errnoOf(err)
		}
	}
	return 0
}

func owner(in *fuse.SetAttrIn) (uid, gid int, ok bool) {
	uid, gid = -1, -1
	if u, uok := in.GetUID(); uok {
		uid, ok = int(u), true
	}
	if g, gok := in.GetGID(); gok {
		gid, ok = int(g), true
	}
	return uid, gid, ok
}

// times reads the new times; "now" stays UTIME_NOW, which needs only write
// permission, where an explicit time needs ownership.
func times(in *fuse.SetAttrIn) ([]unix.Timespec, bool) {
	if in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) == 0 {
		return nil, false
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	for i, bits := range [2][2]uint32{{fuse.FATTR_ATIME, fuse.FATTR_ATIME_NOW}, {fuse.FATTR_MTIME, fuse.FATTR_MTIME_NOW}} {
		switch {
		case in.Valid&bits[0] == 0:
		case in.Valid&bits[1] != 0:
			ts[i] = unix.Timespec{Nsec: unix.UTIME_NOW}
		case i == 0:
			ts[i] = unix.Timespec{Sec: int64(in.Atime), Nsec: int64(in.Atimensec)}
		default:
			ts[i] = unix.Timespec{Sec: int64(in.Mtime), Nsec: int64(in.Mtimensec)}
		}
	}
	return ts, true
}
