package fsys

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/condfs/condfs/internal/fuseconn"
)

// A Host is what the views of one daemon share, and the only owner of it:
// the view registry, the count of renames, the shared backing directories,
// the watcher, the hub, the threads that act as callers and the places of
// requests acting at once. Nothing in the package is mutable outside a Host
// (test hooks are set per Host, by test-only build files).
//
// Locks. None of these is held while another of the list is taken, except
// as the table says, and none shared by views (the first four) is held
// across a syscall that can block on a backing filesystem or on the
// kernel's FUSE locks:
//
//	Host.mu                    the view registry
//	backingSet.mu              the backing registry (opens happen before it)
//	Watcher.mu                 watch tables (inotify_add_watch outside it)
//	threadSet.mu               pinned threads' credentials
//	handleSet.mu               a view's open files
//	fileHandle.mu              a handle's cached decision
//	fileHandle.fdMu (read)     keeps the fd open while its path is read: an
//	                           fstat and a readlink of the handle's own file
//	listings.mu, nameSet.mu    ledgers of what the kernel caches
//	listed.mu                  one listing's drop, held across its entry
//	                           notification (which waits for the directory's
//	                           lock): it stalls only that view's switch
//	barrier.mu                 listings in flight (a reload waits on its cond)
//	dirHandle.mu, rootDir.mu   one listing's read position
//
// A request's place among those acting (acting.go) is taken before any of
// them and never while holding one.
type Host struct {
	log     *slog.Logger
	watcher *Watcher      // nil: no long caching
	hub     *fuseconn.Hub // nil: a connection per view
	// hubPanics counts the FUSE operations of the hub's connection that
	// panicked.
	hubPanics atomic.Int64
	hooks     hooks
	debug     bool
	// observe, if set, is told of every FUSE request of the host's
	// connections when it ends.
	observe func(op string, start time.Time)

	mu    sync.Mutex
	views map[*View]struct{}

	// renames counts renames through any view. A rename can change the
	// decision of names in every view over the same backing tree, so it is
	// part of every view's generation (View.generation).
	renames atomic.Uint64

	backings backingSet
	threads  threadSet
	files    *fileBudget // the descriptors open files may hold (files.go)

	// acting holds a token for each place taken on the host (acting.go).
	acting chan struct{}
	// lockWaiters counts the blocking lock requests waiting in all views.
	lockWaiters atomic.Int32
	// recorders are the views' change recorders (changes.go).
	recorders recorders

	// fault, set only by unit tests, runs at the choke point of every
	// operation: a test makes it panic to prove that one failing request
	// stays alone.
	fault func(op opKind, name string)
}

// HostOptions configure a host.
type HostOptions struct {
	// CacheTTL above DefaultAttrTimeout starts a watcher (inotify, and a
	// fanotify link watch where the daemon may mark filesystems) that lets
	// the kernel cache what no rule governs for that long.
	CacheTTL time.Duration
	// HubDir, if set, serves every view through one FUSE connection
	// mounted there (a root daemon only; see internal/fuseconn/hub.go).
	HubDir string
	Logger *slog.Logger
	// Debug logs every FUSE request.
	Debug bool
	// Observe, if set, is told of every FUSE request when it ends, with
	// go-fuse's name for its opcode (metrics).
	Observe func(op string, start time.Time)
	// ReservedFDs are descriptors the process keeps for other work (the
	// runs' egress connections), beyond the reserve views' open files
	// always leave (files.go).
	ReservedFDs int
}

// NewHost starts what o asks for. Close it after every view it mounted.
func NewHost(o HostOptions) (*Host, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	h := &Host{
		log: o.Logger, hooks: testHooks(), debug: o.Debug, observe: o.Observe, views: map[*View]struct{}{},
		acting: make(chan struct{}, maxActing()), threads: threadSet{maxIdle: maxIdlePins()},
		files: newFileBudget(int64(o.ReservedFDs)),
	}
	if o.CacheTTL > DefaultAttrTimeout {
		w, err := newWatcher(h, o.CacheTTL)
		if err != nil {
			return nil, err
		}
		h.watcher = w
	}
	if o.HubDir != "" {
		hb, err := h.newHub(o.HubDir)
		if err != nil {
			h.Close()
			return nil, err
		}
		h.hub = hb
	}
	return h, nil
}

// Shared reports whether the host's views share one FUSE connection (a hub).
func (h *Host) Shared() bool { return h != nil && h.hub != nil }

// Panics counts the FUSE operations of the hub's connection that panicked
// (a view of its own counts its own: View.Panics).
func (h *Host) Panics() int64 {
	if h == nil || h.hub == nil {
		return 0
	}
	return h.hubPanics.Load()
}

// newHub mounts the hub at dir, whose connection serves every view: its
// nodes' options are every view's (newView's), the kernel caching for
// DefaultAttrTimeout what no watch keeps fresh.
func (h *Host) newHub(dir string) (*fuseconn.Hub, error) {
	timeout, zero := DefaultAttrTimeout, time.Duration(0)
	return fuseconn.NewHub(fuseconn.HubOptions{
		Dir: dir, Logger: h.log,
		FS: &fs.Options{
			EntryTimeout:    &timeout,
			AttrTimeout:     &timeout,
			NegativeTimeout: &zero,
			MountOptions:    viewMountOptions(true, h.debug),
			// Modes reach the kernel as they are (see newView).
			NullPermissions: true,
		},
		Wrap: guardFS{panics: &h.hubPanics, log: h.log, observe: h.observe}.serve,
	})
}

// Close stops the hub and the watcher. Views still mounted stop working
// (ENOTCONN); unmount them first.
func (h *Host) Close() error {
	var errs []error
	if h.hub != nil {
		errs = append(errs, h.hub.Close())
	}
	if h.watcher != nil {
		errs = append(errs, h.watcher.Close())
	}
	return errors.Join(errs...)
}

func (h *Host) register(v *View) {
	h.mu.Lock()
	if _, ok := h.views[v]; !ok && h.hub == nil {
		h.files.conns.Add(1) // its own connection's descriptors
	}
	h.views[v] = struct{}{}
	h.mu.Unlock()
}

func (h *Host) unregister(v *View) {
	h.mu.Lock()
	if _, ok := h.views[v]; ok && h.hub == nil {
		h.files.conns.Add(-1)
	}
	delete(h.views, v)
	h.mu.Unlock()
}

// each returns the views mounted now, for work done outside Host.mu.
func (h *Host) each() []*View {
	h.mu.Lock()
	defer h.mu.Unlock()
	vs := make([]*View, 0, len(h.views))
	for v := range h.views {
		vs = append(vs, v)
	}
	return vs
}

// hooks widen race windows in the integration tests' build only
// (testhooks_condfstest.go); they are zero otherwise.
type hooks struct {
	plusDelay   time.Duration // a READDIRPLUS entry waits this long after its decision
	changeDelay time.Duration // a write or fallocate waits this long after choosing how it acts
	noLinkWatch bool          // run as a daemon that cannot mark filesystems
}
