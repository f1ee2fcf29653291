package integration

// The attack suite: every attack that once worked against condfs, run
// against the real daemon and real mounts, the attacker a real unprivileged
// uid (setpriv). Each test names the class of issue 8 it keeps closed; each
// of them passed (the attack worked) before the fix that closed it.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/control"
)

const nobody = 65534

// openHome is a home whose directories other users may search, as a real
// agent home is (t.TempDir is 0700, which would refuse them natively).
func openHome(t *testing.T, conditions string) *home {
	t.Helper()
	h := newHome(t, conditions, "version: 1\n")
	for _, dir := range []string{h.root, filepath.Dir(h.root)} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// asNobody runs the attacker (or, with a leading "condfs", the condfs
// binary) as uid and gid 65534 with no groups, and returns its output.
func asNobody(t *testing.T, args ...string) string {
	t.Helper()
	bin := attackerBin
	if len(args) > 0 && args[0] == "condfs" {
		bin, args = condfsBin, args[1:]
	}
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", bin}, args...)...)
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

// converseAsNobody starts the attacker as uid and gid 65534 for a
// subcommand that answers stdin line by line; it returns the first line and
// a function that sends a line and returns the answer.
func converseAsNobody(t *testing.T, args ...string) (string, func(string) string) {
	t.Helper()
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", attackerBin}, args...)...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("attacker %v exited at once", args)
	}
	return lines.Text(), func(line string) string {
		t.Helper()
		fmt.Fprintln(stdin, line)
		if !lines.Scan() {
			t.Fatal("attacker exited")
		}
		return lines.Text()
	}
}

// openFor opens a session served to uid owner.
func (d *daemon) openFor(id string, owner int, context any) string {
	d.t.Helper()
	mnt := d.home.path("mnt/" + id)
	d.call("session.open", map[string]any{"id": id, "mount": mnt, "context": context, "owner": owner}, nil)
	return mnt
}

func chownTree(t *testing.T, root string, uid int) {
	t.Helper()
	filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			os.Lchown(p, uid, uid)
		}
		return nil
	})
}

// Class 1: O_CREAT without O_EXCL on the hidden second name of a root-only
// file opened it as root, returned its bytes and chowned it to the caller.
func TestAttackCreateOverHiddenHardLink(t *testing.T) {
	h := openHome(t, privateRule)
	secret := h.write("memories/private/key", "SECRET")
	os.Chmod(secret, 0o600)
	os.MkdirAll(h.path("memories/notes"), 0o777)
	if err := os.Link(secret, h.path("memories/notes/alias")); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, h)
	mnt := d.openFor("s", nobody, dmCtx)
	out := asNobody(t, "creat", mnt+"/memories/notes/alias")
	if strings.Contains(out, "SECRET") || !strings.HasPrefix(out, "errno") {
		t.Fatalf("O_CREAT on a hidden hard link: %s", out)
	}
	var st unix.Stat_t
	unix.Stat(secret, &st)
	if st.Uid != 0 || st.Mode&0o777 != 0o600 {
		t.Fatalf("the protected file changed: uid %d mode %o", st.Uid, st.Mode&0o777)
	}
}

// Class 2: ioctl ran on the backing fd with the daemon's capabilities.
func TestAttackIoctl(t *testing.T) {
	h := openHome(t, "")
	f := h.write("workspace/f.txt", "x")
	os.Chmod(f, 0o644)
	d := startDaemon(t, h)
	mnt := d.openFor("s", nobody, []string{"tui"})
	if out := asNobody(t, "ioctl", mnt+"/workspace/f.txt"); out != "errno ENOTTY" {
		t.Fatalf("ioctl through a view: %s", out)
	}
}

// Class 3: with two views on one tree, a root-only file renamed onto a name
// the first view had cached was read and chmodded through it.
func TestAttackReopenByPath(t *testing.T) {
	h := openHome(t, "")
	pub := h.write("workspace/a.md", "public")
	os.Chmod(pub, 0o644)
	secret := h.write("workspace/secret", "SECRET")
	os.Chmod(secret, 0o600)
	d := startDaemon(t, h)
	a := d.openFor("a", nobody, []string{"tui"})
	b := d.open("b", []string{"tui"})
	if out := asNobody(t, "cat", a+"/workspace/a.md"); out != `read "public"` {
		t.Fatalf("before: %s", out)
	}
	if err := os.Rename(b+"/workspace/secret", b+"/workspace/a.md"); err != nil {
		t.Fatal(err)
	}
	if out := asNobody(t, "cat", a+"/workspace/a.md"); strings.Contains(out, "SECRET") {
		t.Fatalf("read through a stale name: %s", out)
	}
	if out := asNobody(t, "chmod", a+"/workspace/a.md", "666"); out == "chmod done" {
		t.Fatal("chmod through a stale name")
	}
	var st unix.Stat_t
	unix.Stat(h.path("workspace/a.md"), &st)
	if st.Mode&0o777 != 0o600 {
		t.Fatalf("root's file is now mode %o", st.Mode&0o777)
	}
}

// Class 4: a uid admitted with --allow-uid used the daemon's mount(2):
// over root-owned directories, creating directories anywhere, unmounting
// what a swapped symlink named, and switching or closing others' sessions.
func TestAttackSocketLendsMount(t *testing.T) {
	h := openHome(t, "")
	mountRoot := h.path("views")
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666", "--mount-root", mountRoot)
	os.Chmod(filepath.Dir(d.socket), 0o755)
	rootOnly := h.path("rootonly")
	os.Mkdir(rootOnly, 0o700)
	ctl := func(args ...string) string {
		return asNobody(t, append([]string{"condfs", "ctl", "--socket", d.socket}, args...)...)
	}
	if out := ctl("open", "x", rootOnly, "--context", "tui"); !strings.Contains(out, "may mount only") {
		t.Fatalf("mount over a root-owned directory: %s", out)
	}
	fresh := h.path("nowhere/a/b")
	if out := ctl("open", "y", fresh, "--context", "tui"); strings.Contains(out, "mounted at") {
		t.Fatalf("mount on a new path: %s", out)
	}
	if _, err := os.Stat(h.path("nowhere")); err == nil {
		t.Fatal("the daemon created directories for an unprivileged peer")
	}
	// A symlink anywhere on the way is refused, so a swap cannot redirect
	// the mount or, later, the unmount.
	own := h.path("own")
	os.Mkdir(own, 0o755)
	os.Chown(own, nobody, nobody)
	link := h.path("link")
	os.Symlink(own, link)
	if out := ctl("open", "z", link, "--context", "tui"); !strings.Contains(out, "symlink") {
		t.Fatalf("mount through a symlink: %s", out)
	}
	// What it may do: an empty directory it owns, or under --mount-root.
	if out := ctl("open", "mine", own, "--context", "tui"); !strings.Contains(out, "mounted at") {
		t.Fatalf("mount on its own empty directory: %s", out)
	}
	if out := ctl("open", "under", mountRoot+"/under", "--context", "tui"); !strings.Contains(out, "mounted at") {
		t.Fatalf("mount under --mount-root: %s", out)
	}
	// Another uid's session is not its to read, switch or close.
	d.open("rootsess", []string{"tui"})
	for _, args := range [][]string{{"close", "rootsess"}, {"context", "rootsess", "discord:dm"}, {"blocks", "rootsess"}} {
		if out := ctl(args...); !strings.Contains(out, "belongs to another user") {
			t.Fatalf("ctl %v on root's session: %s", args, out)
		}
	}
	if out := ctl("list"); strings.Contains(out, "rootsess") || !strings.Contains(out, "mine") {
		t.Fatalf("session.list shows nobody: %s", out)
	}
	if out := ctl("close", "mine"); !strings.Contains(out, "closed") {
		t.Fatalf("close its own session: %s", out)
	}
}

// Class 5: RENAME_EXCHANGE of an unruled directory with one holding a ruled
// path carried the denied file out from under its rule.
func TestAttackRenameExchange(t *testing.T) {
	const rules = `
[memories."/box/secret.md"]
when = "discord:dm"
action = "allow"
`
	h := openHome(t, rules)
	h.write("memories/box/secret.md", "SECRET")
	h.write("memories/open/readme.md", "r")
	chownTree(t, h.path("memories"), nobody)
	d := startDaemon(t, h)
	mnt := d.openFor("s", nobody, guildCtx)
	if out := asNobody(t, "exchange", mnt+"/memories/open", mnt+"/memories/box"); out != "errno EACCES" {
		t.Fatalf("RENAME_EXCHANGE: %s", out)
	}
	if _, err := os.Stat(h.path("memories/box/secret.md")); err != nil {
		t.Fatal("the protected file moved")
	}
	if out := asNobody(t, "cat", mnt+"/memories/open/secret.md"); strings.Contains(out, "SECRET") {
		t.Fatalf("the protected file is readable: %s", out)
	}
}

// Class 6: an unruled file opened read-write, renamed under a rule through
// another view, then denied by the context, kept reading and writing
// through its passthrough handle.
func TestAttackHandleOutlivesRename(t *testing.T) {
	const rules = `
[workspace."/private/"]
when = "discord:dm"
action = "allow"
`
	h := openHome(t, rules)
	f := h.write("workspace/plain.md", "v1")
	os.MkdirAll(h.path("workspace/private"), 0o755)
	os.Chown(f, nobody, nobody)
	d := startDaemon(t, h)
	a := d.openFor("a", nobody, guildCtx)
	b := d.open("b", dmCtx)
	first, ask := converseAsNobody(t, "hold", a+"/workspace/plain.md")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	if got := ask("r"); got != `read "v1"` {
		t.Fatalf("read before: %s", got)
	}
	if err := os.Rename(b+"/workspace/plain.md", b+"/workspace/private/plain.md"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(b+"/workspace/private/plain.md", []byte("v2 private"), 0o644)
	if got := ask("r"); got != "errno EACCES" {
		t.Fatalf("read after the file moved under a denied rule: %s", got)
	}
	if got := ask("w"); got != "errno EACCES" {
		t.Fatalf("write after the file moved under a denied rule: %s", got)
	}
}

// Class 7: a few MB of nested "[" in conditions.toml overflowed the stack
// on reload, a 600-byte YAML alias bomb exhausted memory, a FIFO at a config
// path hung status, and an empty file on reload dropped every rule.
func TestAttackHostileConfig(t *testing.T) {
	h := openHome(t, privateRule)
	h.write("memories/private/p.md", "p")
	d := startDaemon(t, h)
	mnt := d.open("s", guildCtx)
	status := func() (gen int, errMsg string) {
		var st struct {
			Config map[string]struct {
				Generation int     `json:"generation"`
				Error      *string `json:"error"`
			} `json:"config"`
		}
		d.call("config.reload", map[string]any{}, nil)
		d.call("status", map[string]any{}, &st)
		c := st.Config["conditions"]
		if c.Error != nil {
			errMsg = *c.Error
		}
		return c.Generation, errMsg + " | " + fmt.Sprint(st.Config["policy"].Error != nil)
	}
	check := func(what string) {
		t.Helper()
		if exists(mnt + "/memories/private/p.md") {
			t.Fatalf("%s opened a denied path", what)
		}
		if !exists(mnt + "/memories") {
			t.Fatalf("%s: the view stopped answering", what)
		}
	}
	h.write("config/conditions.toml", strings.Repeat("[", 3<<20))
	if _, msg := status(); !strings.Contains(msg, "nested deeper") {
		t.Fatalf("deep TOML: %s", msg)
	}
	check("deep TOML")
	bomb := "version: 1\nconsts:\n  a: &a [x,x,x,x,x,x,x,x,x]\n"
	for i, c := range "bcdefghi" {
		prev := string("abcdefghi"[i])
		bomb += fmt.Sprintf("  %c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, prev, prev, prev, prev, prev, prev, prev, prev, prev)
	}
	bomb += "roles:\n  default:\n    tools: {}\n"
	h.write("config/policy.yaml", bomb)
	if _, msg := status(); !strings.HasSuffix(msg, "true") {
		t.Fatalf("alias bomb loaded: %s", msg)
	}
	out, err := exec.Command(condfsBin, "policy", "lint", h.path("config/policy.yaml")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "expand") {
		t.Fatalf("policy lint on an alias bomb: %v %s", err, out)
	}
	os.Remove(h.path("config/conditions.toml"))
	if err := unix.Mkfifo(h.path("config/conditions.toml"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() { _, msg := status(); done <- msg }()
	select {
	case msg := <-done:
		if !strings.Contains(msg, "regular file") {
			t.Fatalf("FIFO: %s", msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a FIFO at the config path hung status")
	}
	check("FIFO")
	os.Remove(h.path("config/conditions.toml"))
	h.write("config/conditions.toml", "")
	if _, msg := status(); !strings.Contains(msg, "empty") {
		t.Fatalf("empty conditions.toml: %s", msg)
	}
	check("empty conditions.toml")
}

// Class 8: a session.open whose mountpoint hangs held the daemon's lock:
// every other session's context.set and status hung with it.
func TestAttackHungOpen(t *testing.T) {
	h := openHome(t, privateRule)
	h.write("memories/private/p.md", "p")
	d := startDaemon(t, h)
	mnt := d.open("s", dmCtx)
	// A FUSE filesystem that never answers: mounted, its fd never read.
	hung := h.path("hung")
	os.Mkdir(hung, 0o755)
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("hung", hung, "fuse.hung", 0, fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			unix.Unmount(hung, unix.MNT_DETACH)
			unix.Close(fd)
		}
	}
	defer release()
	go func() {
		c, err := control.Dial(d.socket)
		if err != nil {
			return
		}
		defer c.Close()
		c.Call("session.open", map[string]any{"id": "stuck", "mount": hung + "/sub", "context": []string{"tui"}}, nil)
	}()
	time.Sleep(300 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		c, err := control.Dial(d.socket)
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		if err := c.Call("context.set", map[string]any{"session": "s", "context": guildCtx}, nil); err != nil {
			done <- err
			return
		}
		done <- c.Call("status", map[string]any{}, nil)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a hung session.open stalled another session's context.set")
	}
	if exists(mnt + "/memories/private/p.md") {
		t.Fatal("the switched session still sees its old context")
	}
	release()
}

// Class 9: a directory fd opened before a switch listed names the new
// context denies.
func TestAttackStaleDirectoryHandle(t *testing.T) {
	h := openHome(t, privateRule)
	h.write("memories/private/p.md", "p")
	h.write("memories/open.md", "o")
	d := startDaemon(t, h)
	mnt := d.open("s", dmCtx)
	dir, err := os.Open(mnt + "/memories")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	d.setContext("s", guildCtx)
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

// Class 12 (a guard for new surface, never a hole): ruled files use the page
// cache, so a shared mapping of one made in a DM must stop reading when the
// session moves to a guild, with the descriptor long closed.
func TestAttackMappedRuledFile(t *testing.T) {
	h := openHome(t, privateRule)
	h.write("memories/private/diary.md", "secret diary")
	chownTree(t, h.path("memories"), nobody)
	d := startDaemon(t, h)
	a := d.openFor("a", nobody, dmCtx)
	first, ask := converseAsNobody(t, "mmap", a+"/memories/private/diary.md")
	if first != "mapped" {
		t.Fatalf("mmap: %s", first)
	}
	if got := ask("r"); got != `read "secret diary"` {
		t.Fatalf("mapping read in a DM: %s", got)
	}
	d.setContext("a", guildCtx)
	if got := ask("r"); got != "SIGBUS" {
		t.Fatalf("mapping read after the switch to a guild: %s", got)
	}
	if got := asNobody(t, "cat", a+"/memories/private/diary.md"); got != "errno ENOENT" {
		t.Fatalf("cat after the switch: %s", got)
	}
	d.setContext("a", dmCtx)
	if got := ask("r"); got != `read "secret diary"` {
		t.Fatalf("mapping read after switching back: %s", got)
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// Class 10 (lower): the daemon opened backing files as root, so a 0700
// directory above the backing root, which keeps uid 65534 out natively, did
// not keep it out of the view.
func TestAttackAncestorsAboveTheBackingRoot(t *testing.T) {
	h := openHome(t, "")
	f := h.write("workspace/f.txt", "behind a closed door")
	os.Chmod(f, 0o644)
	d := startDaemon(t, h)
	// The view lives outside the home, so that closing the home closes
	// only the backing tree's ancestors, not the way to the view.
	mnt, err := os.MkdirTemp("", "condfs-view")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(mnt, 0o755)
	defer os.RemoveAll(mnt)
	d.call("session.open", map[string]any{"id": "s", "mount": mnt, "context": []string{"tui"}, "owner": nobody}, nil)
	defer d.call("session.close", map[string]any{"id": "s"}, nil)
	if out := asNobody(t, "cat", mnt+"/workspace/f.txt"); !strings.HasPrefix(out, "read") {
		t.Fatalf("before: %s", out)
	}
	// What the kernel caches (the entry, the listing) is as far behind a
	// closed ancestor as the file itself, once the watcher has seen the
	// change (it drops every view's cache).
	sh := startShell(t)
	for _, p := range []string{"stat", "ls"} {
		if ok, res := sh.do(p, mnt+"/workspace"); !ok {
			t.Fatalf("before: %s: %s", p, res)
		}
	}
	if err := os.Chmod(h.root, 0o700); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(h.root, 0o755)
	// Within the watcher's moments (events come within about 10 ms), not
	// the second or so after which some cached attributes expire anyway.
	for deadline := time.Now().Add(800 * time.Millisecond); ; time.Sleep(10 * time.Millisecond) {
		okStat, _ := sh.do("stat", mnt+"/workspace/f.txt")
		okList, names := sh.do("ls", mnt+"/workspace")
		if !okStat && !okList {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("800 ms after a 0700 ancestor shut 65534 out, the view still answers from its cache: stat %v, ls %v %q", okStat, okList, names)
		}
	}
	if out := asNobody(t, "cat", h.path("workspace/f.txt")); out != "errno EACCES" {
		t.Fatalf("natively: %s", out)
	}
	if out := asNobody(t, "cat", mnt+"/workspace/f.txt"); strings.HasPrefix(out, "read") {
		t.Fatalf("through the view, past a 0700 ancestor: %s", out)
	}
}

// Class 11: the shared connection. Every view of a root daemon is a bind
// mount of one FUSE mount (the hub). The hub itself must be out of every
// caller's reach; two sessions over the same backing tree must never
// share a node (go-fuse merges nodes with equal inode numbers, and a node
// decides with its own session's context); and a file held open in a
// view must do nothing once its session is closed.
func TestAttackSharedConnection(t *testing.T) {
	if os.Getenv("CONDFS_TEST_CONNECTIONS") == "per-session" {
		t.Log("per-session connections: no hub; the node and held-file checks still run")
	}
	h := openHome(t, privateRule)
	h.write("memories/private/p.md", "secret")
	h.write("memories/open.md", "open")
	chownTree(t, h.path("memories"), nobody)
	d := startDaemon(t, h)
	rootView := d.open("root-dm", dmCtx) // root's own session, in a DM
	mine := d.openFor("mine", nobody, guildCtx)
	// Root's session caches the private file's node first.
	if b, err := os.ReadFile(rootView + "/memories/private/p.md"); err != nil || string(b) != "secret" {
		t.Fatalf("root's DM view: %q %v", b, err)
	}
	sh := startShell(t)
	for _, p := range []string{"/memories/private/p.md", "/memories/private"} {
		if ok, res := sh.do("cat", mine+p); ok {
			t.Fatalf("a guild session read %s through a node another session made: %q", p, res)
		}
	}
	if ok, names := sh.do("ls", mine+"/memories"); !ok || strings.Contains(names, "private") {
		t.Fatalf("guild view lists %q (%v)", names, ok)
	}
	// The hub, where every session's view lives, is not reachable.
	hub := filepath.Join(filepath.Dir(d.socket), "hub")
	if _, err := os.Stat(hub); err == nil {
		for _, p := range []string{hub, hub + "/1", hub + "/2", hub + "/2/memories/private/p.md", hub + "/1/memories/private/p.md"} {
			if ok, res := sh.do("cat", p); ok {
				t.Fatalf("read %s through the hub: %q", p, res)
			}
			if ok, res := sh.do("ls", p); ok {
				t.Fatalf("listed %s through the hub: %q", p, res)
			}
		}
	}
	// A file held open across session.close does nothing afterwards.
	ok, id := sh.do("open", mine+"/memories/open.md")
	if !ok {
		t.Fatalf("open in own view: %s", id)
	}
	if ok, res := sh.do("read", id); !ok || res != "open" {
		t.Fatalf("read before close: %q %v", res, ok)
	}
	d.call("session.close", map[string]any{"id": "mine"}, nil)
	if ok, res := sh.do("read", id); ok {
		t.Fatalf("a file held across session.close still reads: %q", res)
	}
	if ok, _ := sh.do("write", id, "X"); ok {
		t.Fatal("a file held across session.close still writes")
	}
	sh.do("close", id)
	// Root's session is untouched by the other's close.
	if b, err := os.ReadFile(rootView + "/memories/private/p.md"); err != nil || string(b) != "secret" {
		t.Fatalf("root's view after the other session closed: %q %v", b, err)
	}
}

// Class 12: a uid the session does not admit reached what the kernel had
// cached. Admission was checked by the daemon only, and a path walk, a stat
// or a listing the kernel answers from its cache never reaches the daemon:
// once the owner had looked, uid 65534 could stat the owner's files through
// the owner's view (and, with listings cached, list its directories).
func TestAttackNotAdmitted(t *testing.T) {
	h := openHome(t, privateRule)
	h.write("memories/notes/a.md", "a")
	h.write("memories/private/p.md", "p")
	chownTree(t, h.path("memories"), nobody) // natively, 65534 may read all of it
	os.Chmod(h.path("mnt"), 0o755)
	d := startDaemon(t, h, "--cache-ttl", "1m")
	mnt := d.open("root-view", dmCtx) // owned by root; 65534 is not let in
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
	sh := startShell(t)
	if ok, res := sh.do("stat", h.path("memories/notes/a.md")); !ok {
		t.Fatalf("natively, 65534 stats the file: %s", res)
	}
	for _, p := range []string{"/memories", "/memories/notes", "/memories/notes/a.md", "/memories/private/p.md"} {
		if ok, res := sh.do("stat", mnt+p); ok {
			t.Errorf("uid 65534, not admitted, stats %s in root's view: %s", p, res)
		}
		if ok, res := sh.do("ls", mnt+p); ok {
			t.Errorf("uid 65534, not admitted, lists %s in root's view: %q", p, res)
		}
		if ok, res := sh.do("cat", mnt+p); ok {
			t.Errorf("uid 65534, not admitted, reads %s in root's view: %q", p, res)
		}
	}
	// A view that lets 65534 in (allow_uids, an ACL entry on the root)
	// keeps every other uid out all the same.
	shared := h.path("mnt/shared")
	d.call("session.open", map[string]any{"id": "shared", "mount": shared, "context": dmCtx, "allow_uids": []int{nobody}}, nil)
	if ok, res := sh.do("ls", shared+"/memories/notes"); !ok || res != "a.md" {
		t.Fatalf("uid 65534, admitted, lists %q (%v)", res, ok)
	}
	if ok, res := sh.do("stat", shared+"/memories/notes/a.md"); !ok {
		t.Fatalf("uid 65534, admitted, cannot stat: %s", res)
	}
	other := exec.Command("setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", attackerBin, "cat", shared+"/memories/notes/a.md")
	if out, _ := other.CombinedOutput(); !strings.HasPrefix(string(out), "errno") {
		t.Errorf("uid 65533, not admitted, reads through a view that admits 65534: %q", out)
	}
}

// Class 13: a mode with no permission bits reached the kernel as 0755 (a
// directory; 0644 a file): go-fuse fills in a zero mode unless told not to
// (NullPermissions), and the kernel decides by what it is told
// (default_permissions). After a chmod 000, made through the view or in the
// backing tree, every admitted uid went on opening the directory, reading
// the listing the kernel kept and walking through it to cached entries,
// all of which native refuses, until the watcher's drop sent the next
// request to the daemon.
func TestAttackModeZeroShut(t *testing.T) {
	h := openHome(t, "")
	for _, d := range []string{"view", "backing"} {
		h.write("memories/"+d+"/a.md", "a")
		os.Chmod(h.path("memories/"+d), 0o755)
		os.Chmod(h.path("memories/"+d+"/a.md"), 0o644)
	}
	chownTree(t, h.path("memories"), nobody)
	os.Chmod(h.path("mnt"), 0o755)
	d := startDaemon(t, h, "--cache-ttl", "1m")
	mnt := h.path("mnt/s")
	d.call("session.open", map[string]any{"id": "s", "mount": mnt, "context": []string{"tui"}, "owner": nobody, "allow_uids": []int{65533}}, nil)
	owner := startShell(t)
	shells := []struct {
		who string
		sh  *shellProc
	}{{"65533 (admitted)", startShellAs(t, 65533)}, {"65534 (the owner)", owner}}
	// Both list the directories and stat a file in each: the kernel
	// keeps the listings and the entries.
	for _, s := range shells {
		for _, dir := range []string{"view", "backing"} {
			if ok, names := s.sh.do("ls", mnt+"/memories/"+dir); !ok || names != "a.md" {
				t.Fatalf("before: %s lists %s: %q %v", s.who, dir, names, ok)
			}
			if ok, res := s.sh.do("stat", mnt+"/memories/"+dir+"/a.md"); !ok {
				t.Fatalf("before: %s stats %s/a.md: %s", s.who, dir, res)
			}
		}
	}
	// The owner shuts one through the view, root the other in the
	// backing tree.
	if ok, res := owner.do("chmod", mnt+"/memories/view", "000"); !ok {
		t.Fatalf("chmod through the view: %s", res)
	}
	if err := os.Chmod(h.path("memories/backing"), 0); err != nil {
		t.Fatal(err)
	}
	for _, s := range shells {
		if ok, res := s.sh.do("ls", h.path("memories/view")); ok {
			t.Fatalf("natively, %s lists a 000 directory: %q", s.who, res)
		}
		// Through the view at once (the SETATTR's answer is final); in
		// the backing tree once the watcher has told (within about 10 ms).
		if ok, res := s.sh.do("ls", mnt+"/memories/view"); ok {
			t.Errorf("%s lists a directory its owner shut through the view: %q", s.who, res)
		}
		if ok, res := s.sh.do("stat", mnt+"/memories/view/a.md"); ok {
			t.Errorf("%s stats a file in a directory its owner shut through the view: %s", s.who, res)
		}
		for deadline := time.Now().Add(800 * time.Millisecond); ; time.Sleep(10 * time.Millisecond) {
			okList, names := s.sh.do("ls", mnt+"/memories/backing")
			okStat, _ := s.sh.do("stat", mnt+"/memories/backing/a.md")
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
