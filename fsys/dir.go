package fsys

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// dirHandle is an open directory. It reads the backing directory as the
// kernel asks, and decides each entry when it hands it out, in the
// session's context at that moment and for the directory's current path
// (found from its fd): a handle opened before a context switch never lists
// a name the new context denies, and nothing is kept between READDIRs.
type dirHandle struct {
	node *node

	mu      sync.Mutex
	fd      int
	buf     []byte
	off, n  int
	pos     uint64 // entries handed out since the last rewind
	dirPath string
	dirOK   bool
	cached  bool // opened with its listing cached (listing.go)
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
	_ fs.FileFsyncdirer   = (*dirHandle)(nil)
)

// OpendirHandle opens the directory the node stands for, as the caller
// (reading a directory needs read permission on it).
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	t, errno := n.enter(ctx, opLookup, "")
	if errno != 0 {
		return nil, 0, errno
	}
	defer t.leave()
	if !t.isDir() {
		return nil, 0, syscall.ENOTDIR
	}
	n.watch(t.path)
	fd, err := reopenDir(t.fd)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	open, cached := n.cacheFlags(&t, fd)
	return &dirHandle{node: n, fd: fd, cached: cached}, open, 0
}

var _ fs.FileLookuper = (*dirHandle)(nil)

// Lookup gives a READDIRPLUS listing a full entry for a name the view does
// not know yet (see node.lookup for ruled names, plusMu for reloads).
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n := d.node
	if n.GetChild(name) != nil {
		// Known already: the kernel has its entry, or looks it up on its
		// own. Deciding it again for every listing would cost what a warm
		// walk saves.
		return nil, syscall.ENOENT
	}
	in, errno := n.lookup(ctx, name, out, true)
	if errno == 0 {
		n.view.plusHanded.Store(true)
	}
	if plusDelay > 0 {
		time.Sleep(plusDelay)
	}
	return in, errno
}

// plusDelay is zero except in the integration tests' build
// (testhooks_condfstest.go).
var plusDelay time.Duration

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
		if d.off >= d.n {
			if d.buf == nil {
				// Most opens of a cached listing never read.
				d.buf = make([]byte, 8<<10)
			}
			nb, err := unix.Getdents(d.fd, d.buf)
			if err != nil {
				return nil, errnoOf(err)
			}
			if nb <= 0 {
				return nil, 0
			}
			d.off, d.n = 0, nb
			// The directory may have moved since the last batch.
			p, _, unlinked, ok := b.spacePath(d.fd)
			d.dirPath, d.dirOK = p, ok && !unlinked
		}
		name, typ, ino, reclen := parseDirent(d.buf[d.off:d.n])
		d.off += reclen
		if !d.dirOK || name == "" || name == "." || name == ".." {
			continue
		}
		p := join(d.dirPath, name)
		snap := v.snapshot()
		if vis, _ := snap.cfg.Visible(sp, p, snap.atoms); !vis {
			continue
		}
		mode := uint32(typ) << 12
		if typ == unix.DT_LNK || typ == unix.DT_UNKNOWN || (typ == unix.DT_REG && snap.cfg.HasRules(sp) && !v.opts.AllowHardlinks) {
			var st unix.Stat_t
			if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue
			}
			mode = st.Mode
			if !v.opts.AllowHardlinks {
				v.opts.Watcher.shows(&st)
			}
			if v.hides(snap.cfg, sp, p, &st, func() (string, error) { return readlinkat(d.fd, name) }) {
				if st.Mode&unix.S_IFMT == unix.S_IFREG {
					// Nothing reports the other link going away.
					d.node.noListCache.Store(true)
				}
				continue
			}
		}
		d.pos++
		st := unix.Stat_t{Ino: ino, Dev: b.dev, Mode: mode}
		return &fuse.DirEntry{Name: name, Mode: mode, Ino: v.stableAttr(&st).Ino, Off: d.pos}, 0
	}
}

// Seekdir rewinds (offset 0) or moves to the offset of an entry already
// handed out, by rewinding and skipping: the entries are decided again.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	if off == d.pos {
		d.mu.Unlock()
		return 0
	}
	if _, err := unix.Seek(d.fd, 0, 0); err != nil {
		d.mu.Unlock()
		return errnoOf(err)
	}
	d.off, d.n, d.pos = 0, 0, 0
	d.mu.Unlock()
	for d.pos < off {
		de, errno := d.Readdirent(ctx)
		if errno != 0 {
			return errno
		}
		if de == nil {
			break
		}
	}
	return 0
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	return errnoOf(unix.Fsync(d.fd))
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fd >= 0 {
		unix.Close(d.fd)
		d.fd = -1
		if d.cached {
			d.node.closedListing()
		}
	}
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
