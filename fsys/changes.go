package fsys

import (
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// Changes records what a view changes in its backing trees, so that it can
// be undone (the changes package, docs/changes.md). Every mutation calls
// Before, on the thread acting as the caller, once the choke point has
// decided it and before it is made: an error refuses the change (with the
// errno it wraps, EIO otherwise), so nothing is changed unrecorded. After
// (or Wrote, for a write through an open file) follows a change that was
// made. A directory's rename is announced by Moved and confirmed by
// Renamed. Armed is checked first, and is false until a checkpoint exists:
// before one, a change costs an atomic load or two.
type Changes interface {
	Armed() bool
	Before(space, path string) error
	Moved(space, from, to string, exchange bool) error
	Renamed(space, from, to string, exchange bool)
	After(space, path string)
	Wrote(space, path string, fd int)
}

// recorders holds the views' Changes: a view with none costs a mutation
// one atomic load (count).
type recorders struct {
	count atomic.Int32
	m     sync.Map // *View → Changes
}

// SetChanges gives the view its recorder (nil: none). The daemon sets it
// before the view is handed out and clears it when the session closes.
func (v *View) SetChanges(c Changes) {
	r := &v.host.recorders
	if c == nil {
		if _, ok := r.m.LoadAndDelete(v); ok {
			r.count.Add(-1)
		}
		return
	}
	if _, loaded := r.m.Swap(v, c); !loaded {
		r.count.Add(1)
	}
}

// recorder gives the view's recorder when it records (a checkpoint
// exists), else nil.
func (v *View) recorder() Changes {
	r := &v.host.recorders
	if r.count.Load() == 0 {
		return nil
	}
	c, ok := r.m.Load(v)
	if !ok {
		return nil
	}
	if ch := c.(Changes); ch.Armed() {
		return ch
	}
	return nil
}

// changing records p of sp before a change; a failure refuses it.
func (v *View) changing(sp space, p string) (Changes, syscall.Errno) {
	c := v.recorder()
	if c == nil {
		return nil, 0
	}
	if err := c.Before(sp.String(), p); err != nil {
		v.log.Warn("change not recorded; refused", "space", sp.String(), "path", p, "err", err)
		return nil, changeErrno(err)
	}
	return c, 0
}

// changed notes a change made after changing.
func changed(c Changes, sp space, p string) {
	if c != nil {
		c.After(sp.String(), p)
	}
}

func changeErrno(err error) syscall.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		switch e {
		case unix.ENOSPC, unix.EACCES, unix.EPERM, unix.ENOENT, unix.ELOOP, unix.ENOTDIR, unix.EXDEV:
			return e
		}
	}
	return syscall.EIO
}

// renaming records both names of a rename (a directory as a move).
func (v *View) renaming(sp space, from, to string, dirMoves, exchange bool) (Changes, syscall.Errno) {
	c := v.recorder()
	if c == nil {
		return nil, 0
	}
	s := sp.String()
	var err error
	if dirMoves {
		if !exchange {
			err = c.Before(s, to)
		}
		if err == nil {
			err = c.Moved(s, from, to, exchange)
		}
	} else {
		err = c.Before(s, from)
		if err == nil {
			err = c.Before(s, to)
		}
	}
	if err != nil {
		v.log.Warn("rename not recorded; refused", "space", s, "from", from, "to", to, "err", err)
		return nil, changeErrno(err)
	}
	return c, 0
}

// noteRenamed notes a rename made after renaming.
func noteRenamed(c Changes, sp space, from, to string, dirMoves, exchange bool) {
	if c == nil {
		return
	}
	s := sp.String()
	if dirMoves {
		c.Renamed(s, from, to, exchange)
	}
	c.After(s, from)
	c.After(s, to)
}

// writing records the file an open handle writes, before a write,
// truncate, chmod or allocate through it; p is its path now.
func (h *fileHandle) writing() (c Changes, p string, errno syscall.Errno) {
	v := h.node.view
	if v.recorder() == nil {
		return nil, "", 0
	}
	h.mu.Lock()
	p = h.last
	h.mu.Unlock()
	c, errno = v.changing(h.node.space, p)
	return c, p, errno
}

// wrote notes a change made through the handle.
func (h *fileHandle) wrote(c Changes, p string) {
	if c == nil {
		return
	}
	h.withFD(func(fd int) syscall.Errno {
		c.Wrote(h.node.space.String(), p, fd)
		return 0
	})
}

// Restored tells the view that a rollback changed paths of the space
// named spaceName in its backing tree behind the kernel's back (moved: a
// directory renamed back, under each of its names). Before it returns the
// kernel keeps nothing of them from before, as a switch keeps nothing it
// changes: each name's entry is dropped, or expired when it still names
// the same inode (as the Watcher's report of the change would do, later);
// the attributes and cached pages of the node there go, so that a
// descriptor of a file restored in place reads the restored content; the
// directory holding it loses its attributes and its cached listing. Below
// a directory moved back every cached entry and node goes the same way:
// their names changed with it.
func (v *View) Restored(spaceName string, paths []string, moved []string) {
	if v.closed.Load() {
		return
	}
	// What the watcher has queued (the rollback's own changes among it) is
	// told first: no report of it comes after this invalidation.
	if !v.host.watcher.sync(time.Second) {
		v.log.Warn("rollback: the backing watch did not report in time; invalidating anyway")
	}
	sp, ok := spaceByName(spaceName)
	if !ok {
		return
	}
	top := v.root.EmbeddedInode().GetChild(sp.String())
	if top == nil {
		return // nothing of the space is cached
	}
	below := v.stale()
	if below != entryExpired {
		below = entryDropped
	}
	for _, p := range moved {
		if in := cachedAt(top, p); in != nil {
			v.restoredBelow(in, below)
		}
	}
	byDepth := append([]string(nil), paths...)
	byDepth = append(byDepth, moved...)
	sort.SliceStable(byDepth, func(i, j int) bool {
		return strings.Count(byDepth[i], "/") > strings.Count(byDepth[j], "/")
	})
	dirs := map[*fs.Inode]bool{}
	seen := map[string]bool{}
	for _, p := range byDepth {
		if seen[p] {
			continue
		}
		seen[p] = true
		if p == "/" {
			top.NotifyContent(0, 0)
			continue
		}
		dir, name := split(p)
		din := cachedAt(top, dir)
		if din == nil {
			continue // nothing cached below dir
		}
		v.dropListing(din, name, v.restoredFate(din, p, name))
		if ch := din.GetChild(name); ch != nil {
			ch.NotifyContent(0, 0) // attributes and pages
		}
		dirs[din] = true
	}
	for din := range dirs {
		din.NotifyContent(-1, 0) // its mtime and link count
	}
}

// cachedAt is the node the view's tree has at p below the space's top
// node, or nil.
func cachedAt(top *fs.Inode, p string) *fs.Inode {
	in := top
	for _, name := range strings.Split(strings.Trim(p, "/"), "/") {
		if name == "" {
			continue
		}
		if in = in.GetChild(name); in == nil {
			return nil
		}
	}
	return in
}

// restoredFate is what a rollback's change to p (dir's name) does to the
// kernel's entry of it: dropped unless the name still stands for the
// node's inode, beneath the backing root; then expired where the kernel
// can (kept for a directory, dropped otherwise, where it cannot), as
// changedFate decides for the Watcher.
func (v *View) restoredFate(dir *fs.Inode, p, name string) entryFate {
	ch := dir.GetChild(name)
	if ch == nil {
		return entryDropped // no entry, or a negative one
	}
	cn, ok := ch.Operations().(*node)
	if !ok {
		return entryDropped
	}
	b := cn.backing()
	if b == nil {
		return entryDropped
	}
	fd, err := b.open(p, unix.O_PATH, 0)
	if err != nil {
		return entryDropped
	}
	var st unix.Stat_t
	err = b.fstat(fd, &st)
	unix.Close(fd)
	if err != nil || st.Dev != cn.dev || st.Ino != cn.ino {
		return entryDropped
	}
	if fate := v.stale(); fate == entryExpired || ch.IsDir() {
		return fate
	}
	return entryDropped
}

// restoredBelow sends every cached entry below dir the fate and drops each
// node's attributes and pages (a directory moved back: the names below it
// changed), deepest first; then dir's own.
func (v *View) restoredBelow(dir *fs.Inode, fate entryFate) {
	v.notifyEntry(dir, barrierName) // after the lookups in flight in it
	for name, child := range dir.Children() {
		if child.IsDir() {
			v.restoredBelow(child, fate)
		} else {
			child.NotifyContent(0, 0)
		}
		v.dropListing(dir, name, fate)
	}
	dir.NotifyContent(0, 0)
}
