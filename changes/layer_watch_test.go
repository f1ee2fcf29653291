package changes

import (
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLayerWatchRemountsWhenBackingNamesChange: a layer told of its
// backing tree's changes by a BackingWatch shows a file replaced by rename
// and a directory removed and made again, within the watch's delay and a
// remount.
func TestLayerWatchRemountsWhenBackingNamesChange(t *testing.T) {
	backing, state := layerFixture(t)
	w, err := NewBackingWatch(50 * time.Millisecond)
	must(t, err)
	defer w.Close()
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true, Watch: w})
	must(t, err)
	defer l.Remove()
	merged := l.Merged("workspace")
	read := func(p string) string { b, _ := os.ReadFile(merged + p); return string(b) }
	if got := read("/src/a.txt") + read("/gone/sub/x"); got != "one\nx" {
		t.Fatalf("before: %q", got)
	}
	must(t, os.WriteFile(backing+"/src/a.tmp", []byte("new\n"), 0o644))
	must(t, os.Rename(backing+"/src/a.tmp", backing+"/src/a.txt"))
	must(t, os.RemoveAll(backing+"/gone"))
	must(t, os.MkdirAll(backing+"/gone/sub", 0o755))
	must(t, os.WriteFile(backing+"/gone/sub/y", []byte("y"), 0o644))
	start := time.Now()
	for read("/src/a.txt")+read("/gone/sub/y") != "new\ny" {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the layer still shows %q %q", read("/src/a.txt"), read("/gone/sub/y"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("shown after %v", time.Since(start))
	info, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	if n := strings.Count(string(info), " "+merged+" "); n != 1 {
		t.Fatalf("%d mounts on the merged directory after remounts, want 1", n)
	}
}

// BenchmarkLayerRemount: what mounting a layer afresh costs (each commit,
// discard and batch of backing changes pays it once per space).
func BenchmarkLayerRemount(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("the layer is mounted by overlayfs: needs root")
	}
	dir := b.TempDir()
	backing, state := dir+"/backing", dir+"/state"
	if err := os.MkdirAll(backing+"/src", 0o755); err != nil {
		b.Fatal(err)
	}
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Remove()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := l.Remount("workspace"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLayerRemountNeverShowsAnEmptyMergedDirectory: a remount mounts the
// new layer beneath the old one before the old one goes, so a path
// resolved in the merged directory meanwhile reaches one or the other,
// never the empty directory under both.
func TestLayerRemountNeverShowsAnEmptyMergedDirectory(t *testing.T) {
	backing, state := layerFixture(t)
	l := openTestLayer(t, state, backing, true)
	defer l.Remove()
	merged := l.Merged("workspace")
	stop := make(chan struct{})
	missed := make(chan string, 1)
	go func() {
		defer close(missed)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := os.Lstat(merged + "/keep.txt"); err != nil {
				missed <- err.Error()
				return
			}
		}
	}()
	for i := 0; i < 20; i++ {
		must(t, l.Remount("workspace"))
	}
	close(stop)
	if err, ok := <-missed; ok {
		t.Fatalf("the merged directory lost keep.txt during a remount: %s", err)
	}
}

// TestLayerWatchIgnoresTheLayersOwnWrites: a state directory inside the
// backing tree does not remount its layer at each write of the session
// (nor each remount its next one, without end).
func TestLayerWatchIgnoresTheLayersOwnWrites(t *testing.T) {
	backing, _ := layerFixture(t)
	state := backing + "/.state"
	w, err := NewBackingWatch(20 * time.Millisecond)
	must(t, err)
	defer w.Close()
	l, err := OpenLayer(LayerOptions{Dir: state, Roots: map[string]string{"workspace": backing}, Fresh: true, Watch: w})
	must(t, err)
	defer l.Remove()
	merged := l.Merged("workspace")
	mnt := func() uint64 {
		var stx unix.Statx_t
		must(t, unix.Statx(unix.AT_FDCWD, merged, 0, unix.STATX_MNT_ID, &stx))
		return stx.Mnt_id
	}
	time.Sleep(100 * time.Millisecond) // the layer's own setup
	before := mnt()
	change(t, l, "/src/new.txt", func(p string) error { return os.WriteFile(p, []byte("n"), 0o644) })
	time.Sleep(200 * time.Millisecond)
	if mnt() != before {
		t.Fatal("a write of the session into its layer remounted it")
	}
}
