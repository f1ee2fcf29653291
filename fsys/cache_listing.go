package fsys

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// kernelCache is what a view knows of what the kernel caches of it, so that
// a switch or reload can drop, before it returns, whatever it changes.
type kernelCache struct {
	listingsIn barrier     // listings in flight, for a reload to wait for
	plusHanded atomic.Bool // a listing handed out a full entry since the last reload
	lists      listings
	absences   nameSet // hidden names the kernel remembers as missing
	plusRuled  nameSet // ruled names listings handed out with full entries
}

// Directory listings in the kernel's cache.
//
// The daemon answers OPENDIR with ENOSYS, so the kernel (no_opendir, Linux
// ≥ 5.1) opens directories by itself: no OPENDIR or RELEASEDIR round trip
// per directory, and every listing it reads is kept in the directory's page
// cache (FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE, chosen by the kernel) until
// something drops it. Each READDIR is served on a directory opened for that
// request alone, as its caller, through the choke point (guardFS.withDir,
// node.OpendirHandle). What the kernel answers from a cached listing it
// checks itself, for whichever admitted uid asks (mode bits and POSIX ACLs,
// as for a cached stat, on the attributes as the backing has them: a 000
// directory is 000 to the kernel, see newView).
//
// So a cached listing must go before anything that could change it is
// final. Every directory a READDIR is served for is recorded (listings),
// and its cached listing is dropped, after the listings in flight on it
// (a barrier notification, then FUSE_NOTIFY_INVAL_INODE):
//
//   - by a context switch, before it returns, for every recorded directory
//     whose names a switch can decide differently (a rule governs it or a
//     name below it; the view's root);
//   - by a reload, lost events, a rename of a directory or a new hard link
//     in a space with rules: every recorded directory of the view;
//   - by the Watcher, when another process changes the backing directory
//     (the notification of the name waits for listings in flight itself);
//   - when it is older than the Watcher's TTL;
//   - right after it is read, when nothing would report a change to it: the
//     Watcher does not watch the directory, or the space has rules and no
//     link watch covers its filesystem (link(2) raises no inotify event at
//     the first name's directory, yet hides the file there), or a listing
//     of it hid a multiply-linked file (nothing reports the other name
//     going away). Such a directory is listed by the daemon each time, as
//     before the kernel cached listings.

// barrierName is a name notified to wait for the listings in flight on a
// directory: the kernel's entry notification takes the directory's lock,
// which every getdents holds (shared) until its reply is in the cache.
const barrierName = ".condfs-listing-barrier"

// listings is a view's record of the directories it has listed, while the
// kernel holds them.
type listings struct {
	mu     sync.Mutex
	listed map[*fs.Inode]*listed
	// epoch moves on when the classification of the records may be out of
	// date (a reload, a directory moved): a switch then decides again
	// whether it can change such a record's listing.
	epoch atomic.Uint64
}

type listed struct {
	n *node // nil for the view's root
	// mu is held by a drop from its barrier to its end, so that a switch
	// that finds a drop in progress waits for it before it returns.
	mu sync.Mutex
	// dirty: a READDIR was served since the last drop.
	dirty atomic.Bool
	armed atomic.Bool // the TTL timer runs
	// Guarded by listings.mu:
	sensitive bool        // a switch can change the listing (rule-reached), as classified at epoch
	epoch     uint64      // listings.epoch read before that classification
	ttl       *time.Timer // drops the listing when it is too old
}

// listing records that the directory in (n; nil for the view's root) is
// being listed, before its entries are decided: a switch or reload that
// looks at the record after this drops what this listing caches, and one
// that looked before has stored the context or rules it decides with.
// sensitive says whether a context switch can change the listing, as
// classified at epoch (listings.epoch, read before the classification's
// rules were); keep, whether the kernel may keep it: if not, it is dropped
// as soon as the listing in flight is in the cache.
func (v *View) listing(in *fs.Inode, n *node, sensitive bool, epoch uint64, keep bool) {
	l := &v.cache.lists
	l.mu.Lock()
	rec := l.listed[in]
	if rec == nil {
		rec = &listed{n: n}
		l.listed[in] = rec
	}
	rec.sensitive, rec.epoch = sensitive, epoch
	rec.dirty.Store(true)
	ttl := v.host.watcher.ttlFor(n)
	if keep && ttl > 0 && !v.closed.Load() && rec.armed.CompareAndSwap(false, true) {
		rec.ttl = time.AfterFunc(ttl, func() {
			rec.armed.Store(false)
			v.dropRec(in, rec, barrierName, entryDropped)
		})
	}
	l.mu.Unlock()
	if !keep {
		go v.dropRec(in, rec, barrierName, entryDropped)
	}
}

// keepsListing reports whether the kernel may keep a listing of n, as the
// choke point found it (t): only while something reports what changes it.
func (n *node) keepsListing(t *target) bool {
	w := n.view.host.watcher
	return w.live() && n.wd.Load() != 0 && !n.noListCache.Load() &&
		(!t.d.hidesLinked(n.space) || w.watchesLinks(t.b))
}

// dropRec drops the listing the kernel may hold of in: it sends the entry
// name its fate (the barrier when no name changed, or when the name's entry
// is kept), which waits for the listings in flight on the directory, then
// drops the pages if a READDIR was served since the last drop. Nothing may
// be held that a request being served needs.
func (v *View) dropRec(in *fs.Inode, rec *listed, name string, fate entryFate) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	dirty := rec.dirty.Swap(false)
	switch {
	case name != barrierName && fate != entryKept:
		v.notifyFate(in, name, fate)
	case dirty:
		v.notifyEntry(in, barrierName)
	}
	if dirty {
		in.NotifyContent(0, 0)
	}
}

// dropListing sends the entry name of directory in its fate and drops the
// listing the kernel may hold of it (the Watcher: a name changed there).
func (v *View) dropListing(in *fs.Inode, name string, fate entryFate) {
	v.cache.lists.mu.Lock()
	rec := v.cache.lists.listed[in]
	v.cache.lists.mu.Unlock()
	if rec == nil {
		v.notifyFate(in, name, fate)
		return
	}
	v.dropRec(in, rec, name, fate)
}

// dropListings drops, before it returns, the listings the kernel may hold
// of the view's directories that sel selects (all when sel is nil; given
// the record's node and its classification, if current).
func (v *View) dropListings(sel func(n *node, sensitive, current bool) bool) {
	l := &v.cache.lists
	epoch := l.epoch.Load()
	l.mu.Lock()
	type todo struct {
		in  *fs.Inode
		rec *listed
	}
	var drop []todo
	for in, rec := range l.listed {
		if sel == nil || sel(rec.n, rec.sensitive, rec.epoch == epoch) {
			drop = append(drop, todo{in, rec})
		}
	}
	l.mu.Unlock()
	for _, d := range drop {
		v.dropRec(d.in, d.rec, barrierName, entryDropped)
	}
}

// switchChanges selects, for a context switch, the listings it can change:
// of directories a rule reaches (it governs them or a name below them), of
// those cut off from the tree, and of the view's root.
func (v *View) switchChanges(n *node, sensitive, current bool) bool {
	if n == nil {
		return true
	}
	if current {
		return sensitive
	}
	p, ok := n.path()
	if !ok {
		return true
	}
	return v.decision().sensitive(n.space, p)
}

// unlisted forgets in's record: the kernel holds the directory no more.
func (v *View) unlisted(in *fs.Inode) {
	l := &v.cache.lists
	l.mu.Lock()
	if rec := l.listed[in]; rec != nil {
		if rec.ttl != nil {
			rec.ttl.Stop()
		}
		delete(l.listed, in)
	}
	l.mu.Unlock()
}

// forgetListings stops every record of an unmounted view.
func (v *View) forgetListings() {
	l := &v.cache.lists
	l.mu.Lock()
	for in, rec := range l.listed {
		if rec.ttl != nil {
			rec.ttl.Stop()
		}
		delete(l.listed, in)
	}
	l.mu.Unlock()
}

// nameSet records names the kernel may remember in a way that a switch or
// reload must undo before it returns, each as decided at some generation:
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

// add records dir's name, as decided at generation g, and reports whether the
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
	return dir.view.generation() == g
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
	return !v.decision().shows(dir.space, join(p, name))
}

// dropCaches drops every entry and listing the kernel caches for v: any
// decision may have changed (events were lost, or a directory above a
// backing root changed). Where the kernel can expire entries, every
// directory's entry is expired (its next use looks it up and decides it
// again) and every other one dropped, rather than the epoch bumped: an
// entry the epoch made stale is unhashed at its next use, and a process
// whose working directory it is has no name until that lookup answers
// (getcwd(2) fails with ENOENT, and sqlite3, node and prove with it). The
// epoch is left for kernels that have it and cannot expire.
func (v *View) dropCaches() {
	if v.closed.Load() {
		return
	}
	if v.stale() == entryExpired || !v.bumpEpoch(false) {
		v.invalidateEntries(v.root.EmbeddedInode(), everyEntry(v.stale(), entryDropped))
	}
	v.cache.lists.epoch.Add(1)
	v.dropListings(nil)
}

func (n *node) wdSlot() *atomic.Int32 { return &n.wd }
func (n *node) owner() changeSink     { return n.view }

// changed is the watcher's report of a change in the backing directory n
// stands for (dir): name made, removed, moved, or changed in its
// attributes or content ("" for the directory itself).
func (n *node) changed(name string, mask uint32, dir string, multiNamedAt func(p string) bool) {
	v := n.view
	if v.closed.Load() {
		return
	}
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 && name != "" && !v.host.watcher.watchesLinks(n.backing()) {
		// A new name for an existing file (link(2)) changes no event of
		// the file's other names' directories, yet hides them in a space
		// with rules: every cached entry of that space goes. (The link
		// watch reports it instead where it runs, wherever the name is
		// made.)
		if v.decision().hidesLinked(n.space) && multiNamedAt(dir+"/"+name) {
			if sp := v.root.GetChild(n.space.String()); sp != nil {
				v.invalidateEntries(sp, v.linkedFate())
			}
			v.dropListings(nil)
		}
	}
	if f := v.opts.OnBackingNames; f != nil && name != "" && n.backing().merged &&
		mask&(unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0 {
		f(n.space.String(), dir+"/"+name)
	}
	in := n.EmbeddedInode()
	in.NotifyContent(-1, 0) // the directory's own attributes (mtime, nlink)
	if name == "" {
		if mask&unix.IN_MOVE_SELF != 0 && v.decision().ruledSpace(n.space) {
			// The names below moved with it: rules may decide them
			// differently now.
			v.cache.lists.epoch.Add(1)
			v.dropListings(nil)
		}
		return
	}
	if mask&^(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) != 0 {
		// Made, removed, moved, or its attributes changed (a link count, a
		// mode): the next access looks it up and decides, and a cached
		// listing goes (after the listings in flight).
		v.dropListing(in, name, n.changedFate(name, mask, dir))
	}
	if ch := in.GetChild(name); ch != nil {
		ch.NotifyContent(0, 0) // attributes and cached pages
	}
}

// changedFate is what the watch's report of a change to name in the backing
// directory dir does to the kernel's entry of it. An entry that no longer
// stands for the inode the name has (gone, or another one there) is
// dropped. One the name was made for (by this view, or looked up since) is
// kept: the view's own new directory keeps its name for a process that
// enters it at once. Any other change to the inode (its attributes, its
// link count) expires the entry, to be decided again at its next use; a
// kernel that cannot expire keeps a directory's entry (what decides a
// directory does not follow its attributes, which are dropped by the
// caller) and drops any other.
func (n *node) changedFate(name string, mask uint32, dir string) entryFate {
	ch := n.GetChild(name)
	if ch == nil {
		return entryDropped // no entry, or a negative one
	}
	cn, ok := ch.Operations().(*node)
	var st unix.Stat_t
	if !ok || unix.Lstat(dir+"/"+name, &st) != nil || st.Dev != cn.dev || st.Ino != cn.ino {
		return entryDropped
	}
	if mask&^(unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_MODIFY|unix.IN_CLOSE_WRITE) == 0 {
		return entryKept
	}
	if fate := n.view.stale(); fate == entryExpired || ch.IsDir() {
		return fate
	}
	return entryDropped
}
