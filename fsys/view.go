// Package fsys mounts a session's view: a FUSE filesystem whose root holds
// memories/ and workspace/ over real backing directories, in which every
// lookup, readdir, open and mutation is decided by the path rules (acl)
// against the session's current context.
//
// Every decision is made by one type, decision (decide.go), the only code
// that consults the rules: a path, what an entry is (the hiding rules:
// symlinks out of the space, multiply-linked files in ruled spaces), a
// listed entry, an open handle, and what a switch or reload must drop from
// the kernel's caches. Node operations reach it through one choke point,
// (*node).prepare, which takes what an operation names and its kind
// (lookup, mutate, create, exchange, I/O), decides, then reaches the
// backing tree beneath its root with openat2 and checks that a node still
// stands for the inode it was made for; listings (dir.go), open handles
// (node_open.go) and the view's root (root.go) ask the same decision for what
// they hand out. Denied paths do not exist (ENOENT); creating a denied name
// gets EACCES.
//
// What the views of a daemon share, and the lock order, belong to a Host
// (host.go).
//
// Files, by idea: decide.go, every decision; node.go, node_open.go,
// node_mutate.go, node_xattr.go and node_locks.go, the FUSE nodes by
// operation; dir.go, listings and the connection's directory handling;
// root.go, a view's root; acting.go and creds.go, acting as the caller;
// backing.go, reaching the backing trees beneath their roots; cache_*.go,
// what the kernel caches and how it is dropped (listings, name sets, the
// reload barrier); watch*.go, inotify and the fanotify link watch, which
// report to the views; notify.go, what the view's entries are sent (a
// FUSE connection, its mount, the hub, fusermount3 and stale mounts are
// package internal/fuseconn's); guard.go, panics and metrics; files.go, the
// bound on the descriptors open files hold; view.go, a session's view
// (mount, switch, reload, unmount).
//
// Authority is never more than the caller's: a root daemon runs every
// backing call with the requesting process's fsuid, fsgid and groups
// (creds.go), creates with O_EXCL, opens only regular files and
// directories, refuses ioctl and filters privileged xattr namespaces. Only
// the session's owner (and uids it lets in) may enter a view.
//
// No stale authority: SetContext and Invalidate return only after the
// kernel's dentry caches have been invalidated, with FUSE_NOTIFY_INC_EPOCH
// where the kernel has it (Linux ≥ 6.16) and per-entry notifications
// otherwise, after the cached pages of every open file the new state
// denies have been dropped, and after every cached listing they can change
// and every remembered absence of a hidden name are gone (cache_listing.go).
// Every read, write and listing that reaches the daemon decides again;
// cached pages are read only through a handle whose decision stands
// (newHandle, revoke).
package fsys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/internal/fuseconn"
	"github.com/condfs/condfs/internal/safepath"
)

// Options configure a view.
type Options struct {
	Mountpoint string
	// MountFD, if positive, is an O_PATH fd of the mountpoint directory
	// that the caller opened and checked (without following symlinks):
	// the view is mounted exactly there, whatever the path names by now.
	MountFD   int
	Memories  string // backing directory of memories/
	Workspace string // backing directory of workspace/
	// MemoriesOver and WorkspaceOver, when set, are the backing trees a
	// staged session's layer is merged over (Memories and Workspace are
	// then the merged directories, in the daemon's private state
	// directory): a caller must be able to search the directories above
	// them, as natively, and those are watched.
	MemoriesOver, WorkspaceOver string
	// MemoriesRoot and WorkspaceRoot, when positive, are descriptors of
	// the merged directories (the view takes copies of them), served
	// instead of opening Memories and Workspace, which then only name
	// them: an unprivileged daemon's layer is mounted in a user namespace
	// of its own and attached nowhere the daemon could name by a path.
	MemoriesRoot, WorkspaceRoot int
	// OnBackingNames, if set, is told (never holding a lock of the view)
	// of each name made, removed or moved in a directory of a merged
	// space's backing tree that the view watches (every directory it has
	// looked up there): the layer's mount keeps what it looked up of the
	// backing tree, and is mounted afresh (a daemon with no fanotify
	// watch of the backing filesystems).
	OnBackingNames func(space, path string)
	Rules          Rules
	// Replaced, if set, gives the rules a reload is replacing while it is
	// applied (nil otherwise): what they list for runs to execute stays
	// read-only until the runs follow the new rules (decision.readOnly).
	Replaced Rules
	Context  cctx.Set
	// AllowHardlinks turns off hiding of multiply-linked files and the
	// refusal of link() in spaces that have rules.
	AllowHardlinks bool
	// AllowOther lets users other than the daemon's reach the mount; it
	// needs a root daemon, which then acts as each caller. Even so, only
	// Owner and AllowUIDs may enter the view.
	AllowOther bool
	// Owner is the uid the view serves; AllowUIDs are the other uids let
	// in. A daemon that is not root serves its own uid only.
	Owner     uint32
	AllowUIDs []uint32
	// AttrTimeout is the kernel's positive entry and attribute cache
	// time; 0 means DefaultAttrTimeout.
	AttrTimeout time.Duration
	// OnDeny, if set, is told of every path the rules deny to a request
	// that names it (lookup, mutation, or I/O on a revoked handle), for
	// the audit log. Entries left out of a listing are not reported.
	OnDeny DenyFunc
}

// View is one mounted session view. Its state is grouped by the idea that
// owns it: what decides (authz, decide.go), the backing directories
// (spaces), the mount (mnt), what the kernel caches (cache,
// cache_listing.go), the open files (handles), acting as callers (caller,
// acting.go) and counters (stats).
type View struct {
	// renumbered: StableAttr generations of the numbers whose node an
	// open file left on a detached mount holds (remount_handles.go).
	renumbered renumbered

	host    *Host
	opts    Options
	log     *slog.Logger
	closed  atomic.Bool
	authz   authority
	spaces  spaces
	root    *rootNode
	mnt     mountState
	cache   kernelCache // what the kernel caches of the view
	handles handleSet   // open files, for revocation
	aliases aliasSet    // the name of each number of a staged space (aliases.go)
	caller  callerState
	stats   viewStats
	// remountMu: every operation of a view serving a staged layer holds it
	// shared (become to restore), Remount exclusively (remount.go).
	remountMu sync.RWMutex
	isStaged  bool // fixed once the view is made
}

// spaces are the backing directories of memories and workspace, in that
// order.
type spaces struct {
	dirs [2]*backing
	mu   sync.Mutex // release runs once (from Unmount or the last forget)
}

// release gives both backings back to the host.
func (s *spaces) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, b := range s.dirs {
		if b != nil {
			b.release()
			s.dirs[i] = nil
		}
	}
}

// mountState is how a view is mounted and numbers its nodes; fixed once
// it is mounted.
type mountState struct {
	fsOpts  *fs.Options
	conn    *fuseconn.Conn // the view's own connection; nil in a hub (or not mounted)
	id      uint64         // the kernel's id of the view's mount, to unmount exactly it
	hub     *fuseconn.Hub  // the hub serving the view, if any
	hubName string         // the view's directory in the hub
	gen     uint64         // generation of the view's nodes (its hub's count; 1 alone)
	rootDev uint64         // the memories backing's device, mixed into inode numbers
	at      time.Time      // the mount root's timestamp
	once    sync.Once      // Unmount runs once
}

// viewStats are a view's counters.
type viewStats struct {
	// lockWaiters counts the view's blocking lock requests waiting (node_locks.go).
	lockWaiters atomic.Int32
	// reads counts READ requests the daemon served.
	reads atomic.Int64
	// panics counts FUSE operations that panicked (and failed with EIO).
	panics atomic.Int64
}

// DefaultAttrTimeout is how long the kernel keeps what no watch keeps
// fresh: entries and attributes of ruled names among them. After the daemon
// dies, descriptors opened before still read cached pages until their
// file's attributes lapse: a restarted daemon waits this long before it
// serves the sessions it restores.
const DefaultAttrTimeout = time.Second

// Mount builds a view and mounts it. Without Options.MountFD, a
// mountpoint left stale by a crashed daemon (ENOTCONN) is cleared first;
// with it, the caller has confined and cleared the mountpoint, and a dead
// or live FUSE mount there is an error.
func (h *Host) Mount(opts Options) (*View, error) {
	v, err := h.newView(opts)
	if err != nil {
		return nil, err
	}
	if err := checkMountpoint(opts); err != nil {
		v.closeBacking()
		return nil, err
	}
	if v.mnt.hub != nil {
		err = v.mountHub()
	} else {
		err = v.mount()
	}
	if err != nil {
		v.closeBacking()
		return nil, err
	}
	return v, nil
}

func checkMountpoint(opts Options) error {
	if opts.MountFD <= 0 {
		return fuseconn.ClearStale(opts.Mountpoint)
	}
	switch state, err := fuseconn.Probe(opts.MountFD); {
	case err != nil:
		return fmt.Errorf("%s: %w", opts.Mountpoint, err)
	case state == fuseconn.LiveFUSE:
		return fmt.Errorf("%s is already a live FUSE mount; unmount it or pick another mountpoint", opts.Mountpoint)
	case state == fuseconn.DeadFUSE:
		return fmt.Errorf("%s is a dead FUSE mount", opts.Mountpoint)
	}
	return nil
}

// newView builds a view's node tree over its backing directories without
// mounting it: the tree can then be driven in-process (the unit tests do).
func (h *Host) newView(opts Options) (*View, error) {
	if opts.Rules == nil {
		return nil, errors.New("fsys: Options.Rules is required")
	}
	if opts.AllowOther && os.Geteuid() != 0 {
		return nil, errors.New("fsys: allow_other needs a root daemon: one that cannot act as its callers serves its own uid only")
	}
	if opts.AttrTimeout == 0 {
		opts.AttrTimeout = DefaultAttrTimeout
	}
	v := &View{
		host: h, opts: opts, log: h.log,
		mnt: mountState{at: time.Now(), gen: 1},
		cache: kernelCache{
			lists:    listings{listed: map[*fs.Inode]*listed{}},
			absences: nameSet{max: maxAbsences}, plusRuled: nameSet{max: maxPlusRuled},
		},
		caller: callerState{switchCreds: os.Geteuid() == 0, acting: make(chan struct{}, maxActingPerView())},
	}
	v.authz.rules = opts.Rules
	set := opts.Context
	v.authz.atoms.Store(&set)
	over := [2]string{opts.MemoriesOver, opts.WorkspaceOver}
	roots := [2]int{opts.MemoriesRoot, opts.WorkspaceRoot}
	for i, dir := range []string{opts.Memories, opts.Workspace} {
		b, err := h.backings.acquireOver(dir, roots[i], over[i])
		if err != nil {
			v.closeBacking()
			return nil, err
		}
		v.spaces.dirs[i] = b
		// Mark the filesystem before any entry of it is cached: a link made
		// before the mark would go unreported. (One fd per filesystem, for
		// the daemon's life.)
		h.watcher.watchesLinks(b)
		h.watcher.watchAbove(b)
	}
	v.mnt.rootDev = v.spaces.dirs[0].dev
	v.isStaged = v.staged()
	if h.hub != nil {
		v.mnt.hub = h.hub
		v.mnt.gen = h.hub.NextGen()
	}
	v.root = &rootNode{view: v}
	v.root.access = newRootAccess(v)
	v.handles.owner = h.files.owner(opts.Owner)
	h.register(v) // until closeBacking: renames through other views reach its handles
	zero := time.Duration(0)
	v.mnt.fsOpts = &fs.Options{
		EntryTimeout:    &opts.AttrTimeout,
		AttrTimeout:     &opts.AttrTimeout,
		NegativeTimeout: &zero,
		MountOptions:    viewMountOptions(opts.AllowOther, h.debug),
		RootStableAttr:  &fs.StableAttr{Ino: 1},
		// A mode with no permission bits reaches the kernel as it is: go-fuse
		// would answer 0755 (0644) for it, and the kernel, which checks
		// cached attributes itself (default_permissions), would let every
		// admitted uid open a 000 directory, read its cached listing and
		// walk through it.
		NullPermissions: true,
	}
	return v, nil
}

func viewMountOptions(allowOther, debug bool) fuse.MountOptions {
	return fuse.MountOptions{
		FsName:        "condfs",
		Name:          "condfs",
		AllowOther:    allowOther,
		Options:       []string{"default_permissions"},
		MaxBackground: 64,
		EnableLocks:   true,
		// The kernel checks permissions on what it has cached (a path
		// walk through cached entries, a stat of cached attributes) by
		// itself, for every caller the view admits: with the backing's
		// POSIX ACLs (read through GETXATTR), as natively, not with
		// mode bits alone, which let a uid an ACL denies stat what
		// another uid had looked up.
		EnableAcl: true,
		// The kernel leaves clearing the setuid and setgid bits of a file
		// written, truncated or opened with O_TRUNC to the daemon
		// (FUSE_HANDLE_KILLPRIV_V2), which makes the change as the caller,
		// so that the backing kernel clears them as natively (setid.go).
		// Without it, the kernel first sent a chmod as the writer, which a
		// writer who does not own the file may not make (EPERM).
		ExtraCapabilities: fuse.CAP_HANDLE_KILLPRIV_V2,
		// READDIRPLUS is on. The kernel stamps a READDIRPLUS entry with
		// the epoch current when it links it, so one decided before a
		// context switch and linked after would answer stale: ruled
		// entries are recorded and dropped by the switch (node.lookup);
		// a reload, which can change any decision, waits for listings in
		// flight (its barrier) and drops the entries it changed.
		Debug: debug,
	}
}

// admits reports whether uid may enter the view.
func (v *View) admits(uid uint32) bool {
	if v.mnt.hub != nil && !v.opts.AllowOther && int(uid) != self.uid {
		// The hub is mounted allow_other; a view without it admits the
		// daemon's uid alone, as the kernel would.
		return false
	}
	if uid == v.opts.Owner {
		return true
	}
	for _, u := range v.opts.AllowUIDs {
		if u == uid {
			return true
		}
	}
	return false
}

// handleSet is a view's open files, for revocation.
type handleSet struct {
	mu sync.Mutex
	m  map[*fileHandle]struct{}
	// open counts the descriptors the view's open files hold, and the
	// opens under way, and owner what all its owner's views hold
	// (files.go); warned, that one met its bound.
	open   atomic.Int64
	owner  *atomic.Int64
	warned atomic.Bool
}

func (s *handleSet) add(h *fileHandle) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*fileHandle]struct{}{}
	}
	s.m[h] = struct{}{}
	s.mu.Unlock()
}

func (s *handleSet) remove(h *fileHandle) {
	s.mu.Lock()
	delete(s.m, h)
	s.mu.Unlock()
}

// all returns the open files now, for work done outside the lock.
func (s *handleSet) all() []*fileHandle {
	s.mu.Lock()
	defer s.mu.Unlock()
	hs := make([]*fileHandle, 0, len(s.m))
	for h := range s.m {
		hs = append(hs, h)
	}
	return hs
}

// revoke decides every open file of the view again and drops the kernel's
// cached pages (mapped ones included) of each that is now denied, so that
// its next read reaches the daemon and fails.
func (v *View) revoke() { v.revokeWhere(nil) }

// revokeWhere is revoke for the open files that sel selects (all, when sel
// is nil); each selected one decides afresh, whatever it decided before.
func (v *View) revokeWhere(sel func(*fileHandle) bool) {
	for _, h := range v.handles.all() {
		if sel != nil {
			if !sel(h) {
				continue
			}
			h.moves.Add(1)
		}
		if !h.decide(false) {
			if errno := h.node.NotifyContent(0, 0); errno != 0 && errno != syscall.ENOENT {
				v.log.Debug("NotifyContent", "errno", errno)
			}
		}
	}
}

// revokeMoved decides again, as the daemon, the open files of every view
// on filesystem dev after a rename there, each by the path its descriptor
// has now. Not only those whose last known path the rename moved: that
// path can be stale (a rename on the backing since, or a concurrent rename
// of a parent between this rename's decision and its renameat2), and a
// file moved into a denied directory either way must stop being read and
// written through handles held open (integration/views/rename_test.go).
func (h *Host) revokeMoved(dev uint64) {
	h.threads.unpin() // the daemon's credentials: the thread may keep a caller's
	for _, v := range h.each() {
		v.revokeWhere(func(fh *fileHandle) bool {
			b := fh.node.backing()
			return b != nil && b.dev == dev
		})
	}
}

// mount mounts the view on a connection of its own.
func (v *View) mount() error {
	mpfd, err := v.mountpointFD()
	if err != nil {
		return fmt.Errorf("mount %s: %w", v.opts.Mountpoint, err)
	}
	if v.opts.MountFD <= 0 {
		defer unix.Close(mpfd)
	}
	c, err := fuseconn.Mount(fuseconn.Options{
		Mountpoint: v.opts.Mountpoint, MountFD: mpfd, Root: v.root, FS: v.mnt.fsOpts, Fusermount: true, Log: v.log,
		Wrap: guardFS{panics: &v.stats.panics, log: v.log, observe: v.host.observe}.serve,
	})
	if err != nil {
		return err
	}
	v.mnt.conn, v.mnt.id = c, c.MountID()
	v.log.Debug("view mounted", "mountpoint", v.opts.Mountpoint, "inc_epoch", c.Epoch())
	return nil
}

// mountHub bind-mounts the view from its hub.
func (v *View) mountHub() error {
	mpfd, err := v.mountpointFD()
	if err != nil {
		return fmt.Errorf("mount %s: %w", v.opts.Mountpoint, err)
	}
	if v.opts.MountFD <= 0 {
		defer unix.Close(mpfd)
	}
	name, id, err := v.mnt.hub.Attach(v.mnt.gen, v.root, mpfd, v.opts.Mountpoint)
	if err != nil {
		return fmt.Errorf("mount %s: %w", v.opts.Mountpoint, err)
	}
	v.mnt.hubName, v.mnt.id = name, id
	v.log.Debug("view mounted from the hub", "mountpoint", v.opts.Mountpoint, "hub", v.mnt.hub.Dir(), "name", v.mnt.hubName)
	return nil
}

// mountpointFD is Options.MountFD, or the mountpoint opened without
// following symlinks (the caller closes it then).
func (v *View) mountpointFD() (int, error) {
	if v.opts.MountFD > 0 {
		return v.opts.MountFD, nil
	}
	return safepath.OpenDir(v.opts.Mountpoint)
}

// auditDeny reports a denial with the context it was decided in.
func (v *View) auditDeny(atoms cctx.Set, sp space, path, op string) {
	if v.opts.OnDeny != nil {
		v.opts.OnDeny(atoms, sp, path, op)
	}
}

// generation changes with every event that can change one of the view's
// decisions: its switches and reloads, and renames through any view of its
// host. Both counts only grow, so their sum changes whenever either does.
func (v *View) generation() uint64 { return v.authz.changes.Load() + v.host.renames.Load() }

// Context returns the view's current context.
func (v *View) Context() cctx.Set { return *v.authz.atoms.Load() }

// Owner is the uid the view serves.
func (v *View) Owner() uint32 { return v.opts.Owner }

// Mountpoint is where the view is mounted.
func (v *View) Mountpoint() string { return v.opts.Mountpoint }

// SetContext switches the view's context. When it returns, no kernel cache
// answers for a path whose decision changed, and open handles on newly
// denied files fail their next read or write.
func (v *View) SetContext(set cctx.Set) error {
	old := v.authz.atoms.Swap(&set)
	return v.invalidate(true, old)
}

// invalidate drops cached entries and re-decides open files. A context
// switch (scoped, from the context old) keeps the rules, so on the
// per-entry path only entries a rule governs (the path or a directory above
// it matched by a rule) can change their decision: those whose decision
// changed are dropped, the others expired. A reload may have changed any
// rule: every cached entry whose decision changed is dropped, and every
// other expired (invalidateChanged).
func (v *View) invalidate(scoped bool, old *cctx.Set) error {
	if v.closed.Load() {
		return errors.New("view is unmounted")
	}
	v.authz.changes.Add(1)
	if !scoped {
		// Every listing decided with the old rules has its nodes in the
		// tree before the reload looks for entries to drop.
		v.cache.listingsIn.wait()
	}
	// Where the kernel expires entries (Linux 6.2 and later), a switch or
	// reload expires those whose decision it keeps rather than marking
	// every entry stale: an entry the epoch made stale is dropped on the
	// next walk through it, and for that lookup's round trip a process
	// whose working directory it is has no name (getcwd answers ENOENT);
	// an expired one stays linked while it is looked up again. The
	// notifications cost little beside deciding each cached entry again,
	// which a reload does on both paths (BenchmarkContextSet).
	if v.stale() == entryExpired || !v.bumpEpoch(scoped) {
		if scoped {
			// Only entries a rule governs can change their decision; the
			// walk descends only where a rule names a path below.
			now := v.decision()
			before := now
			before.atoms = *old
			stale := v.stale()
			fate := func(sp space, p string, _ bool) entryFate {
				if _, ruled := now.path(sp, p); !ruled {
					return entryKept
				}
				if now.changedFrom(before, sp, p) {
					return entryDropped
				}
				return stale
			}
			v.dropWhere(now.sensitive, fate)
		} else {
			v.invalidateChanged(v.stale())
		}
	} else if !scoped && v.cache.plusHanded.Swap(false) {
		// Entries of listings decided with the old rules that the kernel
		// links after the bump carry the new epoch: drop, one by one,
		// those whose decision changed. Each notification waits for the
		// directory's readdir to finish linking. (Only a view whose
		// listings handed out entries since the last reload can have one.)
		v.invalidateChanged(entryKept)
	}
	if scoped {
		v.dropListings(v.switchChanges)
	} else {
		// Any listing may change on a reload, and the records'
		// classification with it.
		v.cache.lists.epoch.Add(1)
		v.dropListings(nil)
	}
	// Hidden names may be shown now, and ruled names listed just before
	// the switch may be linked after its epoch bump: those it hides go.
	v.forget(&v.cache.absences, nil)
	v.forget(&v.cache.plusRuled, v.hiddenNow)
	v.revoke()
	return nil
}

// invalidateChanged drops the cached entries whose decision differs between
// the rules before the reload and now (all of a space whose hiding of
// multiply-linked files changed; everything when the old rules are
// unknown), and sends every other one the fate unchanged.
func (v *View) invalidateChanged(unchanged entryFate) {
	before, known := v.reloadedFrom()
	if !known {
		v.invalidateEntries(v.root.EmbeddedInode(), everyEntry(entryDropped, entryDropped))
		return
	}
	now := v.decision()
	fate := func(sp space, p string, _ bool) entryFate {
		if now.changedFrom(before, sp, p) {
			return entryDropped
		}
		return unchanged
	}
	v.dropWhere(func(space, string) bool { return true }, fate)
}

// bumpEpoch invalidates every cached entry of the view's connection at once,
// where the kernel can, and reports whether it did. A hub's connection
// serves every session: a context switch concerns one session, so only a
// reload (unscoped) bumps a hub's epoch. Switches and reloads use it only
// where the kernel cannot expire entries (invalidate); lost events always.
func (v *View) bumpEpoch(scoped bool) bool {
	if v.mnt.hub != nil {
		return !scoped && v.mnt.hub.Conn().BumpEpoch(v.log)
	}
	return v.mnt.conn.BumpEpoch(v.log)
}

// dropWhere sends, deepest first, the cached entries of every space (its
// root entry included) the fate their path and kind (a directory or not)
// have, descending into a cached directory where descend says. Every
// invalidation walk is this one, with its own selection.
func (v *View) dropWhere(descend func(sp space, p string) bool, fate func(sp space, p string, dir bool) entryFate) {
	root := v.root.EmbeddedInode()
	v.notifyEntry(root, barrierName) // see dropCached
	for name, child := range root.Children() {
		sp, ok := spaceByName(name)
		if !ok {
			continue
		}
		v.dropCached(child, "/", func(p string) bool { return descend(sp, p) }, func(p string, dir bool) entryFate { return fate(sp, p, dir) })
		v.notifyFate(root, name, fate(sp, "/", true))
	}
}

// dropCached is dropWhere's walk below dir, at path p in its space. It
// first waits for the lookups in flight in dir (the notification takes the
// directory's lock, which a lookup holds until its entry is linked): one
// decided before the change has its node in the tree by then, to be found
// below.
func (v *View) dropCached(dir *fs.Inode, p string, descend func(p string) bool, fate func(p string, dir bool) entryFate) {
	v.notifyEntry(dir, barrierName)
	for name, child := range dir.Children() {
		cp := join(p, name)
		if child.IsDir() && descend(cp) {
			v.dropCached(child, cp, descend, fate)
		}
		v.notifyFate(dir, name, fate(cp, child.IsDir()))
	}
}

// invalidateEntries sends every cached entry below dir the fate of its kind.
func (v *View) invalidateEntries(dir *fs.Inode, fate func(p string, dir bool) entryFate) {
	v.dropCached(dir, "/", func(string) bool { return true }, fate)
}

// everyEntry is the fate dirs for every directory and files for every other
// entry.
func everyEntry(dirs, files entryFate) func(string, bool) entryFate {
	return func(_ string, dir bool) entryFate {
		if dir {
			return dirs
		}
		return files
	}
}

// linkedFate is the fate of the entries of a space with rules after a file
// of its filesystem got another name: a file there may be hidden now, to be
// decided again at its next use. A directory's decision never follows its
// names' link counts: a kernel that cannot expire keeps directories' entries
// and drops the others.
func (v *View) linkedFate() func(string, bool) entryFate {
	if v.stale() == entryExpired {
		return everyEntry(entryExpired, entryExpired)
	}
	return everyEntry(entryKept, entryDropped)
}

func (v *View) notifyEntry(dir *fs.Inode, name string) {
	if errno := dir.NotifyEntry(name); errno != 0 && errno != syscall.ENOENT {
		v.log.Debug("NotifyEntry", "name", name, "errno", errno)
	}
}

// linkedOn: a file on one of the filesystems devs got another name. In a
// space with rules such a file is hidden, wherever the new name is: every
// cached entry and listing of such a space on those filesystems goes.
func (v *View) linkedOn(devs map[uint64]bool) {
	if v.closed.Load() {
		return
	}
	d, dropped := v.decision(), false
	for sp, b := range v.spaces.dirs {
		if b == nil || !d.hidesLinked(space(sp)) {
			continue
		}
		if dev, _ := b.linkFS(); !devs[dev] {
			continue
		}
		if in := v.root.GetChild(space(sp).String()); in != nil {
			v.invalidateEntries(in, v.linkedFate())
		}
		dropped = true
	}
	if dropped {
		v.dropListings(nil)
	}
}

// Panics counts the FUSE operations that panicked; each failed with EIO
// and nothing else was affected.
func (v *View) Panics() int64 { return v.stats.panics.Load() }

// DaemonReads counts READ requests the daemon served (page-cache hits never
// reach it).
func (v *View) DaemonReads() int64 { return v.stats.reads.Load() }

// Unmount unmounts the view and waits for its server to stop.
func (v *View) Unmount() error {
	var err error
	v.mnt.once.Do(func() {
		v.closed.Store(true)
		// Files still open in the view decide no more (closed), and their
		// cached pages go, so that nothing is read through it from now.
		v.revoke()
		v.forgetListings()
		if w := v.host.watcher; w != nil {
			w.removeOwner(v)
		}
		v.host.unregister(v)
		if v.mnt.hub != nil {
			// The bind mount goes (by its id, as below); the view's nodes
			// live on in the hub until the kernel forgets them, and no
			// operation on them does anything now (closed). The backing
			// directories are closed when the last is forgotten.
			if v.mnt.id != 0 {
				err = v.unmountOwn()
			}
			v.mnt.hub.Detach(v.mnt.hubName)
			return
		}
		if v.mnt.conn == nil {
			v.closeBacking()
			return
		}
		// We mounted it, so we unmount it: exactly the mount we made,
		// found without following symlinks and by its mount id, then
		// unmounted through that fd (a path swapped meanwhile cannot
		// redirect it). MNT_DETACH lets a busy mount go once its last
		// user leaves; the view does nothing meanwhile (closed), and its
		// descriptors go when the connection ends.
		err = v.unmountOwn()
		v.mnt.conn.Release(time.Second, v.log, v.closeBacking)
	})
	return err
}

// closeBacking closes what the view holds of the backing trees once no
// request can reach it (its connection ended, or the hub forgot its
// root), open files the kernel sent no RELEASE for included.
func (v *View) closeBacking() {
	v.host.unregister(v)
	for _, h := range v.handles.all() {
		h.release(context.Background())
	}
	v.spaces.release()
}

func (v *View) unmountOwn() error {
	mp := v.opts.Mountpoint
	fd, err := safepath.OpenDir(mp)
	if err != nil {
		return fmt.Errorf("unmount %s: %w", mp, err)
	}
	defer unix.Close(fd)
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		return fmt.Errorf("unmount %s: %w", mp, err)
	}
	if stx.Mnt_id != v.mnt.id {
		return fmt.Errorf("unmount %s: the mount there is not this view's (mount id %d, ours %d); left alone", mp, stx.Mnt_id, v.mnt.id)
	}
	if v.mnt.conn != nil && v.mnt.conn.Fusermount() {
		// fusermount3 resolves the path itself, with the daemon's own
		// (unprivileged) authority.
		return fuseconn.FusermountUnmount(mp)
	}
	if e := unix.Unmount(procPath(fd), 0); e != nil {
		if e2 := unix.Unmount(procPath(fd), unix.MNT_DETACH); e2 != nil && e2 != unix.EINVAL {
			return fmt.Errorf("unmount %s: %w", mp, e2)
		}
	}
	return nil
}
