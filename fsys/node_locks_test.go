package fsys

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestLockWaiterBounds: a view holds at most MaxLockWaitersPerView waiters
// and all views MaxLockWaiters; leaving gives the places back.
func TestLockWaiterBounds(t *testing.T) {
	h := &Host{}
	var views []*View
	for h.lockWaiters.Load() < MaxLockWaiters {
		v := &View{host: h}
		views = append(views, v)
		for v.enterWait() {
		}
		if got := v.stats.lockWaiters.Load(); got > MaxLockWaitersPerView {
			t.Fatalf("a view holds %d waiters", got)
		}
	}
	if got := h.lockWaiters.Load(); got != MaxLockWaiters {
		t.Fatalf("%d waiters in all, want %d", got, MaxLockWaiters)
	}
	fresh := &View{host: h}
	if fresh.enterWait() {
		t.Fatal("a waiter beyond the bound of all views got a place")
	}
	views[0].leaveWait()
	if !fresh.enterWait() {
		t.Fatal("a place given back was not free")
	}
	fresh.leaveWait()
	for _, v := range views[1:] {
		for v.stats.lockWaiters.Load() > 0 {
			v.leaveWait()
		}
	}
	for views[0].stats.lockWaiters.Load() > 0 {
		views[0].leaveWait()
	}
	if got := h.lockWaiters.Load(); got != 0 {
		t.Fatalf("%d waiters left", got)
	}
}

// TestLockWaitEndsWhenTheHolderReleases: a blocking lock request on a
// lock another holds waits (polling, without a thread) until the holder
// lets go, then has it; a waiter whose caller gives up answers EINTR.
func TestLockWaitEndsWhenTheHolderReleases(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("private/l.md", "x")
	ctx := context.Background()
	open := func() *fileHandle {
		fh, _, errno := f.node("memories", "private", "l.md").Open(ctx, syscall.O_RDWR)
		if errno != 0 {
			t.Fatalf("open: %v", errno)
		}
		h := fh.(*fileHandle)
		t.Cleanup(func() { h.Release(ctx) })
		return h
	}
	holder, waiter := open(), open()
	lk := fuse.FileLock{Start: 0, End: 10, Typ: syscall.F_WRLCK}
	if errno := holder.Setlk(ctx, 1, &lk, 0); errno != 0 {
		t.Fatalf("the holder's lock: %v", errno)
	}
	if errno := waiter.Setlk(ctx, 2, &lk, 0); errno != syscall.EAGAIN {
		t.Fatalf("a second lock on a held range: %v, want EAGAIN", errno)
	}
	gaveUp, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if errno := waiter.Setlkw(gaveUp, 2, &lk, 0); errno != syscall.EINTR {
		t.Errorf("a wait its caller gave up: %v, want EINTR", errno)
	}
	got := make(chan syscall.Errno, 1)
	go func() { got <- waiter.Setlkw(ctx, 2, &lk, 0) }()
	select {
	case errno := <-got:
		t.Fatalf("the wait ended while the lock was held: %v", errno)
	case <-time.After(50 * time.Millisecond):
	}
	unlock := fuse.FileLock{Start: 0, End: 10, Typ: syscall.F_UNLCK}
	if errno := holder.Setlk(ctx, 1, &unlock, 0); errno != 0 {
		t.Fatalf("the holder's release: %v", errno)
	}
	select {
	case errno := <-got:
		if errno != 0 {
			t.Errorf("the wait after the release: %v", errno)
		}
	case <-time.After(liveness):
		t.Fatal("the wait did not end after the holder let go")
	}
	if n := f.v.stats.lockWaiters.Load(); n != 0 {
		t.Errorf("%d lock waiters left", n)
	}
}
