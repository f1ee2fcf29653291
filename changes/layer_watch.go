package changes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/fanotify"
)

// A BackingWatch tells staged layers of changes to the names in their
// backing trees made by anyone else (the host, other sessions' views, the
// session's own commit), so that each mounts its layer afresh (Remount):
// overlayfs shows a backing entry as it was when it looked it up, and a
// file another writer replaced by rename, or a directory removed and made
// again, stays so in the staged view until then. Content written in place
// and attributes show through the mount as they change (overlayfs reads the
// backing inode it holds): only names count.
//
// One fanotify group marks each backing filesystem whole (FAN_MARK_FILESYSTEM:
// inotify would need a watch per directory), reporting each create, delete
// and rename with the directory it happened in (FAN_REPORT_DFID_NAME). An
// event counts for a layer's space when its directory is beneath the
// space's backing root, which open_by_handle_at and the directory's path
// tell; the answer is kept per directory (a bounded cache, emptied when a
// directory moves). A space told of a change is mounted again after
// Delay, once for every change in that time: a busy tree costs one remount
// per Delay, and the staged view shows a change within Delay and a
// remount, as a direct view shows one within its attribute timeout. Lost
// events (the queue overflowed) remount every space watched.
type BackingWatch struct {
	f     *os.File
	delay time.Duration

	mu     sync.Mutex
	roots  map[*watchedRoot]struct{}
	marked map[unix.Fsid]bool
	cache  map[string][]*watchedRoot // a directory's file handle → the roots it is beneath
	done   chan struct{}
	closed bool
}

// DefaultWatchDelay is how long a BackingWatch gathers changes before it
// mounts a space again: well inside the views' attribute timeout (1 s).
const DefaultWatchDelay = 200 * time.Millisecond

const maxWatchCache = 1 << 14

type watchedRoot struct {
	real    string // the root's path, as the kernel names it
	exclude string // a directory below it whose changes do not count ("" none)
	fd      int    // O_RDONLY directory: open_by_handle_at's mount
	fsid    unix.Fsid
	changed func()
	timer   *time.Timer // pending remount, guarded by BackingWatch.mu
	wg      sync.WaitGroup
}

// NewBackingWatch starts a watch; it needs CAP_SYS_ADMIN (a root daemon,
// as staged sessions do).
func NewBackingWatch(delay time.Duration) (*BackingWatch, error) {
	if delay <= 0 {
		delay = DefaultWatchDelay
	}
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_DFID_NAME|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("staged: fanotify: %w", err)
	}
	w := &BackingWatch{f: os.NewFile(uintptr(fd), "fanotify"), delay: delay, roots: map[*watchedRoot]struct{}{},
		marked: map[unix.Fsid]bool{}, cache: map[string][]*watchedRoot{}, done: make(chan struct{})}
	go w.read()
	return w, nil
}

const watchMask = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO | unix.FAN_ONDIR

// Watch calls changed (on a goroutine of its own, at most once per delay;
// a change during a call schedules another, which may overlap it) after
// names change beneath dir. stop ends it, waiting for the calls in
// progress.
//
// Changes below exclude (the layer's own directory, should the state
// directory be inside the backing tree: its own writes would remount it
// without end) do not count.
func (w *BackingWatch) Watch(dir, exclude string, changed func()) (stop func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("staged: watch %s: %w", dir, err)
	}
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	var sf unix.Statfs_t
	if err == nil {
		err = unix.Fstatfs(fd, &sf)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("staged: watch %s: %w", dir, err)
	}
	r := &watchedRoot{real: real, fd: fd, fsid: sf.Fsid, changed: changed}
	if exclude != "" {
		if ex, err := filepath.EvalSymlinks(exclude); err == nil {
			r.exclude = ex
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		unix.Close(fd)
		return nil, errors.New("staged: the backing watch is closed")
	}
	if !w.marked[sf.Fsid] {
		if err := unix.FanotifyMark(int(w.f.Fd()), unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, watchMask, unix.AT_FDCWD, real); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("staged: watch the filesystem of %s: %w", dir, err)
		}
		w.marked[sf.Fsid] = true
	}
	w.roots[r] = struct{}{}
	clear(w.cache)
	return func() { w.unwatch(r) }, nil
}

func (w *BackingWatch) unwatch(r *watchedRoot) {
	w.mu.Lock()
	if _, ok := w.roots[r]; !ok {
		w.mu.Unlock()
		return
	}
	delete(w.roots, r)
	clear(w.cache)
	if r.timer != nil && r.timer.Stop() {
		r.wg.Done() // it will not run
	}
	r.timer = nil
	w.mu.Unlock()
	r.wg.Wait() // a remount in progress ends before its layer closes
	unix.Close(r.fd)
}

// Close stops the watch and waits for the remounts in progress. (A
// filesystem mark goes with the group.)
func (w *BackingWatch) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	var roots []*watchedRoot
	for r := range w.roots {
		if r.timer != nil && r.timer.Stop() {
			r.wg.Done() // it will not run
		}
		roots = append(roots, r)
		delete(w.roots, r)
	}
	w.mu.Unlock()
	w.f.Close()
	<-w.done
	for _, r := range roots {
		r.wg.Wait()
		unix.Close(r.fd)
	}
}

// due schedules r's remount after the delay, unless one is pending; w.mu
// is held.
func (w *BackingWatch) due(r *watchedRoot) {
	if r.timer != nil || w.closed {
		return
	}
	r.wg.Add(1)
	r.timer = time.AfterFunc(w.delay, func() {
		defer r.wg.Done()
		w.mu.Lock()
		_, live := w.roots[r]
		if live {
			r.timer = nil // a change from now on schedules another
		}
		w.mu.Unlock()
		if live {
			r.changed()
		}
	})
}

func (w *BackingWatch) read() {
	defer close(w.done)
	err := fanotify.Read(w.f, func(events []fanotify.Event) {
		for _, ev := range events {
			if ev.Mask&unix.FAN_Q_OVERFLOW != 0 {
				w.all()
				continue
			}
			w.event(ev.Info, ev.Mask)
		}
	})
	if !errors.Is(err, os.ErrClosed) {
		w.all() // no more reports: show the trees as they are now
	}
}

// all schedules a remount of every root.
func (w *BackingWatch) all() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for r := range w.roots {
		w.due(r)
	}
}

// event handles one event's directory record: the roots its directory is
// beneath are due a remount. A directory moved empties the cache (what
// was beneath a root may not be now, and the other way round).
func (w *BackingWatch) event(info []byte, mask uint64) {
	id, handle, k, ok := fanotify.FileID(info, unix.FAN_EVENT_INFO_TYPE_DFID_NAME, unix.FAN_EVENT_INFO_TYPE_DFID)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if mask&unix.FAN_ONDIR != 0 && mask&(unix.FAN_MOVED_FROM|unix.FAN_MOVED_TO) != 0 {
		clear(w.cache)
	}
	roots, ok := w.cache[k]
	if !ok {
		for r := range w.roots {
			if r.fsid == id && beneath(r, handle) {
				roots = append(roots, r)
			}
		}
		if len(w.cache) >= maxWatchCache {
			clear(w.cache)
		}
		w.cache[k] = roots
	}
	for _, r := range roots {
		w.due(r)
	}
}

// beneath: the directory handle names is r's root or below it. One gone
// (removed since the event) is not: its removal is reported in the
// directory above it too.
func beneath(r *watchedRoot, handle unix.FileHandle) bool {
	fd, err := unix.OpenByHandleAt(r.fd, handle, unix.O_PATH)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return false
	}
	if r.exclude != "" && (p == r.exclude || strings.HasPrefix(p, r.exclude+"/")) {
		return false
	}
	return p == r.real || strings.HasPrefix(p, strings.TrimSuffix(r.real, "/")+"/")
}

// BackingNamesChanged tells the layer that a name was made, removed or
// moved at path in space's backing tree: the view's own watch of the
// backing directories it has looked up reports it (fsys.Options.OnBackingNames)
// where the daemon has no BackingWatch (one that is not root). The space
// is mounted again after DefaultWatchDelay, once for every change in that
// time, as a BackingWatch does. A change inside the layer's own directory
// (a state directory within the backing tree) never counts: each remount
// changes it.
func (l *Layer) BackingNamesChanged(space, path string) {
	dir, err := filepath.Abs(l.opts.Dir)
	if err != nil || path == dir || strings.HasPrefix(path, dir+"/") {
		return
	}
	if _, ok := l.spaces[space]; !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.namesChanged[space] != nil {
		return
	}
	if l.namesChanged == nil {
		l.namesChanged = map[string]*time.Timer{}
	}
	l.remounts.Add(1)
	l.namesChanged[space] = time.AfterFunc(DefaultWatchDelay, func() {
		defer l.remounts.Done()
		l.mu.Lock()
		delete(l.namesChanged, space)
		l.mu.Unlock()
		if err := l.Remount(space); err != nil {
			l.opts.Log.Warn("staged: the layer could not be mounted again after its backing tree changed", "space", space, "err", err)
		}
	})
}

// Watched: a BackingWatch tells the layer of its backing trees' changes.
func (l *Layer) Watched() bool { return l.opts.Watch != nil }
