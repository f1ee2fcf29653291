package fsys

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// liveness bounds how long a test waits for something that must not be
// blocked; it fails only if the thing hangs (never a speed target).
const liveness = 20 * time.Second

func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(liveness):
		t.Fatalf("%s: still blocked after %v", what, liveness)
	}
}

// TestBarrierWaitsForOlderListingsOnly: a reload waits for the listings
// that began before it, and a listing that begins meanwhile neither waits
// nor is waited for. (With the read-write lock it replaces, a listing
// that began while a reload waited for a slow one waited too, in every
// session.)
func TestBarrierWaitsForOlderListingsOnly(t *testing.T) {
	var b barrier
	old := b.enter()
	waited := make(chan struct{})
	go func() {
		b.wait()
		close(waited)
	}()
	for closed := false; !closed; {
		b.mu.Lock()
		closed = b.round > old
		b.mu.Unlock()
		if !closed {
			time.Sleep(time.Millisecond)
		}
	}
	within(t, "a listing that began while a reload waits", func() {
		r := b.enter()
		if r == old {
			t.Errorf("a listing after the reload began entered the reload's round %d", r)
		}
		b.leave(r)
	})
	select {
	case <-waited:
		t.Fatal("the reload did not wait for the listing in flight before it")
	default:
	}
	b.leave(old)
	within(t, "the reload after the old listing left", func() { <-waited })
	within(t, "a reload with nothing in flight", b.wait)
}

// hangFS is a filesystem whose name "stuck" answers no LOOKUP until
// release is closed: a backing directory that hangs, as a dead NFS server's
// does.
type hangFS struct {
	fs.Inode
	release chan struct{}
}

var _ fs.NodeLookuper = (*hangFS)(nil)

func (h *hangFS) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if name != "stuck" {
		return nil, syscall.ENOENT
	}
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil, syscall.EINTR
	}
	out.Mode = syscall.S_IFDIR | 0o755
	return h.NewInode(ctx, &fs.Inode{}, fs.StableAttr{Mode: syscall.S_IFDIR}), 0
}

// mountHang mounts a hangFS (through fusermount3 when not root) and
// returns the path of its stuck name; the cleanup releases and unmounts.
func mountHang(t *testing.T) (stuck string, release func()) {
	t.Helper()
	dir := t.TempDir()
	h := &hangFS{release: make(chan struct{})}
	srv, err := fs.Mount(dir, h, &fs.Options{MountOptions: fuse.MountOptions{FsName: "hang", DisableXAttrs: true}})
	if err != nil {
		t.Skipf("no FUSE mount here (%v): the hung backing needs one", err)
	}
	var once sync.Once
	release = func() { once.Do(func() { close(h.release) }) }
	t.Cleanup(func() {
		release()
		srv.Unmount()
	})
	return filepath.Join(dir, "stuck"), release
}

// TestHungBackingBlocksOnlyItself: a backing directory whose open hangs
// holds up the view that names it, not another view's (the set's lock was
// held across the open and the stat of every backing directory).
func TestHungBackingBlocksOnlyItself(t *testing.T) {
	stuck, release := mountHang(t)
	var s backingSet
	got := make(chan error, 1)
	go func() {
		b, err := s.acquire(stuck)
		if err == nil {
			b.release()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it reach the hung open (not needed to pass)
	dir := t.TempDir()
	within(t, "acquiring another backing while one hangs", func() {
		b, err := s.acquire(dir)
		if err != nil {
			t.Error(err)
			return
		}
		b2, err := s.acquire(dir + "/.")
		if err != nil {
			t.Error(err)
			return
		}
		if b2 != b || b.refs != 2 {
			t.Errorf("the same directory, named twice, is not shared (refs %d)", b.refs)
		}
		b2.release()
		b.release()
		s.mu.Lock()
		if len(s.m) != 0 {
			t.Errorf("released backings stay in the set: %v", s.m)
		}
		s.mu.Unlock()
		var st unix.Stat_t
		if unix.Fstat(b.fd, &st) == nil {
			t.Error("the last release left the directory open")
		}
	})
	release()
	within(t, "the hung acquire after release", func() { <-got })
}

// TestHungWatchBlocksOnlyItself: a watch whose directory hangs in
// inotify_add_watch holds up that lookup alone; other lookups add their
// watches and the event reader goes on (Watcher.mu was held across it).
func TestHungWatchBlocksOnlyItself(t *testing.T) {
	stuck, release := mountHang(t)
	h, err := NewHost(HostOptions{CacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	defer release() // before Close, should the test fail while the add hangs
	f := newFixtureOn(t, h, "", dm)
	os.Mkdir(filepath.Join(f.mem, "d"), 0o755)
	w := h.watcher
	n := f.node("memories", "d") // its lookup adds watches too
	w.remove(n)
	hung := &node{view: f.v}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.add(hung, stuck)
	}()
	time.Sleep(50 * time.Millisecond) // let it reach the hung add (not needed to pass)
	dir := filepath.Join(f.mem, "d")
	within(t, "a watch while another hangs", func() { w.add(n, dir) })
	if n.wd.Load() == 0 {
		t.Fatal("no watch added")
	}
	within(t, "an event while a watch hangs", func() {
		os.WriteFile(filepath.Join(dir, "x"), nil, 0o644)
		for {
			w.mu.Lock()
			pending := len(w.next.pending) > 0 || w.next.timer != nil
			w.mu.Unlock()
			if pending {
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	w.remove(n)
	release()
	within(t, "the hung watch after release", func() { <-done })
}

// openRead opens a file of f's memories and reads it once, so that its
// handle has decided.
func (f *fixture) openRead(path ...string) *fileHandle {
	f.t.Helper()
	ctx := context.Background()
	fh, _, errno := f.node(append([]string{"memories"}, path...)...).Open(ctx, syscall.O_RDONLY)
	if errno != 0 {
		f.t.Fatalf("open %v: %v", path, errno)
	}
	h := fh.(*fileHandle)
	f.t.Cleanup(func() { h.Release(ctx) })
	if _, errno := h.Read(ctx, make([]byte, 8), 0); errno != 0 {
		f.t.Fatalf("read %v: %v", path, errno)
	}
	return h
}

// standing reports whether h's last decision still stands (no event since
// has asked it to decide again).
func standing(h *fileHandle) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cached && h.gen == h.node.view.authz.changes.Load() && h.seen == h.moves.Load()
}

// TestRenameDecidesByCurrentPaths: a rename decides again, before it
// returns, every open file on its filesystem in every view of the host,
// each by the path its descriptor has now (a last decided path can be
// stale: integration/views/rename_test.go), and what is still allowed stays open.
func TestRenameDecidesByCurrentPaths(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("a/one.md", "1")
	f.write("b/two.md", "2")
	f.write("private/three.md", "3")
	other := &fixture{t: t, mem: f.mem, work: f.work, rules: f.rules}
	v2, err := f.v.host.newView(Options{Mountpoint: "/nonexistent", Memories: f.mem, Workspace: f.work, Rules: f.rules, Context: dm, Owner: uint32(os.Getuid())})
	if err != nil {
		t.Fatal(err)
	}
	defer v2.closeBacking()
	other.attach(v2)
	one, two, three := f.openRead("a", "one.md"), f.openRead("b", "two.md"), other.openRead("private", "three.md")
	oneThere := other.openRead("a", "one.md")
	ctx := context.Background()
	a := f.node("memories", "a")
	if errno := a.Rename(ctx, "one.md", a, "uno.md", 0); errno != 0 {
		t.Fatal(errno)
	}
	for _, h := range []*fileHandle{one, oneThere, two, three} {
		if h.moves.Load() != 1 || !standing(h) {
			t.Errorf("%s: moves %d, standing %v after a rename on its filesystem", h.last, h.moves.Load(), standing(h))
		}
	}
	if one.last != "/a/uno.md" || oneThere.last != "/a/uno.md" {
		t.Errorf("the moved file's handles decided for %q and %q, not its new name", one.last, oneThere.last)
	}
	// A file moved behind the views' back is decided by where it is now
	// at the next rename, not by its last decided path.
	if err := os.Rename(filepath.Join(f.mem, "b"), filepath.Join(f.mem, "c")); err != nil {
		t.Fatal(err)
	}
	mem := f.node("memories")
	if errno := mem.Rename(ctx, "a", mem, "d", 0); errno != 0 {
		t.Fatal(errno)
	}
	if two.moves.Load() != 2 || !standing(two) || two.last != "/c/two.md" {
		t.Errorf("a file moved on the backing: moves %d, last %q", two.moves.Load(), two.last)
	}
}

// TestSwitchKeepsOtherViewsDecisions: a context switch voids the decisions
// of its own view's handles only (it voided every view's: with 10,000
// sessions, each switch made every open file decide again).
func TestSwitchKeepsOtherViewsDecisions(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("notes.md", "n")
	other := &fixture{t: t, mem: f.mem, work: f.work, rules: f.rules}
	v2, err := f.v.host.newView(Options{Mountpoint: "/nonexistent", Memories: f.mem, Workspace: f.work, Rules: f.rules, Context: dm, Owner: uint32(os.Getuid())})
	if err != nil {
		t.Fatal(err)
	}
	defer v2.closeBacking()
	other.attach(v2)
	mine, theirs := f.openRead("notes.md"), other.openRead("notes.md")
	decidedAt := func(h *fileHandle) uint64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.gen
	}
	mineAt, theirsAt := decidedAt(mine), decidedAt(theirs)
	if err := f.v.SetContext(guild); err != nil {
		t.Fatal(err)
	}
	if decidedAt(mine) == mineAt {
		t.Error("the switching view's handle kept its decision")
	}
	if !standing(theirs) || decidedAt(theirs) != theirsAt {
		t.Error("another view's switch voided this view's decision")
	}
	if err := v2.SetContext(guild); err != nil {
		t.Fatal(err)
	}
	if decidedAt(theirs) == theirsAt {
		t.Error("the view's own switch left its decision standing")
	}
}
