package fsys

import (
	"context"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a file, directory or symlink inside one space. It stands for one
// backing inode (dev, ino): operations on the node reach that inode or fail,
// never whatever has its name now.
type node struct {
	fs.Inode
	view      *View
	space     space
	spaceRoot bool
	dev, ino  uint64
	wd        atomic.Int32 // the inotify watch of its directory (set under the Watcher's lock)

	// noListCache: a listing of the directory hid a multiply-linked file.
	noListCache atomic.Bool

	// writers counts its handles open for writing: a file a run may
	// execute (decision.readOnly) that has one is read through no handle,
	// so that a shared mapping from before it was listed cannot bring
	// pages it wrote back into the cache.
	writers atomic.Int32

	// forgotten: the kernel holds the node no more (OnForget).
	forgotten atomic.Bool
}

func (n *node) backing() *backing { return n.view.spaces.dirs[n.space] }

// path returns n's canonical path in its space, as this view's tree knows
// it. ok is false for a node that is no longer reachable (unlinked or
// forgotten): callers fail closed.
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

// opKind is what an operation does with what it names. The choke point
// decides by it, and it names the audit record.
type opKind uint8

const (
	// opLookup sees an existing entry: lookup, getattr, readlink, open,
	// opendir, xattr reads. Hidden: ENOENT.
	opLookup opKind = iota
	// opMutate changes or removes an existing entry: unlink, rmdir,
	// setattr, xattr writes, a rename's source. Hidden: ENOENT.
	opMutate
	// opCreate makes a name: create, mkdir, mknod, symlink, link, a
	// rename's target. Denied: EACCES (ENOENT under a hidden directory).
	opCreate
	// opExchange is either side of RENAME_EXCHANGE: it must exist, and
	// denied or hidden answers EACCES.
	opExchange
	// opIO reads, writes or lists through an open handle. Denied: EACCES.
	opIO
)

func (o opKind) String() string {
	return [...]string{"lookup", "mutate", "create", "exchange", "io"}[o]
}

// target is what one operation names, resolved through the choke point.
type target struct {
	as    asCaller // what enter did to the thread's credentials
	b     *backing
	path  string // canonical path in the space
	d     decision
	ruled bool   // some rule governs the path or a directory above it
	gen   uint64 // the view's generation before the decision (see newHandle)
	// absent: the name is visible to the rules but not in the backing
	// tree (ENOENT from the backing, not from a decision).
	absent bool
	// hidden: the rules hide the path (ENOENT from the decision).
	hidden bool
	dirfd  int // O_PATH fd of the parent directory, or -1
	name   string
	fd     int         // O_PATH|O_NOFOLLOW fd of the entry itself, or -1
	st     unix.Stat_t // the entry's attributes, when fd >= 0
}

func (t *target) close() {
	if t.dirfd >= 0 {
		unix.Close(t.dirfd)
		t.dirfd = -1
	}
	if t.fd >= 0 {
		unix.Close(t.fd)
		t.fd = -1
	}
}

// enter is how a node operation starts: admit the caller and act as it
// (become), then resolve what the operation names (prepare). On success the
// operation must call leave.
func (n *node) enter(ctx context.Context, op opKind, name string) (target, syscall.Errno) {
	return n.enterAt(ctx, op, name, nil)
}

// enterAt is enter, resolving a listed name beneath the listing's own
// directory (see listedAt).
func (n *node) enterAt(ctx context.Context, op opKind, name string, at *listedAt) (target, syscall.Errno) {
	a, errno := n.view.become(ctx)
	if errno != 0 {
		return target{dirfd: -1, fd: -1}, errno
	}
	t, errno := n.prepareAt(a, op, name, at)
	t.as = a
	if errno != 0 {
		a.restore()
	}
	return t, errno
}

// leave ends what enter began.
func (t *target) leave() {
	t.close()
	t.as.restore()
}

func (t *target) isDir() bool { return t.st.Mode&unix.S_IFMT == unix.S_IFDIR }

// prepare is the single choke point of every operation on a node: n itself
// (name == "") or its child name. It decides with the rules for the path
// and every directory above it, then reaches the backing tree beneath its
// root, as the current thread's credentials (the caller's, see become):
//   - the parent directory, for operations that make or remove names;
//   - the entry itself (O_PATH, a symlink as the link), for all but
//     creates. An operation on n itself checks that the entry is still the
//     inode n stands for (ESTALE otherwise), and every entry passes the
//     view's hiding rules (hides).
//
// On success the caller owns t and must close it.
func (n *node) prepare(a asCaller, op opKind, name string) (t target, errno syscall.Errno) {
	return n.prepareAt(a, op, name, nil)
}

// listedAt is where a READDIRPLUS listing found a name: the directory it
// reads (opened by the same request, through prepare, as the same caller,
// for node n) whose current path is path, and the entry's attributes if the
// listing has read them already. A lookup of that name resolves it beneath
// fd (one fstatat, or none) instead of from the backing root (openat2 of
// the whole path, fstat, close): the same inode, since fd is the directory
// at path, which is n's.
type listedAt struct {
	fd   int
	path string
	st   *unix.Stat_t
}

// prepareAt is prepare; at, if set, is where a listing found name (used
// only when the listed directory's path is n's).
func (n *node) prepareAt(a asCaller, op opKind, name string, at *listedAt) (t target, errno syscall.Errno) {
	t.dirfd, t.fd = -1, -1
	if f := n.view.host.fault; f != nil {
		f(op, name)
	}
	dir, ok := n.path()
	if !ok {
		return t, syscall.ENOENT
	}
	t.b = n.backing()
	t.gen = n.view.generation() // before the decision: see newHandle
	t.d = n.view.decision()
	t.path, t.name = dir, name
	if name != "" {
		if name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return t, syscall.EINVAL
		}
		t.path = join(dir, name)
	}
	vis, ruled := t.d.path(n.space, t.path)
	if !vis {
		t.hidden = true
		n.view.auditDeny(t.d.atoms, n.space, t.path, op.String())
		return t, t.d.denial(op, n.space, dir, name)
	}
	t.ruled = ruled
	if errno := n.mayAct(&t, a, op); errno != 0 {
		return t, errno
	}
	if name != "" && op != opLookup {
		fd, err := t.b.openDir(dir)
		if err != nil {
			return t, errnoOf(err)
		}
		t.dirfd = fd
	}
	if op == opCreate {
		return t, 0
	}
	if at != nil && op == opLookup && name != "" && at.path == dir {
		if at.st != nil {
			t.st = *at.st
		} else if err := t.b.statName(at.fd, name, &t.st); err != nil {
			t.absent = err == unix.ENOENT
			return t, errnoOf(err)
		}
		if t.d.hides(n.space, t.path, &t.st, func() (string, error) { return readlinkat(at.fd, name) }) {
			return t, syscall.ENOENT
		}
		return t, 0
	}
	fd, err := t.b.open(t.path, unix.O_PATH, 0)
	if err != nil {
		t.close()
		t.absent = err == unix.ENOENT
		return t, errnoOf(err)
	}
	t.fd = fd
	if err := t.b.fstat(fd, &t.st); err != nil {
		t.close()
		return t, errnoOf(err)
	}
	if name == "" && (t.st.Dev != n.dev || t.st.Ino != n.ino) {
		// The name now belongs to another inode (a rename through another
		// view, or in the backing tree): never act on it for this node.
		t.close()
		return t, syscall.ESTALE
	}
	if t.d.hides(n.space, t.path, &t.st, func() (string, error) { return readlinkat(fd, "") }) {
		t.close()
		if op == opExchange {
			return t, syscall.EACCES
		}
		return t, syscall.ENOENT
	}
	return t, 0
}

// mayAct: op may change t's path (not one a run may execute: EROFS), and
// a caller whose credentials the thread took may search the directories
// above the backing root.
func (n *node) mayAct(t *target, a asCaller, op opKind) syscall.Errno {
	if op != opLookup && op != opIO && t.d.readOnly(n.space, t.path) {
		n.view.auditDeny(t.d.atoms, n.space, t.path, op.String())
		return syscall.EROFS
	}
	if a.switched {
		if err := t.b.ancestorsSearchable(); err != nil {
			return errnoOf(err)
		}
	}
	return 0
}

// multiNamed reports a regular file with more than one name: in a space
// with rules it is hidden (hides), as its other name may be protected.
func multiNamed(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1
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
	rootDev := v.mnt.rootDev
	ino := st.Ino ^ swapped ^ ((rootDev << 32) | (rootDev >> 32))
	if ino <= 1 {
		ino += 1 << 62 // 1 is the mount root
	}
	// The generation keeps the views of one hub apart: go-fuse merges
	// nodes with equal StableAttr, and a node belongs to one view.
	return fs.StableAttr{Mode: st.Mode, Ino: ino, Gen: v.mnt.gen + v.renumbered.of(ino)<<32}
}

// newChild makes (or finds) the node for the entry at path below n. The
// entry is cached long when the watcher reports changes in n's directory
// (a switch or reload drops it when its decision changes); a new directory
// node is watched in turn.
func (n *node) newChild(ctx context.Context, st *unix.Stat_t, path string, ruled bool, out *fuse.EntryOut) *fs.Inode {
	out.Attr.FromStat(toSyscall(st))
	w := n.view.host.watcher
	if ttl := w.ttlFor(n); ttl > 0 {
		out.SetEntryTimeout(ttl)
		if !ruled { // see attrTTL
			out.SetAttrTimeout(ttl)
		}
	}
	if n.view.decision().hidesLinked(n.space) {
		w.shows(n.backing(), st)
	}
	child := &node{view: n.view, space: n.space, dev: st.Dev, ino: st.Ino}
	return n.NewInode(ctx, child, n.view.stableAttr(st))
}

// dirOf is the directory part of a canonical space path ("" for the root).
func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return ""
}

// watch makes sure the watcher watches n's directory (at path), once the
// kernel uses n: a node made by a lookup may be dropped for one go-fuse
// already has, so only a node the kernel names is watched.
//
// A staged view's directory is watched in the backing tree its layer is
// merged over: overlayfs reports to inotify only what changes through it,
// and everything that changes the layer goes through the view (which the
// kernel sees) or mounts it afresh (a commit, discard or rollback, and
// the backing watch's remounts, each dropping every cached entry of the
// space). A directory only the layer has is not watched (short TTL).
func (n *node) watch(path string) {
	w := n.view.host.watcher
	if w == nil || n.wd.Load() != 0 {
		return
	}
	b := n.backing()
	if b.merged {
		w.add(n, b.above+path)
		return
	}
	w.add(n, b.real+path)
}

// OnForget: the kernel holds the node no more; its watch and its listing
// record go.
func (n *node) OnForget() {
	n.forgotten.Store(true)
	if w := n.view.host.watcher; w != nil {
		w.remove(n)
	}
	n.view.unlisted(n.EmbeddedInode())
}

func toSyscall(st *unix.Stat_t) *syscall.Stat_t {
	return &syscall.Stat_t{
		Dev: st.Dev, Ino: st.Ino, Nlink: st.Nlink, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid,
		Rdev: st.Rdev, Size: st.Size, Blksize: st.Blksize, Blocks: st.Blocks,
		Atim: syscall.Timespec(st.Atim), Mtim: syscall.Timespec(st.Mtim), Ctim: syscall.Timespec(st.Ctim),
	}
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeReadlinker     = (*node)(nil)
	_ fs.NodeStatfser       = (*node)(nil)
	_ fs.NodeIoctler        = (*node)(nil)
)

// Lookup finds a child: one openat2 and one fstat (a missing name, the
// common case before a create, costs one syscall).
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.lookup(ctx, name, out, nil)
}

// lookup is Lookup, for a LOOKUP or (listed) for an entry a READDIRPLUS
// listing hands out. The kernel links a listed entry when the listing's
// answer arrives, stamped with the epoch current then: a ruled one is
// recorded for the switches to drop (plusRuled), and none is given if a
// switch began since the decision. A listed name without an entry is
// looked up by the kernel on its own, so no absence is recorded for it.
// A listed name is resolved where the listing found it (listedAt).
func (n *node) lookup(ctx context.Context, name string, out *fuse.EntryOut, listed *listedAt) (*fs.Inode, syscall.Errno) {
	g := n.view.generation() // before the decision; see nameSet
	t, errno := n.enterAt(ctx, opLookup, name, listed)
	if errno != 0 && listed != nil {
		return nil, errno
	}
	if errno != 0 {
		// The kernel may remember an absence (guardFS.Lookup) while it
		// lasts: git asks for .gitignore in every directory, and for every
		// file of a hidden directory it has in its index, on every status.
		if (t.absent && !t.ruled) || t.hidden {
			n.watch(dirOf(t.path))
		}
		if ttl := n.view.host.watcher.ttlFor(n); ttl > 0 {
			switch {
			case t.absent && !t.ruled:
				// Missing from the backing directory, and no rule
				// governs the name: it appears only when something
				// makes it there, which the watcher reports.
				out.SetEntryTimeout(ttl)
			case t.hidden && name != "" && n.view.cache.absences.add(n, name, g):
				// Hidden: a switch or reload forgets it (View.forget).
				out.SetEntryTimeout(ttl)
			}
		}
		return nil, errno
	}
	defer t.leave()
	if listed != nil && t.ruled && !n.view.cache.plusRuled.add(n, name, g) {
		return nil, syscall.ENOENT
	}
	n.watch(dirOf(t.path))
	if n.view.claim(n, name, &t) {
		// Another file of its number is at the name the view gives it
		// (aliases.go).
		n.view.auditDeny(t.d.atoms, n.space, t.path, "a second file of one inode number")
		return nil, syscall.ENOENT
	}
	return n.newChild(ctx, &t.st, t.path, t.ruled, out), 0
}

// Lookup: node.lookup marks an absence the kernel may remember (a hidden
// or missing name) with an entry timeout and no node; the answer is then a
// negative entry, not ENOENT (which the kernel does not cache).
func (c connFS) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	code := c.RawFileSystem.Lookup(cancel, header, name, out)
	if code == fuse.ENOENT && out.NodeId == 0 && out.EntryTimeout() > 0 {
		code = fuse.OK
	}
	return code
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if fh, ok := f.(*fileHandle); ok {
		return fh.Getattr(ctx, out)
	}
	t, errno := n.enter(ctx, opLookup, "")
	if errno != 0 {
		return errno
	}
	defer t.leave()
	out.FromStat(toSyscall(&t.st))
	if t.isDir() {
		n.watch(t.path)
	}
	if ttl := n.attrTTL(t.isDir(), t.ruled); ttl > 0 {
		out.SetTimeout(ttl)
	}
	return 0
}

// attrTTL is how long the kernel may keep n's attributes: long when a
// watch reports its changes (its directory's; a directory's own), else 0
// (the default, DefaultAttrTimeout). A ruled node's stay short. A ruled
// directory: a switch drops its entry, but a process whose cwd it is stats
// it without a lookup. A ruled file: the kernel reads an open file's cached
// pages, and lists a listed directory's cache, without asking the daemon
// until its attributes lapse (FUSE_AUTO_INVAL_DATA); if the daemon dies,
// nothing else cuts such a descriptor off, so it must fail (ENOTCONN)
// within DefaultAttrTimeout of the crash (the daemon waits that long
// before it serves restored sessions).
func (n *node) attrTTL(isDir, ruled bool) time.Duration {
	w := n.view.host.watcher
	if w == nil || ruled {
		return 0
	}
	dir := n
	if !isDir {
		dir = nil
		if _, p := n.Parent(); p != nil {
			dir, _ = p.Operations().(*node)
		}
	}
	return w.ttlFor(dir)
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	t, errno := n.enter(ctx, opLookup, "")
	if errno != 0 {
		return nil, errno
	}
	defer t.leave()
	if t.st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return nil, syscall.EINVAL
	}
	// prepare has checked that the link stays in its space.
	link, err := readlinkat(t.fd, "")
	if err != nil {
		return nil, errnoOf(err)
	}
	return []byte(link), 0
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var s syscall.Statfs_t
	if errno := n.view.acts(func() syscall.Errno { return errnoOf(syscall.Fstatfs(n.backing().fd, &s)) }); errno != 0 {
		return errno
	}
	out.FromStatfsT(&s)
	return 0
}

// Ioctl is refused: a backing ioctl would run with the daemon's
// capabilities (EXT4_IOC_SHUTDOWN, FS_IOC_SETFLAGS with the immutable bit,
// ...), whatever the caller may do natively.
func (n *node) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}
