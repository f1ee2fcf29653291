package fsys

import (
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// sync returns once every event queued for the watcher before it was
// called has been told to the views (every flush that carries one has
// ended), or after timeout, reporting which. A change the daemon made in a
// backing tree itself (a rollback) is then reported by no later flush: the
// view's own invalidation after sync is the last, and no notification
// sent after the change was answered races with a caller's request (a
// FUSE_NOTIFY_INVAL_INODE that lands while a read's GETATTR is in flight
// makes the kernel drop the fresh attributes and read with the old size).
//
// The marker: a watch of an inode nothing else watches (a memfd's), added
// and removed at once. Its IN_IGNORED is queued behind every event before
// it, so the reader passes it once it has gathered them.
func (w *Watcher) sync(timeout time.Duration) bool {
	if !w.live() {
		return true
	}
	mfd, err := unix.MemfdCreate("condfs-watch-marker", unix.MFD_CLOEXEC)
	if err != nil {
		return false
	}
	defer unix.Close(mfd)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return true
	}
	// Added under w.mu, so that the reader cannot see its IN_IGNORED
	// before it is known (it is queued only at the removal below).
	wd, err := unix.InotifyAddWatch(int(w.f.Fd()), "/proc/self/fd/"+strconv.Itoa(mfd), unix.IN_ATTRIB)
	if err != nil {
		w.mu.Unlock()
		return false
	}
	done := make(chan struct{})
	if w.next.markers == nil {
		w.next.markers = map[int32]chan struct{}{}
	}
	w.next.markers[int32(wd)] = done
	w.mu.Unlock()
	if _, err := unix.InotifyRmWatch(int(w.f.Fd()), uint32(wd)); err != nil {
		w.mu.Lock()
		if w.next.markers[int32(wd)] == done {
			delete(w.next.markers, int32(wd))
		}
		w.mu.Unlock()
		return false
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		w.mu.Lock()
		delete(w.next.markers, int32(wd))
		w.mu.Unlock()
		return false
	}
}

// passed: the reader passed the marker wd (w.mu held). The events before
// it are gathered: its sync waits for the flush that tells them, or for
// the one running, or for none.
func (w *Watcher) passed(wd int32) {
	c := w.next.markers[wd]
	delete(w.next.markers, wd)
	if w.next.timer == nil && len(w.next.pending) == 0 && !w.next.aboveChanged && len(w.next.linked) == 0 {
		close(c)
		return
	}
	w.next.told = append(w.next.told, c)
}
