package views

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestCreateOverHiddenHardLinkRefused: O_CREAT without O_EXCL on the
// hidden second name of a root-only file must not open it as root, return
// its bytes or chown it to the caller: a hidden name is absent for every
// operation, and the backing file is opened as the caller.
func TestCreateOverHiddenHardLinkRefused(t *testing.T) {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	secret := h.Write("memories/private/key", "SECRET")
	os.Chmod(secret, 0o600)
	os.MkdirAll(h.Path("memories/notes"), 0o777)
	if err := os.Link(secret, h.Path("memories/notes/alias")); err != nil {
		t.Fatal(err)
	}
	d := testenv.Start(t, h)
	mnt := d.OpenFor("s", testenv.Nobody, testenv.DM)
	out := testenv.AsNobody(t, "creat", mnt+"/memories/notes/alias")
	if strings.Contains(out, "SECRET") || !strings.HasPrefix(out, "errno") {
		t.Fatalf("O_CREAT on a hidden hard link: %s", out)
	}
	var st unix.Stat_t
	unix.Stat(secret, &st)
	if st.Uid != 0 || st.Mode&0o777 != 0o600 {
		t.Fatalf("the protected file changed: uid %d mode %o", st.Uid, st.Mode&0o777)
	}
}

// TestIoctlNeverRunsWithDaemonCapabilities: an ioctl through a view would
// run on the backing descriptor with the daemon's capabilities; the view
// answers ENOTTY.
func TestIoctlNeverRunsWithDaemonCapabilities(t *testing.T) {
	h := testenv.OpenHome(t, "")
	f := h.Write("workspace/f.txt", "x")
	os.Chmod(f, 0o644)
	d := testenv.Start(t, h)
	mnt := d.OpenFor("s", testenv.Nobody, []string{"tui"})
	if out := testenv.AsNobody(t, "ioctl", mnt+"/workspace/f.txt"); out != "errno ENOTTY" {
		t.Fatalf("ioctl through a view: %s", out)
	}
}

// TestCachedNameNeverReopensAnotherFile: with two views on one tree, a
// root-only file renamed onto a name the first view has cached is not read
// or chmodded through it: a node opens the inode it was decided for, or
// nothing.
func TestCachedNameNeverReopensAnotherFile(t *testing.T) {
	h := testenv.OpenHome(t, "")
	pub := h.Write("workspace/a.md", "public")
	os.Chmod(pub, 0o644)
	secret := h.Write("workspace/secret", "SECRET")
	os.Chmod(secret, 0o600)
	d := testenv.Start(t, h)
	a := d.OpenFor("a", testenv.Nobody, []string{"tui"})
	b := d.Open("b", []string{"tui"})
	if out := testenv.AsNobody(t, "cat", a+"/workspace/a.md"); out != `read "public"` {
		t.Fatalf("before: %s", out)
	}
	if err := os.Rename(b+"/workspace/secret", b+"/workspace/a.md"); err != nil {
		t.Fatal(err)
	}
	if out := testenv.AsNobody(t, "cat", a+"/workspace/a.md"); strings.Contains(out, "SECRET") {
		t.Fatalf("read through a stale name: %s", out)
	}
	if out := testenv.AsNobody(t, "chmod", a+"/workspace/a.md", "666"); out == "chmod done" {
		t.Fatal("chmod through a stale name")
	}
	var st unix.Stat_t
	unix.Stat(h.Path("workspace/a.md"), &st)
	if st.Mode&0o777 != 0o600 {
		t.Fatalf("root's file is now mode %o", st.Mode&0o777)
	}
}

// TestDirectoryHandleListsByCurrentContext: a directory descriptor opened
// before a switch lists only what the new context shows.
func TestDirectoryHandleListsByCurrentContext(t *testing.T) {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	h.Write("memories/private/p.md", "p")
	h.Write("memories/open.md", "o")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.DM)
	dir, err := os.Open(mnt + "/memories")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	d.SetContext("s", testenv.Guild)
	names, err := dir.Readdirnames(-1)
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	for _, n := range names {
		if n == "private" {
			t.Fatalf("a handle opened in a DM lists %v in a guild", names)
		}
	}
}

// TestMappedRuledFileStopsAtSwitch: ruled files use the page
// cache, so a shared mapping of one made in a DM must stop reading when the
// session moves to a guild, with the descriptor long closed.
func TestMappedRuledFileStopsAtSwitch(t *testing.T) {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	h.Write("memories/private/diary.md", "secret diary")
	testenv.ChownTree(t, h.Path("memories"), testenv.Nobody)
	d := testenv.Start(t, h)
	a := d.OpenFor("a", testenv.Nobody, testenv.DM)
	first, ask := testenv.ConverseAsNobody(t, "mmap", a+"/memories/private/diary.md")
	if first != "mapped" {
		t.Fatalf("mmap: %s", first)
	}
	if got := ask("r"); got != `read "secret diary"` {
		t.Fatalf("mapping read in a DM: %s", got)
	}
	d.SetContext("a", testenv.Guild)
	if got := ask("r"); got != "SIGBUS" {
		t.Fatalf("mapping read after the switch to a guild: %s", got)
	}
	if got := testenv.AsNobody(t, "cat", a+"/memories/private/diary.md"); got != "errno ENOENT" {
		t.Fatalf("cat after the switch: %s", got)
	}
	d.SetContext("a", testenv.DM)
	if got := ask("r"); got != `read "secret diary"` {
		t.Fatalf("mapping read after switching back: %s", got)
	}
}

// TestClosedAncestorClosesTheView: a 0700 directory above the backing
// root, which keeps uid 65534 out natively, keeps it out of the view too:
// the daemon opens backing files as the caller, not as root.
func TestClosedAncestorClosesTheView(t *testing.T) {
	h := testenv.OpenHome(t, "")
	f := h.Write("workspace/f.txt", "behind a closed door")
	os.Chmod(f, 0o644)
	d := testenv.Start(t, h)
	// The view lives outside the home, so that closing the home closes
	// only the backing tree's ancestors, not the way to the view.
	mnt, err := os.MkdirTemp("", "condfs-view")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(mnt, 0o755)
	defer os.RemoveAll(mnt)
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": []string{"tui"}, "owner": testenv.Nobody}, nil)
	defer d.Call("session.close", map[string]any{"id": "s"}, nil)
	if out := testenv.AsNobody(t, "cat", mnt+"/workspace/f.txt"); !strings.HasPrefix(out, "read") {
		t.Fatalf("before: %s", out)
	}
	// What the kernel caches (the entry, the listing) is as far behind a
	// closed ancestor as the file itself, once the watcher has seen the
	// change (it drops every view's cache).
	sh := testenv.StartShell(t)
	for _, p := range []string{"stat", "ls"} {
		if ok, res := sh.Do(p, mnt+"/workspace"); !ok {
			t.Fatalf("before: %s: %s", p, res)
		}
	}
	if err := os.Chmod(h.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(h.Root, 0o755)
	// Within the watcher's moments (events come within about 10 ms), not
	// the second or so after which some cached attributes expire anyway.
	for deadline := time.Now().Add(800 * time.Millisecond); ; time.Sleep(10 * time.Millisecond) {
		okStat, _ := sh.Do("stat", mnt+"/workspace/f.txt")
		okList, names := sh.Do("ls", mnt+"/workspace")
		if !okStat && !okList {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("800 ms after a 0700 ancestor shut 65534 out, the view still answers from its cache: stat %v, ls %v %q", okStat, okList, names)
		}
	}
	if out := testenv.AsNobody(t, "cat", h.Path("workspace/f.txt")); out != "errno EACCES" {
		t.Fatalf("natively: %s", out)
	}
	if out := testenv.AsNobody(t, "cat", mnt+"/workspace/f.txt"); strings.HasPrefix(out, "read") {
		t.Fatalf("through the view, past a 0700 ancestor: %s", out)
	}
}

// TestSharedConnectionOutOfReach: the shared connection. Every view of a root daemon is a bind
// mount of one FUSE mount (the hub). The hub itself must be out of every
// caller's reach; two sessions over the same backing tree must never
// share a node (go-fuse merges nodes with equal inode numbers, and a node
// decides with its own session's context); and a file held open in a
// view must do nothing once its session is closed.
func TestSharedConnectionOutOfReach(t *testing.T) {
	if os.Getenv("CONDFS_TEST_CONNECTIONS") == "per-session" {
		t.Log("per-session connections: no hub; the node and held-file checks still run")
	}
	h := testenv.OpenHome(t, testenv.PrivateRule)
	h.Write("memories/private/p.md", "secret")
	h.Write("memories/open.md", "open")
	testenv.ChownTree(t, h.Path("memories"), testenv.Nobody)
	d := testenv.Start(t, h)
	rootView := d.Open("root-dm", testenv.DM) // root's own session, in a DM
	mine := d.OpenFor("mine", testenv.Nobody, testenv.Guild)
	// Root's session caches the private file's node first.
	if b, err := os.ReadFile(rootView + "/memories/private/p.md"); err != nil || string(b) != "secret" {
		t.Fatalf("root's DM view: %q %v", b, err)
	}
	sh := testenv.StartShell(t)
	for _, p := range []string{"/memories/private/p.md", "/memories/private"} {
		if ok, res := sh.Do("cat", mine+p); ok {
			t.Fatalf("a guild session read %s through a node another session made: %q", p, res)
		}
	}
	if ok, names := sh.Do("ls", mine+"/memories"); !ok || strings.Contains(names, "private") {
		t.Fatalf("guild view lists %q (%v)", names, ok)
	}
	// The hub, where every session's view lives, is not reachable.
	hub := filepath.Join(filepath.Dir(d.Socket), "hub")
	if _, err := os.Stat(hub); err == nil {
		for _, p := range []string{hub, hub + "/1", hub + "/2", hub + "/2/memories/private/p.md", hub + "/1/memories/private/p.md"} {
			if ok, res := sh.Do("cat", p); ok {
				t.Fatalf("read %s through the hub: %q", p, res)
			}
			if ok, res := sh.Do("ls", p); ok {
				t.Fatalf("listed %s through the hub: %q", p, res)
			}
		}
	}
	// A file held open across session.close does nothing afterwards.
	ok, id := sh.Do("open", mine+"/memories/open.md")
	if !ok {
		t.Fatalf("open in own view: %s", id)
	}
	if ok, res := sh.Do("read", id); !ok || res != "open" {
		t.Fatalf("read before close: %q %v", res, ok)
	}
	d.Call("session.close", map[string]any{"id": "mine"}, nil)
	if ok, res := sh.Do("read", id); ok {
		t.Fatalf("a file held across session.close still reads: %q", res)
	}
	if ok, _ := sh.Do("write", id, "X"); ok {
		t.Fatal("a file held across session.close still writes")
	}
	sh.Do("close", id)
	// Root's session is untouched by the other's close.
	if b, err := os.ReadFile(rootView + "/memories/private/p.md"); err != nil || string(b) != "secret" {
		t.Fatalf("root's view after the other session closed: %q %v", b, err)
	}
}

// TestUnadmittedUidReachesNothingCached: a uid the session does not admit
// reaches nothing the kernel has cached. A path walk, a stat or a listing
// the kernel answers from its cache never reaches the daemon, so admission
// checked by the daemon alone would let uid 65534 stat (and, with listings
// cached, list) the owner's files once the owner had looked; the kernel
// checks admission too.
func TestUnadmittedUidReachesNothingCached(t *testing.T) {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	h.Write("memories/notes/a.md", "a")
	h.Write("memories/private/p.md", "p")
	testenv.ChownTree(t, h.Path("memories"), testenv.Nobody) // natively, 65534 may read all of it
	os.Chmod(h.Path("mnt"), 0o755)
	d := testenv.Start(t, h, "--cache-ttl", "1m")
	mnt := d.Open("root-view", testenv.DM) // owned by root; 65534 is not let in
	os.Chmod(filepath.Dir(mnt), 0o755)
	for _, dir := range []string{mnt, mnt + "/memories", mnt + "/memories/notes", mnt + "/memories/private"} {
		if _, err := os.ReadDir(dir); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"/memories/notes/a.md", "/memories/private/p.md"} {
		if _, err := os.ReadFile(mnt + f); err != nil {
			t.Fatal(err)
		}
	}
	sh := testenv.StartShell(t)
	if ok, res := sh.Do("stat", h.Path("memories/notes/a.md")); !ok {
		t.Fatalf("natively, 65534 stats the file: %s", res)
	}
	for _, p := range []string{"/memories", "/memories/notes", "/memories/notes/a.md", "/memories/private/p.md"} {
		if ok, res := sh.Do("stat", mnt+p); ok {
			t.Errorf("uid 65534, not admitted, stats %s in root's view: %s", p, res)
		}
		if ok, res := sh.Do("ls", mnt+p); ok {
			t.Errorf("uid 65534, not admitted, lists %s in root's view: %q", p, res)
		}
		if ok, res := sh.Do("cat", mnt+p); ok {
			t.Errorf("uid 65534, not admitted, reads %s in root's view: %q", p, res)
		}
	}
	// A view that lets 65534 in (allow_uids, an ACL entry on the root)
	// keeps every other uid out all the same.
	shared := h.Path("mnt/shared")
	d.Call("session.open", map[string]any{"id": "shared", "mount": shared, "context": testenv.DM, "allow_uids": []int{testenv.Nobody}}, nil)
	if ok, res := sh.Do("ls", shared+"/memories/notes"); !ok || res != "a.md" {
		t.Fatalf("uid 65534, admitted, lists %q (%v)", res, ok)
	}
	if ok, res := sh.Do("stat", shared+"/memories/notes/a.md"); !ok {
		t.Fatalf("uid 65534, admitted, cannot stat: %s", res)
	}
	other := testenv.CommandAs(65533, testenv.Attacker(), "cat", shared+"/memories/notes/a.md")
	if out, _ := other.CombinedOutput(); !strings.HasPrefix(string(out), "errno") {
		t.Errorf("uid 65533, not admitted, reads through a view that admits 65534: %q", out)
	}
}

// TestModeZeroStaysShut: a mode with no permission bits reaches the kernel
// as 0 (go-fuse would fill in 0755 for a directory, 0644 for a file, unless
// told not to: NullPermissions), and the kernel decides by what it is told
// (default_permissions). After a chmod 000, made through the view or in the
// backing tree, no admitted uid opens the directory, reads the listing the
// kernel kept or walks through it to cached entries, as natively.
func TestModeZeroStaysShut(t *testing.T) {
	h := testenv.OpenHome(t, "")
	for _, d := range []string{"view", "backing"} {
		h.Write("memories/"+d+"/a.md", "a")
		os.Chmod(h.Path("memories/"+d), 0o755)
		os.Chmod(h.Path("memories/"+d+"/a.md"), 0o644)
	}
	testenv.ChownTree(t, h.Path("memories"), testenv.Nobody)
	os.Chmod(h.Path("mnt"), 0o755)
	d := testenv.Start(t, h, "--cache-ttl", "1m")
	mnt := h.Path("mnt/s")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": []string{"tui"}, "owner": testenv.Nobody, "allow_uids": []int{65533}}, nil)
	owner := testenv.StartShell(t)
	shells := []struct {
		who string
		sh  *testenv.Shell
	}{{"65533 (admitted)", testenv.StartShellAs(t, 65533)}, {"65534 (the owner)", owner}}
	// Both list the directories and stat a file in each: the kernel
	// keeps the listings and the entries.
	for _, s := range shells {
		for _, dir := range []string{"view", "backing"} {
			if ok, names := s.sh.Do("ls", mnt+"/memories/"+dir); !ok || names != "a.md" {
				t.Fatalf("before: %s lists %s: %q %v", s.who, dir, names, ok)
			}
			if ok, res := s.sh.Do("stat", mnt+"/memories/"+dir+"/a.md"); !ok {
				t.Fatalf("before: %s stats %s/a.md: %s", s.who, dir, res)
			}
		}
	}
	// The owner shuts one through the view, root the other in the
	// backing tree.
	if ok, res := owner.Do("chmod", mnt+"/memories/view", "000"); !ok {
		t.Fatalf("chmod through the view: %s", res)
	}
	if err := os.Chmod(h.Path("memories/backing"), 0); err != nil {
		t.Fatal(err)
	}
	for _, s := range shells {
		if ok, res := s.sh.Do("ls", h.Path("memories/view")); ok {
			t.Fatalf("natively, %s lists a 000 directory: %q", s.who, res)
		}
		// Through the view at once (the SETATTR's answer is final); in
		// the backing tree once the watcher has told (within about 10 ms).
		if ok, res := s.sh.Do("ls", mnt+"/memories/view"); ok {
			t.Errorf("%s lists a directory its owner shut through the view: %q", s.who, res)
		}
		if ok, res := s.sh.Do("stat", mnt+"/memories/view/a.md"); ok {
			t.Errorf("%s stats a file in a directory its owner shut through the view: %s", s.who, res)
		}
		for deadline := time.Now().Add(800 * time.Millisecond); ; time.Sleep(10 * time.Millisecond) {
			okList, names := s.sh.Do("ls", mnt+"/memories/backing")
			okStat, _ := s.sh.Do("stat", mnt+"/memories/backing/a.md")
			if !okList && !okStat {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("800 ms after a chmod 000 in the backing tree, %s still lists it (%v %q) or stats below it (%v)", s.who, okList, names, okStat)
				break
			}
		}
	}
}

// TestBackingModesHold: with allow_other, another user gains nothing
// through the view that the backing modes deny (default_permissions).
func TestBackingModesHold(t *testing.T) {
	h := testenv.NewHome(t, "", "version: 1\n")
	h.Write("workspace/open.txt", "open")
	h.Write("workspace/secret.txt", "secret")
	os.Chmod(h.Path("workspace/secret.txt"), 0o600)
	d := testenv.Start(t, h)
	mnt := h.Path("mnt/s")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": []string{"tui"}, "allow_uids": []int{65534}}, nil)
	for dir := mnt; dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, h.Root) || dir == filepath.Dir(h.Root) {
			os.Chmod(dir, 0o755)
		}
	}
	as := func(args ...string) (string, error) {
		out, err := testenv.CommandAs(testenv.Nobody, args[0], args[1:]...).CombinedOutput()
		return string(out), err
	}
	if out, err := as("cat", mnt+"/workspace/open.txt"); err != nil || out != "open" {
		t.Fatalf("nobody cannot read a world-readable file: %q %v", out, err)
	}
	if out, err := as("cat", mnt+"/workspace/secret.txt"); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("nobody read a 0600 root file through the view: %q %v", out, err)
	}
	if out, err := as("touch", mnt+"/workspace/new.txt"); err == nil {
		t.Fatalf("nobody created a file in a root-owned 0755 directory: %q", out)
	}
}

// TestBackingACLsHold: the kernel decides on its own what it has cached (a
// path walk through cached entries, a stat of cached attributes), for every
// uid the view admits. It must use the backing's POSIX ACLs there, as
// natively: with mode bits alone, uid 65534, which an ACL entry denies on a
// 0755 directory, could stat a file in it once root had looked it up, and
// an ACL entry granting it a 0700 directory was refused.
func TestBackingACLsHold(t *testing.T) {
	h := testenv.NewHome(t, "", "version: 1\n")
	h.Write("workspace/denied/f.txt", "d")
	h.Write("workspace/granted/f.txt", "g")
	d := testenv.Start(t, h)
	mnt := h.Path("mnt/s")
	d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": []string{"tui"}, "allow_uids": []int{testenv.Nobody}}, nil)
	for dir := mnt; dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, h.Root) || dir == filepath.Dir(h.Root) {
			os.Chmod(dir, 0o755)
		}
	}
	os.Chmod(h.Path("workspace/denied"), 0o755)
	setACL(t, h.Path("workspace/denied"), 7, 0, 5, 5)
	os.Chmod(h.Path("workspace/granted"), 0o700)
	setACL(t, h.Path("workspace/granted"), 7, 5, 0, 0)
	stat := func(p string) error {
		out, err := testenv.CommandAs(testenv.Nobody, "stat", "-c", "%s", p).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if stat(h.Path("workspace/denied/f.txt")) == nil || stat(h.Path("workspace/granted/f.txt")) != nil {
		t.Fatal("the ACLs do not decide natively as this test expects")
	}
	for _, name := range []string{"denied", "granted"} {
		// Root looks it up first: the entries are in the kernel's cache.
		if _, err := os.Stat(mnt + "/workspace/" + name + "/f.txt"); err != nil {
			t.Fatal(err)
		}
	}
	if err := stat(mnt + "/workspace/denied/f.txt"); err == nil {
		t.Fatal("uid 65534 stat'd, through entries root had cached, a file in a directory a POSIX ACL denies it")
	}
	if err := stat(mnt + "/workspace/granted/f.txt"); err != nil {
		t.Fatalf("uid 65534 could not stat a file in a 0700 directory a POSIX ACL grants it: %v", err)
	}
}

// TestCreateModesFollowUmask: files and directories made through a view
// get the caller's mode less its umask, as natively (the daemon runs with
// umask 0; with FUSE_POSIX_ACL negotiated the kernel still applies the
// caller's umask, as no FUSE_DONT_MASK is asked for).
func TestCreateModesFollowUmask(t *testing.T) {
	defer syscall.Umask(syscall.Umask(0o027))
	h := testenv.NewHome(t, "", "version: 1\n")
	d := testenv.Start(t, h)
	mnt := d.Open("s", []string{"tui"})
	if err := os.WriteFile(mnt+"/workspace/f", nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt+"/workspace/d", 0o777); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"f": 0o640, "d": 0o750} {
		st, err := os.Stat(h.Path("workspace/" + name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Fatalf("%s made with umask 027: %v, want %v", name, st.Mode().Perm(), want)
		}
	}
}

// setACL sets a directory's access ACL: the owner's, uid 65534's, the owning
// group's and others' permissions (the mask is the group class's union).
// Written as the system.posix_acl_access xattr, so no acl tools are needed.
func setACL(t *testing.T, dir string, owner, nobodyPerm, group, other uint16) {
	t.Helper()
	const undefined = 0xffffffff
	entries := []struct {
		tag, perm uint16
		id        uint32
	}{
		{0x01, owner, undefined},              // ACL_USER_OBJ
		{0x02, nobodyPerm, testenv.Nobody},    // ACL_USER
		{0x04, group, undefined},              // ACL_GROUP_OBJ
		{0x10, group | nobodyPerm, undefined}, // ACL_MASK
		{0x20, other, undefined},              // ACL_OTHER
	}
	b := binary.LittleEndian.AppendUint32(nil, 2) // POSIX_ACL_XATTR_VERSION
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	if err := unix.Setxattr(dir, "system.posix_acl_access", b, 0); err != nil {
		t.Fatalf("set the ACL of %s: %v", dir, err)
	}
}
