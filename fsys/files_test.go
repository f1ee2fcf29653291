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
// (TestRunOpenFilesCannotExhaustDaemon); one owner opening views of its own
// did the same (TestOneUidCannotTakeEveryViewsRoom). A view now holds at most its share
// and an owner's views half the room (EMFILE beyond), all views together
// leave the daemon a reserve (ENFILE beyond), and a refused create makes
// nothing.
func TestOpenFilesBounded(t *testing.T) {
	host, err := NewHost(HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	var fx []*fixture
	for _, owner := range []uint32{1001, 1001, 1002, 1002, 1003} {
		f := newFixtureOn(t, host, testRules, dm)
		f.v.handles.owner = host.files.owner(owner) // as if owner had opened it
		for j := range 6 {
			os.WriteFile(filepath.Join(f.mem, fmt.Sprintf("f%d", j)), []byte("x"), 0o644)
		}
		fx = append(fx, f)
	}
	a, a2, b, b2, c := fx[0], fx[1], fx[2], fx[3], fx[4]
	// Five views of their own connections: room is limit - 512 - 5*2.
	host.files.limit, host.files.perView = 512+10+12, 4
	if got := host.files.room(); got != 12 {
		t.Fatalf("room %d, want 12", got)
	}
	ctx := context.Background()
	var held []*fileHandle
	open := func(f *fixture, i int) syscall.Errno {
		fh, _, errno := f.node("memories", fmt.Sprintf("f%d", i)).Open(ctx, syscall.O_RDONLY)
		if errno == 0 {
			held = append(held, fh.(*fileHandle))
		}
		return errno
	}
	want := func(what string, got, want syscall.Errno) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
	for i := range 4 {
		want(fmt.Sprintf("a's open %d of its 4", i), open(a, i), 0)
	}
	want("a's fifth open (its view's share)", open(a, 4), syscall.EMFILE)
	var out fuse.EntryOut
	_, _, _, errno := a.node("memories").Create(ctx, "new", syscall.O_WRONLY, 0o644, &out)
	want("a's create at its bound", errno, syscall.EMFILE)
	if _, err := os.Lstat(filepath.Join(a.mem, "new")); !os.IsNotExist(err) {
		t.Errorf("a refused create left a file: %v", err)
	}
	for i := range 2 {
		want(fmt.Sprintf("a2's open %d (same owner)", i), open(a2, i), 0)
	}
	want("a2's third open (its owner's half of the room)", open(a2, 2), syscall.EMFILE)
	for i := range 4 {
		want(fmt.Sprintf("b's open %d", i), open(b, i), 0)
	}
	for i := range 2 {
		want(fmt.Sprintf("b2's open %d", i), open(b2, i), 0)
	}
	want("c's open with the room full", open(c, 0), syscall.ENFILE)
	// A release gives its descriptor back.
	held[0].Release(ctx)
	want("c's open after a released one", open(c, 0), 0)
	for _, h := range held[1:] {
		h.Release(ctx)
	}
	if n := host.files.open.Load(); n != 0 {
		t.Errorf("after every release the host counts %d descriptors", n)
	}
	for i, f := range fx {
		if f.v.handles.open.Load() != 0 || f.v.handles.owner.Load() != 0 {
			t.Errorf("after every release view %d counts %d, its owner %d", i, f.v.handles.open.Load(), f.v.handles.owner.Load())
		}
	}
}
