package fsys

import (
	"context"
	"fmt"
	"os"
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

// chown gives a new entry to the calling user, as a root daemon serving
// other users must (the kernel created nothing; we did, as root).
func chown(ctx context.Context, dirfd int, name string) {
	if os.Geteuid() != 0 {
		return
	}
	if caller, ok := fuse.FromContext(ctx); ok {
		unix.Fchownat(dirfd, name, int(caller.Uid), int(caller.Gid), unix.AT_SYMLINK_NOFOLLOW)
	}
}

// made finishes a create-like operation: owner, stat, new inode. On a
// failure after the entry exists, remove is called to undo it.
func (n *node) made(ctx context.Context, t *target, out *fuse.EntryOut, remove func()) (*fs.Inode, syscall.Errno) {
	chown(ctx, t.dirfd, t.name)
	var st unix.Stat_t
	if err := t.fstat(&st); err != nil {
		remove()
		return nil, errnoOf(err)
	}
	return n.newChild(ctx, &st, out), 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	t, errno := n.resolve(name, true)
	defer t.close()
	if errno != 0 {
		return nil, nil, 0, errno
	}
	flags &^= syscall.O_APPEND | fuse.FMODE_EXEC
	fd, err := unix.Openat(t.dirfd, name, int(flags)|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return nil, nil, 0, errnoOf(err)
	}
	ch, errno := n.made(ctx, &t, out, func() { unix.Unlinkat(t.dirfd, name, 0) })
	if errno != 0 {
		unix.Close(fd)
		return nil, nil, 0, errno
	}
	fh, fflags := ch.Operations().(*node).newHandle(fd, t.path, t.ruled)
	return ch, fh, fflags, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, errno := n.resolve(name, true)
	defer t.close()
	if errno != 0 {
		return nil, errno
	}
	if err := unix.Mkdirat(t.dirfd, name, mode); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, &t, out, func() { unix.Unlinkat(t.dirfd, name, unix.AT_REMOVEDIR) })
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, errno := n.resolve(name, true)
	defer t.close()
	if errno != 0 {
		return nil, errno
	}
	if err := unix.Mknodat(t.dirfd, name, mode, int(rdev)); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, &t, out, func() { unix.Unlinkat(t.dirfd, name, 0) })
}

func (n *node) Symlink(ctx context.Context, link, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, errno := n.resolve(name, true)
	defer t.close()
	if errno != 0 {
		return nil, errno
	}
	if escapes(t.path, link) {
		// It would be hidden at once: refuse rather than make an entry
		// that cannot be seen.
		n.view.auditDeny(t.snap.ctx, n.space, t.path, "symlink out of the space")
		return nil, syscall.EACCES
	}
	if err := unix.Symlinkat(link, t.dirfd, name); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, &t, out, func() { unix.Unlinkat(t.dirfd, name, 0) })
}

// existing resolves a child that must exist and be visible.
func (n *node) existing(name string) (target, syscall.Errno) {
	t, errno := n.resolve(name, true)
	if errno != 0 {
		return t, errno
	}
	var st unix.Stat_t
	if err := t.fstat(&st); err != nil {
		t.close()
		return t, errnoOf(err)
	}
	if n.hidden(&t, &st) {
		t.close()
		return t, syscall.ENOENT
	}
	return t, 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	t, errno := n.existing(name)
	if errno != 0 {
		return errno
	}
	defer t.close()
	return errnoOf(unix.Unlinkat(t.dirfd, name, 0))
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	t, errno := n.existing(name)
	if errno != 0 {
		return errno
	}
	defer t.close()
	return errnoOf(unix.Unlinkat(t.dirfd, name, unix.AT_REMOVEDIR))
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok || np.space != n.space {
		return syscall.EXDEV
	}
	src, errno := n.existing(name)
	if errno != 0 {
		return errno
	}
	defer src.close()
	dst, errno := np.resolve(newName, true)
	if errno != 0 {
		return errno
	}
	defer dst.close()
	if flags&unix.RENAME_EXCHANGE != 0 {
		var st unix.Stat_t
		if err := dst.fstat(&st); err != nil {
			return errnoOf(err)
		}
		if np.hidden(&dst, &st) {
			return syscall.ENOENT
		}
	}
	// Moving a directory moves every path below it: refuse when a rule
	// governs something under either name, or protected files would walk
	// out from under their rules.
	var st unix.Stat_t
	if err := src.fstat(&st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if src.snap.cfg.HasRulesUnder(n.space, src.path) || dst.snap.cfg.HasRulesUnder(n.space, dst.path) {
			n.view.auditDeny(src.snap.ctx, n.space, src.path, "rename of a directory holding ruled paths")
			return syscall.EACCES
		}
	}
	return errnoOf(unix.Renameat2(src.dirfd, name, dst.dirfd, newName, uint(flags)))
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	tn, ok := target.(*node)
	if !ok || tn.space != n.space {
		return nil, syscall.EXDEV
	}
	snap := n.view.snapshot()
	if !n.view.opts.AllowHardlinks && snap.cfg.HasRules(n.space) {
		n.view.auditDeny(snap.ctx, n.space, name, "link")
		return nil, syscall.EPERM
	}
	src, errno := tn.self(true)
	defer src.close()
	if errno != 0 {
		return nil, errno
	}
	t, errno := n.resolve(name, true)
	defer t.close()
	if errno != 0 {
		return nil, errno
	}
	if err := unix.Linkat(src.dirfd, src.name, t.dirfd, name, 0); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, &t, out, func() { unix.Unlinkat(t.dirfd, name, 0) })
}

// pathFD opens the target itself as an O_PATH fd (a symlink as the link),
// for operations that then go through /proc/self/fd.
func (t *target) pathFD() (int, error) {
	if t.name == "" {
		return unix.Dup(t.b.fd)
	}
	return unix.Openat(t.dirfd, t.name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

func procPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fsa, ok := f.(fs.FileSetattrer); ok {
		// A gated handle re-decides itself; a passthrough handle has no
		// check of its own, so decide here.
		if _, gated := f.(*gatedFile); !gated {
			t, errno := n.selfCheck(true)
			t.close()
			if errno != 0 {
				return errno
			}
		}
		return fsa.Setattr(ctx, in, out)
	}
	t, errno := n.self(true)
	defer t.close()
	if errno != 0 {
		return errno
	}
	pfd, err := t.pathFD()
	if err != nil {
		return errnoOf(err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return errnoOf(err)
	}
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	if m, ok := in.GetMode(); ok {
		if isLink {
			return syscall.EOPNOTSUPP
		}
		if err := unix.Chmod(procPath(pfd), m); err != nil {
			return errnoOf(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		su, sg := -1, -1
		if uok {
			su = int(uid)
		}
		if gok {
			sg = int(gid)
		}
		if err := unix.Fchownat(pfd, "", su, sg, unix.AT_EMPTY_PATH); err != nil {
			return errnoOf(err)
		}
	}
	if sz, ok := in.GetSize(); ok {
		if isLink {
			return syscall.EINVAL
		}
		wfd, err := t.b.open(t.path, unix.O_WRONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return errnoOf(err)
		}
		err = unix.Ftruncate(wfd, int64(sz))
		unix.Close(wfd)
		if err != nil {
			return errnoOf(err)
		}
	}
	mtime, mok := in.GetMTime()
	atime, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(atime.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mtime.UnixNano())
		}
		if isLink {
			err = unix.UtimesNanoAt(t.dirfd, t.name, ts, unix.AT_SYMLINK_NOFOLLOW)
		} else {
			err = unix.UtimesNanoAt(unix.AT_FDCWD, procPath(pfd), ts, 0)
		}
		if err != nil {
			return errnoOf(err)
		}
	}
	if err := unix.Fstat(pfd, &st); err != nil {
		return errnoOf(err)
	}
	out.FromStat(toSyscall(&st))
	return 0
}

// xattrTarget opens the target for an xattr call. Symlinks carry no user
// xattrs on Linux; they answer as the kernel would.
func (n *node) xattrTarget(mutate bool) (int, syscall.Errno) {
	t, errno := n.self(mutate)
	defer t.close()
	if errno != 0 {
		return -1, errno
	}
	pfd, err := t.pathFD()
	if err != nil {
		return -1, errnoOf(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK {
		unix.Close(pfd)
		if err != nil {
			return -1, errnoOf(err)
		}
		return -1, syscall.EPERM
	}
	return pfd, 0
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	pfd, errno := n.xattrTarget(false)
	if errno != 0 {
		if errno == syscall.EPERM {
			return 0, syscall.ENODATA
		}
		return 0, errno
	}
	defer unix.Close(pfd)
	sz, err := unix.Getxattr(procPath(pfd), attr, dest)
	return uint32(sz), errnoOf(err)
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	pfd, errno := n.xattrTarget(false)
	if errno != 0 {
		if errno == syscall.EPERM {
			return 0, 0
		}
		return 0, errno
	}
	defer unix.Close(pfd)
	sz, err := unix.Listxattr(procPath(pfd), dest)
	return uint32(sz), errnoOf(err)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	pfd, errno := n.xattrTarget(true)
	if errno != 0 {
		return errno
	}
	defer unix.Close(pfd)
	return errnoOf(unix.Setxattr(procPath(pfd), attr, data, int(flags)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	pfd, errno := n.xattrTarget(true)
	if errno != 0 {
		return errno
	}
	defer unix.Close(pfd)
	return errnoOf(unix.Removexattr(procPath(pfd), attr))
}
