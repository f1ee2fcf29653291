package fsys

import (
	"context"
	"encoding/binary"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/fuseconn"
)

// dirHandle is a directory opened to serve one READDIR (connFS.withDir;
// the kernel opens directories by itself, see cache_listing.go). It reads the
// backing directory from the offset the kernel asks for, and decides each
// entry when it hands it out, in the session's context at that moment and
// for the directory's current path (found from its fd): nothing is kept
// between READDIRs. An entry's offset is the backing directory's own
// (d_off), so any offset the kernel hands back is one seek away.
type dirHandle struct {
	node  *node
	round uint64 // of the view's listings in flight (barrier)

	mu      sync.Mutex
	fd      int
	buf     []byte
	bo, bn  int    // the unread part of buf
	at      uint64 // the offset reached: that of the last entry read
	dirPath string
	dirOK   bool
	// The last entry handed out, and its attributes if Readdirent read
	// them (Lookup, for READDIRPLUS, comes right after).
	lastName string
	lastSt   unix.Stat_t
	lastOK   bool
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
	_ fs.FileFsyncdirer   = (*dirHandle)(nil)
)

// OpendirHandle opens the directory the node stands for, as the caller
// (reading a directory needs read permission on it), for one READDIR or
// FSYNCDIR, and records the listing the kernel may cache (cache_listing.go). The
// listing is in flight (barrier) from before its first decision until
// Releasedir, when go-fuse has its entries' nodes in the tree.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	round := n.view.cache.listingsIn.enter()
	h, errno := n.opendir(ctx)
	if errno != 0 {
		n.view.cache.listingsIn.leave(round)
		return nil, 0, errno
	}
	h.round = round
	return h, 0, 0
}

func (n *node) opendir(ctx context.Context) (*dirHandle, syscall.Errno) {
	epoch := n.view.cache.lists.epoch.Load() // before the rules are read
	t, errno := n.enter(ctx, opLookup, "")
	if errno != 0 {
		return nil, errno
	}
	defer t.leave()
	if !t.isDir() {
		return nil, syscall.ENOTDIR
	}
	n.watch(t.path)
	fd, err := reopenDir(t.fd)
	if err != nil {
		return nil, errnoOf(err)
	}
	sensitive := t.ruled || t.d.holdsRuled(n.space, t.path)
	n.view.listing(n.EmbeddedInode(), n, sensitive, epoch, n.keepsListing(&t))
	return &dirHandle{node: n, fd: fd}, 0
}

var _ fs.FileLookuper = (*dirHandle)(nil)

// Lookup gives a READDIRPLUS listing a full entry for a name the view does
// not know yet (see node.lookup for ruled names, barrier for reloads).
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n := d.node
	if n.GetChild(name) != nil {
		// Known already: the kernel has its entry, or looks it up on its
		// own. Deciding it again for every listing would cost what a warm
		// walk saves.
		return nil, syscall.ENOENT
	}
	d.mu.Lock()
	at := listedAt{fd: d.fd, path: d.dirPath}
	if d.lastOK && d.lastName == name {
		st := d.lastSt
		at.st = &st
	}
	ok := d.dirOK && d.fd >= 0
	d.mu.Unlock()
	if !ok {
		return nil, syscall.ENOENT
	}
	in, errno := n.lookup(ctx, name, out, &at)
	if errno == 0 {
		n.view.cache.plusHanded.Store(true)
	}
	if d := n.view.host.hooks.plusDelay; d > 0 {
		time.Sleep(d)
	}
	return in, errno
}

// Readdirent hands out the next entry the view shows.
func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	// The entries' attributes are read as the caller (a thread keeps the
	// last caller's credentials otherwise).
	a, errno := d.node.view.become(ctx)
	if errno != 0 {
		return nil, errno
	}
	defer a.restore()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fd < 0 {
		return nil, syscall.EBADF
	}
	v, sp, b := d.node.view, d.node.space, d.node.backing()
	for {
		if d.bo >= d.bn {
			if d.buf == nil {
				d.buf = make([]byte, 8<<10)
			}
			nb, err := unix.Getdents(d.fd, d.buf)
			if err != nil {
				return nil, errnoOf(err)
			}
			if nb <= 0 {
				return nil, 0
			}
			d.bo, d.bn = 0, nb
			// The directory may have moved since the last batch.
			p, _, unlinked, ok := b.spacePathSeen(d.fd, d.dirPath)
			d.dirPath, d.dirOK = p, ok && !unlinked
		}
		name, typ, ino, off, reclen := parseDirent(d.buf[d.bo:d.bn])
		d.bo += reclen
		d.at = off
		if !d.dirOK || name == "" || name == "." || name == ".." {
			continue
		}
		p := join(d.dirPath, name)
		dec := v.decision()
		show, check := dec.listed(sp, p, typ)
		if !show {
			continue
		}
		mode := uint32(typ) << 12
		d.lastName, d.lastOK = name, false
		if check {
			var st unix.Stat_t
			if err := d.node.backing().statName(d.fd, name, &st); err != nil {
				continue
			}
			mode = st.Mode
			d.lastSt, d.lastOK = st, true
			if !dec.hardlinks {
				v.host.watcher.shows(b, &st)
			}
			if dec.hides(sp, p, &st, func() (string, error) { return readlinkat(d.fd, name) }) {
				if st.Mode&unix.S_IFMT == unix.S_IFREG && !d.node.noListCache.Swap(true) {
					// Nothing reports the other link going away: this
					// listing goes once it is in the cache, and later
					// ones are never kept.
					in := d.node.EmbeddedInode()
					go v.dropListing(in, barrierName, entryDropped)
				}
				continue
			}
		}
		st := unix.Stat_t{Ino: ino, Dev: b.dev, Mode: mode}
		return &fuse.DirEntry{Name: name, Mode: mode, Ino: v.stableAttr(&st).Ino, Off: off}, 0
	}
}

// Seekdir moves to an offset the kernel was handed (an entry's d_off, or
// 0): the entries from there are read and decided again.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.node.view.acts(func() syscall.Errno { return d.seekdir(off) })
}

func (d *dirHandle) seekdir(off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off == d.at && d.buf != nil {
		return 0
	}
	if _, err := unix.Seek(d.fd, int64(off), 0); err != nil {
		return errnoOf(err)
	}
	d.bo, d.bn, d.at = 0, 0, off
	return 0
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.node.view.acts(func() syscall.Errno {
		d.mu.Lock()
		defer d.mu.Unlock()
		return errnoOf(unix.Fsync(d.fd))
	})
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.node.view.acts(func() syscall.Errno {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.fd >= 0 {
			unix.Close(d.fd)
			d.fd = -1
		}
		return 0
	})
	d.node.view.cache.listingsIn.leave(d.round)
}

// reopenDir opens the directory an O_PATH fd stands for, for reading: as
// "." beneath it, which is that directory and needs no walk through /proc;
// through /proc (reopen) when the caller may read it but not search it.
func reopenDir(pathFD int) (int, error) {
	for {
		fd, err := unix.Openat(pathFD, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		switch err {
		case unix.EINTR:
			continue
		case unix.EACCES:
			return reopen(pathFD, unix.O_RDONLY|unix.O_DIRECTORY)
		}
		return fd, err
	}
}

// parseDirent decodes one linux_dirent64: off is the offset of the entry
// after it.
func parseDirent(b []byte) (name string, typ uint8, ino, off uint64, reclen int) {
	if len(b) < 19 {
		return "", 0, 0, 0, len(b)
	}
	ino = binary.NativeEndian.Uint64(b[0:8])
	off = binary.NativeEndian.Uint64(b[8:16])
	reclen = int(binary.NativeEndian.Uint16(b[16:18]))
	if reclen == 0 || reclen > len(b) {
		return "", 0, 0, 0, len(b)
	}
	typ = b[18]
	nameb := b[19:reclen]
	for i, c := range nameb {
		if c == 0 {
			nameb = nameb[:i]
			break
		}
	}
	return string(nameb), typ, ino, off, reclen
}

// connFS is what a connection (a view's own, or the hub's) answers beyond
// go-fuse's bridge, which it wraps: directories are opened by the kernel
// with no handle, each listing opens its directory for itself (withDir),
// and an absence the nodes mark as one the kernel may remember becomes a
// negative entry (Lookup, node.go).
type connFS struct {
	fuse.RawFileSystem
	notify *fuseconn.Notifier // the bridge's calls into the kernel
}

// serve is what a connection of the views serves (fuseconn.Options.Wrap):
// the guard, connFS, then go-fuse's bridge to the nodes, which reach the
// kernel through n.
func (g guardFS) serve(bridge fuse.RawFileSystem, n *fuseconn.Notifier) fuse.RawFileSystem {
	g.RawFileSystem = connFS{RawFileSystem: bridge, notify: n}
	return g
}

// Init gives the notifier the server. The bridge is not told: it reaches
// the kernel through the notifier it was made with.
func (c connFS) Init(s *fuse.Server) {
	if c.notify != nil {
		c.notify.Init(s)
	}
}

// OpenDir answers ENOSYS: the kernel then opens every directory of the
// connection by itself, with no OPENDIR or RELEASEDIR round trip, and keeps
// the listings it reads in its cache until the daemon drops them
// (cache_listing.go). READDIR and FSYNCDIR come with no handle (withDir).
func (c connFS) OpenDir(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return fuse.ENOSYS
}

func (c connFS) ReadDir(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return c.withDir(cancel, &input.InHeader, input.Fh, func(fh uint64) fuse.Status {
		in := *input
		in.Fh = fh
		return c.RawFileSystem.ReadDir(cancel, &in, out)
	})
}

func (c connFS) ReadDirPlus(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return c.withDir(cancel, &input.InHeader, input.Fh, func(fh uint64) fuse.Status {
		in := *input
		in.Fh = fh
		return c.RawFileSystem.ReadDirPlus(cancel, &in, out)
	})
}

func (c connFS) FsyncDir(cancel <-chan struct{}, input *fuse.FsyncIn) fuse.Status {
	return c.withDir(cancel, &input.InHeader, input.Fh, func(fh uint64) fuse.Status {
		in := *input
		in.Fh = fh
		return c.RawFileSystem.FsyncDir(cancel, &in)
	})
}

// withDir runs op on the directory the request names, opened for it alone,
// as the request's caller, through the nodes' own OPENDIR handling (the
// choke point decides it), and released after. The kernel opened the
// directory with no handle (OpenDir): a request that carries one is refused.
func (c connFS) withDir(cancel <-chan struct{}, h *fuse.InHeader, fh uint64, op func(fh uint64) fuse.Status) fuse.Status {
	if fh != 0 {
		return fuse.EBADF
	}
	var open fuse.OpenOut
	if code := c.RawFileSystem.OpenDir(cancel, &fuse.OpenIn{InHeader: *h, Flags: syscall.O_RDONLY}, &open); code != fuse.OK {
		return code
	}
	defer c.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: *h, Fh: open.Fh})
	return op(open.Fh)
}

// ReleaseDir never comes (no directory is opened with a handle); a handle
// withDir opened is released there.
func (c connFS) ReleaseDir(input *fuse.ReleaseIn) {}
