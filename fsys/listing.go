package fsys

import (
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Directory listings in the kernel's cache (FOPEN_CACHE_DIR).
//
// A listing is cached only for a directory whose listing no context switch
// can change (no rule governs it or any name below it) and whose backing
// directory the Watcher watches, so that a switch never has to find and
// drop listings. Three things can still change a cached listing:
//
//   - another process changes the backing directory: the Watcher's
//     notification of the name (which waits for listings in flight on the
//     directory) is followed by dropping the directory's pages;
//   - a reload, a rename of a directory or a new hard link in a space with
//     rules, or lost events: the view's listing epoch moves on
//     (dropListings). A directory opened later gets its cache dropped at
//     open (no FOPEN_KEEP_CACHE); one open now (a listing may be in flight
//     or a handle may rewind into the cache) is dropped at once;
//   - a second name for a listed file, in a space with rules (which hides
//     files with several names): link(2) raises no inotify event at the
//     first name's directory, and the new name may be anywhere. A root
//     daemon hears of it through a filesystem-wide fanotify mark
//     (linkWatch), which drops the space's entries and listings. Without
//     one, every open in such a space looks at the directory's files' link
//     counts first (an fstatat each, what a listing costs the daemon
//     anyway, less the round trips) and lists uncached when one has
//     several. A directory whose listing hid one is never cached again
//     (noListCache), since nothing reports the other name going away.
//
// A listing is kept no longer than the Watcher's TTL either way.

// dropCacheFlag, set by OpendirHandle, asks guardFS.OpenDir to clear
// FOPEN_KEEP_CACHE, which go-fuse adds to every FOPEN_CACHE_DIR. It is no
// FOPEN_* bit the kernel knows, and never reaches it.
const dropCacheFlag = 1 << 30

// barrierName is a name notified to wait for the listings in flight on a
// directory: the kernel's entry notification takes the directory's lock,
// which every getdents holds (shared) until its reply is in the cache.
const barrierName = ".condfs-listing-barrier"

// listings is a view's record of cached directory listings.
type listings struct {
	mu   sync.Mutex
	open map[*node]int // directories with a caching handle open, and how many
}

// cacheFlags decides whether a directory being opened (path in its space,
// ruled as the choke point found it) lists through the kernel's cache, and
// registers the open handle; the second result says whether Releasedir must
// unregister it.
func (n *node) cacheFlags(t *target, fd int) (uint32, bool) {
	v := n.view
	if !v.opts.Watcher.live() || n.wd.Load() == 0 || n.noListCache.Load() ||
		t.ruled || t.snap.cfg.HasRulesUnder(n.space, t.path) ||
		(!v.opts.AllowHardlinks && t.snap.cfg.HasRules(n.space) && !v.opts.Watcher.watchesLinks(n.backing()) && multiLinked(fd)) {
		n.listGen.Store(0)
		return 0, false
	}
	v.lists.mu.Lock()
	v.lists.open[n]++
	v.lists.mu.Unlock()
	// Registered before the epoch is read: an epoch move that this open
	// misses finds the handle open and drops the pages itself.
	e := v.listEpoch.Load()
	now := time.Now().UnixNano()
	if n.listGen.Swap(e) == e && now-n.listSince.Load() < int64(v.opts.Watcher.ttl) {
		return fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, true
	}
	n.listSince.Store(now)
	return fuse.FOPEN_CACHE_DIR | dropCacheFlag, true
}

// multiLinked reports whether the directory open at fd holds a regular file
// with several names (or cannot be read), and rewinds it.
func multiLinked(fd int) bool {
	defer unix.Seek(fd, 0, 0)
	var buf [8 << 10]byte
	for {
		nb, err := unix.Getdents(fd, buf[:])
		if err != nil {
			return true
		}
		if nb <= 0 {
			return false
		}
		for off := 0; off < nb; {
			name, typ, _, reclen := parseDirent(buf[off:nb])
			off += reclen
			if typ != unix.DT_REG && typ != unix.DT_UNKNOWN {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // gone since: the listing will not show it
			}
			if multiNamed(&st) {
				return true
			}
		}
	}
}

// closedListing unregisters a caching handle.
func (n *node) closedListing() {
	l := &n.view.lists
	l.mu.Lock()
	if l.open[n]--; l.open[n] <= 0 {
		delete(l.open, n)
	}
	l.mu.Unlock()
}

// dropListings makes every cached listing of the view invalid: at the next
// open for directories not open now, at once for the others.
func (v *View) dropListings() {
	v.listEpoch.Add(1)
	v.lists.mu.Lock()
	open := make([]*node, 0, len(v.lists.open))
	for n := range v.lists.open {
		open = append(open, n)
	}
	v.lists.mu.Unlock()
	for _, n := range open {
		n.dropListing(barrierName)
	}
}

// dropListing notifies the entry name of directory n and drops n's cached
// listing: the entry notification waits until every listing in flight on
// the directory (perhaps decided before the change) is in the cache, then
// the pages go. Nothing may be held that a request being served needs.
func (n *node) dropListing(name string) {
	in := n.EmbeddedInode()
	in.NotifyEntry(name)
	if n.listGen.Load() != 0 {
		in.NotifyContent(0, 0)
	}
}

// nameSet records names the kernel may remember in a way that a switch or
// reload must undo before it returns, each as decided at some authGen:
//   - absences: names the rules hide, remembered as missing (the switch
//     may show them);
//   - ruled names a READDIRPLUS handed out with full entries: the kernel
//     links those when the answer arrives, stamped with the epoch current
//     then, so one decided before a switch and linked after it would
//     outlive the switch's epoch bump.
//
// Past its limit a set records nothing more, and the names go unremembered
// (answered uncached, or listed without an entry).
type nameSet struct {
	mu    sync.Mutex
	max   int
	names map[dirName]struct{}
}

type dirName struct {
	dir  *node
	name string
}

const (
	maxAbsences  = 4096
	maxPlusRuled = 1024
)

// add records dir's name, as decided at authGen g, and reports whether the
// kernel may remember it. A switch or reload that began after g (and may
// have taken the records before this one) makes the answer uncached: the
// record alone would be missed.
func (a *nameSet) add(dir *node, name string, g uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.names) >= a.max {
		return false
	}
	if a.names == nil {
		a.names = map[dirName]struct{}{}
	}
	a.names[dirName{dir, name}] = struct{}{}
	return authGen.Load() == g
}

// forget makes the kernel forget the names in a that drop selects (all,
// when drop is nil), after the lookups and listings in flight in their
// directories: an entry notification takes the directory's lock, which a
// lookup holds until its entry is linked and a getdents until its
// READDIRPLUS entries are. The set starts empty again, so it also waits
// for what is in flight in the directories of the names it keeps: a
// listing still in flight at the next switch would link a name that switch
// no longer knows of.
func (v *View) forget(a *nameSet, drop func(dir *node, name string) bool) {
	a.mu.Lock()
	names := a.names
	a.names = nil
	a.mu.Unlock()
	if len(names) == 0 {
		return
	}
	waited := map[*node]bool{}
	for k := range names {
		if drop == nil || drop(k.dir, k.name) {
			v.notifyEntry(k.dir.EmbeddedInode(), k.name)
			waited[k.dir] = true
		}
	}
	for k := range names {
		if !waited[k.dir] {
			v.notifyEntry(k.dir.EmbeddedInode(), barrierName)
			waited[k.dir] = true
		}
	}
}

// hiddenNow reports whether dir's name is hidden in the view's current
// context and rules, or its path is unknown (a node cut off from the tree).
func (v *View) hiddenNow(dir *node, name string) bool {
	p, ok := dir.path()
	if !ok {
		return true
	}
	cfg, atoms := v.rules.Load(), *v.atoms.Load()
	vis, _ := cfg.Visible(dir.space, join(p, name), atoms)
	return !vis
}
