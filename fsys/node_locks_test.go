package fsys

import "testing"

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
