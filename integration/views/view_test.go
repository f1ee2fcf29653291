package views

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"github.com/hanwen/go-fuse/v2/posixtest"
	"golang.org/x/sys/unix"
)

// TestContextFlips switches a session 1,000 times between a context that
// allows /private and one that denies it, while readers hammer stat, open
// and readdir. Every answer given entirely between two switches must match
// the context in force: zero stale answers, in either direction.
func TestContextFlips(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/diary.md", "secret")
	h.Write("memories/notes.md", "public")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.Guild)
	diary := mnt + "/memories/private/diary.md"
	dir := mnt + "/memories/private"

	var started, completed atomic.Int64                 // switches begun and returned
	allowedAt := func(n int64) bool { return n%2 == 1 } // odd: dm
	var checked, stale atomic.Int64
	var perKind [6][2]atomic.Int64 // answers checked by kind, denied and allowed
	var staleMsg atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 6; r++ {
		wg.Add(1)
		go func(kind int) {
			defer wg.Done()
			// Kinds 4 and 5 read through a handle opened once (in a DM),
			// whose pages the kernel caches: with pread, and through a
			// shared mapping.
			var held *os.File
			var mapped []byte
			for kind >= 4 && held == nil {
				select {
				case <-stop:
					return
				default:
				}
				if f, err := os.Open(diary); err == nil {
					held = f
					defer f.Close()
				}
			}
			if kind == 5 {
				m, err := unix.Mmap(int(held.Fd()), 0, len("secret"), unix.PROT_READ, unix.MAP_SHARED)
				if err != nil {
					t.Errorf("mmap: %v", err)
					return
				}
				defer unix.Munmap(m)
				mapped = m
			}
			buf := make([]byte, len("secret"))
			for {
				select {
				case <-stop:
					return
				default:
				}
				c1, s1 := completed.Load(), started.Load()
				var visible bool
				var why error // what a reader saw, for the failure message
				switch kind {
				case 0:
					_, err := os.Stat(diary)
					visible, why = err == nil, err
				case 1:
					b, err := os.ReadFile(diary)
					visible, why = err == nil && string(b) == "secret", err
				case 2:
					ents, err := os.ReadDir(mnt + "/memories")
					why = err
					for _, e := range ents {
						visible = visible || (err == nil && e.Name() == "private")
					}
				case 3:
					_, err := os.ReadDir(dir)
					visible, why = err == nil, err
				case 4:
					n, err := held.ReadAt(buf, 0)
					visible, why = err == nil && string(buf[:n]) == "secret", err
				case 5:
					b, faulted := touch(mapped)
					visible = !faulted && b == 's'
				}
				if kind >= 4 {
					// Page-cache hits return at once; leave the
					// switches some CPU.
					time.Sleep(50 * time.Microsecond)
				}
				if s2 := started.Load(); s1 == c1 && s2 == s1 {
					checked.Add(1)
					if visible {
						perKind[kind][1].Add(1)
					} else {
						perKind[kind][0].Add(1)
					}
					if visible != allowedAt(c1) {
						stale.Add(1)
						staleMsg.Store(fmt.Sprintf("reader %d after switch %d saw visible=%v (%v)", kind, c1, visible, why))
					}
				}
			}
		}(r)
	}
	const switches = 1000
	for i := int64(1); i <= switches; i++ {
		ctx := testenv.Guild
		if allowedAt(i) {
			ctx = testenv.DM
		}
		started.Add(1)
		d.SetContext("s", ctx)
		completed.Add(1)
		// Give readers a window in the new state.
		time.Sleep(200 * time.Microsecond)
	}
	close(stop)
	wg.Wait()
	if n := stale.Load(); n != 0 {
		t.Fatalf("%d stale answers of %d checked: %v", n, checked.Load(), staleMsg.Load())
	}
	if checked.Load() < 1000 {
		t.Fatalf("only %d answers fell between switches; the test proves little", checked.Load())
	}
	for k := range perKind {
		if perKind[k][0].Load() == 0 || perKind[k][1].Load() == 0 {
			t.Fatalf("reader %d gave %d denied and %d allowed answers between switches; the test proves little",
				k, perKind[k][0].Load(), perKind[k][1].Load())
		}
	}
	t.Logf("%d switches, %d answers checked, 0 stale", switches, checked.Load())
}

// TestCwdInHiddenDirectory: a process whose cwd is inside a directory that
// becomes hidden sees nothing there, not even relative lookups.
func TestCwdInHiddenDirectory(t *testing.T) {
	h := testenv.NewHome(t, "[memories.\"/p\"]\nwhen = \"discord:dm\"\naction = \"allow\"\n", "version: 1\n")
	h.Write("memories/p/child.md", "x")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.DM)
	fd, err := unix.Open(mnt+"/memories/p", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "child.md", &st, 0); err != nil {
		t.Fatalf("before the switch: %v", err)
	}
	d.SetContext("s", testenv.Guild)
	if err := unix.Fstatat(fd, "child.md", &st, 0); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("relative lookup in a hidden directory: %v, want ENOENT", err)
	}
	if _, err := unix.Openat(fd, "new.md", unix.O_CREAT|unix.O_WRONLY, 0o644); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("create in a hidden directory: %v, want ENOENT", err)
	}
}

// TestRevocation: an open handle on a file that becomes denied fails its
// next read and write with EACCES; files under no rule use the page cache,
// proven by the daemon's READ count.
func TestRevocation(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/diary.md", "secret diary")
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	h.Write("memories/public.bin", string(big))
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.DM)

	f, err := os.OpenFile(mnt+"/memories/private/diary.md", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 6)
	if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "secret" {
		t.Fatalf("read before: %q %v", buf, err)
	}
	d.SetContext("s", testenv.Guild)
	if _, err := f.ReadAt(buf, 0); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("read after the switch: %v, want EACCES", err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("write after the switch: %v, want EACCES", err)
	}
	d.SetContext("s", testenv.DM)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatalf("read after switching back: %v", err)
	}

	// A file under no rule is served from the page cache: a warm re-read
	// never reaches the daemon.
	if got, err := os.ReadFile(mnt + "/memories/public.bin"); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("public read: %d bytes, %v", len(got), err)
	}
	if n := warmReads(t, d, "s", mnt+"/memories/public.bin", big); n != 0 {
		t.Fatalf("the daemon served %d READs for a warm file under no rule: the page cache is off", n)
	}
	// A ruled file is cached too (the first read of this test already
	// cached it; the switches above dropped its pages only while denied).
	diary := mnt + "/memories/private/diary.md"
	if n := warmReads(t, d, "s", diary, []byte("secret diary")); n != 0 {
		t.Fatalf("the daemon served %d READs for a warm ruled file: the page cache is off", n)
	}
	// Its held handle, whose pages are cached now, is still cut off by a
	// switch: the switch dropped them.
	d.SetContext("s", testenv.Guild)
	if _, err := f.ReadAt(buf, 0); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("read of a cached ruled file after the switch: %v, want EACCES", err)
	}
}

// TestMmapRevocation: shared mappings work, ruled files included, and a
// switch or a reload that denies a mapped file drops its pages before it
// returns: the next touch faults to the daemon and gets SIGBUS, even with
// the descriptor closed after mmap. Switching back maps it in again.
func TestMmapRevocation(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/diary.md", "secret diary")
	h.Write("memories/public.md", "public notes")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.DM)
	diary := mapShared(t, mnt+"/memories/private/diary.md")
	public := mapShared(t, mnt+"/memories/public.md")
	want := func(what string, m []byte, wantByte byte) {
		t.Helper()
		b, faulted := touch(m)
		switch {
		case wantByte == 0 && !faulted:
			t.Fatalf("%s: read %q through the mapping, want SIGBUS", what, b)
		case wantByte != 0 && (faulted || b != wantByte):
			t.Fatalf("%s: %q (fault %v), want %q", what, b, faulted, wantByte)
		}
	}
	want("ruled file mapped in a DM", diary, 's')
	want("unruled file", public, 'p')
	d.SetContext("s", testenv.Guild)
	want("ruled file after the switch to a guild", diary, 0)
	want("unruled file after the switch", public, 'p')
	d.SetContext("s", testenv.DM)
	want("ruled file after switching back", diary, 's')
	h.Write("config/conditions.toml", testenv.PrivateRule+`
[memories."/public.md"]
when = "internal"
action = "allow"
`)
	d.Call("config.reload", map[string]any{}, nil)
	want("file a reload put under a rule that denies it", public, 0)
	want("ruled file after the reload", diary, 's')
}

// mapShared maps a whole file MAP_SHARED, read-only, and closes its
// descriptor (the mapping keeps the file open).
func mapShared(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap MAP_SHARED %s: %v", path, err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return m
}

// touch reads a mapping's first byte; a SIGBUS (the daemon refused the
// page) comes back as faulted.
func touch(m []byte) (b byte, faulted bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			faulted = true
		}
	}()
	return m[0], false
}

// warmReads reads a file whose pages the test has read before, and gives
// the READs the daemon served for it: the fewest of three tries. A READ
// the kernel started before (readahead, a revalidation on a loaded
// machine) may land in one try's count; with the page cache off, every
// try counts READs.
func warmReads(t *testing.T, d *testenv.Daemon, id, path string, want []byte) int64 {
	t.Helper()
	least := int64(-1)
	for try := 0; try < 3 && least != 0; try++ {
		// The previous read waited for every page, so what it started
		// has been counted before it returned.
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read %s: %d bytes, %v", path, len(got), err)
		}
		before := daemonReads(t, d, id)
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("warm read %s: %d bytes, %v", path, len(got), err)
		}
		if n := daemonReads(t, d, id) - before; least < 0 || n < least {
			least = n
		}
	}
	return least
}

func daemonReads(t *testing.T, d *testenv.Daemon, id string) int64 {
	var res struct {
		Sessions []struct {
			ID          string `json:"id"`
			DaemonReads int64  `json:"daemon_reads"`
		} `json:"sessions"`
	}
	d.Call("session.list", map[string]any{}, &res)
	for _, s := range res.Sessions {
		if s.ID == id {
			return s.DaemonReads
		}
	}
	t.Fatalf("no session %s", id)
	return 0
}

// TestSymlinkSwapRace: another process swaps a backing directory with a
// symlink to outside (RENAME_EXCHANGE) while readers go through the view.
// Not one byte from outside may come back.
func TestSymlinkSwapRace(t *testing.T) {
	h := testenv.NewHome(t, "", "version: 1\n")
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "f"), []byte("OUTSIDE"), 0o644)
	h.Write("workspace/d/f", "inside")
	if err := os.Symlink(outside, h.Path("workspace/s")); err != nil {
		t.Fatal(err)
	}
	d := testenv.Start(t, h)
	mnt := d.Open("s", []string{"tui"})
	stop := make(chan struct{})
	var swaps atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			unix.Renameat2(unix.AT_FDCWD, h.Path("workspace/d"), unix.AT_FDCWD, h.Path("workspace/s"), unix.RENAME_EXCHANGE)
			swaps.Add(1)
		}
	}()
	var reads, leaks atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Second)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				for _, p := range []string{"/workspace/d/f", "/workspace/s/f"} {
					b, err := os.ReadFile(mnt + p)
					if err == nil {
						reads.Add(1)
						if bytes.Contains(b, []byte("OUTSIDE")) {
							leaks.Add(1)
						}
					}
					if ents, err := os.ReadDir(mnt + "/workspace/s"); err == nil && len(ents) > 0 {
						// Listing the link's target would be a leak of names.
						for _, e := range ents {
							if e.Name() == "f" {
								if b, err := os.ReadFile(mnt + "/workspace/s/" + e.Name()); err == nil && bytes.Contains(b, []byte("OUTSIDE")) {
									leaks.Add(1)
								}
							}
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	if leaks.Load() != 0 {
		t.Fatalf("%d reads returned bytes from outside the backing tree", leaks.Load())
	}
	if reads.Load() == 0 || swaps.Load() < 100 {
		t.Fatalf("the race never ran: %d reads, %d swaps", reads.Load(), swaps.Load())
	}
	t.Logf("%d swaps, %d successful reads, 0 bytes from outside", swaps.Load(), reads.Load())
}

// TestMountRoot: the root holds exactly memories and workspace and cannot
// be written; a denied space root is absent.
func TestMountRoot(t *testing.T) {
	h := testenv.NewHome(t, "[workspace.\"/\"]\nwhen = \"internal\"\naction = \"allow\"\n", "version: 1\n")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.Guild)
	names := func() []string {
		ents, err := os.ReadDir(mnt)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		sort.Strings(out)
		return out
	}
	if got := names(); fmt.Sprint(got) != "[memories]" {
		t.Fatalf("root lists %v, want [memories]", got)
	}
	d.SetContext("s", []string{"internal"})
	if got := names(); fmt.Sprint(got) != "[memories workspace]" {
		t.Fatalf("root lists %v", got)
	}
	for _, op := range []func() error{
		func() error { return os.WriteFile(mnt+"/x", nil, 0o644) },
		func() error { return os.Mkdir(mnt+"/x", 0o755) },
		func() error { return os.Rename(mnt+"/memories", mnt+"/m2") },
		func() error { return os.Remove(mnt + "/memories") },
		func() error { return os.Symlink("memories", mnt+"/l") },
	} {
		if err := op(); !errors.Is(err, syscall.EACCES) {
			t.Errorf("mutation at the root: %v, want EACCES", err)
		}
	}
}

// TestHardlinks: in a space with rules, multiply-linked files are hidden
// and link() is refused; in a space without rules both work.
func TestHardlinks(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/secret.md", "s")
	os.Link(h.Path("memories/private/secret.md"), h.Path("memories/alias.md"))
	h.Write("workspace/a.txt", "a")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.Guild)
	if _, err := os.Stat(mnt + "/memories/alias.md"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("a hard link to a protected file is visible: %v", err)
	}
	h.Write("memories/plain.md", "p")
	if err := os.Link(mnt+"/memories/plain.md", mnt+"/memories/plain2.md"); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("link in a ruled space: %v, want EPERM", err)
	}
	if err := os.Link(mnt+"/workspace/a.txt", mnt+"/workspace/b.txt"); err != nil {
		t.Fatalf("link in a space without rules: %v", err)
	}
	if _, err := os.Stat(mnt + "/workspace/b.txt"); err != nil {
		t.Fatal(err)
	}
}

// TestRenameCannotMoveRuledPaths: renaming a directory that holds ruled
// paths would carry them out from under their rules.
func TestRenameCannotMoveRuledPaths(t *testing.T) {
	h := testenv.NewHome(t, "[memories.\"/a/secret/\"]\nwhen = \"discord:dm\"\naction = \"allow\"\n", "version: 1\n")
	h.Write("memories/a/secret/x", "x")
	h.Write("memories/b/y", "y")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.Guild)
	if err := os.Rename(mnt+"/memories/a", mnt+"/memories/c"); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("rename of a directory holding a ruled path: %v, want EACCES", err)
	}
	if err := os.Rename(mnt+"/memories/b", mnt+"/memories/c"); err != nil {
		t.Fatalf("plain rename: %v", err)
	}
	if err := os.Rename(mnt+"/memories/c", mnt+"/memories/a/secret"); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("rename onto a denied path: %v, want EACCES", err)
	}
}

// TestPosix runs go-fuse's posixtest suite on a view whose paths are all
// allowed: the view must be a real filesystem.
func TestPosix(t *testing.T) {
	h := testenv.NewHome(t, "", "version: 1\n")
	d := testenv.Start(t, h)
	// Two posixtest cases create absolute symlinks, which the spec hides
	// (conditions.md, "The view"): TestSymlinks below is their equivalent
	// with links inside the space.
	replaced := map[string]bool{"SymlinkReadlink": true, "OpenSymlinkRace": true}
	var names []string
	for name := range posixtest.All {
		if !replaced[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for i, name := range names {
		t.Run(name, func(t *testing.T) {
			mnt := d.Open(fmt.Sprintf("p%d", i), []string{"tui"})
			dir := mnt + "/workspace/" + name
			os.Mkdir(dir, 0o755)
			posixtest.All[name](t, dir)
			d.Call("session.close", map[string]any{"id": fmt.Sprintf("p%d", i)}, nil)
		})
	}
}

// TestSymlinks stands in for posixtest's absolute-link cases: links inside
// the space are created, read and followed through the view; links that
// leave it are refused at creation and hidden when made behind its back.
func TestSymlinks(t *testing.T) {
	h := testenv.NewHome(t, "", "version: 1\n")
	h.Write("workspace/dir/target.txt", "content")
	os.Symlink("/etc/passwd", h.Path("workspace/abs"))
	os.Symlink("../../outside", h.Path("workspace/dir/up"))
	d := testenv.Start(t, h)
	mnt := d.Open("s", []string{"tui"})
	ws := mnt + "/workspace"
	if err := os.Symlink("dir/target.txt", ws+"/rel"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(ws + "/rel"); err != nil || got != "dir/target.txt" {
		t.Fatalf("readlink: %q %v", got, err)
	}
	if b, err := os.ReadFile(ws + "/rel"); err != nil || string(b) != "content" {
		t.Fatalf("follow: %q %v", b, err)
	}
	if fi, err := os.Lstat(ws + "/rel"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("lstat: %v %v", fi, err)
	}
	if _, err := unix.Open(ws+"/rel", unix.O_RDONLY|unix.O_NOFOLLOW, 0); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("O_NOFOLLOW open of a link: %v, want ELOOP", err)
	}
	for _, target := range []string{"/etc/passwd", "../x", "dir/../../x"} {
		if err := os.Symlink(target, ws+"/bad"); !errors.Is(err, syscall.EACCES) {
			t.Fatalf("symlink to %s: %v, want EACCES", target, err)
		}
	}
	for _, p := range []string{ws + "/abs", ws + "/dir/up"} {
		if _, err := os.Lstat(p); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("%s: %v, want hidden", p, err)
		}
	}
	ents, _ := os.ReadDir(ws)
	for _, e := range ents {
		if e.Name() == "abs" {
			t.Fatal("an absolute link is listed")
		}
	}
}

// TestBackingChangesSeen: entries and attributes no rule governs are cached
// for a minute (--cache-ttl), so changes other processes make in the
// backing tree must reach the view through the watcher, within moments:
// a file grown, renamed, removed, given a second name in a space with rules
// (which hides it), and a directory made.
func TestBackingChangesSeen(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/notes/a.md", "one")
	h.Write("memories/b.md", "b")
	sock := h.Path("metrics.sock")
	d := testenv.Start(t, h, "--cache-ttl", "1m", "--metrics", sock)
	mnt := d.Open("s", testenv.DM)
	a, b := mnt+"/memories/notes/a.md", mnt+"/memories/b.md"
	if data, err := os.ReadFile(a); err != nil || string(data) != "one" {
		t.Fatalf("read: %q %v", data, err)
	}
	os.Stat(b)
	// Past the one-second default, the kernel still answers by itself:
	// no lookup or getattr reaches the daemon. (A directory's attributes
	// are cached long from the first getattr after its watch began.)
	time.Sleep(1200 * time.Millisecond)
	os.Stat(a)
	os.Stat(b)
	time.Sleep(1200 * time.Millisecond)
	lookups := func() float64 { return fuseOps(t, sock, "Lookup", "GetAttr") }
	before := lookups()
	for i := 0; i < 10; i++ {
		if _, err := os.Stat(a); err != nil {
			t.Fatal(err)
		}
		os.Stat(b)
	}
	if after := lookups(); after != before {
		t.Fatalf("%v lookups and getattrs reached the daemon for cached entries\n%s", after-before, d.Log())
	}
	within := func(what string, ok func() bool) { t.Helper(); d.Within(what, ok) }
	// The absence of a name no rule governs is remembered too (git asks
	// for .gitignore in every directory), until the name is made.
	missing := mnt + "/memories/notes/.gitignore"
	if testenv.Exists(missing) {
		t.Fatal("a missing name exists")
	}
	before = lookups()
	for i := 0; i < 10; i++ {
		testenv.Exists(missing)
	}
	if after := lookups(); after != before {
		t.Fatalf("%v lookups of a missing name reached the daemon: its absence is not cached", after-before)
	}
	h.Write("memories/notes/.gitignore", "x")
	within("a name made where its absence was cached", func() bool { return testenv.Exists(missing) })
	os.WriteFile(h.Path("memories/notes/a.md"), []byte("one and two"), 0o644)
	within("a file grown", func() bool {
		st, err := os.Stat(a)
		data, _ := os.ReadFile(a)
		return err == nil && st.Size() == 11 && string(data) == "one and two"
	})
	os.Rename(h.Path("memories/notes/a.md"), h.Path("memories/notes/c.md"))
	within("a rename", func() bool { return !testenv.Exists(a) && testenv.Exists(mnt+"/memories/notes/c.md") })
	os.Link(h.Path("memories/b.md"), h.Path("memories/notes/b-again.md"))
	within("a second name hides the file", func() bool { return !testenv.Exists(b) })
	os.Remove(h.Path("memories/notes/c.md"))
	within("a removal", func() bool { return !testenv.Exists(mnt + "/memories/notes/c.md") })
	os.Mkdir(h.Path("memories/notes/new"), 0o755)
	within("a new directory", func() bool { return testenv.Exists(mnt + "/memories/notes/new") })
	os.Chmod(h.Path("memories/notes"), 0o700)
	within("a mode change", func() bool {
		st, err := os.Stat(mnt + "/memories/notes")
		return err == nil && st.Mode().Perm() == 0o700
	})
}

// TestLocksReleasedOnClose: the view answers FLUSH with ENOSYS (no round
// trip on close); POSIX locks must still go when their holder closes the
// file: another process can take the lock moments later.
func TestLocksReleasedOnClose(t *testing.T) {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	h.Write("memories/shared.md", "x")
	os.Chmod(h.Path("memories/shared.md"), 0o666)
	d := testenv.Start(t, h)
	mnt := h.Path("mnt/s")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": testenv.DM, "allow_uids": []int{testenv.Nobody}}, nil)
	p := mnt + "/memories/shared.md"
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.FcntlFlock(f.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		t.Fatal(err)
	}
	sh := testenv.StartShell(t)
	if ok, _ := sh.Do("lock", p); ok {
		t.Fatal("a second process took a lock that is held")
	}
	f.Close()
	// go-fuse holds POSIX locks as OFD locks on the handle's fd, which goes
	// with RELEASE: the kernel sends it in the background after close(2),
	// so the lock goes moments later (with or without FLUSH).
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ok, res := sh.Do("lock", p)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock outlived its holder's close by 3s: %s", res)
		}
	}
}

// TestSwitchDuringListings: a listing of a ruled directory hands out full
// entries (READDIRPLUS) for names the view does not know yet; one decided
// before a context switch reaches the kernel after it, which links it
// stamped with the new epoch. The switch must drop it: a relative lookup
// from a descriptor held on the directory (now hidden) finds nothing. Every
// other round, a switch that keeps the name comes first, and the listing
// is still in flight when the second one hides it.
func TestSwitchDuringListings(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/diary.md", "secret")
	// The test build holds each listed entry between its decision and the
	// answer that carries it, so that the switch lands in between.
	t.Setenv("CONDFS_TEST_PLUS_DELAY", "80ms")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.DM)
	stale, listed, rounds := 0, 0, 0
	// Rounds go on until 10 listings had begun before their switch (a
	// loaded machine starts some too late, which proves nothing), at
	// most 150.
	const want, maxRounds = 10, 150
	for i := 0; listed < want && i < maxRounds; i++ {
		rounds++
		name := fmt.Sprintf("n%03d.md", i) // new each round: unknown to the view
		h.Write("memories/private/"+name, "s")
		// Held on the directory's current entry, the one the listing
		// links its names under (a switch replaces it).
		held, err := unix.Open(mnt+"/memories/private", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		closeHeld := sync.OnceFunc(func() { unix.Close(held) })
		// A descriptor left open on a failure would keep the view's mount
		// busy past the daemon's shutdown.
		t.Cleanup(closeHeld)
		done := make(chan error, 1)
		go func() {
			_, err := os.ReadDir(mnt + "/memories/private")
			done <- err
		}()
		time.Sleep(25 * time.Millisecond) // opened and deciding in a DM
		if i%2 == 1 {
			// First a switch that keeps the name: the listing is still
			// in flight when the next one hides it.
			d.SetContext("s", []string{"discord:dm", "discord:dm:5"})
		}
		d.SetContext("s", testenv.Guild)
		// A listing that had not opened the directory before the switch
		// finds it hidden (a loaded machine): that round proves nothing.
		if err := <-done; err == nil {
			listed++
		} else if !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("round %d: the listing begun in a DM: %v", i, err)
		}
		var st unix.Stat_t
		if unix.Fstatat(held, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			stale++
		}
		closeHeld()
		d.SetContext("s", testenv.DM)
	}
	if stale > 0 {
		t.Fatalf("%d of %d switches left a ruled name a listing handed out before them reachable after", stale, rounds)
	}
	if listed < want {
		t.Fatalf("only %d of %d listings had begun before their switch", listed, rounds)
	}
}

// TestReloadDuringListings: listings hand out full entries (READDIRPLUS)
// for names no rule governs, and two readers list without pause while the
// rules change back and forth. When config.reload returns (and the
// listings in flight then have been answered), a name the new rules hide
// must not be reachable. (The test build holds each listed entry between
// its decision and the answer, so that reloads land in between. On the
// 6.18 kernel here, a listing decided before a reload and linked after it
// did not answer stale even without plusMu and invalidateChanged; they stay
// for kernels that stamp such entries with the new epoch, as the
// FUSE_NOTIFY_INC_EPOCH patches read.)
func TestReloadDuringListings(t *testing.T) {
	open := "[memories.\"/private/\"]\nwhen = \"discord:dm\"\naction = \"allow\"\n"
	hidden := open + "\n[memories.\"/plain/0-secret.md\"]\nwhen = \"discord:guild:999\"\naction = \"allow\"\n"
	h := testenv.NewHome(t, open, "version: 1\n")
	// Few enough names for one answer, the first of a listing, which the
	// kernel always asks as READDIRPLUS.
	for i := 0; i < 12; i++ {
		h.Write(fmt.Sprintf("memories/plain/f%03d.md", i), "f")
	}
	h.Write("memories/plain/0-secret.md", "s")
	// The test build holds each listed entry 2 ms between its decision
	// and the answer, so that reloads land in between.
	t.Setenv("CONDFS_TEST_PLUS_DELAY", "2ms")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.DM)
	dir, secret := mnt+"/memories/plain", mnt+"/memories/plain/0-secret.md"
	defer testenv.Repeat(2, func(int) { os.ReadDir(dir) })()
	stale := 0
	for i := 0; i < 60; i++ {
		h.Write("config/conditions.toml", hidden)
		d.Call("config.reload", map[string]any{}, nil)
		// Listings in flight when it began have been answered and linked
		// by now; any entry they left must be gone.
		time.Sleep(20 * time.Millisecond)
		if _, err := os.Lstat(secret); err == nil {
			stale++
		}
		h.Write("config/conditions.toml", open)
		d.Call("config.reload", map[string]any{}, nil)
		os.Lstat(secret)
	}
	if stale > 0 {
		t.Fatalf("%d of 60 reloads left a hidden name reachable from a listing's entry", stale)
	}
}
