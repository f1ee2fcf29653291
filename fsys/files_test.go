package fsys

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestOpenFilesBounded: one view opening files until it could not took all
// of the daemon's descriptors, and every other view's opens failed with it
// (TestAtk6OpenFilesExhaustDaemon). A view now holds at most its share
// (EMFILE beyond), all views together leave the daemon a reserve (ENFILE
// beyond), and a refused create makes nothing.
func TestOpenFilesBounded(t *testing.T) {
	host, err := NewHost(HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	a := newFixtureOn(t, host, testRules, dm)
	b := newFixtureOn(t, host, testRules, dm)
	// Two views of their own connections: room is limit - 512 - 2*2.
	host.files.limit, host.files.perView = 512+4+6, 4
	if got := host.files.room(); got != 6 {
		t.Fatalf("room %d, want 6", got)
	}
	ctx := context.Background()
	for i := range 6 {
		a.write(fmt.Sprintf("f%d", i), "x")
		os.WriteFile(filepath.Join(b.mem, fmt.Sprintf("f%d", i)), []byte("x"), 0o644)
	}
	open := func(f *fixture, i int) (*fileHandle, syscall.Errno) {
		fh, _, errno := f.node("memories", fmt.Sprintf("f%d", i)).Open(ctx, syscall.O_RDONLY)
		if errno != 0 {
			return nil, errno
		}
		return fh.(*fileHandle), 0
	}
	var held []*fileHandle
	for i := range 4 {
		h, errno := open(a, i)
		if errno != 0 {
			t.Fatalf("view a, open %d of its 4: %v", i, errno)
		}
		held = append(held, h)
	}
	if _, errno := open(a, 4); errno != syscall.EMFILE {
		t.Errorf("view a's fifth open: %v, want EMFILE", errno)
	}
	mem := a.node("memories")
	var out fuse.EntryOut
	if _, _, _, errno := mem.Create(ctx, "new", syscall.O_WRONLY, 0o644, &out); errno != syscall.EMFILE {
		t.Errorf("view a's create at its bound: %v, want EMFILE", errno)
	}
	if _, err := os.Lstat(filepath.Join(a.mem, "new")); !os.IsNotExist(err) {
		t.Errorf("a refused create left a file: %v", err)
	}
	// The other view still opens, up to what the daemon keeps for files.
	var bHeld []*fileHandle
	for i := range 2 {
		h, errno := open(b, i)
		if errno != 0 {
			t.Fatalf("view b, open %d while view a holds its share: %v", i, errno)
		}
		bHeld = append(bHeld, h)
	}
	if _, errno := open(b, 2); errno != syscall.ENFILE {
		t.Errorf("an open past the daemon's room: %v, want ENFILE", errno)
	}
	// A release gives its descriptor back.
	held[0].Release(ctx)
	h, errno := open(b, 2)
	if errno != 0 {
		t.Fatalf("view b after view a released one: %v", errno)
	}
	for _, h := range append(append(held[1:], bHeld...), h) {
		h.Release(ctx)
	}
	if host.files.open.Load() != 0 || a.v.handles.open.Load() != 0 || b.v.handles.open.Load() != 0 {
		t.Errorf("after every release: host %d, a %d, b %d descriptors counted", host.files.open.Load(), a.v.handles.open.Load(), b.v.handles.open.Load())
	}
}
