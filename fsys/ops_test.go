package fsys

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

const workspaceRules = `
[workspace."/"]
when = "internal"
action = "allow"
`

// listRoot reads the root's listing as READDIR would.
func (f *fixture) listRoot() []string {
	f.t.Helper()
	ctx := context.Background()
	fh, _, errno := f.v.root.OpendirHandle(ctx, 0)
	if errno != 0 {
		f.t.Fatalf("opendir of the root: %v", errno)
	}
	d := fh.(*rootDir)
	defer d.Releasedir(ctx, 0)
	var names []string
	for {
		e, errno := d.Readdirent(ctx)
		if errno != 0 {
			f.t.Fatalf("readdir of the root: %v", errno)
		}
		if e == nil {
			return names
		}
		names = append(names, e.Name)
	}
}

// TestRootShowsDecidedSpacesAndRefusesMutations: the root lists and finds
// the spaces the context may see, each decided when handed out, and cannot
// be written.
func TestRootShowsDecidedSpacesAndRefusesMutations(t *testing.T) {
	f := newFixture(t, workspaceRules, dm)
	ctx := context.Background()
	if got := f.listRoot(); len(got) != 1 || got[0] != "memories" {
		t.Errorf("root lists %v in a DM, want memories only", got)
	}
	var out fuse.EntryOut
	if _, errno := f.v.root.Lookup(ctx, "workspace", &out); errno != syscall.ENOENT {
		t.Errorf("lookup of the hidden workspace: %v, want ENOENT", errno)
	}
	if _, errno := f.v.root.Lookup(ctx, "elsewhere", &out); errno != syscall.ENOENT {
		t.Errorf("lookup of a name that is no space: %v", errno)
	}
	internal := mustSet("internal")
	f.v.SetContext(internal)
	got := f.listRoot()
	sort.Strings(got)
	if len(got) != 2 || got[0] != "memories" || got[1] != "workspace" {
		t.Errorf("root lists %v in internal, want both spaces", got)
	}
	fh, _, _ := f.v.root.OpendirHandle(ctx, 0)
	d := fh.(*rootDir)
	if _, errno := d.Lookup(ctx, "workspace", &out); errno != syscall.ENOENT {
		t.Errorf("a listing gave a full entry for a ruled space root (%v): it is looked up on its own", errno)
	}
	if in, errno := d.Lookup(ctx, "memories", &out); errno != 0 || in == nil {
		t.Errorf("a listing gave no entry for an unruled space root: %v", errno)
	}
	if errno := d.Seekdir(ctx, 1); errno != 0 {
		t.Error(errno)
	}
	if e, _ := d.Readdirent(ctx); e == nil || e.Name != "workspace" {
		t.Errorf("after seeking to 1: %+v", e)
	}
	if errno := d.Seekdir(ctx, 9); errno != syscall.EINVAL {
		t.Errorf("seek past the end: %v", errno)
	}
	d.Releasedir(ctx, 0)

	var attr fuse.AttrOut
	f.v.root.Getattr(ctx, nil, &attr)
	if attr.Mode != syscall.S_IFDIR|0o500 || attr.Uid != uint32(os.Getuid()) {
		t.Errorf("root attributes mode %o uid %d, want 0500 and the owner", attr.Mode, attr.Uid)
	}
	if _, errno := f.v.root.Getxattr(ctx, "system.posix_acl_access", nil); errno != syscall.ENODATA {
		t.Errorf("a root with one admitted uid has an ACL (%v)", errno)
	}
	var st fuse.StatfsOut
	if errno := f.v.root.Statfs(ctx, &st); errno != 0 || st.Bsize == 0 {
		t.Errorf("statfs: %v", errno)
	}
	r := f.v.root
	for what, errno := range map[string]syscall.Errno{
		"unlink":   r.Unlink(ctx, "memories"),
		"rmdir":    r.Rmdir(ctx, "memories"),
		"rename":   r.Rename(ctx, "memories", r, "x", 0),
		"setattr":  r.Setattr(ctx, nil, &fuse.SetAttrIn{}, &attr),
		"setxattr": r.Setxattr(ctx, "user.x", nil, 0),
	} {
		if errno != syscall.EACCES {
			t.Errorf("%s on the root: %v, want EACCES", what, errno)
		}
	}
	if _, _, _, errno := r.Create(ctx, "x", 0, 0o644, &out); errno != syscall.EACCES {
		t.Errorf("create on the root: %v", errno)
	}
	if _, errno := r.Mkdir(ctx, "x", 0o755, &out); errno != syscall.EACCES {
		t.Errorf("mkdir on the root: %v", errno)
	}
	if _, errno := r.Mknod(ctx, "x", 0o644, 0, &out); errno != syscall.EACCES {
		t.Errorf("mknod on the root: %v", errno)
	}
	if _, errno := r.Symlink(ctx, "memories", "x", &out); errno != syscall.EACCES {
		t.Errorf("symlink on the root: %v", errno)
	}
	if _, errno := r.Link(ctx, r, "x", &out); errno != syscall.EACCES {
		t.Errorf("link on the root: %v", errno)
	}
	if _, errno := r.Ioctl(ctx, nil, 0, 0, nil, nil); errno != syscall.ENOTTY {
		t.Errorf("ioctl on the root: %v", errno)
	}
}

// TestRootACLForAdmittedUIDs: with other uids let in, the root carries a
// POSIX ACL naming each (sorted), r-x, and nothing for anyone else.
func TestRootACLForAdmittedUIDs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("letting other uids in needs a root daemon (allow_other)")
	}
	f := newFixture(t, "", dm)
	v, err := f.v.host.newView(Options{Mountpoint: "/nonexistent", Memories: f.mem, Workspace: f.work, Rules: f.rules, Context: dm,
		Owner: 1000, AllowUIDs: []uint32{1002, 1001, 1000}, AllowOther: true})
	if err != nil {
		t.Fatal(err)
	}
	defer v.closeBacking()
	buf := make([]byte, 256)
	n, errno := v.root.Getxattr(context.Background(), "system.posix_acl_access", buf)
	if errno != 0 {
		t.Fatal(errno)
	}
	var users []uint32
	for b := buf[4:n]; len(b) >= 8; b = b[8:] {
		if binary.NativeEndian.Uint16(b) == 0x02 {
			users = append(users, binary.NativeEndian.Uint32(b[4:]))
		}
	}
	if len(users) != 2 || users[0] != 1001 || users[1] != 1002 {
		t.Errorf("named users in the ACL: %v, want 1001 1002", users)
	}
	if _, errno := v.root.Getxattr(context.Background(), "system.posix_acl_access", buf[:4]); errno != syscall.ERANGE {
		t.Errorf("a short buffer: %v, want ERANGE", errno)
	}
}

// TestMutationsDecideEachName: every mutation decides the name it makes
// or removes: visible names are made and removed in the backing tree, a
// hidden name does not exist, a denied new name in a visible directory is
// EACCES.
func TestMutationsDecideEachName(t *testing.T) {
	f := newFixture(t, testRules, guild)
	f.write("notes/plain.md", "p")
	os.MkdirAll(filepath.Join(f.mem, "private"), 0o755)
	ctx := context.Background()
	mem := f.node("memories")
	notes := f.node("memories", "notes")
	var out fuse.EntryOut

	in, fh, _, errno := notes.Create(ctx, "new.md", uint32(os.O_RDWR), 0o600, &out)
	if errno != 0 {
		t.Fatalf("create: %v", errno)
	}
	h := fh.(*fileHandle)
	if n, errno := h.Write(ctx, []byte("hello"), 0); errno != 0 || n != 5 {
		t.Fatalf("write: %d %v", n, errno)
	}
	if errno := h.Fsync(ctx, 0); errno != 0 {
		t.Errorf("fsync: %v", errno)
	}
	if errno := h.Flush(ctx); errno != syscall.ENOSYS {
		t.Errorf("flush: %v (FLUSH is not used)", errno)
	}
	if off, errno := h.Lseek(ctx, 0, unix.SEEK_END); errno != 0 || off != 5 {
		t.Errorf("lseek to the end: %d %v", off, errno)
	}
	if errno := h.Allocate(ctx, 0, 4096, 0); errno != 0 && errno != syscall.EOPNOTSUPP {
		t.Errorf("fallocate: %v", errno)
	}
	var attr fuse.AttrOut
	if errno := h.Getattr(ctx, &attr); errno != 0 || attr.Size < 5 {
		t.Errorf("fgetattr: size %d %v", attr.Size, errno)
	}
	size := uint64(2)
	if errno := h.Setattr(ctx, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_SIZE, Size: size}}, &attr); errno != 0 || attr.Size != 2 {
		t.Errorf("ftruncate: size %d %v", attr.Size, errno)
	}
	h.Release(ctx)
	if b, _ := os.ReadFile(filepath.Join(f.mem, "notes/new.md")); string(b) != "he" {
		t.Errorf("backing file holds %q", b)
	}
	if in == nil {
		t.Fatal("create made no node")
	}
	if _, _, _, errno := notes.Create(ctx, "plain.md", uint32(os.O_RDWR|os.O_EXCL), 0o600, &out); errno != syscall.EEXIST {
		t.Errorf("create over an existing name: %v, want EEXIST", errno)
	}
	if _, errno := mem.Mkdir(ctx, "private2", 0o755, &out); errno != 0 {
		t.Errorf("mkdir: %v", errno)
	}
	if _, errno := notes.Mkdir(ctx, "secret.md", 0o755, &out); errno != syscall.EACCES {
		t.Errorf("mkdir of a denied name in a visible directory: %v, want EACCES", errno)
	}
	if _, errno := mem.Symlink(ctx, "notes/plain.md", "link.md", &out); errno != 0 {
		t.Errorf("symlink within the space: %v", errno)
	}
	if _, errno := mem.Symlink(ctx, "/etc/passwd", "out.md", &out); errno != syscall.EACCES {
		t.Errorf("symlink out of the space: %v, want EACCES", errno)
	}
	if _, errno := mem.Symlink(ctx, "../../x", "up.md", &out); errno != syscall.EACCES {
		t.Errorf("symlink climbing out: %v, want EACCES", errno)
	}
	if _, errno := mem.Mknod(ctx, "fifo", syscall.S_IFIFO|0o644, 0, &out); errno != 0 {
		t.Errorf("mknod of a fifo: %v", errno)
	}
	if errno := notes.Unlink(ctx, "new.md"); errno != 0 {
		t.Errorf("unlink: %v", errno)
	}
	if errno := mem.Rmdir(ctx, "private2"); errno != 0 {
		t.Errorf("rmdir: %v", errno)
	}
	if errno := mem.Rmdir(ctx, "private"); errno != syscall.ENOENT {
		t.Errorf("rmdir of a hidden directory: %v, want ENOENT", errno)
	}
	if _, err := os.Stat(filepath.Join(f.mem, "private")); err != nil {
		t.Error("the hidden directory was removed")
	}
	if _, errno := notes.Link(ctx, f.node("memories", "notes", "plain.md"), "again.md", &out); errno != syscall.EPERM {
		t.Errorf("link in a space with rules: %v, want EPERM", errno)
	}
	if f.denials.Load() == 0 {
		t.Error("no denial audited")
	}
}

// TestXattrsAndSetattr: attributes are changed and read through the
// decided entry; privileged namespaces are refused.
func TestXattrsAndSetattr(t *testing.T) {
	f := newFixture(t, testRules, dm)
	p := f.write("a.md", "abc")
	ctx := context.Background()
	n := f.node("memories", "a.md")
	var attr fuse.AttrOut
	in := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_MODE, Mode: 0o600}}
	if errno := n.Setattr(ctx, nil, in, &attr); errno != 0 {
		t.Fatalf("chmod: %v", errno)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v after chmod", st.Mode())
	}
	in = &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_SIZE, Size: 1}}
	if errno := n.Setattr(ctx, nil, in, &attr); errno != 0 {
		t.Fatalf("truncate: %v", errno)
	}
	in = &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_MTIME, Mtime: 1000}}
	if errno := n.Setattr(ctx, nil, in, &attr); errno != 0 {
		t.Fatalf("utimens: %v", errno)
	}
	if st, _ := os.Stat(p); st.Size() != 1 || st.ModTime().Unix() != 1000 {
		t.Errorf("size %d mtime %v after truncate and utimens", st.Size(), st.ModTime())
	}
	if errno := n.Setxattr(ctx, "user.k", []byte("v"), 0); errno != 0 && errno != syscall.EOPNOTSUPP {
		t.Fatalf("setxattr: %v", errno)
	} else if errno == 0 {
		buf := make([]byte, 16)
		if sz, errno := n.Getxattr(ctx, "user.k", buf); errno != 0 || string(buf[:sz]) != "v" {
			t.Errorf("getxattr: %q %v", buf[:sz], errno)
		}
		if sz, errno := n.Listxattr(ctx, buf); errno != 0 || string(buf[:sz]) != "user.k\x00" {
			t.Errorf("listxattr: %q %v", buf[:sz], errno)
		}
		if errno := n.Removexattr(ctx, "user.k"); errno != 0 {
			t.Errorf("removexattr: %v", errno)
		}
	}
	// A caller other than root: only user.*, POSIX ACLs, and reading
	// security.* (a root daemon acting as it keeps CAP_SYS_ADMIN).
	caller := fuse.NewContext(ctx, &fuse.Caller{Owner: fuse.Owner{Uid: 1000, Gid: 1000}})
	for attr, want := range map[string][2]bool{
		"user.k": {true, true}, "system.posix_acl_access": {true, true}, "system.posix_acl_default": {true, true},
		"security.capability": {true, false}, "trusted.overlay": {false, false}, "system.other": {false, false},
	} {
		if r, w := xattrAllowed(caller, attr, false), xattrAllowed(caller, attr, true); r != want[0] || w != want[1] {
			t.Errorf("%s: read %v write %v, want %v", attr, r, w, want)
		}
	}
	if !xattrAllowed(ctx, "trusted.x", true) {
		t.Error("the daemon's own request was refused a namespace")
	}
	var sfs fuse.StatfsOut
	if errno := n.Statfs(ctx, &sfs); errno != 0 {
		t.Errorf("statfs: %v", errno)
	}
	if _, errno := n.Readlink(ctx); errno != syscall.EINVAL {
		t.Errorf("readlink of a file: %v, want EINVAL", errno)
	}
}

// TestLocksAreDecided: a lock call on a handle decides like a read; once
// the handle is denied, only releases go through.
func TestLocksAreDecided(t *testing.T) {
	f := newFixture(t, testRules, dm)
	f.write("private/l.md", "x")
	ctx := context.Background()
	h := f.openRead("private", "l.md")
	lk := fuse.FileLock{Start: 0, End: 10, Typ: syscall.F_RDLCK}
	var out fuse.FileLock
	if errno := h.Getlk(ctx, 1, &lk, 0, &out); errno != 0 {
		t.Fatalf("getlk: %v", errno)
	}
	if errno := h.Setlk(ctx, 1, &lk, 0); errno != 0 {
		t.Fatalf("setlk: %v", errno)
	}
	if errno := h.Setlkw(ctx, 1, &lk, 0); errno != 0 {
		t.Fatalf("setlkw of a free lock: %v", errno)
	}
	f.v.SetContext(guild)
	if errno := h.Setlk(ctx, 1, &lk, 0); errno != syscall.EACCES {
		t.Errorf("setlk after the switch: %v, want EACCES", errno)
	}
	unlock := fuse.FileLock{Start: 0, End: 10, Typ: syscall.F_UNLCK}
	if errno := h.Setlk(ctx, 1, &unlock, 0); errno != 0 {
		t.Errorf("a release after the switch: %v", errno)
	}
}
