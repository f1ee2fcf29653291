package changes

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// A Layer holds a staged session's changes (docs/changes.md, "Staged
// sessions"). Each space has an upper directory laid out as overlayfs lays
// out its upper layer with the userxattr option (a removed name is a
// character device 0/0, a directory whose lower entries are hidden carries
// user.overlay.opaque=y), and the kernel's overlayfs merges it over the
// backing tree at STATE_DIR/changes/ID/merged/SPACE: the session's view
// serves that merged directory exactly as a direct view serves the backing
// tree (the same decision on the path, openat2 beneath the root, the
// caller's credentials), so nothing of the session's reaches the backing
// tree until Commit. The layer is kept on disk and mounted again when the
// session comes back after a crash.
//
// A Layer is the view's change recorder too (the fsys Changes interface):
// Before notes what the backing tree held at a path the first time the
// session changes it (a commit finds conflicts by it) and refuses a change
// beyond MaxBytes.
type Layer struct {
	opts   LayerOptions
	spaces map[string]*layerSpace
	names  []string // the spaces, sorted
	// userns: the daemon is not root, and each mount of the layer is
	// made in a user namespace of its own, attached nowhere
	// (layer_userns.go).
	userns bool
	// namesChanged: the spaces whose backing tree's names changed, each
	// with its remount pending (BackingNamesChanged); guarded by mu.
	namesChanged map[string]*time.Timer
	remounts     sync.WaitGroup // remounts pending or under way

	mu     sync.Mutex
	closed bool
	base   map[key]state // what the backing tree held when first staged
	baseF  *os.File      // base.jsonl, appended
	sizes  map[key]int64 // bytes of each regular file in the upper layers
	used   atomic.Int64

	commitMu    sync.Mutex  // one commit, discard or remount at a time
	remountView RemountFunc // guarded by mu
	unwatch     []func()    // the backing watch's, one per space
}

// LayerOptions configure a Layer.
type LayerOptions struct {
	Dir      string            // the session's directory (STATE_DIR/changes/ID)
	Roots    map[string]string // space name → backing directory
	Fresh    bool              // a new session: whatever is in Dir is removed first
	MaxBytes int64             // what the upper layers may hold (default 1 GiB)
	// Shared, if set, counts what every session of the owner holds: it is
	// bounded by MaxBytes too.
	Shared  *atomic.Int64
	OnLimit func(space, path string) // told of each change refused with ENOSPC
	// Owner is the session owner's uid: a forced commit never replaces
	// or removes what another uid (root aside) has at a path now.
	Owner uint32
	// As, if set (and not root), is whose permission a commit checks in
	// the backing tree now: a change the owner could not make there
	// natively any more is a conflict, even with force.
	As *Owner
	// Watch, if set, tells the layer of names changed in its backing
	// trees: the space is mounted again (Remount).
	Watch *BackingWatch
	Log   *slog.Logger // default slog.Default()
}

type layerSpace struct {
	name               string
	lower, upper, work string
	merged             string
	lowerFD, upperFD   int // O_PATH directories
	mergedFD           int
	mounted            bool
	gen                int // of the current mount (its work directory, work/SPACE/gN)
}

// ErrNotStaged is returned for a selector that names no staged change.
var ErrNotStaged = errors.New("no staged change")

// ErrLayerUnavailable: staged sessions need the kernel's overlayfs, which
// a daemon that is not root mounts in a user namespace of its own
// (layer_userns.go): a kernel before 5.11, or one that lets no user
// namespace be made, has none for it.
var ErrLayerUnavailable = errors.New("staged sessions need overlayfs, which this daemon cannot mount (not root, and no user namespace may mount it)")

// chownIfNot gives fd's directory the owner uid and group gid unless it
// has them: a daemon that is not root may not chown even to itself where
// its group differs.
func chownIfNot(fd int, uid, gid uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Uid == uid && st.Gid == gid {
		return nil
	}
	return unix.Fchownat(fd, "", int(uid), int(gid), unix.AT_EMPTY_PATH)
}

// MergedRoot is a descriptor of the directory the session's view serves
// for space (the layer keeps it; a remount gives the view a new one).
func (l *Layer) MergedRoot(space string) int {
	if sp, ok := l.spaces[space]; ok {
		return sp.mergedFD
	}
	return -1
}

const opaqueXattr = "user.overlay.opaque"

// OpenLayer makes (or finds again) a session's layer and mounts its merged
// directories.
func OpenLayer(opts LayerOptions) (*Layer, error) {
	// The upper and work directories are named in the mount's option
	// string, where , separates options and : lower layers.
	if strings.ContainsAny(opts.Dir, ",:\\") {
		return nil, fmt.Errorf("staged: state directory %q: overlayfs cannot name a path with , : or \\", opts.Dir)
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 1 << 30
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Fresh {
		// What a crashed daemon left mounted goes first: RemoveAll
		// would walk into it.
		for name := range opts.Roots {
			if err := unmountUnder(filepath.Join(opts.Dir, "merged", name)); err != nil {
				return nil, fmt.Errorf("staged: %w", err)
			}
		}
		if err := removeLocal(opts.Dir); err != nil {
			return nil, fmt.Errorf("staged: clear %s: %w", opts.Dir, err)
		}
	}
	if err := safepath.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("staged: %w", err)
	}
	// The merged directories below show the session's files to whoever
	// may search this directory: the daemon only.
	if err := os.Chmod(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("staged: %w", err)
	}
	l := &Layer{opts: opts, spaces: map[string]*layerSpace{}, base: map[key]state{}, sizes: map[key]int64{},
		userns: os.Geteuid() != 0}
	for name := range opts.Roots {
		l.names = append(l.names, name)
	}
	sort.Strings(l.names)
	if err := l.open(); err != nil {
		l.shut(false)
		return nil, err
	}
	return l, nil
}

func (l *Layer) open() error {
	for _, name := range l.names {
		lower := l.opts.Roots[name]
		if strings.ContainsAny(lower, ",:\\") {
			return fmt.Errorf("staged: backing directory %q: overlayfs cannot name a path with , : or \\", lower)
		}
		sp := &layerSpace{name: name, lower: lower, lowerFD: -1, upperFD: -1, mergedFD: -1,
			upper:  filepath.Join(l.opts.Dir, "upper", name),
			work:   filepath.Join(l.opts.Dir, "work", name),
			merged: filepath.Join(l.opts.Dir, "merged", name)}
		l.spaces[name] = sp
		// Earlier mounts' work directories (and a work directory laid
		// out before there were several): nothing mounts them now.
		if err := unmountUnder(sp.merged); err != nil { // what a crashed daemon left mounted
			return fmt.Errorf("staged: %w", err)
		}
		if err := removeLocal(sp.work); err != nil {
			return fmt.Errorf("staged: clear %s: %w", sp.work, err)
		}
		for _, d := range []string{sp.upper, sp.work, sp.merged} {
			if err := safepath.MkdirAll(d, 0o700); err != nil {
				return fmt.Errorf("staged: %w", err)
			}
		}
		var err error
		if sp.lowerFD, err = safepath.OpenDir(lower); err != nil {
			return fmt.Errorf("staged: backing %s: %w", name, err)
		}
		if sp.upperFD, err = safepath.OpenDir(sp.upper); err != nil {
			return fmt.Errorf("staged: layer %s: %w", name, err)
		}
		// The upper layer takes the backing root's mode and owner: the
		// merged root shows them.
		var st unix.Stat_t
		if err := unix.Fstat(sp.lowerFD, &st); err != nil {
			return fmt.Errorf("staged: backing %s: %w", name, err)
		}
		if err := unix.Fchmodat(unix.AT_FDCWD, sp.upper, st.Mode&0o7777, 0); err != nil {
			return fmt.Errorf("staged: layer %s: %w", name, err)
		}
		if err := chownIfNot(sp.upperFD, st.Uid, st.Gid); err != nil {
			return fmt.Errorf("staged: layer %s: %w", name, err)
		}
		if err := l.mountSpace(sp); err != nil {
			return err
		}
	}
	if err := l.loadBase(); err != nil {
		return err
	}
	if err := l.clearTemps(); err != nil {
		return err
	}
	if w := l.opts.Watch; w != nil {
		for _, name := range l.names {
			stop, err := w.Watch(l.spaces[name].lower, l.opts.Dir, func() {
				if err := l.Remount(name); err != nil {
					l.opts.Log.Warn("staged: the layer could not be mounted again after its backing tree changed", "space", name, "err", err)
				}
			})
			if err != nil {
				return err
			}
			l.unwatch = append(l.unwatch, stop)
		}
	}
	for _, name := range l.names {
		l.measure(name, l.spaces[name].upperFD, "/")
	}
	if l.opts.Shared != nil {
		l.opts.Shared.Add(l.used.Load())
	}
	return nil
}

// unmountUnder detaches whatever is mounted on dir (a crashed daemon's
// overlay), as many times as it is mounted; an error when something stays.
func unmountUnder(dir string) error {
	for i := 0; i < 8; i++ {
		switch err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err {
		case nil:
		case unix.EINVAL, unix.ENOENT:
			return nil // not a mountpoint (any more), or no such directory
		default:
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted", dir)
}

// RemoveDir removes a session's directory of changes (a store or a layer
// an earlier session of its id left): a merged directory a crashed daemon
// left mounted is detached first, and nothing is removed across a mount.
func RemoveDir(dir string) error {
	names, _ := os.ReadDir(filepath.Join(dir, "merged"))
	for _, n := range names {
		if err := unmountUnder(filepath.Join(dir, "merged", n.Name())); err != nil {
			return fmt.Errorf("staged: %w", err)
		}
	}
	return removeLocal(dir)
}

// Merged is the directory the session's view serves for space.
func (l *Layer) Merged(space string) string {
	if sp, ok := l.spaces[space]; ok {
		return sp.merged
	}
	return ""
}

func (l *Layer) loadBase() error {
	p := filepath.Join(l.opts.Dir, "base.jsonl")
	data, err := os.ReadFile(p)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("staged: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r record
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue // a torn last line: the change it preceded was not made
		}
		if r.K == kindForget {
			l.dropBase(key{r.S, r.P})
			continue
		}
		l.base[key{r.S, r.P}] = r.St
	}
	l.baseF, err = os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("staged: %w", err)
	}
	return nil
}

// measure counts the entries below rel of an upper layer.
func (l *Layer) measure(space string, root int, rel string) {
	walkUpper(root, rel, func(p string, st *unix.Stat_t) {
		n := entryBytes(st)
		l.sizes[key{space, p}] = n
		l.used.Add(n)
	})
}

// blockBytes is what one entry costs the state directory at least: a
// directory, whiteout, symlink or empty file takes an inode and a block,
// so max_bytes bounds how many of them a session can make too.
const blockBytes = 4096

// entryBytes is what an entry of the layer counts against max_bytes: its
// size in whole blocks, at least one.
func entryBytes(st *unix.Stat_t) int64 {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return blockBytes
	}
	return inBlocks(st.Size)
}

// inBlocks rounds n up to whole blocks, at least one.
func inBlocks(n int64) int64 {
	if n <= blockBytes {
		return blockBytes
	}
	return (n + blockBytes - 1) / blockBytes * blockBytes
}

// walkUpper calls f for every entry below rel, parents first.
func walkUpper(root int, rel string, f func(p string, st *unix.Stat_t)) {
	names, err := listDir(root, rel)
	if err != nil {
		return
	}
	for _, name := range names {
		p := joinPath(rel, name)
		var st unix.Stat_t
		if lstatBeneath(root, p, &st) != nil {
			continue
		}
		f(p, &st)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			walkUpper(root, p, f)
		}
	}
}

func listDir(root int, rel string) ([]string, error) {
	fd, err := safepath.Beneath(root, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	sort.Strings(names)
	return names, err
}

func lstatBeneath(root int, p string, st *unix.Stat_t) error {
	fd, err := safepath.Beneath(root, p, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fstat(fd, st)
}

func joinPath(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

// Armed: a layer records every change.
func (l *Layer) Armed() bool { return l != nil }

// Before notes what the backing tree holds at p the first time the session
// changes it, and refuses a change once the layers hold MaxBytes (or the
// owner's sessions together do).
func (l *Layer) Before(space, p string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return unix.EIO
	}
	sp, ok := l.spaces[space]
	if !ok {
		return nil
	}
	if l.over() {
		if l.opts.OnLimit != nil {
			l.opts.OnLimit(space, p)
		}
		return fmt.Errorf("staged: the layer holds %d bytes, max_bytes %d: %w", l.used.Load(), l.opts.MaxBytes, unix.ENOSPC)
	}
	k := key{space, p}
	if _, ok := l.base[k]; ok {
		return nil
	}
	cur, err := lowerState(sp.lowerFD, p)
	if err != nil {
		return err
	}
	return l.noteBase(k, shown(sp, p, cur))
}

// shown is what the session's view shows at p, where the backing tree
// holds cur: the entry the session changes, and so its base. overlayfs
// looks a backing entry up once per mount, so until the layer is mounted
// afresh (the backing watch does so a moment after a change) the view
// shows, and a change copies up, what the backing tree held before
// another writer replaced or removed it, or nothing where it made one:
// noted so, the other writer's entry is a conflict at commit. Where the
// layer holds an entry the view shows it, and a directory is noted as the
// backing tree holds it (overlayfs numbers a merged one its own way).
// l.mu is held.
func shown(sp *layerSpace, p string, cur state) state {
	if cur.T == "d" || sp.mergedFD < 0 {
		return cur
	}
	if up, err := lowerState(sp.upperFD, p); err != nil || up.T != "n" {
		return cur
	}
	seen, err := lowerState(sp.mergedFD, p)
	if err != nil || seen.T == "d" {
		return cur
	}
	if seen.T != cur.T || seen.T != "n" && changedSince(seen, cur) {
		return seen
	}
	return cur
}

func (l *Layer) over() bool {
	if l.used.Load() >= l.opts.MaxBytes {
		return true
	}
	return l.opts.Shared != nil && l.opts.Shared.Load() >= l.opts.MaxBytes
}

// noteBase records k's state in the backing tree; l.mu is held.
func (l *Layer) noteBase(k key, cur state) error {
	data, err := json.Marshal(record{K: kindBefore, S: k.space, P: k.path, St: cur})
	if err != nil {
		return err
	}
	if _, err := l.baseF.Write(append(data, '\n')); err != nil {
		return fmt.Errorf("staged: note %s: %w", k.path, err)
	}
	l.base[k] = cur
	return nil
}

// kindForget in base.jsonl: the layer holds nothing at the path and below
// it any more (committed or discarded); the next change there notes what
// the backing tree holds then.
const kindForget = "forget"

// forgetBase drops what base holds of k's path and below it; l.mu is held.
func (l *Layer) forgetBase(k key) error {
	data, err := json.Marshal(record{K: kindForget, S: k.space, P: k.path})
	if err != nil {
		return err
	}
	if _, err := l.baseF.Write(append(data, '\n')); err != nil {
		return fmt.Errorf("staged: note %s: %w", k.path, err)
	}
	l.dropBase(k)
	return nil
}

// forgetKeeping is forgetBase of k, then noteBase of each kept path, in
// one append: a crash between them would leave a kept copy no base, and
// the session's next change to it would take another writer's change
// since as its base. l.mu is held.
func (l *Layer) forgetKeeping(k key, kept map[key]state) error {
	recs := []record{{K: kindForget, S: k.space, P: k.path}}
	for kk, st := range kept {
		recs = append(recs, record{K: kindBefore, S: kk.space, P: kk.path, St: st})
	}
	var buf []byte
	for _, r := range recs {
		data, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf = append(append(buf, data...), '\n')
	}
	if _, err := l.baseF.Write(buf); err != nil {
		return fmt.Errorf("staged: note %s: %w", k.path, err)
	}
	l.dropBase(k)
	for kk, st := range kept {
		l.base[kk] = st
	}
	return nil
}

func (l *Layer) dropBase(k key) {
	delete(l.base, k)
	for b := range l.base {
		if b.space == k.space && (k.path == "/" || strings.HasPrefix(b.path, k.path+"/")) {
			delete(l.base, b)
		}
	}
}

// lowerState states p beneath root without following a symlink: a path
// through one does not exist (as in the view).
func lowerState(root int, p string) (state, error) {
	fd, err := safepath.Beneath(root, p, unix.O_PATH, 0)
	switch err {
	case nil:
	case unix.ENOENT, unix.ENOTDIR, unix.ELOOP:
		return none, nil
	default:
		return state{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return state{}, err
	}
	cur := stateOf(&st)
	if cur.T == "l" {
		if cur.Link, err = readlinkFD(fd); err != nil {
			return state{}, err
		}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
		cur.T = "w" // a whiteout
	}
	return cur, nil
}

// Moved: a directory rename in a staged view moves only what the layer
// holds (overlayfs answers EXDEV for a backing directory).
func (l *Layer) Moved(space, from, to string, exchange bool) error {
	if err := l.Before(space, from); err != nil {
		return err
	}
	return l.Before(space, to)
}

// Renamed recounts the layer's bytes: the files below moved with it.
func (l *Layer) Renamed(space, from, to string, exchange bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.spaces[space]; ok && !l.closed {
		l.recount()
	}
}

// recount counts the layers' bytes again; l.mu is held. As the daemon:
// the thread may act as a caller, who may not search every directory of
// the layer (one it made 000 still holds bytes).
func (l *Layer) recount() {
	for k, n := range l.sizes {
		l.addUsed(-n)
		delete(l.sizes, k)
	}
	before := l.used.Load()
	asDaemon(func() error {
		for _, name := range l.names {
			l.measure(name, l.spaces[name].upperFD, "/")
		}
		return nil
	})
	if l.opts.Shared != nil {
		l.opts.Shared.Add(l.used.Load() - before)
	}
}

func (l *Layer) addUsed(n int64) {
	l.used.Add(n)
	if l.opts.Shared != nil {
		l.opts.Shared.Add(n)
	}
}

// After recounts p's bytes in the layer.
func (l *Layer) After(space, p string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sp, ok := l.spaces[space]
	if !ok || l.closed {
		return
	}
	var st unix.Stat_t
	var n int64
	// As the daemon (see Renamed): a file the caller cannot stat in the
	// layer still counts. What a removed directory of the layer held
	// (whiteouts) stays counted until the next recount (a commit, discard,
	// rollback or rename): never less than the layer holds.
	if asDaemon(func() error { return lstatBeneath(sp.upperFD, p, &st) }) == nil {
		n = entryBytes(&st)
	}
	l.setSize(key{space, p}, n)
}

// Wrote recounts the bytes of the file written through fd.
func (l *Layer) Wrote(space, p string, fd int) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.spaces[space]; ok && !l.closed {
		l.setSize(key{space, p}, inBlocks(st.Size))
	}
}

func (l *Layer) setSize(k key, n int64) {
	l.addUsed(n - l.sizes[k])
	if n == 0 {
		delete(l.sizes, k)
	} else {
		l.sizes[k] = n
	}
}

// Use is what the layer holds.
func (l *Layer) Use() Use {
	return Use{Bytes: l.used.Load(), MaxBytes: l.opts.MaxBytes}
}

// staged is one change in the layer, found by comparing it with the
// backing tree.
type staged struct {
	space, path string
	change      string // added, modified, deleted
	up, low     state  // the layer's entry (T "w" for a whiteout) and the backing's
}

func (c staged) shown() string {
	if (c.change == "deleted" && c.low.T == "d") || (c.change != "deleted" && c.up.T == "d") {
		return strings.TrimSuffix(c.path, "/") + "/"
	}
	return c.path
}

// list finds the changes in the layers, parents first.
func (l *Layer) list() ([]staged, error) {
	var out []staged
	for _, name := range l.names {
		sp := l.spaces[name]
		if err := l.walk(sp, "/", true, false, &out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// walk lists the changes below rel; lowerDir: the backing tree has a
// directory at rel; hiding: rel is in an opaque directory of the layer (or
// is one), so the backing entries it does not hold are not in the view.
func (l *Layer) walk(sp *layerSpace, rel string, lowerDir, hiding bool, out *[]staged) error {
	names, err := listDir(sp.upperFD, rel)
	if err != nil {
		return fmt.Errorf("staged: list %s%s: %w", sp.name, rel, err)
	}
	for _, name := range names {
		p := joinPath(rel, name)
		up, err := lowerState(sp.upperFD, p)
		if err != nil {
			return fmt.Errorf("staged: %s%s: %w", sp.name, p, err)
		}
		low := none
		if lowerDir {
			if low, err = lowerState(sp.lowerFD, p); err != nil {
				return fmt.Errorf("staged: %s%s: %w", sp.name, p, err)
			}
		}
		c := staged{space: sp.name, path: p, up: up, low: low}
		switch {
		case up.T == "w":
			if low.T != "n" {
				c.change = "deleted"
			}
		case up.T == "d":
			hides := hiding || isOpaque(sp.upperFD, p)
			switch {
			case low.T == "n":
				c.change = "added"
			case low.T != "d":
				c.change = "modified"
			case up.Mode != low.Mode && l.changed(sp.name, p):
				// A directory copied up keeps the mode it had then: a
				// chmod in the backing tree since is not the session's.
				c.change = "modified"
			}
			if c.change != "" {
				*out = append(*out, c)
			}
			if err := l.walk(sp, p, low.T == "d", hides, out); err != nil {
				return err
			}
			if low.T == "d" && hides {
				if err := l.hiddenBelow(sp, p, out); err != nil {
					return err
				}
			}
			continue
		case low.T == "n":
			c.change = "added"
		case !sameEntry(sp, p, up, low):
			c.change = "modified"
		}
		if c.change != "" {
			*out = append(*out, c)
		}
	}
	return nil
}

// changed: the session changed p itself (Before was told of it).
func (l *Layer) changed(space, p string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.base[key{space, p}]
	return ok
}

// hiddenBelow lists as deleted the backing entries an opaque directory of
// the layer hides (a directory removed and made again in the session).
func (l *Layer) hiddenBelow(sp *layerSpace, dir string, out *[]staged) error {
	names, err := listDir(sp.lowerFD, dir)
	if err != nil {
		return nil // nothing below to hide
	}
	for _, name := range names {
		p := joinPath(dir, name)
		var st unix.Stat_t
		if lstatBeneath(sp.upperFD, p, &st) == nil {
			continue // the layer has its own entry there, listed by walk
		}
		low, err := lowerState(sp.lowerFD, p)
		if err != nil {
			return fmt.Errorf("staged: %s%s: %w", sp.name, p, err)
		}
		if low.T != "n" {
			*out = append(*out, staged{space: sp.name, path: p, change: "deleted", up: state{T: "w"}, low: low})
		}
	}
	return nil
}

func isOpaque(root int, p string) bool {
	fd, err := safepath.Beneath(root, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	buf := make([]byte, 8)
	n, err := unix.Fgetxattr(fd, opaqueXattr, buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// sameEntry: the layer's entry at p shows what the backing tree has (a
// file copied up but not changed, or one committed).
func sameEntry(sp *layerSpace, p string, up, low state) bool {
	if up.T != low.T || up.Mode != low.Mode {
		return false
	}
	switch up.T {
	case "l":
		return up.Link == low.Link
	case "f":
		if up.Size != low.Size {
			return false
		}
		return sameContent(sp.upperFD, sp.lowerFD, p)
	}
	return true
}

func sameContent(a, b int, p string) bool {
	fa, err := safepath.Beneath(a, p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fa)
	fb, err := safepath.Beneath(b, p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fb)
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for off := int64(0); ; {
		na, ea := unix.Pread(fa, ba, off)
		nb, eb := unix.Pread(fb, bb, off)
		if ea != nil || eb != nil || na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if na == 0 {
			return true
		}
		off += int64(na)
	}
}

// Pending reports whether the layer holds a change not in the backing
// tree.
func (l *Layer) Pending() (bool, error) {
	list, err := l.list()
	return len(list) > 0, err
}

// Diff lists the staged changes: what the session's view shows that the
// backing tree does not. visible says which paths the caller may see; the
// others are counted in hidden. With content, each changed text file
// carries a unified diff.
func (l *Layer) Diff(content bool, visible func(space, path string) bool) ([]Change, int, error) {
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	list, err := l.list()
	if err != nil {
		return nil, 0, err
	}
	out, hidden := []Change{}, 0
	for _, c := range list {
		if !visible(c.space, c.path) {
			hidden++
			continue
		}
		ch := Change{Space: c.space, Path: c.shown(), Change: c.change}
		if content && (c.up.T == "f" || c.low.T == "f") && c.up.T != "d" && c.low.T != "d" {
			l.contentOf(&ch, c)
		}
		out = append(out, ch)
	}
	return out, hidden, nil
}

func (l *Layer) contentOf(ch *Change, c staged) {
	sp := l.spaces[c.space]
	read := func(root int, st state) ([]byte, bool) {
		if st.T != "f" {
			return nil, true
		}
		if st.Size > maxDiff {
			return nil, false
		}
		// As the session's owner (As): a backing file the session removed
		// but its owner may not read is listed, its content not shown.
		fd, err := -1, error(unix.EACCES)
		runAs(l.opts.As, func() {
			fd, err = safepath.Beneath(root, c.path, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		})
		if err != nil {
			return nil, false
		}
		defer unix.Close(fd)
		return readAll(fd, int64(st.Size))
	}
	up := c.up
	if up.T == "w" {
		up = none
	}
	old, ok1 := read(sp.lowerFD, c.low)
	now, ok2 := read(sp.upperFD, up)
	if !ok1 || !ok2 || !utf8Valid(old) || !utf8Valid(now) {
		ch.Binary = true
		return
	}
	ch.Diff = unifiedDiff("a"+c.path, "b"+c.path, string(old), string(now))
}

// Selector names staged changes: a space, or a path within one and what
// is below it ("workspace/src" or "/workspace/src").
type Selector struct{ Space, Path string }

// ParseSelectors checks commit's and discard's paths; each must name a
// known space and a clean path within it.
func (l *Layer) ParseSelectors(paths []string) ([]Selector, error) {
	var out []Selector
	for _, raw := range paths {
		p := strings.TrimPrefix(raw, "/")
		space, rest, _ := strings.Cut(p, "/")
		if _, ok := l.spaces[space]; !ok {
			return nil, fmt.Errorf("path %q: begin it with a space (%s)", raw, strings.Join(l.names, " or "))
		}
		rest = "/" + strings.TrimSuffix(rest, "/")
		if rest != "/" && (filepath.Clean(rest) != rest || strings.ContainsRune(rest, 0)) {
			return nil, fmt.Errorf("path %q: not a clean path (no . or .. or //)", raw)
		}
		out = append(out, Selector{space, rest})
	}
	return out, nil
}

// selected lists the changes under sel (all without); a selector that
// holds none is an error (ErrNotStaged).
func (l *Layer) selected(sel []Selector) ([]staged, error) {
	list, err := l.list()
	if err != nil {
		return nil, err
	}
	// A set, each change looked up by its path and those above it: a
	// request may name 100,000 paths, and a layer hold as many changes.
	set := make(map[Selector]bool, len(sel))
	for _, s := range sel {
		set[s] = true
	}
	var todo []staged
	for _, c := range list {
		if len(sel) == 0 || selects(set, c) {
			todo = append(todo, c)
		}
	}
	if len(sel) > 0 && len(todo) == 0 {
		return nil, fmt.Errorf("%w under the paths given", ErrNotStaged)
	}
	return todo, nil
}

// selects: a selector names c's path or one above it.
func selects(set map[Selector]bool, c staged) bool {
	for p := c.path; ; p = parentOf(p) {
		if set[Selector{c.space, p}] {
			return true
		}
		if p == "/" {
			return false
		}
	}
}

// CommitResult is what a commit did.
type CommitResult struct {
	Committed int        `json:"committed"`
	Conflicts []Conflict `json:"conflicts"`
	// Touched: the paths changed in the backing tree.
	Touched []Touched `json:"-"`
}

// DiscardResult is what a discard did.
type DiscardResult struct {
	Discarded int       `json:"discarded"`
	Touched   []Touched `json:"-"`
}

// Commit applies the staged changes under sel (all without) to the backing
// tree: each path atomically (a file is written beside its target and
// renamed over it), parents before what is below them. A path the backing
// tree changed since the session first staged it is a conflict: left as
// it is and reported, unless force. What is committed stays in the layer,
// the same as the backing tree (so no longer a change), until a later
// change of the session. Run again after a crash, it ends in the same
// state: what was committed is no longer a change.
func (l *Layer) Commit(sel []Selector, force bool) (res CommitResult, err error) {
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	res = CommitResult{Conflicts: []Conflict{}}
	if err := l.clearTemps(); err != nil {
		return res, err
	}
	todo, err := l.selected(sel)
	if err != nil {
		return res, err
	}
	var skipped []string // conflicting directories: nothing below them goes
	// A directory is committed open to its owner, and given its own mode
	// once what is below it is in, deepest first: the session filled it
	// before it made it read-only (natively the owner may write in it,
	// then chmod it), and the commit's check of each change below would
	// otherwise find a directory its owner may not write.
	var dirModes []dirMode
	var done []staged
	defer func() {
		l.finishCommit(&res, dirModes, done, &err)
	}()
	for _, c := range todo {
		if under1(skipped, c) {
			continue
		}
		sp := l.spaces[c.space]
		reason := l.conflict(sp, c)
		if reason != "" && force {
			reason = l.notOwners(sp, c)
		}
		if reason == "" {
			reason = l.ownerMayNot(sp, c)
		}
		if reason != "" {
			res.Conflicts = append(res.Conflicts, Conflict{Space: c.space, Path: c.shown(), Reason: reason})
			if c.up.T == "d" {
				skipped = append(skipped, c.space+c.path)
			}
			continue
		}
		if c.up.T == "d" && c.up.Mode&0o700 != 0o700 {
			dirModes = append(dirModes, dirMode{sp, c, c.up.Mode})
			c.up.Mode |= 0o700
		}
		if err := l.commitOne(sp, c); errors.Is(err, errWritten) {
			res.Conflicts = append(res.Conflicts, Conflict{Space: c.space, Path: c.shown(), Reason: "written in the session while it was committed: commit it again"})
			continue
		} else if err != nil {
			return res, fmt.Errorf("staged: commit %s%s: %w", c.space, c.path, err)
		}
		cur, err := lowerState(sp.lowerFD, c.path)
		if err == nil {
			l.mu.Lock()
			err = l.noteBase(key{c.space, c.path}, cur)
			l.mu.Unlock()
		}
		if err != nil {
			return res, err
		}
		res.Committed++
		res.Touched = append(res.Touched, Touched{Space: c.space, Path: c.path, Moved: c.up.T == "d" || c.low.T == "d"})
		done = append(done, c)
	}
	return res, nil
}

// finishCommit gives committed directories their own modes (deepest
// first), then removes from the layer what the commit made the backing
// tree hold and mounts each space it touched again (pruneCommitted). Run
// on every return of Commit: what was committed leaves the layer even when
// a later path failed.
func (l *Layer) finishCommit(res *CommitResult, dirModes []dirMode, done []staged, errp *error) {
	{
		for i := len(dirModes) - 1; i >= 0; i-- {
			dm := dirModes[i]
			if err := chmodBeneath(dm.sp.lowerFD, dm.c.path, dm.mode); err != nil {
				res.Conflicts = append(res.Conflicts, Conflict{Space: dm.c.space, Path: dm.c.shown(), Reason: "its mode could not be set: " + err.Error()})
				continue
			}
			if cur, err := lowerState(dm.sp.lowerFD, dm.c.path); err == nil {
				l.mu.Lock()
				l.noteBase(key{dm.c.space, dm.c.path}, cur)
				l.mu.Unlock()
			}
		}
	}
	err := l.bySpace(done, func(sp *layerSpace, mine []staged) error {
		return l.exclusive(sp, func() error { return l.pruneCommitted(sp, mine, res.Conflicts) })
	})
	*errp = errors.Join(*errp, err)
}

// bySpace calls f for each space with the changes of list in it, and joins
// what they answer.
func (l *Layer) bySpace(list []staged, f func(sp *layerSpace, mine []staged) error) error {
	var errs []error
	for _, name := range l.names {
		var mine []staged
		for _, c := range list {
			if c.space == name {
				mine = append(mine, c)
			}
		}
		if len(mine) == 0 {
			continue
		}
		if err := f(l.spaces[name], mine); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func under1(dirs []string, c staged) bool {
	for _, d := range dirs {
		if strings.HasPrefix(c.space+c.path, d+"/") {
			return true
		}
	}
	return false
}

// conflict says why c cannot be committed without force: the backing tree
// changed at its path since the session first staged it (the nearest path
// at or above it the session changed; a path below one that did not exist
// then must not exist now).
func (l *Layer) conflict(sp *layerSpace, c staged) string {
	l.mu.Lock()
	was, ok := l.base[key{c.space, c.path}]
	absentAbove := false
	if !ok {
		for p := c.path; p != "/" && !ok; {
			p = parentOf(p)
			var w state
			if w, ok = l.base[key{c.space, p}]; ok && w.T == "n" {
				absentAbove = true
			}
		}
	}
	l.mu.Unlock()
	cur, err := lowerState(sp.lowerFD, c.path)
	if err != nil {
		return "cannot be read in the backing tree: " + err.Error()
	}
	switch {
	case absentAbove:
		if cur.T != "n" {
			return "made in the backing tree since the session staged it"
		}
	case !ok:
	case cur.T != was.T:
		return "changed in the backing tree since the session staged it"
	case cur.T == "n":
	case cur.T == "d":
		if cur.Ino != was.Ino || cur.Mode != was.Mode {
			return "changed in the backing tree since the session staged it"
		}
	case changedSince(was, cur):
		return "changed in the backing tree since the session staged it"
	}
	if cur.T == "d" && c.up.T != "d" {
		return l.madeBelowSince(sp, c.path)
	}
	return ""
}

// changedSince: the backing tree's entry cur is not the one the session
// saw (was, of the same type).
func changedSince(was, cur state) bool {
	if cur.T == "d" {
		return cur.Ino != was.Ino || cur.Mode != was.Mode
	}
	return cur.Ino != was.Ino || cur.Size != was.Size || cur.Mtime != was.Mtime || cur.Ctime != was.Ctime || cur.Link != was.Link
}

// madeBelowSince says why a backing directory the session removed or
// replaced cannot go: an entry below it that the session did not see when
// it removed what was there (each removal through the view noted it), or
// one changed since. The directory's own inode and mode say nothing of
// what was made in it, and the commit removes it whole.
func (l *Layer) madeBelowSince(sp *layerSpace, dir string) string {
	reason := ""
	walkBacking(sp.lowerFD, dir, func(p string, cur state, err error) bool {
		if err != nil {
			reason = "cannot be read in the backing tree: " + err.Error()
			return false
		}
		l.mu.Lock()
		was, ok := l.base[key{sp.name, p}]
		l.mu.Unlock()
		switch {
		case !ok || was.T == "n":
			reason = "made in the backing tree below it since the session staged it: " + p
		case was.T != cur.T || changedSince(was, cur):
			reason = "changed in the backing tree below it since the session staged it: " + p
		}
		return reason == ""
	})
	return reason
}

// walkBacking calls f for every entry below dir beneath root, parents
// first, until f answers false; an entry that cannot be listed or stated
// is given with its error.
func walkBacking(root int, dir string, f func(p string, cur state, err error) bool) bool {
	names, err := listDir(root, dir)
	if err != nil {
		return f(dir, state{}, err)
	}
	for _, name := range names {
		p := joinPath(dir, name)
		cur, err := lowerState(root, p)
		if !f(p, cur, err) {
			return false
		}
		if cur.T == "d" && !walkBacking(root, p, f) {
			return false
		}
	}
	return true
}

// notOwners says why a forced commit leaves c: the backing tree has, at
// its path, what another uid owns (the daemon would replace it with its
// own authority where the owner may not).
func (l *Layer) notOwners(sp *layerSpace, c staged) string {
	cur, err := lowerState(sp.lowerFD, c.path)
	if err != nil {
		return "cannot be read in the backing tree: " + err.Error()
	}
	if cur.T != "n" && l.opts.Owner != 0 && cur.UID != l.opts.Owner {
		return "changed in the backing tree and owned by another uid: not replaced, even with force"
	}
	if cur.T == "d" && c.up.T != "d" && l.opts.Owner != 0 {
		// The commit removes the directory whole.
		reason := ""
		walkBacking(sp.lowerFD, c.path, func(p string, cur state, err error) bool {
			if err != nil {
				reason = "cannot be read in the backing tree: " + err.Error()
			} else if cur.UID != l.opts.Owner {
				reason = "holds what another uid owns (" + p + "): not removed, even with force"
			}
			return reason == ""
		})
		return reason
	}
	return ""
}

// ownerMayNot says why the session's owner could not make c's change in
// the backing tree now ("" when it could). A commit writes as the daemon,
// and what the owner's permission allowed when it staged the change may
// have been taken away since (its directory made read-only). The change
// is made in place when the owner keeps the entry's owner: its own file or
// directory, or the content of a file it may write; else in the nearest
// directory of the backing tree above it, which the owner must be able to
// write and search (and, sticky, own it or what is replaced). Only the
// owner's uid and primary gid count: what a supplementary group or an ACL
// entry alone allows is a conflict.
func (l *Layer) ownerMayNot(sp *layerSpace, c staged) string {
	o := l.opts.As
	if o == nil || o.UID == 0 {
		return ""
	}
	cur, err := lowerState(sp.lowerFD, c.path)
	if err != nil {
		return "cannot be read in the backing tree: " + err.Error()
	}
	if cur.T != "n" && cur.T == c.up.T && cur.UID == c.up.UID && cur.GID == c.up.GID {
		if cur.UID == o.UID && (cur.T == "f" || cur.T == "d") {
			return "" // its own: the owner may chmod and write it
		}
		if cur.T == "f" && cur.Mode == c.up.Mode && l.ownerMayAccess(sp.lowerFD, c.path, unix.W_OK) {
			return "" // content the owner may write
		}
	}
	if cur.T == "d" && c.up.T == "d" {
		return "the session's owner does not own " + c.path + " in the backing tree now: its mode is not changed, even with force"
	}
	dir := parentOf(c.path)
	var parent state
	for {
		if parent, err = lowerState(sp.lowerFD, dir); err != nil {
			return "cannot be read in the backing tree: " + err.Error()
		}
		if parent.T == "d" || dir == "/" {
			break
		}
		dir = parentOf(dir)
	}
	if parent.T != "d" || !l.ownerMayAccess(sp.lowerFD, dir, unix.W_OK|unix.X_OK) {
		return "the session's owner may not write in " + dir + " in the backing tree now: not committed, even with force"
	}
	if cur.T != "n" && parent.Mode&unix.S_ISVTX != 0 && cur.UID != o.UID && parent.UID != o.UID {
		return "the session's owner may not replace another uid's entry in the sticky " + dir + ": not committed, even with force"
	}
	return ""
}

// ownerMayAccess: the kernel grants the owner's uid and primary gid mode
// on p beneath root.
func (l *Layer) ownerMayAccess(root int, p string, mode uint32) bool {
	fd, err := safepath.Beneath(root, p, unix.O_PATH, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	ok := false
	ran := runAs(l.opts.As, func() {
		ok = unix.Faccessat2(fd, "", mode, unix.AT_EACCESS|unix.AT_EMPTY_PATH) == nil
	})
	return ran && ok
}

func parentOf(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

// dirMode is a committed directory's own mode, set once what is below it
// is in.
type dirMode struct {
	sp   *layerSpace
	c    staged
	mode uint32
}

// commitOne makes the backing tree hold what the layer has at c.path.
// chmodBeneath sets the mode of the directory p beneath root.
func chmodBeneath(root int, p string, mode uint32) error {
	fd, err := safepath.Beneath(root, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, mode)
}

func (l *Layer) commitOne(sp *layerSpace, c staged) error {
	if c.up.T == "w" {
		return removeBeneath(sp.lowerFD, c.path)
	}
	if err := mkParents(sp.upperFD, sp.lowerFD, parentOf(c.path)); err != nil {
		return err
	}
	return copyEntry(sp.upperFD, sp.lowerFD, c.path, c.up, c.low, false, func(dir, name string) error {
		return l.noteTemp(sp.name, dir, name)
	})
}

// Discard drops the staged changes under sel (all without): their entries
// go from the layer (a whiteout, a file or directory the session made or
// copied up; an opaque directory above a backing entry is made
// transparent first, revealAbove), and the space is mounted again, so the
// view shows what the backing tree holds there now, and what another
// writer changes there later. Nothing is copied: a discard never adds to
// the layer. A file overlayfs copied up when it was opened for writing,
// and never changed, is no change: it stays, with its base (keptCopies).
// Run again after a crash, it ends the same.
func (l *Layer) Discard(sel []Selector) (DiscardResult, error) {
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	var res DiscardResult
	todo, err := l.selected(sel)
	if err != nil {
		return res, err
	}
	err = l.bySpace(todo, func(sp *layerSpace, mine []staged) error {
		return l.exclusive(sp, func() error {
			var done []string
			for _, c := range mine {
				if under1(done, c) {
					continue // its entry went whole
				}
				low, err := lowerState(sp.lowerFD, c.path)
				if err != nil {
					return fmt.Errorf("staged: discard %s%s: %w", c.space, c.path, err)
				}
				whole, err := l.discardOne(sp, c, low)
				if err != nil {
					return fmt.Errorf("staged: discard %s%s: %w", c.space, c.path, err)
				}
				if whole {
					done = append(done, c.space+c.path)
				}
				res.Discarded++
				res.Touched = append(res.Touched, Touched{Space: c.space, Path: c.path, Moved: c.up.T == "d" || low.T == "d"})
			}
			return nil
		})
	})
	l.mu.Lock()
	l.recount()
	if err == nil {
		// The layer holds no change under sel now: what the backing tree
		// held there is noted afresh at the session's next change (a
		// path noted for an operation that then failed would otherwise
		// keep what the backing tree held before the discard).
		forget := func(k key) {
			err = errors.Join(err, l.forgetKeeping(k, l.keptCopies(l.spaces[k.space], k.path)))
		}
		if len(sel) == 0 {
			for _, name := range l.names {
				forget(key{name, "/"})
			}
		}
		for _, s := range sel {
			forget(key{s.Space, s.Path})
		}
	}
	l.mu.Unlock()
	return res, err
}

// keptCopies gives the base to note for each file at or below p that the
// layer still holds after a discard: a copy overlayfs made when the session
// opened a backing file for writing and never changed (the same as the
// backing file, so no change lists it, and a descriptor may still be open
// on it). Like every path the discard leaves as the backing tree has it,
// its base is the backing file as it is now: another writer's change
// before the discard is none of the session's. One that differs (written
// since the discard listed the layer) keeps the base it had. l.mu is held.
func (l *Layer) keptCopies(sp *layerSpace, p string) map[key]state {
	kept := map[key]state{}
	note := func(q string, up state) {
		if up.T == "n" || up.T == "d" || up.T == "w" {
			return
		}
		k := key{sp.name, q}
		if low, err := lowerState(sp.lowerFD, q); err == nil && sameEntry(sp, q, up, low) {
			kept[k] = low
		} else if was, ok := l.base[k]; ok {
			kept[k] = was
		}
	}
	up, err := lowerState(sp.upperFD, p)
	if err != nil {
		return kept
	}
	note(p, up)
	if up.T == "d" {
		walkBacking(sp.upperFD, p, func(q string, cur state, err error) bool {
			if err == nil {
				note(q, cur)
			}
			return true
		})
	}
	return kept
}

// discardOne drops c from the layer; whole: its entry went with all below
// it. As the daemon (exclusive).
func (l *Layer) discardOne(sp *layerSpace, c staged, low state) (whole bool, err error) {
	if c.up.T == "d" && low.T == "d" {
		// Its mode changed: what is below it is listed on its own.
		fd, err := safepath.Beneath(sp.upperFD, c.path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return false, err
		}
		defer unix.Close(fd)
		return false, unix.Fchmod(fd, low.Mode)
	}
	if low.T != "n" {
		if err := revealAbove(sp, c.path); err != nil {
			return false, err
		}
	}
	if err := removeBeneath(sp.upperFD, c.path); err != nil {
		return false, err
	}
	l.mu.Lock()
	err = l.forgetBase(key{c.space, c.path})
	l.mu.Unlock()
	if err != nil {
		return false, err
	}
	pruneAbove(sp, c.path)
	return true, nil
}

// Close unmounts the merged directories and keeps the layer (the session
// comes back with it); Remove drops it too.
func (l *Layer) Close() error { return l.shut(false) }

// Remove unmounts the merged directories and removes the layer.
func (l *Layer) Remove() error { return l.shut(true) }

func (l *Layer) shut(remove bool) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	if l.opts.Shared != nil {
		l.opts.Shared.Add(-l.used.Load())
	}
	l.mu.Unlock()
	for _, stop := range l.unwatch { // a remount in progress ends first
		stop()
	}
	l.mu.Lock()
	for _, t := range l.namesChanged {
		if t.Stop() {
			l.remounts.Done()
		}
	}
	l.mu.Unlock()
	l.remounts.Wait()
	var errs []error
	mounted := false
	for _, sp := range l.spaces {
		for _, fd := range []int{sp.mergedFD, sp.upperFD, sp.lowerFD} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		if sp.mounted {
			if err := unmountUnder(sp.merged); err != nil {
				errs = append(errs, fmt.Errorf("staged: %w", err))
				mounted = true
			}
		}
	}
	if l.baseF != nil {
		l.baseF.Close()
	}
	if remove && !mounted { // never through a merged directory still mounted
		if err := removeLocal(l.opts.Dir); err != nil {
			errs = append(errs, fmt.Errorf("staged: remove %s: %w", l.opts.Dir, err))
		}
	}
	return errors.Join(errs...)
}
