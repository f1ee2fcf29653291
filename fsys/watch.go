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
	next    batch
	// above: watches of the directories above the backing roots (their
	// own attributes only).
	above  map[int32]bool
	closed bool
	done   chan struct{}

	linksDone chan struct{}
	failed    atomic.Bool // reading events failed: nothing is reported any more
}

// batch is what changed since the last flush, told together once
// coalesce has passed.
type batch struct {
	pending      map[pendingKey]uint32
	linked       map[uint64]bool // filesystems where a file got another name
	aboveChanged bool            // a directory above a backing root changed
	timer        *time.Timer     // the flush to come or running; nil: none
	// markers are syncs waiting for the reader to pass their marker;
	// told, those it passed, closed once this batch is told.
	markers map[int32]chan struct{}
	told    []chan struct{}
}

// live reports whether w reports changes, so that views may cache long.
func (w *Watcher) live() bool { return w != nil && !w.failed.Load() }

type watch struct {
	path  string
	nodes map[watched]struct{}
}

// watched is a directory the watcher watches for some view (a directory
// node): it keeps the watch's descriptor, is told of every change below it,
// and names its owner, which is told of what concerns all it caches. The
// watcher reports; what a change drops is the view's business.
type watched interface {
	wdSlot() *atomic.Int32 // the watch's descriptor (0: none), set under Watcher.mu
	// changed: name in the directory at dir (or the directory itself, "")
	// changed as mask says; multiNamedAt tells whether a path names a file
	// with several names (each path is looked at once per flush).
	changed(name string, mask uint32, dir string, multiNamedAt func(p string) bool)
	owner() changeSink
}

// changeSink is told of changes that concern everything it caches.
type changeSink interface {
	// dropCaches: events were lost, or a directory above a backing root
	// changed.
	dropCaches()
	// linkedOn: a file on one of the filesystems devs got another name.
	linkedOn(devs map[uint64]bool)
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
		byWD: map[int32]*watch{}, next: batch{pending: map[pendingKey]uint32{}, linked: map[uint64]bool{}}, above: map[int32]bool{}, done: make(chan struct{}),
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
	if w.next.timer != nil {
		w.next.timer.Stop()
	}
	for wd, c := range w.next.markers {
		close(c)
		delete(w.next.markers, wd)
	}
	for _, c := range w.next.told {
		close(c)
	}
	w.next.told = nil
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
func (w *Watcher) add(n watched, path string) {
	w.mu.Lock()
	if w.closed || n.wdSlot().Load() != 0 || len(w.byWD)+w.adding >= w.max {
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
	if w.closed || n.wdSlot().Load() != 0 {
		// Closed meanwhile, or another request watched n first (the same
		// directory has the same wd: the watch stays for that one).
		return
	}
	ws := w.byWD[int32(wd)]
	if ws == nil {
		ws = &watch{path: path, nodes: map[watched]struct{}{}}
		w.byWD[int32(wd)] = ws
	}
	ws.nodes[n] = struct{}{}
	n.wdSlot().Store(int32(wd))
}

// remove forgets n; the last node of a directory ends its watch.
func (w *Watcher) remove(n watched) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wd := n.wdSlot().Load()
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
	n.wdSlot().Store(0)
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
	if w == nil || b.above == "/" {
		return
	}
	for dir := filepath.Dir(b.above); ; dir = filepath.Dir(dir) {
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

// removeOwner forgets every directory of o: an unmounted view's nodes may
// never be forgotten one by one (a connection of its own just stops).
func (w *Watcher) removeOwner(o changeSink) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, ws := range w.byWD {
		for n := range ws.nodes {
			if n.owner() == o {
				delete(ws.nodes, n)
				n.wdSlot().Store(0)
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
			case ev.Mask&unix.IN_IGNORED != 0 && w.next.markers[ev.Wd] != nil:
				w.passed(ev.Wd)
			case ev.Mask&unix.IN_IGNORED != 0:
				// The directory is gone (or the watch removed): its
				// nodes are unwatched now.
				if ws := w.byWD[ev.Wd]; ws != nil {
					for n := range ws.nodes {
						n.wdSlot().Store(0)
					}
					delete(w.byWD, ev.Wd)
				}
				w.removed++
				delete(w.above, ev.Wd)
			default:
				if w.above[ev.Wd] && name == "" {
					w.next.aboveChanged = true
				}
				w.next.pending[pendingKey{ev.Wd, name}] |= ev.Mask
				if w.next.timer == nil {
					w.next.timer = time.AfterFunc(coalesce, w.flush)
				}
			}
		}
		w.mu.Unlock()
	}
}

type notice struct {
	n    watched
	name string
	mask uint32
	path string // the directory's backing path
}

// flush tells the watched directories, and their owners, of the changes
// gathered. Nothing is held while they are told: what they do may wait for
// a directory's lock, which a request being served may hold.
func (w *Watcher) flush() {
	w.mu.Lock()
	var todo []notice
	for k, mask := range w.next.pending {
		if ws := w.byWD[k.wd]; ws != nil {
			for n := range ws.nodes {
				todo = append(todo, notice{n, k.name, mask, ws.path})
			}
		}
	}
	clear(w.next.pending)
	told := w.next.told
	w.next.told = nil
	above := w.next.aboveChanged
	w.next.aboveChanged = false
	var linkedOwners map[changeSink]map[uint64]bool
	if len(w.next.linked) > 0 {
		linkedOwners = map[changeSink]map[uint64]bool{}
		for _, ws := range w.byWD {
			for n := range ws.nodes {
				linkedOwners[n.owner()] = w.next.linked
			}
		}
		w.next.linked = map[uint64]bool{}
	}
	// w.next.timer stays set until this flush ends (see the end), so that
	// events meanwhile wait for the next one: one flush runs at a time.
	w.mu.Unlock()
	defer w.flushed(told)
	if above {
		w.log.Info("a directory above a backing root changed; every view's cache is dropped")
		for _, v := range w.host.each() {
			v.dropCaches()
		}
	}
	for o, devs := range linkedOwners {
		o.linkedOn(devs)
	}
	seen := map[string]bool{}
	multiNamedAt := func(p string) bool {
		if m, ok := seen[p]; ok {
			return m
		}
		var st unix.Stat_t
		seen[p] = unix.Lstat(p, &st) == nil && multiNamed(&st)
		return seen[p]
	}
	for _, t := range todo {
		t.n.changed(t.name, t.mask, t.path, multiNamedAt)
	}
}

// flushed ends a flush: the next, if events came meanwhile, starts after
// coalesce. Flushes never overlap: each notification may wait for a
// directory's lock that requests being served hold, and a flush started
// every coalesce while others waited was a thread each (a writev to
// /dev/fuse), without bound under a caller's load.
func (w *Watcher) flushed(told []chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next.timer = nil
	for _, c := range told {
		close(c)
	}
	if !w.closed && (len(w.next.pending) > 0 || w.next.aboveChanged || len(w.next.linked) > 0) {
		w.next.timer = time.AfterFunc(coalesce, w.flush)
		return
	}
	// Syncs whose marker came during this flush, with nothing after it:
	// what was queued before them is told.
	for _, c := range w.next.told {
		close(c)
	}
	w.next.told = nil
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
		w.next.linked[d] = true
	}
	if w.next.timer == nil {
		w.next.timer = time.AfterFunc(coalesce, w.flush)
	}
}

// shows records that a view shows the file st of b in a space with rules.
func (w *Watcher) shows(b *backing, st *unix.Stat_t) {
	if w != nil {
		w.links.show(b, st)
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
	owners := map[changeSink]struct{}{}
	for _, ws := range w.byWD {
		for n := range ws.nodes {
			owners[n.owner()] = struct{}{}
		}
	}
	w.mu.Unlock()
	w.log.Warn("inotify queue overflowed; every view's cache is dropped")
	for o := range owners {
		o.dropCaches()
	}
}
