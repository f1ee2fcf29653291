package fsys

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	cctx "github.com/condfs/condfs/context"
)

// listDir opens n as a READDIRPLUS would and reads entries until name,
// returning the handle (the caller releases it).
func listDir(t *testing.T, n *node, name string) *dirHandle {
	t.Helper()
	ctx := context.Background()
	fh, _, errno := n.OpendirHandle(ctx, 0)
	if errno != 0 {
		t.Fatalf("opendir: %v", errno)
	}
	d := fh.(*dirHandle)
	for {
		e, errno := d.Readdirent(ctx)
		if errno != 0 || e == nil {
			t.Fatalf("%q not listed (%v)", name, errno)
		}
		if e.Name == name {
			return d
		}
	}
}

// TestListedEntries: a listing hands out a full entry for a name it just
// read, resolved beneath the listing's own directory (listedAt); a name
// the tree knows already is left to the kernel; a ruled name handed out is
// recorded, and a switch forgets it; a switch that began after the
// decision leaves the name unrecorded and without an entry.
func TestListedEntries(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("notes/plain.md", "p")
	f.write("notes/secret.md", "s")
	ctx := context.Background()
	notes := f.node("memories", "notes")
	var out fuse.EntryOut

	d := listDir(t, notes, "plain.md")
	in, errno := d.Lookup(ctx, "plain.md", &out)
	if errno != 0 || in == nil || out.Attr.Size != 1 {
		t.Fatalf("a listed name got no full entry: %v", errno)
	}
	if !f.v.cache.plusHanded.Load() {
		t.Error("a listing that handed out an entry is not marked")
	}
	notes.AddChild("plain.md", in, true)
	if _, errno := d.Lookup(ctx, "plain.md", &out); errno != syscall.ENOENT {
		t.Errorf("a name the tree knows got a second entry: %v", errno)
	}
	d.Releasedir(ctx, 0)

	d = listDir(t, notes, "secret.md")
	if _, errno := d.Lookup(ctx, "secret.md", &out); errno != 0 {
		t.Fatalf("a ruled listed name visible in a DM: %v", errno)
	}
	d.Releasedir(ctx, 0)
	f.v.cache.plusRuled.mu.Lock()
	recorded := len(f.v.cache.plusRuled.names)
	f.v.cache.plusRuled.mu.Unlock()
	if recorded != 1 {
		t.Fatalf("%d ruled names recorded, want 1", recorded)
	}
	f.v.SetContext(guild)
	f.v.cache.plusRuled.mu.Lock()
	recorded = len(f.v.cache.plusRuled.names)
	f.v.cache.plusRuled.mu.Unlock()
	if recorded != 0 {
		t.Errorf("the switch left %d ruled names recorded", recorded)
	}
	if !f.v.hiddenNow(notes, "secret.md") || f.v.hiddenNow(notes, "plain.md") {
		t.Error("hiddenNow disagrees with the guild's rules")
	}

	g := f.v.generation()
	f.v.SetContext(dm)
	if f.v.cache.plusRuled.add(notes, "secret.md", g) {
		t.Error("a name decided before a switch was let into the kernel's cache")
	}
	full := nameSet{max: 1}
	g = f.v.generation()
	if !full.add(notes, "a", g) || full.add(notes, "b", g) {
		t.Error("a name set past its limit recorded a name")
	}
	// Released, a listing is no longer in flight: a reload does not wait.
	within(t, "a reload after the listings ended", f.v.cache.listingsIn.wait)
}

// TestHiddenAbsencesRemembered: with a watcher, a hidden name's absence is
// remembered (a negative entry for the TTL) and recorded, and a switch
// forgets it; a name that is merely missing and unruled is remembered
// without a record (only something that makes it ends it, which the
// watcher reports).
func TestHiddenAbsencesRemembered(t *testing.T) {
	h, err := NewHost(HostOptions{CacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	f := newFixtureOn(t, h, testRules, guild)
	f.write("notes/secret.md", "s")
	f.write("notes/plain.md", "p")
	ctx := context.Background()
	notes := f.node("memories", "notes")
	var out fuse.EntryOut
	if _, errno := notes.Lookup(ctx, "secret.md", &out); errno != syscall.ENOENT || out.EntryTimeout() == 0 {
		t.Fatalf("a hidden name: %v, timeout %v; want a remembered absence", errno, out.EntryTimeout())
	}
	f.v.cache.absences.mu.Lock()
	n := len(f.v.cache.absences.names)
	f.v.cache.absences.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d absences recorded, want 1", n)
	}
	out = fuse.EntryOut{}
	if _, errno := notes.Lookup(ctx, "missing.md", &out); errno != syscall.ENOENT || out.EntryTimeout() == 0 {
		t.Errorf("a missing unruled name: %v, timeout %v", errno, out.EntryTimeout())
	}
	f.v.SetContext(dm)
	f.v.cache.absences.mu.Lock()
	n = len(f.v.cache.absences.names)
	f.v.cache.absences.mu.Unlock()
	if n != 0 {
		t.Errorf("the switch left %d absences", n)
	}
	if in, errno := notes.Lookup(ctx, "secret.md", &out); errno != 0 || in == nil {
		t.Errorf("the name shown by the switch: %v", errno)
	}
	var attr fuse.AttrOut
	if errno := notes.Getattr(ctx, nil, &attr); errno != 0 || attr.Timeout() == 0 {
		t.Errorf("a watched unruled directory's attributes: %v, timeout %v", errno, attr.Timeout())
	}
}

// held walks path as the kernel does when it holds the entries already:
// each name's node in the tree is used, and only a missing one looked up
// (fixture.walk looks every name up again).
func (f *fixture) held(path ...string) *node {
	f.t.Helper()
	in := f.v.root.EmbeddedInode()
	var out fuse.EntryOut
	for _, name := range path {
		if ch := in.GetChild(name); ch != nil {
			in = ch
			continue
		}
		ch, errno := in.Operations().(fs.NodeLookuper).Lookup(context.Background(), name, &out)
		if errno != 0 {
			f.t.Fatalf("lookup %s of %v: %v", name, path, errno)
		}
		in.AddChild(name, ch, true)
		in = ch
	}
	return in.Operations().(*node)
}

// writeWork writes a file of the workspace backing tree, whose space has
// no rules: the kernel may keep its listings wherever the watcher watches
// (a space with rules needs the link watch too, which needs root).
func (f *fixture) writeWork(rel, text string) {
	f.t.Helper()
	p := filepath.Join(f.work, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// listedDirty reports whether the view's record of in says the kernel may
// hold a listing of it read since its last drop; false with no record.
func listedDirty(v *View, in *fs.Inode) bool {
	v.cache.lists.mu.Lock()
	rec := v.cache.lists.listed[in]
	v.cache.lists.mu.Unlock()
	return rec != nil && rec.dirty.Load()
}

// watchedFixture is a fixture on a host with a watcher, which lets the
// kernel keep listings.
func watchedFixture(t *testing.T, atoms cctx.Set) (*fixture, *Host) {
	t.Helper()
	h, err := NewHost(HostOptions{CacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return newFixtureOn(t, h, testRules, atoms), h
}

// listed lists n (a READDIRPLUS up to name) and checks the listing is
// recorded as one the kernel holds.
func (f *fixture) listed(n *node, name string) {
	f.t.Helper()
	listDir(f.t, n, name).Releasedir(context.Background(), 0)
	if !listedDirty(f.v, n.EmbeddedInode()) {
		f.t.Fatalf("a listing up to %s is not recorded as held by the kernel", name)
	}
}

// TestBackingChangeDropsTheListing: a name made in a listed directory
// behind the view's back (another process, reported by the watcher) drops
// the listing the kernel holds of it; a change of a file's content alone
// does not (the listing names the same files).
func TestBackingChangeDropsTheListing(t *testing.T) {
	f, h := watchedFixture(t, guild)
	f.writeWork("src/main.go", "p")
	src := f.held("workspace", "src")
	f.listed(src, "main.go")
	if src.wd.Load() == 0 {
		t.Fatal("a listed directory is not watched")
	}
	f.writeWork("src/main.go", "changed")
	if !h.watcher.sync(liveness) {
		t.Fatal("the watcher did not report in time")
	}
	if !listedDirty(f.v, src.EmbeddedInode()) {
		t.Error("a change of a file's content dropped its directory's listing")
	}
	f.writeWork("src/new.go", "n")
	if !h.watcher.sync(liveness) {
		t.Fatal("the watcher did not report in time")
	}
	if listedDirty(f.v, src.EmbeddedInode()) {
		t.Error("a name made behind the view left the directory's listing in the kernel")
	}
}

// TestRollbackDropsRestoredListings: Restored (a rollback changed the
// backing tree) drops the listing of the directory of every restored path,
// and of every directory below one moved back that holds entries, before
// it returns; a listing elsewhere stays.
func TestRollbackDropsRestoredListings(t *testing.T) {
	f, _ := watchedFixture(t, guild)
	f.writeWork("src/main.go", "p")
	f.writeWork("lib/old/deep/x.go", "x")
	f.writeWork("lib/other.go", "o")
	src := f.held("workspace", "src")
	deep := f.held("workspace", "lib", "old", "deep")
	f.held("workspace", "lib", "old", "deep", "x.go") // an entry the kernel holds below it
	lib := f.held("workspace", "lib")
	f.listed(src, "main.go")
	f.listed(deep, "x.go")
	f.listed(lib, "other.go")
	f.v.Restored("workspace", []string{"/src/main.go"}, []string{"/lib/old"})
	if listedDirty(f.v, src.EmbeddedInode()) {
		t.Error("the restored file's directory kept its listing")
	}
	if listedDirty(f.v, deep.EmbeddedInode()) {
		t.Error("a directory below one moved back kept its listing")
	}
	if listedDirty(f.v, lib.EmbeddedInode()) {
		t.Error("the moved directory's parent kept its listing")
	}
	f.listed(src, "main.go")
	f.v.Restored("memories", []string{"/src/main.go"}, nil)
	f.v.Restored("nospace", []string{"/src/main.go"}, nil)
	if !listedDirty(f.v, src.EmbeddedInode()) {
		t.Error("a rollback in another space dropped a listing of the workspace")
	}
}

// TestLostEventsDropEveryListing: when the watcher lost events (its queue
// overflowed), every listing the kernel holds of every view goes.
func TestLostEventsDropEveryListing(t *testing.T) {
	f, h := watchedFixture(t, guild)
	f.writeWork("src/main.go", "p")
	src := f.held("workspace", "src")
	f.listed(src, "main.go")
	h.watcher.overflow()
	if listedDirty(f.v, src.EmbeddedInode()) {
		t.Error("lost events left a listing in the kernel")
	}
}

// TestNewLinkDropsListingsOfRuledSpaces: when a file of a filesystem got
// another name (the link watch reports it), the listings of a view's
// spaces with rules on that filesystem go, since such a file is hidden
// now; a new name on another filesystem drops nothing. The kernel keeps a
// listing of a space with rules only where the link watch runs (root).
func TestNewLinkDropsListingsOfRuledSpaces(t *testing.T) {
	f, h := watchedFixture(t, guild)
	f.write("notes/plain.md", "p")
	b := f.v.spaces.dirs[0]
	if !h.watcher.watchesLinks(b) {
		t.Skip("no link watch here (fanotify needs root): the kernel keeps no listing of a space with rules")
	}
	notes := f.held("memories", "notes")
	f.listed(notes, "plain.md")
	f.v.linkedOn(map[uint64]bool{b.dev + 1: true})
	if !listedDirty(f.v, notes.EmbeddedInode()) {
		t.Error("a new name on another filesystem dropped a listing")
	}
	f.v.linkedOn(map[uint64]bool{b.dev: true})
	if listedDirty(f.v, notes.EmbeddedInode()) {
		t.Error("a new name on the filesystem of a space with rules left its listing")
	}
}

// TestChangedFateFollowsTheInode: what the watcher's report of a change
// does to the kernel's entry of a name: dropped when the name no longer
// stands for the node's inode (replaced) or the tree has no entry; kept
// when the name was made for that very inode; when only the inode's
// attributes changed, kept for a directory (what decides it does not
// follow them) and dropped for a file, where entries cannot be expired (no
// mounted connection offers it).
func TestChangedFateFollowsTheInode(t *testing.T) {
	f := newFixture(t, testRules, guild)
	f.write("notes/a.md", "a")
	f.write("notes/sub/b.md", "b")
	notes := f.held("memories", "notes")
	f.held("memories", "notes", "a.md")
	f.held("memories", "notes", "sub")
	dir := filepath.Join(f.mem, "notes")
	cases := []struct {
		name string
		mask uint32
		want entryFate
	}{
		{"a.md", unix.IN_CREATE, entryKept},
		{"a.md", unix.IN_ATTRIB, entryDropped},
		{"sub", unix.IN_ATTRIB, entryKept},
		{"missing.md", unix.IN_CREATE, entryDropped},
	}
	for _, c := range cases {
		if got := notes.changedFate(c.name, c.mask, dir); got != c.want {
			t.Errorf("%s %#x: fate %d, want %d", c.name, c.mask, got, c.want)
		}
	}
	// Another file renamed over a.md: the entry names another inode now.
	f.write("notes/c.md", "c")
	if err := os.Rename(filepath.Join(dir, "c.md"), filepath.Join(dir, "a.md")); err != nil {
		t.Fatal(err)
	}
	if got := notes.changedFate("a.md", unix.IN_MOVED_TO, dir); got != entryDropped {
		t.Errorf("a name replaced by another inode: fate %d, want dropped", got)
	}
	if got := f.v.restoredFate(notes.EmbeddedInode(), "/notes/a.md", "a.md"); got != entryDropped {
		t.Errorf("a rollback that put another inode at a name: fate %d, want dropped", got)
	}
	if got := f.v.restoredFate(notes.EmbeddedInode(), "/notes/sub", "sub"); got != entryKept {
		t.Errorf("a rollback that left a directory's inode in place: fate %d, want kept", got)
	}
}

// TestOpenFileNamedWherever: an open file is named by where it is now,
// beneath the backing root; a file really named "x (deleted)" is that
// name, while a file whose name was removed is unlinked when no name is
// left, and not named at all when another name remains (which one is not
// known); a file outside the space has no name in it.
func TestOpenFileNamedWherever(t *testing.T) {
	f := newFixture(t, testRules, guild)
	b := f.v.spaces.dirs[0]
	open := func(rel string) int {
		t.Helper()
		fd, err := unix.Open(filepath.Join(f.mem, rel), unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	f.write("d/x (deleted)", "x")
	if p, n, unlinked, ok := b.spacePath(open("d/x (deleted)")); p != "/d/x (deleted)" || n != 1 || unlinked || !ok {
		t.Errorf("a file named x (deleted): %q %d %v %v", p, n, unlinked, ok)
	}
	f.write("d/moved", "m")
	fd := open("d/moved")
	if err := os.Rename(filepath.Join(f.mem, "d/moved"), filepath.Join(f.mem, "e")); err != nil {
		t.Fatal(err)
	}
	if p, _, _, ok := b.spacePath(fd); p != "/e" || !ok {
		t.Errorf("a file moved in the backing tree: %q %v, want /e", p, ok)
	}
	f.write("d/two", "2")
	if err := os.Link(filepath.Join(f.mem, "d/two"), filepath.Join(f.mem, "d/other")); err != nil {
		t.Fatal(err)
	}
	fd = open("d/two")
	os.Remove(filepath.Join(f.mem, "d/two"))
	if p, _, unlinked, ok := b.spacePath(fd); ok || unlinked || p != "" {
		t.Errorf("a file whose name went while another remains: %q %v %v, want no name", p, unlinked, ok)
	}
	os.Remove(filepath.Join(f.mem, "d/other"))
	if _, _, unlinked, ok := b.spacePath(fd); !unlinked || !ok {
		t.Errorf("a file with no name left: unlinked %v ok %v", unlinked, ok)
	}
	outside, err := unix.Open(f.work, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(outside)
	if _, _, _, ok := b.spacePath(outside); ok {
		t.Error("a directory outside the space was named in it")
	}
}
