package fsys

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeDir is a watched directory that records what it is told.
type fakeDir struct {
	wd    atomic.Int32
	o     *fakeOwner
	mu    sync.Mutex
	names map[string]uint32
}

func (d *fakeDir) wdSlot() *atomic.Int32 { return &d.wd }
func (d *fakeDir) owner() changeSink     { return d.o }
func (d *fakeDir) changed(name string, mask uint32, dir string, multiNamedAt func(string) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.names == nil {
		d.names = map[string]uint32{}
	}
	d.names[name] |= mask
}

func (d *fakeDir) told(name string, mask uint32) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.names[name]&mask != 0
}

type fakeOwner struct{ drops, linked atomic.Int32 }

func (o *fakeOwner) dropCaches()                   { o.drops.Add(1) }
func (o *fakeOwner) linkedOn(devs map[uint64]bool) { o.linked.Add(int32(len(devs))) }

// eventually waits for cond, failing the test if it never holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(liveness)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, liveness)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWatcherReports: the watcher tells each watched directory of every
// change below it (coalesced), its owner of lost events and of new links,
// and forgets a directory that goes; it never decides anything itself.
// Runs as any user (inotify needs no privilege).
func TestWatcherReports(t *testing.T) {
	h, err := NewHost(HostOptions{CacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	w := h.watcher
	dir := filepath.Join(t.TempDir(), "d")
	os.Mkdir(dir, 0o755)
	o := &fakeOwner{}
	d, twin := &fakeDir{o: o}, &fakeDir{o: o}
	w.add(d, dir)
	w.add(twin, dir) // a second view's node of the same directory
	if d.wd.Load() == 0 || d.wd.Load() != twin.wd.Load() {
		t.Fatalf("watches %d and %d: want one, shared", d.wd.Load(), twin.wd.Load())
	}
	if got := w.ttlFor(&node{}); got != 0 {
		t.Errorf("an unwatched directory gets TTL %v", got)
	}
	os.WriteFile(filepath.Join(dir, "x"), []byte("1"), 0o644)
	os.Rename(filepath.Join(dir, "x"), filepath.Join(dir, "y"))
	eventually(t, "create and rename reported to both", func() bool {
		return d.told("x", unix.IN_CREATE) && d.told("x", unix.IN_MOVED_FROM) && d.told("y", unix.IN_MOVED_TO) && twin.told("y", unix.IN_MOVED_TO)
	})
	w.overflow()
	if o.drops.Load() != 1 {
		t.Errorf("an overflow dropped %d owners' caches, want the one owner once", o.drops.Load())
	}
	w.linkedOn(map[uint64]bool{7: true})
	eventually(t, "a link reported to the owner", func() bool { return o.linked.Load() == 1 })
	w.remove(twin)
	if twin.wd.Load() != 0 || d.wd.Load() == 0 {
		t.Error("removing one directory's node ended the other's watch")
	}
	os.Remove(filepath.Join(dir, "y"))
	os.Remove(dir)
	eventually(t, "a removed directory unwatched", func() bool { return d.wd.Load() == 0 })
	w.mu.Lock()
	left := len(w.byWD)
	w.mu.Unlock()
	if left != 0 {
		t.Errorf("%d watches left after their directory went", left)
	}
	w.removeOwner(o)
}

// TestWatcherShare: beyond its share of the uid's inotify watches, a
// directory is not watched (its entries keep the short TTL).
func TestWatcherShare(t *testing.T) {
	h, err := NewHost(HostOptions{CacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	w := h.watcher
	w.max = 1
	o := &fakeOwner{}
	a, b := &fakeDir{o: o}, &fakeDir{o: o}
	w.add(a, t.TempDir())
	w.add(b, t.TempDir())
	if a.wd.Load() == 0 || b.wd.Load() != 0 {
		t.Errorf("watches %d, %d with a share of one", a.wd.Load(), b.wd.Load())
	}
	w.removeOwner(o)
	if a.wd.Load() != 0 {
		t.Error("removeOwner left a watch")
	}
}

// TestSyncReturnsAfterQueuedEventsAreTold: sync returns only once every
// change made before it was called has been told to the watched
// directories (a rollback's own changes are then reported by no later
// flush); with nothing queued it returns at once, and on a closed watcher
// it does not wait.
func TestSyncReturnsAfterQueuedEventsAreTold(t *testing.T) {
	h, err := NewHost(HostOptions{CacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	w := h.watcher
	dir := t.TempDir()
	o := &fakeOwner{}
	d := &fakeDir{o: o}
	w.add(d, dir)
	if !w.sync(liveness) {
		t.Fatal("sync with nothing queued timed out")
	}
	for i, name := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
		if !w.sync(liveness) {
			t.Fatalf("sync after %s timed out", name)
		}
		if !d.told(name, unix.IN_CREATE) {
			t.Fatalf("sync returned before %s's creation was told", name)
		}
	}
	w.removeOwner(o)
	h.Close()
	if !w.sync(time.Nanosecond) {
		t.Error("sync on a closed watcher waited")
	}
}
