package fsys

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
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
