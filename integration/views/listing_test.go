package views

import (
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// TestListingCache: the kernel keeps listings of directories no rule
// reaches (a second listing reaches no READDIR at the daemon), and such a
// listing never outlives what changes it: a change to the backing
// directory, a reload (a handle held open and rewound included), a new hard
// link in a space with rules (which hides both names, wherever the new one
// is made), and a directory
// moved to where rules decide its names.
func TestListingCache(t *testing.T) {
	const rules = testenv.PrivateRule + `
[memories."/dest/secret2.md"]
when = "discord:guild:1"
action = "allow"
`
	const hiding = rules + `
[memories."/plain/secret.md"]
when = "discord:guild:1"
action = "allow"
`
	h := testenv.NewHome(t, rules, "version: 1\n")
	for _, f := range []string{"a.md", "b.md", "secret.md", "linked.md"} {
		h.Write("memories/plain/"+f, f)
	}
	h.Write("memories/mv/secret2.md", "s")
	h.Write("memories/private/p.md", "protected")
	h.Write("memories/solo/one.md", "1")
	sock := h.Path("metrics.sock")
	d := testenv.Start(t, h, "--cache-ttl", "1m", "--metrics", sock)
	mnt := d.Open("s", testenv.DM)
	plain := mnt + "/memories/plain"

	list := func(dir string) []string {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("readdir %s: %v", dir, err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	readdirs := func() float64 { return fuseOps(t, sock, "ReadDir", "ReadDirPlus") }
	if got := list(plain); !slices.Equal(got, []string{"a.md", "b.md", "linked.md", "secret.md"}) {
		t.Fatalf("listing: %v", got)
	}
	before := readdirs()
	for i := 0; i < 5; i++ {
		list(plain)
	}
	// Without the link watch, a space with rules is listed by the daemon
	// each time (link counts are checked as it lists).
	if after := readdirs(); after != before && os.Getenv("CONDFS_TEST_NO_FANOTIFY") == "" {
		t.Fatalf("%v READDIRs reached the daemon for a cached listing", after-before)
	}

	// held opens a directory and reads it through, keeping it open.
	held := func(dir string) *os.File {
		t.Helper()
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		f.Readdirnames(-1)
		return f
	}
	within := func(what string, ok func() bool) { t.Helper(); d.Within(what, ok) }
	// Changes another process makes; the second puts the directory's
	// mtime back, as rsync -a or tar do, so the kernel's own check of the
	// mtime cannot see it.
	h.Write("memories/plain/new.md", "n")
	within("a name made in the backing directory", func() bool { return slices.Contains(list(plain), "new.md") })
	st, err := os.Stat(h.Path("memories/plain"))
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(h.Path("memories/plain/new.md"))
	if err := os.Chtimes(h.Path("memories/plain"), st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	within("a name removed, the mtime put back", func() bool { return !slices.Contains(list(plain), "new.md") })
	list(plain)
	h.Write("memories/plain/new2.md", "n")
	if err := os.Chtimes(h.Path("memories/plain"), st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	within("a name made, the mtime put back", func() bool { return slices.Contains(list(plain), "new2.md") })
	os.Remove(h.Path("memories/plain/new2.md"))

	// A handle held open across a reload that hides a name, then rewound,
	// lists without it, and so does a new listing, as soon as the reload
	// has returned.
	f, err := os.Open(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if names, _ := f.Readdirnames(-1); !slices.Contains(names, "secret.md") {
		t.Fatalf("held handle: %v", names)
	}
	h.Write("config/conditions.toml", hiding)
	d.Call("config.reload", map[string]any{}, nil)
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	if names, _ := f.Readdirnames(-1); slices.Contains(names, "secret.md") {
		t.Fatalf("a held handle, rewound after the reload, lists a name the new rules hide: %v", names)
	}
	if names := list(plain); slices.Contains(names, "secret.md") {
		t.Fatalf("a listing after the reload shows a name the new rules hide: %v", names)
	}
	h.Write("config/conditions.toml", rules)
	d.Call("config.reload", map[string]any{}, nil)
	if names := list(plain); !slices.Contains(names, "secret.md") {
		t.Fatalf("the name is back in the rules but not in the listing: %v", names)
	}

	// The first rule of a space hides its multiply-linked files, though no
	// rule names them: a listing held open and rewound after that reload
	// shows none. (Their names are looked up before the listing, which
	// then notifies none of them by itself.)
	h.Write("workspace/w/one.md", "1")
	os.Link(h.Path("workspace/w/one.md"), h.Path("workspace/w/two.md"))
	w := mnt + "/workspace/w"
	os.Lstat(w + "/one.md")
	os.Lstat(w + "/two.md")
	if names := list(w); !slices.Equal(names, []string{"one.md", "two.md"}) {
		t.Fatalf("no rules in workspace yet: %v", names)
	}
	hw := held(w)
	h.Write("config/conditions.toml", rules+"\n[workspace.\"/elsewhere/\"]\nwhen = \"internal\"\naction = \"allow\"\n")
	d.Call("config.reload", map[string]any{}, nil)
	hw.Seek(0, 0)
	if names, _ := hw.Readdirnames(-1); len(names) != 0 {
		t.Fatalf("a held handle, rewound after a reload, lists files with two names in a space that has rules now: %v", names)
	}
	if names := list(w); len(names) != 0 {
		t.Fatalf("a listing after the reload lists files with two names: %v", names)
	}

	// A second name made in the backing tree, in a listed directory, for a
	// file of a protected directory: the cached listing goes, and the new
	// name is hidden (a file with several names in a space with rules),
	// and so is the file's other name in a second listed directory.
	list(plain)
	list(mnt + "/memories/private")
	if err := os.Link(h.Path("memories/private/p.md"), h.Path("memories/plain/alias.md")); err != nil {
		t.Fatal(err)
	}
	within("a name made by link(2)", func() bool { return !slices.Contains(list(mnt+"/memories/private"), "p.md") })
	if names := list(plain); slices.Contains(names, "alias.md") {
		t.Fatalf("a listing shows a second name of a protected file: %v", names)
	}

	// A second name made outside every watched directory, even outside the
	// space: the file's listed name and its cached entry go all the same
	// (the daemon's filesystem-wide watch of link counts).
	solo := mnt + "/memories/solo"
	time.Sleep(100 * time.Millisecond) // the watcher done with the changes above
	list(solo)
	if names := list(solo); !slices.Equal(names, []string{"one.md"}) {
		t.Fatalf("solo: %v", names)
	}
	if err := os.Link(h.Path("memories/solo/one.md"), h.Path("outside-link")); err != nil {
		t.Fatal(err)
	}
	within("a second name made outside the space hides the first", func() bool {
		if os.Getenv("CONDFS_TEST_NO_FANOTIFY") != "" {
			// A daemon that cannot mark filesystems checks link counts
			// when it lists; an entry it cached may show until its TTL.
			return !slices.Contains(list(solo), "one.md")
		}
		_, err := os.Lstat(solo + "/one.md")
		return !slices.Contains(list(solo), "one.md") && err != nil
	})

	// A directory another process moves to where a rule decides one of its
	// names: a handle held on it lists without that name once rewound.
	mv := mnt + "/memories/mv"
	if names := list(mv); !slices.Contains(names, "secret2.md") {
		t.Fatalf("mv: %v", names)
	}
	g := held(mv)
	if err := os.Rename(h.Path("memories/mv"), h.Path("memories/dest")); err != nil {
		t.Fatal(err)
	}
	within("a moved directory's names decided at its new path", func() bool {
		g.Seek(0, 0)
		names, _ := g.Readdirnames(-1)
		return !slices.Contains(names, "secret2.md")
	})
}

// TestHiddenAbsenceCached: the kernel remembers that a hidden name is
// missing (git asks for every file of a hidden directory it has in its
// index, on every status), and forgets it the moment a switch shows it.
func TestHiddenAbsenceCached(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/diary.md", "secret")
	sock := h.Path("metrics.sock")
	d := testenv.Start(t, h, "--cache-ttl", "1m", "--metrics", sock)
	mnt := d.Open("s", testenv.Guild)
	lookups := func() float64 { return fuseOps(t, sock, "Lookup") }
	diary := mnt + "/memories/private/diary.md"
	for round := 0; round < 3; round++ {
		if testenv.Exists(diary) {
			t.Fatalf("round %d: a hidden file exists in the guild", round)
		}
		before := lookups()
		for i := 0; i < 10; i++ {
			testenv.Exists(diary)
		}
		if n := lookups() - before; n != 0 {
			t.Fatalf("round %d: %v lookups of a hidden name reached the daemon: its absence is not cached", round, n)
		}
		d.SetContext("s", testenv.DM)
		if data, err := os.ReadFile(diary); err != nil || string(data) != "secret" {
			t.Fatalf("round %d: right after the switch to a DM: %q %v (a remembered absence outlived the switch)", round, data, err)
		}
		d.SetContext("s", testenv.Guild)
	}
}

// TestLinkWatchFromTheStart: a file a fresh view has only looked up (no
// directory listed, no name made anywhere) loses its entry when it gains a
// second name outside the space. The filesystem is marked when the view
// opens, not at the first listing: a link made before the mark went
// unreported, and the entry stayed cached for the whole TTL.
func TestLinkWatchFromTheStart(t *testing.T) {
	if os.Getenv("CONDFS_TEST_NO_FANOTIFY") != "" {
		t.Skip("without the link watch an entry may show until its TTL (documented)")
	}
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/solo/one.md", "1")
	d := testenv.Start(t, h, "--cache-ttl", "1m")
	mnt := d.Open("s", testenv.DM)
	one := mnt + "/memories/solo/one.md"
	for i := 0; i < 2; i++ {
		if _, err := os.Lstat(one); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(h.Path("memories/solo/one.md"), h.Path("outside-link")); err != nil {
		t.Fatal(err)
	}
	d.Within("a second name made outside the space hides the first", func() bool {
		_, err := os.Lstat(one)
		return err != nil
	})
}

// TestWalkWhileTreeChanges: another process changes the backing tree
// (files made, removed, moved in and out of a hidden directory, linked,
// directories made and moved) while walkers walk the view. No walk ever
// shows a name below a directory the rules hide, and once the changes stop
// the view's walk matches the backing tree under the rules within moments:
// cached listings, entries and absences all follow (the watcher's events
// arrive within about 10 ms; the harness allows 3 s).
func TestWalkWhileTreeChanges(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule+`
[memories."/net/"]
when = "discord:guild:1"
action = "allow"
`, "version: 1\n")
	dirs := []string{"d0", "d1", "d2", "d0/sub", "net", "net/x", "private", "private/y"}
	for i, dir := range dirs {
		h.Write(fmt.Sprintf("memories/%s/f%d.md", dir, i), "x")
	}
	// Quiet directories: walked throughout, changed only at the end, so
	// their listings and entries are in the kernel's cache by then.
	quiet := []string{"q0", "q1", "q2"}
	for _, dir := range quiet {
		for i := 0; i < 5; i++ {
			h.Write(fmt.Sprintf("memories/%s/f%d.md", dir, i), "x")
		}
	}
	d := testenv.Start(t, h, "--cache-ttl", "1m")
	mnt := d.Open("s", testenv.Guild)
	root := mnt + "/memories"
	back := h.Path("memories")

	// walkView lists every name below root; it fails the test on a name
	// the rules hide. Entries that vanish mid-walk are skipped.
	walkView := func() map[string]bool {
		seen := map[string]bool{}
		filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			rel, _ := filepath.Rel(root, p)
			if rel == "private" || strings.HasPrefix(rel, "private/") {
				t.Errorf("a walk showed %s, which the rules hide in a guild", rel)
			}
			// Each name stat'd too: a stale cached entry would answer.
			if _, serr := os.Lstat(p); err == nil && serr == nil && rel != "." {
				seen[rel] = true
			}
			return nil
		})
		return seen
	}
	walks := make([]int, 2)
	stop := testenv.Repeat(len(walks), func(w int) {
		walkView()
		walks[w]++
	})

	rng := rand.New(rand.NewSource(1))
	pick := func() string { return filepath.Join(back, dirs[rng.Intn(len(dirs))]) }
	files := func(dir string) []string {
		ents, _ := os.ReadDir(dir)
		var out []string
		for _, e := range ents {
			if e.Type().IsRegular() {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
		return out
	}
	for i := 0; i < 1500; i++ {
		dir := pick()
		switch op := rng.Intn(10); {
		case op < 4:
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("n%d.md", i)), []byte("n"), 0o644)
		case op < 6:
			if fl := files(dir); len(fl) > 0 {
				os.Remove(fl[rng.Intn(len(fl))])
			}
		case op < 8:
			// In and out of the hidden directory, and between others.
			if fl := files(dir); len(fl) > 0 {
				f := fl[rng.Intn(len(fl))]
				os.Rename(f, filepath.Join(pick(), filepath.Base(f)))
			}
		case op < 9:
			if fl := files(dir); len(fl) > 0 {
				os.Link(fl[rng.Intn(len(fl))], filepath.Join(pick(), fmt.Sprintf("l%d.md", i)))
			}
		default:
			sub := filepath.Join(dir, fmt.Sprintf("s%d", i))
			if os.Mkdir(sub, 0o755) == nil {
				os.WriteFile(filepath.Join(sub, "in.md"), []byte("i"), 0o644)
				os.Rename(sub, filepath.Join(pick(), fmt.Sprintf("m%d", i)))
			}
		}
		if i%5 == 0 {
			time.Sleep(time.Millisecond) // walks in between
		}
	}
	stop()
	// Last, changes in the quiet directories: each must be seen on its
	// own (a new hard link anywhere drops the space's cached entries and
	// listings, and the walkers above listed these directories often).
	var gone []string
	for i := 0; i < 15; i++ {
		dir := quiet[i%3]
		switch i % 3 {
		case 0:
			h.Write(fmt.Sprintf("memories/%s/last%d.md", dir, i), "n")
		case 1:
			rel := fmt.Sprintf("%s/f%d.md", dir, i/3)
			os.Remove(filepath.Join(back, rel))
			gone = append(gone, rel)
		case 2:
			rel := fmt.Sprintf("%s/f%d.md", dir, i/3)
			to := "private"
			if i%2 == 0 {
				to = quiet[0]
			}
			os.Rename(filepath.Join(back, rel), filepath.Join(back, to, fmt.Sprintf("moved%d.md", i)))
			gone = append(gone, rel)
		}
	}
	// What the view must show now: the backing tree less the hidden
	// directory and, in this space with rules, files with several names.
	want := map[string]bool{}
	filepath.WalkDir(back, func(p string, e fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(back, p)
		switch {
		case err != nil || rel == ".":
			return nil
		case rel == "private":
			return filepath.SkipDir
		}
		if e.Type().IsRegular() {
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) == nil && st.Nlink > 1 {
				return nil
			}
		}
		want[rel] = true
		return nil
	})
	var diff []string
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := walkView()
		diff = diff[:0]
		for p := range want {
			if !got[p] {
				diff = append(diff, "missing "+p)
			}
		}
		for p := range got {
			if !want[p] {
				diff = append(diff, "extra "+p)
			}
		}
		for _, p := range gone {
			if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
				diff = append(diff, "stale entry "+p)
			}
		}
		if len(diff) == 0 {
			break
		}
		if time.Now().After(deadline) {
			slices.Sort(diff)
			t.Fatalf("3 s after the changes stopped the view's walk still differs from the backing tree under the rules (%d names):\n%s", len(diff), strings.Join(diff[:min(len(diff), 20)], "\n"))
		}
	}
	t.Logf("%d walks during 1,500 changes; %d names after", walks[0]+walks[1], len(want))
}

// TestRuledListingGivesEntries: a listing of a ruled directory hands the
// kernel full entries (READDIRPLUS) for its names, so stat'ing each name
// after the listing costs no LOOKUP round trip (a switch drops the ones it
// hides: TestSwitchDuringListings).
func TestRuledListingGivesEntries(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	const files = 50
	for i := 0; i < files; i++ {
		h.Write(fmt.Sprintf("memories/private/f%02d.md", i), "p")
	}
	sock := h.Path("metrics.sock")
	d := testenv.Start(t, h, "--metrics", sock)
	mnt := d.Open("s", testenv.DM)
	dir := mnt + "/memories/private"
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	before := fuseOps(t, sock, "Lookup")
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != files {
		t.Fatalf("listing: %d names, %v", len(ents), err)
	}
	for _, e := range ents {
		if _, err := os.Lstat(dir + "/" + e.Name()); err != nil {
			t.Fatal(err)
		}
	}
	if n := fuseOps(t, sock, "Lookup") - before; n > 0 {
		t.Fatalf("%v LOOKUPs reached the daemon for %d names a listing of a ruled directory had just given", n, files)
	}
}

// TestRuledListingCached: the kernel opens directories by itself (no
// OPENDIR or RELEASEDIR round trip) and keeps every listing it reads, ruled
// directories' too, so listing again reaches the daemon with nothing. A
// context switch drops, before it returns, each cached listing it can
// change: right after it, a new listing and one held open and rewound show
// the names the new context shows and no other.
func TestRuledListingCached(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule+`
[memories."/notes/guild.md"]
when = "discord:guild:1"
action = "allow"
`, "version: 1\n")
	h.Write("memories/notes/a.md", "a")
	h.Write("memories/notes/guild.md", "g")
	h.Write("memories/private/p.md", "p")
	sock := h.Path("metrics.sock")
	d := testenv.Start(t, h, "--cache-ttl", "1m", "--metrics", sock)
	mnt := d.Open("s", testenv.DM)
	notes, mem, private := mnt+"/memories/notes", mnt+"/memories", mnt+"/memories/private"
	names := func(f *os.File) []string {
		t.Helper()
		if _, err := f.Seek(0, 0); err != nil {
			t.Fatal(err)
		}
		ns, err := f.Readdirnames(-1)
		if err != nil {
			t.Fatalf("readdir %s: %v", f.Name(), err)
		}
		slices.Sort(ns)
		return ns
	}
	list := func(dir string) []string {
		t.Helper()
		f, err := os.Open(dir)
		if err != nil {
			t.Fatalf("open %s: %v", dir, err)
		}
		defer f.Close()
		return names(f)
	}
	dirOps := func() float64 { return fuseOps(t, sock, "OpenDir", "ReadDir", "ReadDirPlus", "ReleaseDir") }
	want := map[bool]map[string][]string{
		true:  {notes: {"a.md"}, mem: {"notes", "private"}, private: {"p.md"}},
		false: {notes: {"a.md", "guild.md"}, mem: {"notes"}},
	}
	for _, dir := range []string{notes, mem, private} {
		list(dir)
	}
	held, err := os.Open(notes)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for round := 0; round < 6; round++ {
		dm := round%2 == 0
		for dir, w := range want[dm] {
			if got := list(dir); !slices.Equal(got, w) {
				t.Fatalf("round %d (dm %v): %s lists %v, want %v", round, dm, dir, got, w)
			}
		}
		if got := names(held); !slices.Equal(got, want[dm][notes]) {
			t.Fatalf("round %d (dm %v): a handle held open and rewound lists %v", round, dm, got)
		}
		before := dirOps()
		for dir := range want[dm] {
			list(dir)
		}
		names(held)
		// Without the link watch, a space with rules is listed by the
		// daemon each time (link counts are checked as it lists).
		if n := dirOps() - before; n != 0 && os.Getenv("CONDFS_TEST_NO_FANOTIFY") == "" {
			t.Fatalf("round %d: listing again reached the daemon %v times: the listings are not cached", round, n)
		}
		if dm {
			d.SetContext("s", testenv.Guild)
		} else {
			d.SetContext("s", testenv.DM)
		}
	}
}

// fuseOps counts the FUSE requests of the given opcodes the daemon behind
// the metrics socket has served.
func fuseOps(t *testing.T, sock string, ops ...string) float64 {
	t.Helper()
	var n float64
	for _, m := range testenv.Scrape(t, sock)["condfs_fuse_op_seconds"].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "op" && slices.Contains(ops, lp.GetValue()) {
				n += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return n
}
