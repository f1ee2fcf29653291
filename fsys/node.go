package fsys

import (
	"context"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
)

// node is a file, directory or symlink inside one space.
type node struct {
	fs.Inode
	view      *View
	space     acl.Space
	spaceRoot bool
}

// snapshot is the state one operation decides with: read once, so that an
// operation never mixes two configs or two contexts.
type snapshot struct {
	cfg *acl.Config
	ctx cctx.Set
}

func (v *View) snapshot() snapshot {
	return snapshot{cfg: v.rules.Load(), ctx: *v.ctx.Load()}
}

func (n *node) backing() *backing { return n.view.spaces[n.space] }

// path returns n's canonical path in its space. ok is false for a node that
// is no longer reachable (unlinked or forgotten): callers fail closed.
func (n *node) path() (p string, ok bool) {
	var buf [16]string
	segs := buf[:0]
	in := &n.Inode
	for {
		if nn, isNode := in.Operations().(*node); isNode && nn.spaceRoot {
			break
		}
		name, parent := in.Parent()
		if parent == nil {
			return "", false
		}
		segs = append(segs, name)
		in = parent
	}
	if len(segs) == 0 {
		return "/", true
	}
	var b strings.Builder
	for i := len(segs) - 1; i >= 0; i-- {
		b.WriteByte('/')
		b.WriteString(segs[i])
	}
	return b.String(), true
}

// target is what one operation names, resolved through the choke point.
type target struct {
	b     *backing
	dirfd int    // O_PATH fd of the parent directory in the backing tree
	name  string // the last name ("" for the space root)
	path  string // canonical path in the space
	ruled bool   // some rule governs the path or a directory above it
	snap  snapshot
}

func (t *target) close() {
	if t.dirfd >= 0 {
		unix.Close(t.dirfd)
	}
}

// resolve is the single choke point of every operation that names a child
// of directory n: it decides with the rules, then opens the backing parent
// directory beneath its root. A hidden parent answers ENOENT; a denied
// child answers ENOENT for lookups and EACCES for mutations.
func (n *node) resolve(name string, mutate bool) (t target, errno syscall.Errno) {
	t, errno = n.check(name, mutate)
	if errno != 0 {
		return t, errno
	}
	dir, _ := split(t.path)
	fd, err := t.b.openDir(dir)
	if err != nil {
		return t, errnoOf(err)
	}
	t.dirfd = fd
	return t, 0
}

// check is resolve's decision half: the rules alone, no backing access.
func (n *node) check(name string, mutate bool) (t target, errno syscall.Errno) {
	t.dirfd = -1
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return t, syscall.EINVAL
	}
	dir, ok := n.path()
	if !ok {
		return t, syscall.ENOENT
	}
	t.snap = n.view.snapshot()
	t.b, t.name, t.path = n.backing(), name, join(dir, name)
	vis, ruled := t.snap.cfg.Visible(n.space, t.path, t.snap.ctx)
	if !vis {
		if parentVis, _ := t.snap.cfg.Visible(n.space, dir, t.snap.ctx); !parentVis || !mutate {
			// Named explicitly (listings never show it): worth an audit line.
			n.view.auditDeny(t.snap.ctx, n.space, t.path, "lookup")
			return t, syscall.ENOENT
		}
		n.view.auditDeny(t.snap.ctx, n.space, t.path, "mutate")
		return t, syscall.EACCES
	}
	t.ruled = ruled
	return t, 0
}

// self resolves n itself, for operations on a node (getattr, open,
// setattr, ...). The space root has no parent in the backing tree; its
// target uses the root fd and an empty name.
func (n *node) self(mutate bool) (target, syscall.Errno) { return n.selfAt(mutate, true) }

// selfCheck decides about n itself without opening its backing parent, for
// operations that reach the backing file by its own path (open, readdir).
func (n *node) selfCheck(mutate bool) (target, syscall.Errno) { return n.selfAt(mutate, false) }

func (n *node) selfAt(mutate, openParent bool) (t target, errno syscall.Errno) {
	t.dirfd = -1
	if n.spaceRoot {
		t.snap = n.view.snapshot()
		t.b, t.path = n.backing(), "/"
		vis, ruled := t.snap.cfg.Visible(n.space, "/", t.snap.ctx)
		if !vis {
			return t, syscall.ENOENT
		}
		t.ruled = ruled
		return t, 0
	}
	name, parent := n.Parent()
	if parent == nil {
		return t, syscall.ENOENT
	}
	pn, ok := parent.Operations().(*node)
	if !ok {
		return t, syscall.ENOENT
	}
	if openParent {
		t, errno = pn.resolve(name, mutate)
	} else {
		t, errno = pn.check(name, mutate)
	}
	if errno == syscall.ENOENT && mutate {
		// The kernel holds this inode, so the name was visible once:
		// a mutation through it is a denial, not a missing file.
		return t, syscall.EACCES
	}
	return t, errno
}

// fstat stats the target without following a final symlink.
func (t *target) fstat(st *unix.Stat_t) error {
	if t.name == "" {
		return unix.Fstat(t.b.fd, st)
	}
	return unix.Fstatat(t.dirfd, t.name, st, unix.AT_SYMLINK_NOFOLLOW)
}

// hidden applies the view's rules that depend on what the entry is:
// symlinks that leave their space, and (in a space with rules) regular
// files with several hard links, whose other names may be protected.
func (n *node) hidden(t *target, st *unix.Stat_t) bool {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		link, err := readlinkat(t.dirfd, t.name)
		return err != nil || escapes(t.path, link)
	case unix.S_IFREG:
		return st.Nlink > 1 && !n.view.opts.AllowHardlinks && t.snap.cfg.HasRules(n.space)
	}
	return false
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

func (v *View) stableAttr(st *unix.Stat_t) fs.StableAttr {
	// Mix the device into the inode number, as go-fuse's loopback does, so
	// that the two spaces never collide even on different filesystems.
	swapped := (st.Dev << 32) | (st.Dev >> 32)
	rootDev := v.spaces[0].dev
	ino := st.Ino ^ swapped ^ ((rootDev << 32) | (rootDev >> 32))
	if ino <= 1 {
		ino += 1 << 62 // 1 is the mount root
	}
	return fs.StableAttr{Mode: st.Mode, Ino: ino, Gen: 1}
}

func (n *node) newChild(ctx context.Context, st *unix.Stat_t, out *fuse.EntryOut) *fs.Inode {
	out.Attr.FromStat(toSyscall(st))
	child := &node{view: n.view, space: n.space}
	return n.NewInode(ctx, child, n.view.stableAttr(st))
}

func toSyscall(st *unix.Stat_t) *syscall.Stat_t {
	return &syscall.Stat_t{
		Dev: st.Dev, Ino: st.Ino, Nlink: st.Nlink, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid,
		Rdev: st.Rdev, Size: st.Size, Blksize: st.Blksize, Blocks: st.Blocks,
		Atim: syscall.Timespec(st.Atim), Mtim: syscall.Timespec(st.Mtim), Ctim: syscall.Timespec(st.Ctim),
	}
}

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
)

// Lookup opens the entry itself (O_PATH, a symlink as the link) in one
// openat2 call, so that a missing name, the common case before a create,
// costs one syscall.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, errno := n.check(name, false)
	if errno != 0 {
		return nil, errno
	}
	fd, err := t.b.open(t.path, unix.O_PATH, 0)
	if err != nil {
		return nil, errnoOf(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errnoOf(err)
	}
	// hidden() reads a link through dirfd+name; "" with the link's own
	// O_PATH fd reads the link itself.
	t.dirfd, t.name = fd, ""
	hide := n.hidden(&t, &st)
	t.dirfd = -1
	if hide {
		return nil, syscall.ENOENT
	}
	return n.newChild(ctx, &st, out), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if fh, ok := f.(fileHandle); ok {
		return fh.getattr(out)
	}
	t, errno := n.self(false)
	defer t.close()
	if errno != 0 {
		return errno
	}
	var st unix.Stat_t
	if err := t.fstat(&st); err != nil {
		return errnoOf(err)
	}
	out.FromStat(toSyscall(&st))
	return 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	t, errno := n.self(false)
	defer t.close()
	if errno != 0 {
		return nil, errno
	}
	link, err := readlinkat(t.dirfd, t.name)
	if err != nil {
		return nil, errnoOf(err)
	}
	if escapes(t.path, link) {
		return nil, syscall.ENOENT
	}
	return []byte(link), 0
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var s syscall.Statfs_t
	if err := syscall.Fstatfs(n.backing().fd, &s); err != nil {
		return errnoOf(err)
	}
	out.FromStatfsT(&s)
	return 0
}

// Readdir lists the directory, leaving out every entry the view hides.
// It decides per call, so a handle opened before a context switch lists
// what the new context may see.
func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	t, errno := n.selfCheck(false)
	defer t.close()
	if errno != 0 {
		return nil, errno
	}
	fd, err := t.b.open(t.path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, errnoOf(err)
	}
	defer unix.Close(fd)
	var entries []fuse.DirEntry
	buf := make([]byte, 32<<10)
	checkLinks := !n.view.opts.AllowHardlinks && t.snap.cfg.HasRules(n.space)
	for {
		nb, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, errnoOf(err)
		}
		if nb <= 0 {
			break
		}
		for off := 0; off < nb; {
			name, typ, ino, reclen := parseDirent(buf[off:nb])
			off += reclen
			if name == "" || name == "." || name == ".." {
				continue
			}
			p := join(t.path, name)
			if vis, _ := t.snap.cfg.Visible(n.space, p, t.snap.ctx); !vis {
				continue
			}
			mode := uint32(typ) << 12
			switch typ {
			case unix.DT_LNK:
				link, err := readlinkat(fd, name)
				if err != nil || escapes(p, link) {
					continue
				}
			case unix.DT_REG, unix.DT_UNKNOWN:
				if checkLinks || typ == unix.DT_UNKNOWN {
					var st unix.Stat_t
					if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
						continue
					}
					mode = st.Mode
					cand := target{b: t.b, dirfd: fd, name: name, path: p, snap: t.snap}
					if n.hidden(&cand, &st) {
						continue
					}
				}
			}
			st := unix.Stat_t{Ino: ino, Dev: t.b.dev, Mode: mode}
			entries = append(entries, fuse.DirEntry{Name: name, Mode: mode, Ino: n.view.stableAttr(&st).Ino})
		}
	}
	return fs.NewListDirStream(entries), 0
}

// parseDirent decodes one linux_dirent64.
func parseDirent(b []byte) (name string, typ uint8, ino uint64, reclen int) {
	if len(b) < 19 {
		return "", 0, 0, len(b)
	}
	ino = uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
	reclen = int(b[16]) | int(b[17])<<8
	if reclen == 0 || reclen > len(b) {
		return "", 0, 0, len(b)
	}
	typ = b[18]
	nameb := b[19:reclen]
	for i, c := range nameb {
		if c == 0 {
			nameb = nameb[:i]
			break
		}
	}
	return string(nameb), typ, ino, reclen
}
