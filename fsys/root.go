package fsys

import (
	"context"
	"encoding/binary"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// rootNode is the mount root: exactly memories/ and workspace/ (each only
// while its space root is visible), and nothing can be written there.
type rootNode struct {
	fs.Inode
	view   *View
	access rootAccess // fixed for the view's life: who may enter it
}

var (
	_ fs.NodeLookuper       = (*rootNode)(nil)
	_ fs.NodeOpendirHandler = (*rootNode)(nil)
	_ fs.FileReaddirenter   = (*rootDir)(nil)
	_ fs.FileSeekdirer      = (*rootDir)(nil)
	_ fs.NodeIoctler        = (*rootNode)(nil)
	_ fs.NodeGetattrer      = (*rootNode)(nil)
	_ fs.NodeCreater        = (*rootNode)(nil)
	_ fs.NodeMkdirer        = (*rootNode)(nil)
	_ fs.NodeMknoder        = (*rootNode)(nil)
	_ fs.NodeSymlinker      = (*rootNode)(nil)
	_ fs.NodeUnlinker       = (*rootNode)(nil)
	_ fs.NodeRmdirer        = (*rootNode)(nil)
	_ fs.NodeRenamer        = (*rootNode)(nil)
	_ fs.NodeLinker         = (*rootNode)(nil)
	_ fs.NodeSetattrer      = (*rootNode)(nil)
	_ fs.NodeSetxattrer     = (*rootNode)(nil)
	_ fs.NodeStatfser       = (*rootNode)(nil)
	_ fs.NodeOnForgetter    = (*rootNode)(nil)
	_ fs.NodeGetxattrer     = (*rootNode)(nil)
)

func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	a, errno := r.view.become(ctx)
	if errno != 0 {
		return nil, errno
	}
	a.restore()
	sp, ok := spaceByName(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	d := r.view.decision()
	vis, ruled := d.path(sp, "/")
	if !vis {
		r.view.auditDeny(d.atoms, sp, "/", opLookup.String())
		return nil, syscall.ENOENT
	}
	b := r.view.spaces.dirs[sp]
	var st unix.Stat_t
	if err := b.fstat(b.fd, &st); err != nil {
		return nil, errnoOf(err)
	}
	out.Attr.FromStat(toSyscall(&st))
	if w := r.view.host.watcher; w != nil && !ruled {
		// The name stands while the rules do (a reload invalidates it);
		// the directory's attributes come from its own watch (Getattr).
		out.SetEntryTimeout(w.ttl)
	}
	child := &node{view: r.view, space: sp, spaceRoot: true, dev: st.Dev, ino: st.Ino}
	return r.NewInode(ctx, child, r.view.stableAttr(&st)), 0
}

// OpendirHandle lists the visible spaces, each decided when it is handed
// out.
func (r *rootNode) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	round := r.view.cache.listingsIn.enter()
	a, errno := r.view.become(ctx)
	if errno != 0 {
		r.view.cache.listingsIn.leave(round)
		return nil, 0, errno
	}
	a.restore()
	// Its listing changes only with a switch or a reload, which drop it.
	r.view.listing(r.EmbeddedInode(), nil, true, r.view.cache.lists.epoch.Load(), true)
	return &rootDir{view: r.view, round: round}, 0, 0
}

type rootDir struct {
	view  *View
	round uint64 // of the view's listings in flight (barrier)
	mu    sync.Mutex
	next  int
}

var _ fs.FileReleasedirer = (*rootDir)(nil)

// Releasedir ends the listing: its entries are in the tree (barrier).
func (d *rootDir) Releasedir(ctx context.Context, flags uint32) {
	d.view.cache.listingsIn.leave(d.round)
}

func (d *rootDir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.view.closed.Load() {
		return nil, syscall.EIO
	}
	dec := d.view.decision()
	for d.next < spaceCount {
		sp := space(d.next)
		d.next++
		if dec.shows(sp, "/") {
			var st unix.Stat_t
			b := d.view.spaces.dirs[sp]
			b.fstat(b.fd, &st)
			return &fuse.DirEntry{Name: sp.String(), Mode: unix.S_IFDIR, Ino: d.view.stableAttr(&st).Ino, Off: uint64(d.next)}, 0
		}
	}
	return nil, 0
}

var _ fs.FileLookuper = (*rootDir)(nil)

// Lookup gives READDIRPLUS a full entry for a space root no rule governs
// (see dirHandle.Lookup).
func (d *rootDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	sp, ok := spaceByName(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	if _, ruled := d.view.decision().path(sp, "/"); ruled {
		return nil, syscall.ENOENT
	}
	in, errno := d.view.root.Lookup(ctx, name, out)
	if errno == 0 {
		d.view.cache.plusHanded.Store(true)
	}
	return in, errno
}

func (d *rootDir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off > spaceCount {
		return syscall.EINVAL
	}
	d.next = int(off)
	return 0
}

// Getattr answers the root's mode and owner so that the kernel itself keeps
// out every uid the view does not admit (with the ACL Getxattr gives for
// the others it admits): what the kernel answers from its cache (a walk
// through cached entries, a cached listing) never reaches the daemon's own
// check (admits), but every path walk in the view starts with a search of
// the root.
func (r *rootNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	a := &r.access
	out.Mode = syscall.S_IFDIR | a.mode
	out.Nlink = 4
	out.Uid, out.Gid = a.uid, uint32(os.Getegid())
	t := r.view.mnt.at
	out.SetTimes(&t, &t, &t)
	if w := r.view.host.watcher; w != nil {
		out.SetTimeout(w.ttl) // made up, and never changes
	}
	return 0
}

// Getxattr gives the root's POSIX ACL: r-x for each admitted uid but the
// owner, nothing for anyone else.
func (r *rootNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	a := &r.access
	if attr != "system.posix_acl_access" || a.acl == nil {
		return 0, syscall.ENODATA
	}
	if len(dest) < len(a.acl) {
		return uint32(len(a.acl)), syscall.ERANGE
	}
	return uint32(copy(dest, a.acl)), 0
}

// rootAccess is how the kernel keeps a view's root to the uids the view
// admits.
type rootAccess struct {
	uid  uint32
	mode uint32
	acl  []byte // system.posix_acl_access, or nil
}

// newRootAccess: the root is r-x for the owner, for every other admitted
// uid through an ACL entry, and closed to everyone else (root excepted, who
// needs no view to read the backing tree). With nobody admitted, it is
// closed to all.
func newRootAccess(v *View) rootAccess {
	var in []uint32
	for _, u := range append([]uint32{v.opts.Owner}, v.opts.AllowUIDs...) {
		if v.admits(u) && !slices.Contains(in, u) {
			in = append(in, u)
		}
	}
	switch len(in) {
	case 0:
		return rootAccess{uid: uint32(self.uid), mode: 0}
	case 1:
		return rootAccess{uid: in[0], mode: 0o500}
	}
	// struct posix_acl_xattr_header, then entries (tag u16, perm u16,
	// id u32) sorted by tag and id, as the kernel checks them.
	const (
		userObj, user, groupObj, mask, other = 0x01, 0x02, 0x04, 0x10, 0x20
		rx, none, undefined                  = 5, 0, ^uint32(0)
	)
	named := slices.Clone(in[1:])
	slices.Sort(named)
	b := binary.NativeEndian.AppendUint32(nil, 2)
	entry := func(tag, perm uint16, id uint32) {
		b = binary.NativeEndian.AppendUint16(b, tag)
		b = binary.NativeEndian.AppendUint16(b, perm)
		b = binary.NativeEndian.AppendUint32(b, id)
	}
	entry(userObj, rx, undefined)
	for _, u := range named {
		entry(user, rx, u)
	}
	entry(groupObj, none, undefined)
	entry(mask, rx, undefined)
	entry(other, none, undefined)
	// The group bits carry the mask: the kernel reads the ACL only when
	// they are set.
	return rootAccess{uid: in[0], mode: 0o550, acl: b}
}

// OnForget: the kernel holds nothing of a hub view any more (every node
// below was forgotten first), so no operation can reach its backing
// directories: close them.
func (r *rootNode) OnForget() {
	if r.view.mnt.hub != nil && r.view.closed.Load() {
		r.view.closeBacking()
	}
}

func (r *rootNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	a, errno := r.view.become(ctx)
	if errno != 0 {
		return errno
	}
	a.restore()
	var s syscall.Statfs_t
	if err := syscall.Fstatfs(r.view.spaces.dirs[0].fd, &s); err != nil {
		return errnoOf(err)
	}
	out.FromStatfsT(&s)
	return 0
}

// The root cannot be written: every mutation is EACCES.

func (r *rootNode) Create(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EACCES
}
func (r *rootNode) Mkdir(context.Context, string, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EACCES
}
func (r *rootNode) Mknod(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EACCES
}
func (r *rootNode) Symlink(context.Context, string, string, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EACCES
}
func (r *rootNode) Unlink(context.Context, string) syscall.Errno { return syscall.EACCES }
func (r *rootNode) Rmdir(context.Context, string) syscall.Errno  { return syscall.EACCES }
func (r *rootNode) Rename(context.Context, string, fs.InodeEmbedder, string, uint32) syscall.Errno {
	return syscall.EACCES
}
func (r *rootNode) Link(context.Context, fs.InodeEmbedder, string, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EACCES
}
func (r *rootNode) Setattr(context.Context, fs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return syscall.EACCES
}
func (r *rootNode) Setxattr(context.Context, string, []byte, uint32) syscall.Errno {
	return syscall.EACCES
}

func (r *rootNode) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}
