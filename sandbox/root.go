package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// newRootAt is where the root is built before pivot_root. The init's mount
// namespace is private, so covering the host's /tmp there hides nothing of
// the host's: every host tree the root needs is cloned before.
const newRootAt = "/tmp"

const (
	attrRO      = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	attrData    = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC
	attrDevNode = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC
	flagsTmpfs  = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
)

// libDirs are the host's library directories: bound read-only when they are
// real directories, recreated as symlinks when they are links (usr-merge).
var libDirs = []string{"/lib", "/lib32", "/lib64", "/libx32"}

// devNodes are the device nodes of the run's /dev, bound from the host's.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// cloneTree takes a detached copy of the host mount at path (not its
// submounts) with attrs set, to be attached inside the root later. Taken
// while the host's tree is still visible, it needs no path after pivot_root.
func cloneTree(path string, attrs uint64) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("clone %s: %w", path, err)
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attrs}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("set attributes of %s: %w", path, err)
	}
	return fd, nil
}

// asOwner runs f on a locked OS thread whose filesystem uid and gid and
// groups are the run's owner's (each per thread: the raw syscalls). The
// thread is never unlocked, so it ends with the goroutine and its
// identity serves nothing else.
func asOwner(s Spec, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		groups := make([]int, len(s.Groups))
		for i, g := range s.Groups {
			groups[i] = int(g)
		}
		if !s.UserNS {
			if err := unix.Setgroups(groups); err != nil {
				errc <- fmt.Errorf("act as the owner: setgroups: %w", err)
				return
			}
		}
		unix.Setfsgid(int(s.GID))
		unix.Setfsuid(int(s.UID))
		// setfs[ug]id report no error: read them back.
		if u, _ := unix.SetfsuidRetUid(-1); u != int(s.UID) {
			errc <- fmt.Errorf("act as the owner: fsuid is %d, not %d", u, s.UID)
			return
		}
		if g, _ := unix.SetfsgidRetGid(-1); g != int(s.GID) {
			errc <- fmt.Errorf("act as the owner: fsgid is %d, not %d", g, s.GID)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// attach moves a detached clone onto target.
func attach(fd int, target string) error {
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach at %s: %w", target, err)
	}
	return nil
}

func mountTmpfs(target string, flags uintptr, data string) error {
	if err := unix.Mount("tmpfs", target, "tmpfs", flags, data); err != nil {
		return fmt.Errorf("tmpfs at %s: %w", target, err)
	}
	return nil
}

func setRO(target string) error {
	if err := unix.MountSetattr(unix.AT_FDCWD, target, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("read-only %s: %w", target, err)
	}
	return nil
}

// shown says whether p lies in a tree the run shows whole: /usr (outside
// the bin directories) or a library directory.
func (h *hostLayout) shown(p string) bool {
	for _, d := range h.binDirs {
		if under(p, d) {
			return false
		}
	}
	for _, d := range append([]string{"/usr"}, h.libs...) {
		if under(p, d) {
			return true
		}
	}
	return false
}

// hostLayout is what the init learns of the host before it hides it.
type hostLayout struct {
	links    map[string]string // /bin, /lib64, ... that are symlinks: their targets
	libs     []string          // real library directories
	binDirs  []string          // bin directories that exist as real directories
	etc      map[string][]byte // files of the run's /etc, by name
	etcLinks map[string]string // symlinks of the run's /etc (localtime)
	etcDirs  []string          // directories bound into the run's /etc
	bundle   []byte            // the run's TrustBundle: the host's and Spec.Trust; nil: the host's as it is
}

// TrustBundle is where a run finds the system's certificate bundle.
const TrustBundle = "/etc/ssl/certs/ca-certificates.crt"

func readHost(is *initSpec) (*hostLayout, error) {
	h := &hostLayout{links: map[string]string{}, etc: map[string][]byte{}, etcLinks: map[string]string{}}
	for _, d := range append(append([]string{}, libDirs...), "/bin", "/sbin") {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(d)
			if err != nil {
				return nil, err
			}
			h.links[d] = t
		case fi.IsDir() && (d == "/bin" || d == "/sbin"):
			h.binDirs = append(h.binDirs, d)
		case fi.IsDir():
			h.libs = append(h.libs, d)
		}
	}
	for _, d := range []string{"/usr/bin", "/usr/sbin", "/usr/local/bin"} {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			h.binDirs = append(h.binDirs, d)
		}
	}
	files := []string{"hosts", "nsswitch.conf", "ld.so.cache"}
	switch is.Spec.Network {
	case "host":
		files = append(files, "resolv.conf")
	case "policy":
		// The gateway is the only resolver, and no name is known ahead.
		files = files[1:]
		h.etc["resolv.conf"] = []byte("nameserver " + is.Spec.Link.Peer + "\n")
		h.etc["hosts"] = []byte("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
	}
	for _, f := range files {
		if b, err := readSmall("/etc/" + f); err == nil {
			h.etc[f] = b
		}
	}
	if fi, err := os.Lstat("/etc/localtime"); err == nil {
		if fi.Mode()&os.ModeSymlink != 0 {
			if t, err := os.Readlink("/etc/localtime"); err == nil {
				h.etcLinks["localtime"] = t
			}
		} else if b, err := readSmall("/etc/localtime"); err == nil {
			h.etc["localtime"] = b
		}
	}
	for _, d := range []string{"ssl/certs", "alternatives"} {
		if fi, err := os.Stat("/etc/" + d); err == nil && fi.IsDir() {
			h.etcDirs = append(h.etcDirs, d)
		}
	}
	if len(is.Spec.Trust) > 0 {
		host, err := readSmall(TrustBundle)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, step("trust", err)
		}
		if len(host) > 0 && host[len(host)-1] != '\n' {
			host = append(host, '\n')
		}
		h.bundle = append(host, is.Spec.Trust...)
	}
	h.etc["passwd"], h.etc["group"] = identity(is.Spec)
	return h, nil
}

// identity writes the run's passwd and group: the owner and nobody, named
// as the host names them.
func identity(s Spec) (passwd, group []byte) {
	users := hostNames("/etc/passwd")
	groups := hostNames("/etc/group")
	name := func(m map[uint32]string, id uint32, def string) string {
		if n, ok := m[id]; ok {
			return n
		}
		return def
	}
	var p, g bytes.Buffer
	fmt.Fprintf(&p, "%s:x:%d:%d::/workspace:/bin/sh\n", name(users, s.UID, "user"), s.UID, s.GID)
	if s.UID != 65534 {
		fmt.Fprintf(&p, "%s:x:65534:65534::/nonexistent:/usr/sbin/nologin\n", name(users, 65534, "nobody"))
	}
	seen := map[uint32]bool{}
	for _, id := range append([]uint32{s.GID, 65534}, s.Groups...) {
		if seen[id] {
			continue
		}
		seen[id] = true
		def := "g" + strconv.FormatUint(uint64(id), 10)
		if id == 65534 {
			def = "nogroup"
		}
		fmt.Fprintf(&g, "%s:x:%d:\n", name(groups, id, def), id)
	}
	return p.Bytes(), g.Bytes()
}

func hostNames(path string) map[uint32]string {
	m := map[uint32]string{}
	f, err := os.Open(path)
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ":")
		if len(fs) < 3 || !validName(fs[0]) {
			continue
		}
		if id, err := strconv.ParseUint(fs[2], 10, 32); err == nil {
			if _, dup := m[uint32(id)]; !dup {
				m[uint32(id)] = fs[0]
			}
		}
	}
	return m
}

func validName(n string) bool {
	if n == "" || len(n) > 32 {
		return false
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// buildRoot builds the run's root and pivots into it. It returns the live
// allowlist with the binaries of is.Spec.Allowed attached.
func buildRoot(is *initSpec) (*allowState, error) {
	s := is.Spec
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, step("private mounts", err)
	}
	h, err := readHost(is)
	if err != nil {
		return nil, step("read host", err)
	}
	// Clone every host tree the root shows while the host is visible.
	clones := map[string]int{}
	defer func() {
		for _, fd := range clones {
			unix.Close(fd)
		}
	}()
	if err := cloneHost(s, h, clones); err != nil {
		return nil, err
	}
	al, err := newAllowState(is.Entries, h, s)
	if err != nil {
		return nil, step("clone binaries", err)
	}
	ok := false
	defer func() {
		if !ok {
			al.close()
		}
	}()
	n := newRootAt
	if err := assembleRoot(n, is, h, clones, al); err != nil {
		return nil, err
	}
	if err := pivot(n); err != nil {
		return nil, step("pivot_root", err)
	}
	if err := al.set(s.Allowed, false); err != nil {
		return nil, step("binaries", err)
	}
	for _, d := range append([]string{"/", "/etc", "/dev"}, h.binDirs...) {
		if err := setRO(d); err != nil {
			return nil, step("read-only", err)
		}
	}
	// Nothing of the init (its descriptors, its memory) is for the command,
	// also on the user-namespace path where both have the same uid.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, step("dumpable", err)
	}
	ok = true
	return al, nil
}

// cloneHost takes a detached clone of every host tree the root shows, and
// of the view, into clones (by the path they take in the root).
func cloneHost(s Spec, h *hostLayout, clones map[string]int) error {
	clone := func(key, path string, attrs uint64) error {
		fd, err := cloneTree(path, attrs)
		if err != nil {
			return err
		}
		clones[key] = fd
		return nil
	}
	if err := clone("/usr", "/usr", attrRO); err != nil {
		return step("clone host", err)
	}
	for _, d := range h.libs {
		if err := clone(d, d, attrRO); err != nil {
			return step("clone host", err)
		}
	}
	for _, d := range h.etcDirs {
		if err := clone("/etc/"+d, "/etc/"+d, attrRO); err != nil {
			return step("clone host", err)
		}
	}
	for _, n := range devNodes {
		if _, err := os.Stat("/dev/" + n); err != nil {
			continue
		}
		if err := clone("/dev/"+n, "/dev/"+n, attrDevNode); err != nil {
			return step("clone host", err)
		}
	}
	// The view admits its owner (and uids it lets in), not root: the
	// init reaches it as the owner.
	if err := asOwner(s, func() error { return clone("/workspace", s.Workspace, attrData) }); err != nil {
		return step("clone workspace", err)
	}
	if err := asOwner(s, func() error { return clone("/memories", s.Memories, attrData) }); err != nil {
		return step("clone memories", err)
	}
	return nil
}

// assembleRoot builds the run's root in n (a new tmpfs) from the clones,
// before pivot_root.
func assembleRoot(n string, is *initSpec, h *hostLayout, clones map[string]int, al *allowState) error {
	s := is.Spec
	if err := mountTmpfs(n, flagsTmpfs, "mode=0755,size=1m,nr_inodes=4096"); err != nil {
		return step("new root", err)
	}
	mk := func(p string, mode os.FileMode) error { return os.MkdirAll(n+p, mode) }
	if err := mk("/usr", 0o755); err != nil {
		return step("/usr", err)
	}
	if err := attach(clones["/usr"], n+"/usr"); err != nil {
		return step("/usr", err)
	}
	for d, t := range h.links {
		if err := os.Symlink(t, n+d); err != nil {
			return step("links", err)
		}
	}
	for _, d := range h.libs {
		if err := mk(d, 0o755); err != nil {
			return step(d, err)
		}
		if err := attach(clones[d], n+d); err != nil {
			return step(d, err)
		}
	}
	// Before the bin directories' tmpfs: a cover of a directory above one
	// (/usr/local) must lie beneath it.
	for _, p := range is.NoExec {
		if err := coverNoexec(n, p); err != nil {
			return step("noexec programs", err)
		}
	}
	if err := al.attachShown(n); err != nil {
		return step("binaries", err)
	}
	for _, d := range h.binDirs {
		if err := mk(d, 0o755); err != nil {
			return step(d, err)
		}
		if err := mountTmpfs(n+d, flagsTmpfs, "mode=0755,size=256k,nr_inodes=8192"); err != nil {
			return step(d, err)
		}
	}
	if err := buildEtc(n, h, clones); err != nil {
		return step("/etc", err)
	}
	if err := buildDev(n, clones); err != nil {
		return step("/dev", err)
	}
	if err := mk("/proc", 0o555); err != nil {
		return step("/proc", err)
	}
	if err := unix.Mount("proc", n+"/proc", "proc", flagsTmpfs, ""); err != nil {
		return step("/proc", err)
	}
	if err := buildTmp(n, s.TmpSize); err != nil {
		return step("/tmp", err)
	}
	for _, d := range []string{"/workspace", "/memories"} {
		if err := mk(d, 0o755); err != nil {
			return step(d, err)
		}
		if err := attach(clones[d], n+d); err != nil {
			return step(d, err)
		}
	}
	if err := al.placeholders(n); err != nil {
		return step("binaries", err)
	}
	if err := unix.Sethostname([]byte(is.Hostname)); err != nil {
		return step("hostname", err)
	}
	if s.Network != "host" {
		if err := loopbackUp(); err != nil {
			return step("loopback", err)
		}
	}
	return nil
}

func buildEtc(n string, h *hostLayout, clones map[string]int) error {
	etc := n + "/etc"
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	if err := mountTmpfs(etc, flagsTmpfs, "mode=0755,size=4m,nr_inodes=1024"); err != nil {
		return err
	}
	for name, b := range h.etc {
		if err := os.WriteFile(etc+"/"+name, b, 0o644); err != nil {
			return err
		}
	}
	for name, t := range h.etcLinks {
		if err := os.Symlink(t, etc+"/"+name); err != nil {
			return err
		}
	}
	for _, d := range h.etcDirs {
		if err := os.MkdirAll(etc+"/"+d, 0o755); err != nil {
			return err
		}
		if err := attach(clones["/etc/"+d], etc+"/"+d); err != nil {
			return err
		}
	}
	return trustBundle(etc, h.bundle)
}

// trustBundle makes the run's TrustBundle the host's with Spec.Trust: a
// file of the run's /etc (read-only with it) bound over the host's, or
// put in its place when the host has none.
func trustBundle(etc string, bundle []byte) error {
	if bundle == nil {
		return nil
	}
	dst := etc + strings.TrimPrefix(TrustBundle, "/etc")
	if _, err := os.Stat(dst); err != nil {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, bundle, 0o644)
	}
	src := etc + "/condfs-trust.crt"
	if err := os.WriteFile(src, bundle, 0o644); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("trust bundle at %s: %w", dst, err)
	}
	// A bind mount is writable whatever its source's: read-only as /etc.
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("trust bundle at %s: read-only: %w", dst, err)
	}
	return nil
}

func buildDev(n string, clones map[string]int) error {
	dev := n + "/dev"
	if err := os.Mkdir(dev, 0o755); err != nil {
		return err
	}
	if err := mountTmpfs(dev, unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return err
	}
	for _, name := range devNodes {
		fd, ok := clones["/dev/"+name]
		if !ok {
			continue
		}
		if err := os.WriteFile(dev+"/"+name, nil, 0o666); err != nil {
			return err
		}
		if err := attach(fd, dev+"/"+name); err != nil {
			return err
		}
	}
	for name, t := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx",
	} {
		if err := os.Symlink(t, dev+"/"+name); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dev+"/pts", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("devpts: %w", err)
	}
	return os.Mkdir(dev+"/shm", 0o755)
}

// buildTmp makes /tmp and /dev/shm two directories of one tmpfs, so its size
// bounds both together. The tmpfs's own mount is dropped once both are bound.
func buildTmp(n string, size int64) error {
	scratch := n + "/.tmp"
	for _, d := range []string{scratch, n + "/tmp"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := mountTmpfs(scratch, flagsTmpfs, fmt.Sprintf("mode=0755,size=%d", size)); err != nil {
		return err
	}
	for _, b := range []struct{ dir, at string }{{"tmp", "/tmp"}, {"shm", "/dev/shm"}} {
		p := scratch + "/" + b.dir
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		if err := unix.Chmod(p, 0o1777); err != nil {
			return err
		}
		if err := unix.Mount(p, n+b.at, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", b.at, err)
		}
	}
	if err := unix.Unmount(scratch, unix.MNT_DETACH); err != nil {
		return err
	}
	return os.Remove(scratch)
}

// newTmp replaces the run's /tmp and /dev/shm (after pivot_root) with two
// directories of a new tmpfs, as buildTmp made them: the sandbox's next
// command finds them empty. The old tmpfs goes with its last mount.
func newTmp(size int64) error {
	if size == 0 {
		size = defaultTmpSize
	}
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fs)
	for k, v := range map[string]string{"mode": "0755", "size": strconv.FormatInt(size, 10)} {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return fmt.Errorf("tmpfs %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("tmpfs: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(mnt)
	for _, b := range []struct{ dir, at string }{{"tmp", "/tmp"}, {"shm", "/dev/shm"}} {
		if err := unix.Mkdirat(mnt, b.dir, 0o755); err != nil {
			return err
		}
		if err := unix.Fchmodat(mnt, b.dir, 0o1777, 0); err != nil {
			return err
		}
		sub, err := unix.OpenTree(mnt, b.dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fmt.Errorf("open_tree %s: %w", b.dir, err)
		}
		err = unix.Unmount(b.at, unix.MNT_DETACH)
		if err == nil {
			err = attach(sub, b.at)
		}
		unix.Close(sub)
		if err != nil {
			return fmt.Errorf("%s: %w", b.at, err)
		}
	}
	return nil
}

// pivot makes n the root and detaches the host's (runc's pivot_root(".", ".")).
func pivot(n string) error {
	oldRoot, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(oldRoot)
	if err := unix.Chdir(n); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return err
	}
	if err := unix.Fchdir(oldRoot); err != nil {
		return err
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	return unix.Chdir("/")
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
