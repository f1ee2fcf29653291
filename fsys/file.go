package fsys

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// fileHandle is implemented by both kinds of open file.
type fileHandle interface {
	getattr(out *fuse.AttrOut) syscall.Errno
}

// passFile is an open file under no rule. Its decision cannot change while
// the config stays the same, so it offers its fd for kernel passthrough:
// reads and writes then never reach the daemon.
type passFile struct {
	*fs.LoopbackFile
	view *View
}

func (f *passFile) getattr(out *fuse.AttrOut) syscall.Errno {
	return f.LoopbackFile.Getattr(context.Background(), out)
}

// Read is only reached when passthrough is unavailable (not root).
func (f *passFile) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.view.reads.Add(1)
	return f.LoopbackFile.Read(ctx, buf, off)
}

// gatedFile is an open file under a rule. It deliberately has no
// PassthroughFd method, so go-fuse never hands it to the kernel: every
// read and write comes here and is checked against the current context
// (direct I/O keeps the page cache from answering instead).
type gatedFile struct {
	lf   *fs.LoopbackFile
	node *node
	// path at open, used when the node has since been unlinked: a file's
	// authority does not end because its name went away.
	openPath string
}

var (
	_ fs.FileReader    = (*gatedFile)(nil)
	_ fs.FileWriter    = (*gatedFile)(nil)
	_ fs.FileFlusher   = (*gatedFile)(nil)
	_ fs.FileFsyncer   = (*gatedFile)(nil)
	_ fs.FileReleaser  = (*gatedFile)(nil)
	_ fs.FileGetattrer = (*gatedFile)(nil)
	_ fs.FileSetattrer = (*gatedFile)(nil)
	_ fs.FileLseeker   = (*gatedFile)(nil)
	_ fs.FileAllocater = (*gatedFile)(nil)
)

// allowed re-decides the file's path in the current context.
func (f *gatedFile) allowed() bool {
	p, ok := f.node.path()
	if !ok {
		p = f.openPath
	}
	snap := f.node.view.snapshot()
	vis, _ := snap.cfg.Visible(f.node.space, p, snap.ctx)
	if !vis {
		f.node.view.auditDeny(snap.ctx, f.node.space, p, "io")
	}
	return vis
}

func (f *gatedFile) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.node.view.reads.Add(1)
	if !f.allowed() {
		return nil, syscall.EACCES
	}
	return f.lf.Read(ctx, buf, off)
}

func (f *gatedFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if !f.allowed() {
		return 0, syscall.EACCES
	}
	return f.lf.Write(ctx, data, off)
}

func (f *gatedFile) Flush(ctx context.Context) syscall.Errno   { return f.lf.Flush(ctx) }
func (f *gatedFile) Release(ctx context.Context) syscall.Errno { return f.lf.Release(ctx) }

func (f *gatedFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return f.lf.Fsync(ctx, flags)
}

func (f *gatedFile) getattr(out *fuse.AttrOut) syscall.Errno {
	if !f.allowed() {
		return syscall.EACCES
	}
	return f.lf.Getattr(context.Background(), out)
}

func (f *gatedFile) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return f.getattr(out)
}

func (f *gatedFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !f.allowed() {
		return syscall.EACCES
	}
	return f.lf.Setattr(ctx, in, out)
}

func (f *gatedFile) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if !f.allowed() {
		return 0, syscall.EACCES
	}
	return f.lf.Lseek(ctx, off, whence)
}

func (f *gatedFile) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if !f.allowed() {
		return syscall.EACCES
	}
	return f.lf.Allocate(ctx, off, size, mode)
}

// newHandle wraps an open fd: gated under a rule, passthrough otherwise.
func (n *node) newHandle(fd int, path string, ruled bool) (fs.FileHandle, uint32) {
	lf := fs.NewLoopbackFile(fd).(*fs.LoopbackFile)
	if ruled {
		return &gatedFile{lf: lf, node: n, openPath: path}, fuse.FOPEN_DIRECT_IO
	}
	return &passFile{LoopbackFile: lf, view: n.view}, 0
}

var _ = (fs.NodeOpener)((*node)(nil))

// Open opens the file beneath its space root; the rules decide first.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	t, errno := n.selfCheck(flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0)
	defer t.close()
	if errno != 0 {
		if errno == syscall.ENOENT {
			errno = syscall.EACCES // the kernel had the inode: the path is denied now
		}
		return nil, 0, errno
	}
	flags &^= syscall.O_APPEND | fuse.FMODE_EXEC | syscall.O_CREAT | syscall.O_EXCL | syscall.O_NOCTTY
	fd, err := t.b.open(t.path, int(flags), 0)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, 0, errnoOf(err)
	}
	// A hard link made after the lookup must not open a protected file.
	if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 && !n.view.opts.AllowHardlinks && t.snap.cfg.HasRules(n.space) {
		unix.Close(fd)
		return nil, 0, syscall.EACCES
	}
	fh, fflags := n.newHandle(fd, t.path, t.ruled)
	return fh, fflags, 0
}

var (
	_ fs.FileGetlker  = (*gatedFile)(nil)
	_ fs.FileSetlker  = (*gatedFile)(nil)
	_ fs.FileSetlkwer = (*gatedFile)(nil)
)

func (f *gatedFile) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	return f.lf.Getlk(ctx, owner, lk, flags, out)
}

func (f *gatedFile) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return f.lf.Setlk(ctx, owner, lk, flags)
}

func (f *gatedFile) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return f.lf.Setlkw(ctx, owner, lk, flags)
}
