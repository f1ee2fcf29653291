package fsys

// These tests drive the view's node tree in-process, without mounting (as
// gocryptfs tests its frontend): they run as an ordinary user and cover the
// view's behaviour row by row. What needs the kernel (caches, epoch,
// credentials of other users) is tested through real mounts in integration/.

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/internal/fuseconn"
)

const testRules = `
[memories."/private/"]
when = "discord:dm"
action = "allow"

[memories."/notes/secret.md"]
when = "discord:dm"
action = "allow"

[memories."/guild/"]
when = "!discord:dm"
action = "allow"
`

var (
	dm    = mustSet("discord:dm", "discord:dm:1", "discord:channel:1")
	guild = mustSet("discord:guild:2", "discord:channel:3")
)

func mustSet(atoms ...string) cctx.Set {
	s, err := cctx.NewSet(atoms)
	if err != nil {
		panic(err)
	}
	return s
}

type fixture struct {
	t         *testing.T
	v         *View
	mem, work string
	rules     *atomic.Pointer[acl.Config]
	denials   atomic.Int64
	raw       fuse.RawFileSystem
}

// newFixture builds a view over two temporary backing directories, with
// files laid out by the caller, in context atoms.
func newFixture(t *testing.T, rules string, atoms cctx.Set) *fixture {
	t.Helper()
	host, err := NewHost(HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return newFixtureOn(t, host, rules, atoms)
}

// newFixtureOn is newFixture on host.
func newFixtureOn(t *testing.T, host *Host, rules string, atoms cctx.Set) *fixture {
	t.Helper()
	f := &fixture{t: t, mem: t.TempDir(), work: t.TempDir(), rules: &atomic.Pointer[acl.Config]{}}
	cfg, err := acl.Parse("conditions.toml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	f.rules.Store(cfg)
	v, err := host.newView(Options{
		Mountpoint: "/nonexistent", Memories: f.mem, Workspace: f.work, Rules: f.rules, Context: atoms,
		Owner:  uint32(os.Getuid()),
		OnDeny: func(cctx.Set, acl.Space, string, string) { f.denials.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.closeBacking)
	f.attach(v)
	return f
}

// attach makes v the fixture's view, with the bridge a mount would serve
// driven in-process (it also attaches the tree's root).
func (f *fixture) attach(v *View) {
	f.v = v
	f.raw = fuseconn.Options{Root: v.root, FS: v.mnt.fsOpts, Wrap: guardFS{panics: &v.stats.panics, log: v.log}.serve}.RawFS(&fuseconn.Notifier{})
}

func (f *fixture) write(rel, text string) string {
	f.t.Helper()
	p := filepath.Join(f.mem, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// walk looks a path up from the mount root, component by component, as
// the kernel does.
func (f *fixture) walk(ctx context.Context, path ...string) (*fs.Inode, syscall.Errno) {
	var in *fs.Inode
	var out fuse.EntryOut
	in, errno := f.v.root.Lookup(ctx, path[0], &out)
	if errno != 0 {
		return nil, errno
	}
	// The bridge adds a looked-up child to its parent; do what it does.
	f.v.root.AddChild(path[0], in, true)
	for _, name := range path[1:] {
		child, errno := in.Operations().(*node).Lookup(ctx, name, &out)
		if errno != 0 {
			return nil, errno
		}
		in.AddChild(name, child, true)
		in = child
	}
	return in, 0
}

func (f *fixture) node(path ...string) *node {
	f.t.Helper()
	in, errno := f.walk(context.Background(), path...)
	if errno != 0 {
		f.t.Fatalf("lookup %v: %v", path, errno)
	}
	return in.Operations().(*node)
}

func (f *fixture) wantErrno(what string, got, want syscall.Errno) {
	f.t.Helper()
	if got != want {
		f.t.Errorf("%s: errno %v, want %v", what, got, want)
	}
}

func TestHiddenNamesAndAncestors(t *testing.T) {
	f := newFixture(t, testRules, guild)
	f.write("private/diary.md", "dear diary")
	f.write("notes/secret.md", "s")
	f.write("notes/public.md", "p")
	ctx := context.Background()
	_, errno := f.walk(ctx, "memories", "private")
	f.wantErrno("lookup a hidden directory", errno, syscall.ENOENT)
	_, errno = f.walk(ctx, "memories", "notes", "secret.md")
	f.wantErrno("lookup a hidden exact path", errno, syscall.ENOENT)
	if _, errno := f.walk(ctx, "memories", "notes", "public.md"); errno != 0 {
		t.Fatalf("lookup an unruled file: %v", errno)
	}
	// A directory node obtained while it was visible (a process's cwd)
	// finds nothing after the switch: every directory above is decided.
	f.v.SetContext(dm)
	priv := f.node("memories", "private")
	f.v.SetContext(guild)
	var out fuse.EntryOut
	_, errno = priv.Lookup(ctx, "diary.md", &out)
	f.wantErrno("lookup under a directory hidden since", errno, syscall.ENOENT)
	_, _, _, errno = priv.Create(ctx, "new.md", syscall.O_WRONLY, 0o644, &out)
	f.wantErrno("create under a hidden directory", errno, syscall.ENOENT)
	notes := f.node("memories", "notes")
	_, _, _, errno = notes.Create(ctx, "secret.md", syscall.O_WRONLY, 0o644, &out)
	f.wantErrno("create a denied name that exists", errno, syscall.EACCES)
	f.wantErrno("unlink a hidden name", notes.Unlink(ctx, "secret.md"), syscall.ENOENT)
	if f.denials.Load() == 0 {
		t.Error("denials were not audited")
	}
	// Listing leaves hidden names out.
	names := f.list(f.node("memories"))
	if names["private"] || !names["notes"] || names["guild"] {
		t.Errorf("memories lists %v", names)
	}
}

func (f *fixture) list(n *node) map[string]bool {
	f.t.Helper()
	h, _, errno := n.OpendirHandle(context.Background(), 0)
	if errno != 0 {
		f.t.Fatalf("opendir: %v", errno)
	}
	d := h.(*dirHandle)
	defer d.Releasedir(context.Background(), 0)
	names := map[string]bool{}
	for {
		de, errno := d.Readdirent(context.Background())
		if errno != 0 {
			f.t.Fatalf("readdirent: %v", errno)
		}
		if de == nil {
			return names
		}
		names[de.Name] = true
	}
}

func TestDirectoryHandleDecidesEachEntryWhenRead(t *testing.T) {
	f := newFixture(t, testRules, dm)
	os.MkdirAll(filepath.Join(f.mem, "private"), 0o755)
	os.MkdirAll(filepath.Join(f.mem, "guild"), 0o755)
	f.write("a.md", "a")
	mem := f.node("memories")
	h, _, errno := mem.OpendirHandle(context.Background(), 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	d := h.(*dirHandle)
	defer d.Releasedir(context.Background(), 0)
	f.v.SetContext(guild) // after opendir, before the first READDIR
	seen := map[string]bool{}
	for {
		de, errno := d.Readdirent(context.Background())
		if errno != 0 {
			t.Fatal(errno)
		}
		if de == nil {
			break
		}
		seen[de.Name] = true
	}
	if seen["private"] || !seen["guild"] || !seen["a.md"] {
		t.Errorf("a handle opened in a DM, read in a guild, lists %v", seen)
	}
	// Rewinding lists again, in the context of now.
	f.v.SetContext(dm)
	if errno := d.Seekdir(context.Background(), 0); errno != 0 {
		t.Fatal(errno)
	}
	de, _ := d.Readdirent(context.Background())
	seen = map[string]bool{}
	for ; de != nil; de, _ = d.Readdirent(context.Background()) {
		seen[de.Name] = true
	}
	if !seen["private"] || seen["guild"] {
		t.Errorf("after rewinding in a DM: %v", seen)
	}
}

func TestSymlinksAndHardLinks(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("notes/public.md", "p")
	os.Symlink("public.md", filepath.Join(f.mem, "notes/inner"))
	os.Symlink("/etc/passwd", filepath.Join(f.mem, "notes/abs"))
	os.Symlink("../../x", filepath.Join(f.mem, "notes/out"))
	secret := f.write("private/key", "k")
	os.Link(secret, filepath.Join(f.mem, "notes/alias"))
	ctx := context.Background()
	notes := f.node("memories", "notes")
	var out fuse.EntryOut
	if _, errno := notes.Lookup(ctx, "inner", &out); errno != 0 {
		t.Errorf("a link inside the space: %v", errno)
	}
	for _, name := range []string{"abs", "out", "alias"} {
		_, errno := notes.Lookup(ctx, name, &out)
		f.wantErrno("lookup "+name, errno, syscall.ENOENT)
	}
	names := f.list(notes)
	if names["abs"] || names["out"] || names["alias"] || !names["inner"] || !names["public.md"] {
		t.Errorf("notes lists %v", names)
	}
	// Creating over the hidden second name of a protected file never
	// opens it (O_CREAT without O_EXCL).
	_, fh, _, errno := notes.Create(ctx, "alias", syscall.O_RDWR, 0o600, &out)
	f.wantErrno("O_CREAT on a hidden hard link", errno, syscall.EACCES)
	if fh != nil {
		t.Fatal("a handle on the protected file was returned")
	}
	pub := f.node("memories", "notes", "public.md")
	_, errno = notes.Link(ctx, pub, "second", &out)
	f.wantErrno("link in a ruled space", errno, syscall.EPERM)
	_, errno = notes.Symlink(ctx, "/etc/shadow", "evil", &out)
	f.wantErrno("symlink out of the space", errno, syscall.EACCES)
}

func TestCreateNeverOpensAnExistingFileItDidNotMake(t *testing.T) {
	f := newFixture(t, "", dm) // no rules: hard links are shown
	f.write("a.md", "old")
	ctx := context.Background()
	mem := f.node("memories")
	var out fuse.EntryOut
	// The name appeared after the kernel's negative lookup: without
	// O_EXCL it is opened as open(2) would, and nothing is truncated or
	// chowned; with O_EXCL it is EEXIST.
	_, fh, _, errno := mem.Create(ctx, "a.md", syscall.O_RDONLY, 0o600, &out)
	if errno != 0 {
		t.Fatalf("create over an existing visible file: %v", errno)
	}
	h := fh.(*fileHandle)
	buf := make([]byte, 16)
	res, errno := h.Read(ctx, buf, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	if got, _ := res.Bytes(buf); string(got) != "old" {
		t.Errorf("read %q", got)
	}
	h.Release(ctx)
	_, _, _, errno = mem.Create(ctx, "a.md", syscall.O_RDONLY|syscall.O_EXCL, 0o600, &out)
	f.wantErrno("O_EXCL create over an existing file", errno, syscall.EEXIST)
	_, fh, _, errno = mem.Create(ctx, "b.md", syscall.O_WRONLY, 0o640, &out)
	if errno != 0 {
		t.Fatal(errno)
	}
	fh.(*fileHandle).Release(ctx)
	st, err := os.Stat(filepath.Join(f.mem, "b.md"))
	if err != nil || st.Mode().Perm() != 0o640&^umask() {
		t.Errorf("created file: %v %v", st.Mode(), err)
	}
}

func umask() os.FileMode {
	m := unix.Umask(0)
	unix.Umask(m)
	return os.FileMode(m)
}

func TestRenameGuards(t *testing.T) {
	const rules = `
[memories."/box/secret.md"]
when = "discord:dm"
action = "allow"
`
	f := newFixture(t, rules, guild)
	f.write("box/secret.md", "s")
	f.write("open/readme.md", "r")
	f.write("file.md", "f")
	ctx := context.Background()
	mem := f.node("memories")
	// Exchanging an unruled directory with one holding a ruled
	// path would carry the denied file out from under its rule.
	f.wantErrno("RENAME_EXCHANGE open <-> box", mem.Rename(ctx, "open", mem, "box", unix.RENAME_EXCHANGE), syscall.EACCES)
	f.wantErrno("RENAME_EXCHANGE box <-> open", mem.Rename(ctx, "box", mem, "open", unix.RENAME_EXCHANGE), syscall.EACCES)
	f.wantErrno("rename box", mem.Rename(ctx, "box", mem, "elsewhere", 0), syscall.EACCES)
	if _, err := os.Stat(filepath.Join(f.mem, "box/secret.md")); err != nil {
		t.Fatal("the protected file moved")
	}
	box := f.node("memories", "box")
	f.wantErrno("rename onto a denied name", mem.Rename(ctx, "file.md", box, "secret.md", 0), syscall.EACCES)
	f.wantErrno("exchange with a denied name", mem.Rename(ctx, "file.md", box, "secret.md", unix.RENAME_EXCHANGE), syscall.EACCES)
	f.wantErrno("rename a visible file", mem.Rename(ctx, "file.md", mem, "moved.md", 0), 0)
}

func TestNodeReachesOnlyItsOwnInode(t *testing.T) {
	f := newFixture(t, "", dm)
	f.write("a.md", "mine")
	ctx := context.Background()
	a := f.node("memories", "a.md")
	// Another file renamed onto the cached name is not what was cached.
	f.write("other.md", "not yours")
	if err := os.Rename(filepath.Join(f.mem, "other.md"), filepath.Join(f.mem, "a.md")); err != nil {
		t.Fatal(err)
	}
	var attr fuse.AttrOut
	f.wantErrno("getattr", a.Getattr(ctx, nil, &attr), syscall.ESTALE)
	_, _, errno := a.Open(ctx, syscall.O_RDONLY)
	f.wantErrno("open", errno, syscall.ESTALE)
	in := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_MODE, Mode: 0o666}}
	f.wantErrno("chmod", a.Setattr(ctx, nil, in, &attr), syscall.ESTALE)
	_, errno = a.Getxattr(ctx, "user.x", nil)
	f.wantErrno("getxattr", errno, syscall.ESTALE)
	if st, _ := os.Stat(filepath.Join(f.mem, "a.md")); st.Mode().Perm() == 0o666 {
		t.Error("the other file was chmodded")
	}
}

func TestHandlesAcrossAContextSwitch(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("private/diary.md", "dear diary")
	ctx := context.Background()
	d := f.node("memories", "private", "diary.md")
	fh, flags, errno := d.Open(ctx, syscall.O_RDWR)
	if errno != 0 {
		t.Fatal(errno)
	}
	h := fh.(*fileHandle)
	defer h.Release(ctx)
	if flags&fuse.FOPEN_DIRECT_IO != 0 || flags&fuse.FOPEN_KEEP_CACHE == 0 {
		t.Errorf("a ruled file is opened with flags %#x, want the page cache kept", flags)
	}
	buf := make([]byte, 64)
	if _, errno := h.Read(ctx, buf, 0); errno != 0 {
		t.Fatalf("read in a DM: %v", errno)
	}
	f.v.SetContext(guild)
	_, errno = h.Read(ctx, buf, 0)
	f.wantErrno("read after the switch", errno, syscall.EACCES)
	_, errno = h.Write(ctx, []byte("x"), 0)
	f.wantErrno("write after the switch", errno, syscall.EACCES)
	var attr fuse.AttrOut
	f.wantErrno("fgetattr after the switch", h.Getattr(ctx, &attr), syscall.EACCES)
}

// TestOpenAcrossASwitch: an open decided before a switch but registered for
// revocation after it (revoke did not see it) is decided again: refused
// when the switch denies the file, and without FOPEN_KEEP_CACHE (pages
// cached under the old decision are dropped at open) when it still allows.
func TestOpenAcrossASwitch(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("private/diary.md", "dear diary")
	d := f.node("memories", "private", "diary.md")
	open := func(between func()) (uint32, syscall.Errno) {
		tg, errno := d.prepare(asCaller{}, opLookup, "")
		if errno != 0 {
			t.Fatal(errno)
		}
		defer tg.close()
		between()
		fh, flags, errno := d.openEntry(&tg, syscall.O_RDONLY)
		if fh != nil {
			fh.Release(context.Background())
		}
		return flags, errno
	}
	if flags, errno := open(func() {}); errno != 0 || flags&fuse.FOPEN_KEEP_CACHE == 0 {
		t.Fatalf("open with no switch: flags %#x, %v", flags, errno)
	}
	_, errno := open(func() { f.v.SetContext(guild) })
	f.wantErrno("open decided in a DM, finished in a guild", errno, syscall.EACCES)
	// The refused open's descriptor is closed once: its number, free
	// again, goes to one of the next opens, and nothing closes it under
	// that open later (the os.File that owned it did, when collected: a
	// directory handle's fd, in the flips test under load).
	var next []int
	for i := 0; i < 8; i++ {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		next = append(next, fd)
	}
	for i := 0; i < 20; i++ {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
		for _, fd := range next {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
				t.Fatalf("fd %d, opened after the refused open, was closed under it: %v", fd, err)
			}
		}
	}
	f.v.SetContext(dm)
	flags, errno := open(func() { f.v.SetContext(dm) })
	if errno != 0 || flags&fuse.FOPEN_KEEP_CACHE != 0 {
		t.Fatalf("open across a switch that still allows: flags %#x, %v; want no FOPEN_KEEP_CACHE", flags, errno)
	}
}

// TestReleasedHandleDecidesNothing: revoke may decide a handle it listed
// just before RELEASE closed its fd. The number may be another open's by
// then; the released handle must not be decided by that file.
func TestReleasedHandleDecidesNothing(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("private/diary.md", "dear diary")
	f.write("plain.md", "plain")
	ctx := context.Background()
	fh, _, errno := f.node("memories", "private", "diary.md").Open(ctx, syscall.O_RDONLY)
	if errno != 0 {
		t.Fatal(errno)
	}
	h := fh.(*fileHandle)
	number := h.fd
	h.Release(ctx)
	fd, err := unix.Open(filepath.Join(f.mem, "plain.md"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// The number goes to the other file, as the next open would take it.
	if err := unix.Dup3(fd, number, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(number)
	f.v.SetContext(guild) // the handle's last decision is out of date
	if h.decide(false) {
		t.Fatal("a released handle was decided visible, by the file that took its fd's number")
	}
}

func TestHandleFollowsRenamesOutOfItsRule(t *testing.T) {
	// An unruled file opened read-write, renamed under a rule
	// through another view, then denied.
	f := newFixture(t, testRules, guild)
	f.write("plain.md", "v1")
	os.MkdirAll(filepath.Join(f.mem, "private"), 0o755)
	ctx := context.Background()
	n := f.node("memories", "plain.md")
	fh, flags, errno := n.Open(ctx, syscall.O_RDWR)
	if errno != 0 {
		t.Fatal(errno)
	}
	h := fh.(*fileHandle)
	defer h.Release(ctx)
	if flags&fuse.FOPEN_DIRECT_IO != 0 {
		t.Error("an unruled file should use the page cache")
	}
	buf := make([]byte, 8)
	if _, errno := h.Read(ctx, buf, 0); errno != 0 {
		t.Fatalf("read before: %v", errno)
	}
	// A second view on the same tree, in a DM, moves the file.
	other := &fixture{t: t, mem: f.mem, work: f.work, rules: f.rules}
	v2, err := f.v.host.newView(Options{Mountpoint: "/nonexistent", Memories: f.mem, Workspace: f.work, Rules: f.rules, Context: dm, Owner: uint32(os.Getuid())})
	if err != nil {
		t.Fatal(err)
	}
	defer v2.closeBacking()
	other.attach(v2)
	mem2 := other.node("memories")
	priv2 := other.node("memories", "private")
	if errno := mem2.Rename(ctx, "plain.md", priv2, "plain.md", 0); errno != 0 {
		t.Fatalf("rename through the other view: %v", errno)
	}
	_, errno = h.Read(ctx, buf, 0)
	f.wantErrno("read after the file moved under a denied rule", errno, syscall.EACCES)
	_, errno = h.Write(ctx, []byte("v2"), 0)
	f.wantErrno("write after the file moved under a denied rule", errno, syscall.EACCES)
	// Unlinked, a file keeps the authority of its last name.
	os.Remove(filepath.Join(f.mem, "private/plain.md"))
	f.v.SetContext(guild)
	_, errno = h.Read(ctx, buf, 0)
	f.wantErrno("read of the unlinked file", errno, syscall.EACCES)
}

func TestIoctlAndSpecialFiles(t *testing.T) {
	f := newFixture(t, "", dm)
	f.write("a.md", "a")
	if err := unix.Mkfifo(filepath.Join(f.mem, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := f.node("memories", "a.md")
	_, errno := a.Ioctl(ctx, nil, 0x5801, 0, nil, nil)
	f.wantErrno("ioctl", errno, syscall.ENOTTY)
	fifo := f.node("memories", "fifo")
	_, _, errno = fifo.Open(ctx, syscall.O_RDONLY) // would block forever if opened
	f.wantErrno("open a FIFO", errno, syscall.EACCES)
}

func TestSetattrAndXattrNamespaces(t *testing.T) {
	f := newFixture(t, "", dm)
	f.write("a.md", "abc")
	ctx := context.Background()
	a := f.node("memories", "a.md")
	var attr fuse.AttrOut
	in := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_MODE | fuse.FATTR_SIZE, Mode: 0o600, Size: 1}}
	if errno := a.Setattr(ctx, nil, in, &attr); errno != 0 {
		t.Fatal(errno)
	}
	st, _ := os.Stat(filepath.Join(f.mem, "a.md"))
	if st.Mode().Perm() != 0o600 || st.Size() != 1 {
		t.Errorf("after setattr: %v size %d", st.Mode(), st.Size())
	}
	caller := &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}, Pid: uint32(os.Getpid())}, Cancel: nil}
	if os.Getuid() != 0 {
		f.wantErrno("set trusted.*", a.Setxattr(caller, "trusted.x", []byte("1"), 0), syscall.EPERM)
		f.wantErrno("set security.capability", a.Setxattr(caller, "security.capability", []byte("1"), 0), syscall.EPERM)
	}
}

func TestOnlyTheOwnerEnters(t *testing.T) {
	f := newFixture(t, "", dm)
	f.write("a.md", "a")
	other := &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: uint32(os.Getuid()) + 1, Gid: 1}, Pid: 1}}
	var out fuse.EntryOut
	_, errno := f.v.root.Lookup(other, "memories", &out)
	f.wantErrno("another uid's lookup", errno, syscall.EACCES)
	_, _, errno = f.v.root.OpendirHandle(other, 0)
	f.wantErrno("another uid's readdir", errno, syscall.EACCES)
	mem := f.node("memories")
	_, errno = mem.Lookup(other, "a.md", &out)
	f.wantErrno("another uid's lookup below", errno, syscall.EACCES)
}

// TestPanicFailsOneRequest: a panic inside an operation fails that request
// with EIO, is counted, and the next request is served.
func TestPanicFailsOneRequest(t *testing.T) {
	f := newFixture(t, "", dm)
	f.write("a.md", "a")
	f.v.host.fault = func(op opKind, name string) {
		if name == "boom" {
			panic("test fault in " + op.String())
		}
	}
	defer func() { f.v.host.fault = nil }()
	var out fuse.EntryOut
	// Requests from the view's owner (this test's uid).
	caller := fuse.Caller{Owner: fuse.Owner{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}, Pid: uint32(os.Getpid())}
	hdr := &fuse.InHeader{NodeId: 1, Caller: caller}
	if st := f.raw.Lookup(nil, hdr, "memories", &out); !st.Ok() {
		t.Fatalf("lookup memories: %v", st)
	}
	mem := &fuse.InHeader{NodeId: out.NodeId, Caller: caller}
	if st := f.raw.Lookup(nil, mem, "boom", &out); st != fuse.EIO {
		t.Fatalf("a panicking lookup answered %v, want EIO", st)
	}
	if n := f.v.Panics(); n != 1 {
		t.Fatalf("%d panics counted", n)
	}
	if st := f.raw.Lookup(nil, mem, "a.md", &out); !st.Ok() {
		t.Fatalf("the next lookup: %v", st)
	}
}

// TestSwitchesDuringReloads runs context switches, reloads and lookups at
// once (go test -race checks the view's shared state: the context, the
// epoch flag, the handle set and the authority generation).
func TestSwitchesDuringReloads(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("private/p.md", "p")
	f.write("notes/public.md", "n")
	fh, _, errno := f.node("memories", "notes", "public.md").Open(context.Background(), syscall.O_RDONLY)
	if errno != 0 {
		t.Fatal(errno)
	}
	defer fh.(*fileHandle).Release(context.Background())
	cfgs := []*acl.Config{f.rules.Load(), acl.Empty()}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				switch g {
				case 0:
					f.v.SetContext([]cctx.Set{dm, guild}[i%2])
				case 1:
					f.rules.Store(cfgs[i%2])
					f.v.Invalidate(nil)
				case 2:
					var out fuse.EntryOut
					f.v.root.Lookup(context.Background(), "memories", &out)
					fh.(*fileHandle).Read(context.Background(), make([]byte, 4), 0)
				}
			}
		}(g)
	}
	time.Sleep(300 * time.Millisecond)
	close(done)
	wg.Wait()
}
