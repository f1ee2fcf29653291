package fsys

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Watcher lets the kernel keep what views show for a long time. Entries
// and attributes are cached for Watcher's TTL instead of a second (a switch
// or a reload drops every entry whose decision it changes, whatever the
// TTL); the Watcher keeps them true to the
// backing trees, which other processes may change, by watching (inotify)
// every backing directory some view's kernel cache holds, and telling each
// such view of every change below it: a name made, removed, moved or
// changed in its attributes loses its cached entry; a file written loses
// its cached attributes and pages.
//
// What is cached is metadata: every open, read of a ruled file, listing and
// mutation still reaches the daemon and is decided then, so a change the
// Watcher is late to report (events are coalesced for a few milliseconds)
// or never sees (a network filesystem's remote changes; a queue overflow
// invalidates everything) shows at worst stale names and attributes for up
// to the TTL, never content the rules deny.
type Watcher struct {
	host *Host
	f    *os.File // the inotify fd, read through the runtime poller
	ttl  time.Duration
	log  *slog.Logger

	max     int        // the most watches it holds (a share of the uid's inotify limit)
	links   *linkWatch // nil: views check link counts themselves
	mu      sync.Mutex
	byWD    map[int32]*watch
	adding  int    // watches being added (add), counted against max
	removed uint64 // watches removed (an add in flight may have got a dead wd)
	pending map[pendingKey]uint32
	linked  map[uint64]bool // filesystems where a file got another name
	// above: watches of the directories above the backing roots (their
	// own attributes only); aboveChanged, one of them changed since the
	// last flush.
	above        map[int32]bool
	aboveChanged bool
	timer        *time.Timer
	closed       bool
	done         chan struct{}

	linksDone chan struct{}
	failed    atomic.Bool // reading events failed: nothing is reported any more
}

// live reports whether w reports changes, so that views may cache long.
func (w *Watcher) live() bool { return w != nil && !w.failed.Load() }

type watch struct {
	path  string
	nodes map[*node]struct{}
}

type pendingKey struct {
	wd   int32
	name string
}

const (
	watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB |
		unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
		unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW | unix.IN_EXCL_UNLINK
	// coalesce gathers a burst of events (a writer's IN_MODIFY per
	// write) into one notification per name.
	coalesce = 10 * time.Millisecond
)

// newWatcher starts h's watcher; ttl is how long unruled entries and
// attributes are cached.
func newWatcher(h *Host, ttl time.Duration) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &Watcher{
		host: h, f: os.NewFile(uintptr(fd), "inotify"), ttl: ttl, log: h.log, max: maxWatches(),
		byWD: map[int32]*watch{}, pending: map[pendingKey]uint32{}, linked: map[uint64]bool{}, above: map[int32]bool{}, done: make(chan struct{}),
		links: newLinkWatch(h.hooks),
	}
	go w.read()
	if w.links != nil {
		w.linksDone = make(chan struct{})
		go func() {
			defer close(w.linksDone)
			w.links.read(w.linkedOn)
		}()
	}
	return w, nil
}

// Close stops the watcher. Views that use it keep their caches until the
// TTL; close it after them.
func (w *Watcher) Close() error {
	w.mu.Lock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	err := w.f.Close()
	<-w.done
	if w.links != nil {
		w.links.close()
		<-w.linksDone
	}
	return err
}

// maxWatches is a quarter of fs.inotify.max_user_watches, at most 65,536.
func maxWatches() int {
	n := 8192
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_watches"); err == nil {
		fmt.Sscan(string(b), &n)
	}
	return max(1, min(65536, n/4))
}

// add watches the backing directory at path for n (a directory node). The
// watch is added with nothing held: inotify_add_watch resolves path, which
// may block on a backing filesystem that hangs, and lookups in every view
// and the event reader take w.mu.
func (w *Watcher) add(n *node, path string) {
	w.mu.Lock()
	if w.closed || n.wd.Load() != 0 || len(w.byWD)+w.adding >= w.max {
		// Beyond its share, directories are not watched and their entries
		// get the short TTL: a caller who makes and walks many directories
		// must not use up the daemon's uid's watches, which other services
		// of that uid share.
		w.mu.Unlock()
		return
	}
	w.adding++
	var wd int
	var err error
	for try := 0; ; try++ {
		removed := w.removed
		w.mu.Unlock()
		wd, err = unix.InotifyAddWatch(int(w.f.Fd()), path, watchMask)
		w.mu.Lock()
		if err != nil || w.removed == removed {
			break
		}
		// A watch was removed meanwhile: perhaps this one (the last node
		// of the same directory went), and its wd is dead. Add it again.
		if try == 2 {
			w.adding--
			w.mu.Unlock()
			return
		}
	}
	defer w.mu.Unlock()
	w.adding--
	if err != nil {
		// No watch (the limit is reached, or the directory went): the
		// node's entries are then cached for the short TTL only.
		w.log.Debug("inotify_add_watch", "path", path, "err", err)
		return
	}
	if w.closed || n.wd.Load() != 0 {
		// Closed meanwhile, or another request watched n first (the same
		// directory has the same wd: the watch stays for that one).
		return
	}
	ws := w.byWD[int32(wd)]
	if ws == nil {
		ws = &watch{path: path, nodes: map[*node]struct{}{}}
		w.byWD[int32(wd)] = ws
	}
	ws.nodes[n] = struct{}{}
	n.wd.Store(int32(wd))
}

// remove forgets n; the last node of a directory ends its watch.
func (w *Watcher) remove(n *node) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wd := n.wd.Load()
	if wd == 0 {
		return
	}
	if ws := w.byWD[wd]; ws != nil {
		delete(ws.nodes, n)
		if len(ws.nodes) == 0 {
			delete(w.byWD, wd)
			if !w.closed && !w.above[wd] {
				unix.InotifyRmWatch(int(w.f.Fd()), uint32(wd))
				w.removed++
			}
		}
	}
	n.wd.Store(0)
}

// aboveMask: a directory above a backing root matters only for its own
// search permission (mode, owner, ACLs) and for going away. IN_MASK_ADD
// keeps a backing directory's watch of the same inode whole.
const aboveMask = unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW | unix.IN_MASK_ADD

// watchAbove watches the directories above b's root. A native walk to the
// backing tree crosses them, and the daemon checks that its callers may
// (ancestorsSearchable), but what the kernel answers from its cache (a
// walk through cached entries, a stat, a listing) never reaches the
// daemon: when one of them changes its attributes, every view drops its
// cache, and the next answer is decided as the caller again.
func (w *Watcher) watchAbove(b *backing) {
	if w == nil || b.real == "/" {
		return
	}
	for dir := filepath.Dir(b.real); ; dir = filepath.Dir(dir) {
		// Added with nothing held (see add).
		if wd, err := unix.InotifyAddWatch(int(w.f.Fd()), dir, aboveMask); err == nil {
			w.mu.Lock()
			w.above[int32(wd)] = true
			w.mu.Unlock()
		} else {
			w.log.Debug("inotify_add_watch above a backing root", "path", dir, "err", err)
		}
		if dir == "/" {
			return
		}
	}
}

// removeView forgets every node of v: an unmounted view's nodes may never
// be forgotten one by one (a connection of its own just stops).
func (w *Watcher) removeView(v *View) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, ws := range w.byWD {
		for n := range ws.nodes {
			if n.view == v {
				delete(ws.nodes, n)
				n.wd.Store(0)
			}
		}
		if len(ws.nodes) == 0 {
			delete(w.byWD, wd)
			if !w.closed {
				unix.InotifyRmWatch(int(w.f.Fd()), uint32(wd))
				w.removed++
			}
		}
	}
}

// ttlFor is how long the kernel may keep an entry below the directory node
// dir, or its attributes: long when the watcher reports changes in dir,
// else 0 (the view's default). A ruled directory's own attributes are the
// exception (see attrTTL).
func (w *Watcher) ttlFor(dir *node) time.Duration {
	if !w.live() || dir == nil || dir.wd.Load() == 0 {
		return 0
	}
	return w.ttl
}

func (w *Watcher) read() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		nr, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.log.Error("inotify read; views keep their short caches only", "err", err)
				w.failed.Store(true)
				w.overflow()
			}
			return
		}
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= nr; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			name := string(nameBytes)
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				w.mu.Unlock()
				w.overflow()
				w.mu.Lock()
			case ev.Mask&unix.IN_IGNORED != 0:
				// The directory is gone (or the watch removed): its
				// nodes are unwatched now.
				if ws := w.byWD[ev.Wd]; ws != nil {
					for n := range ws.nodes {
						n.wd.Store(0)
					}
					delete(w.byWD, ev.Wd)
				}
				w.removed++
				delete(w.above, ev.Wd)
			default:
				if w.above[ev.Wd] && name == "" {
					w.aboveChanged = true
				}
				w.pending[pendingKey{ev.Wd, name}] |= ev.Mask
				if w.timer == nil {
					w.timer = time.AfterFunc(coalesce, w.flush)
				}
			}
		}
		w.mu.Unlock()
	}
}

type notice struct {
	n    *node
	name string
	mask uint32
	path string // the directory's backing path
}

// flush tells the views of the changes gathered. Nothing is held while the
// kernel is told: a notification waits for the directory's lock, which a
// request being served may hold.
func (w *Watcher) flush() {
	w.mu.Lock()
	var todo []notice
	for k, mask := range w.pending {
		if ws := w.byWD[k.wd]; ws != nil {
			for n := range ws.nodes {
				todo = append(todo, notice{n, k.name, mask, ws.path})
			}
		}
	}
	clear(w.pending)
	above := w.aboveChanged
	w.aboveChanged = false
	var linkedViews map[*View]map[uint64]bool
	if len(w.linked) > 0 {
		linkedViews = map[*View]map[uint64]bool{}
		for _, ws := range w.byWD {
			for n := range ws.nodes {
				linkedViews[n.view] = w.linked
			}
		}
		w.linked = map[uint64]bool{}
	}
	// w.timer stays set until this flush ends (see the end), so that
	// events meanwhile wait for the next one: one flush runs at a time.
	w.mu.Unlock()
	defer w.flushed()
	if above {
		w.log.Info("a directory above a backing root changed; every view's cache is dropped")
		for _, v := range w.host.each() {
			v.dropCaches()
		}
	}
	for v, devs := range linkedViews {
		v.linkedOn(devs)
	}
	linked := map[string]bool{}
	for _, t := range todo {
		v := t.n.view
		if v.closed.Load() {
			continue
		}
		if t.mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 && t.name != "" && !w.watchesLinks(t.n.backing()) {
			// A new name for an existing file (link(2)) changes no event
			// of the file's other names' directories, yet hides them in a
			// space with rules: every cached entry of that space goes.
			// (The link watch reports it instead where it runs, wherever
			// the name is made.)
			p := t.path + "/" + t.name
			if _, seen := linked[p]; !seen {
				var st unix.Stat_t
				linked[p] = unix.Lstat(p, &st) == nil && multiNamed(&st)
			}
			if linked[p] && v.decision().hidesLinked(t.n.space) {
				if sp := v.root.GetChild(t.n.space.String()); sp != nil {
					v.invalidateEntries(sp)
				}
				v.dropListings(nil)
			}
		}
		dir := t.n.EmbeddedInode()
		dir.NotifyContent(-1, 0) // the directory's own attributes (mtime, nlink)
		if t.name == "" {
			if t.mask&unix.IN_MOVE_SELF != 0 && v.decision().ruledSpace(t.n.space) {
				// The names below moved with it: rules may decide them
				// differently now.
				v.lists.epoch.Add(1)
				v.dropListings(nil)
			}
			continue
		}
		if t.mask&^(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) != 0 {
			// Made, removed, moved, or its attributes changed (a link
			// count, a mode): the next access looks it up and decides,
			// and a cached listing goes (after the listings in flight).
			v.dropListing(dir, t.name)
		}
		if ch := dir.GetChild(t.name); ch != nil {
			ch.NotifyContent(0, 0) // attributes and cached pages
		}
	}
}

// flushed ends a flush: the next, if events came meanwhile, starts after
// coalesce. Flushes never overlap: each notification may wait for a
// directory's lock that requests being served hold, and a flush started
// every coalesce while others waited was a thread each (a writev to
// /dev/fuse), without bound under a caller's load.
func (w *Watcher) flushed() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = nil
	if !w.closed && (len(w.pending) > 0 || w.aboveChanged || len(w.linked) > 0) {
		w.timer = time.AfterFunc(coalesce, w.flush)
	}
}

// linkedOn is told by the link watch of filesystems on which a file got
// another name; the views hear of it with the next flush.
func (w *Watcher) linkedOn(devs map[uint64]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	for d := range devs {
		w.linked[d] = true
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(coalesce, w.flush)
	}
}

// shows records that a view shows the file st in a space with rules.
func (w *Watcher) shows(st *unix.Stat_t) {
	if w != nil {
		w.links.show(st)
	}
}

// watchesLinks reports whether link counts rising on b's filesystem are
// reported (see linkWatch).
func (w *Watcher) watchesLinks(b *backing) bool {
	return w != nil && w.links.watches(b)
}

// overflow: events were lost, so every view loses what it cached.
func (w *Watcher) overflow() {
	w.mu.Lock()
	views := map[*View]struct{}{}
	for _, ws := range w.byWD {
		for n := range ws.nodes {
			views[n.view] = struct{}{}
		}
	}
	w.mu.Unlock()
	w.log.Warn("inotify queue overflowed; every view's cache is dropped")
	for v := range views {
		v.dropCaches()
	}
}

// dropCaches drops every entry and listing the kernel caches for v.
func (v *View) dropCaches() {
	if v.closed.Load() {
		return
	}
	if !v.bumpEpoch(false) {
		v.invalidateEntries(v.root.EmbeddedInode())
	}
	v.lists.epoch.Add(1)
	v.dropListings(nil)
}
