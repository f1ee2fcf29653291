package changes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// A layer is mounted afresh after every commit and discard (and when the
// backing tree changes beneath it): overlayfs never looks again at a lower
// entry it has looked up (ext4 and most filesystems have no revalidation
// for it to ask), so a mount that has seen a file keeps showing the inode
// it saw after another writer renames a new file over it, and a directory
// removed and made again in the backing tree as it was. A new mount over
// the same upper directory looks everything up again. Each mount has a
// work directory of its own (work/SPACE/gN): the mount it replaces is
// detached, not gone, while a descriptor opened on it lives, and two
// mounts never share one. The work directories of earlier mounts are
// removed once the new one is up (a copy-up through a descriptor of a
// detached mount then fails: it never lands in the layer unseen), and all
// of them when the layer opens.

// mountSlots bounds the layers mounted at once, across the daemon: one
// change to a backing tree that many staged sessions share remounts each
// of them, and each mount at once would be a thread blocked in mount(2)
// per session (the Go runtime ends the process at 10,000), or, in a daemon
// that is not root, a child process and its memory per session. A mount
// waiting for a slot holds back its own view only.
var mountSlots = make(chan struct{}, max(4, 2*runtime.NumCPU()))

// mountSpace mounts sp's merged directory with a fresh work directory,
// after detaching whatever is mounted there, and opens its root.
func (l *Layer) mountSpace(sp *layerSpace) error {
	mountSlots <- struct{}{}
	defer func() { <-mountSlots }()
	sp.gen++
	work := filepath.Join(sp.work, "g"+strconv.Itoa(sp.gen))
	if err := removeLocal(work); err != nil {
		return fmt.Errorf("staged: %w", err)
	}
	if err := safepath.MkdirAll(work, 0o700); err != nil {
		return fmt.Errorf("staged: %w", err)
	}
	if l.userns {
		fd, err := mountInUserNS(sp, work)
		if err != nil {
			return err
		}
		l.setMerged(sp, fd)
		l.dropOldWork(sp, work)
		return nil
	}
	if err := asMounter(func() error {
		if sp.mounted && mountBeneath(sp, work) {
			return nil
		}
		if err := unmountUnder(sp.merged); err != nil {
			return fmt.Errorf("staged: %w", err)
		}
		sp.mounted = false
		opt := "lowerdir=" + lowerFDPath(sp.lowerFD) + ",upperdir=" + sp.upper + ",workdir=" + work +
			",userxattr,redirect_dir=nofollow,index=off,metacopy=off,xino=off"
		if err := unix.Mount("overlay", sp.merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opt); err != nil {
			if err == unix.EPERM {
				return ErrLayerUnavailable
			}
			return fmt.Errorf("staged: mount the layer of %s: %w", sp.name, err)
		}
		sp.mounted = true
		return nil
	}); err != nil {
		return err
	}
	fd, err := safepath.OpenDir(sp.merged)
	if err != nil {
		return fmt.Errorf("staged: merged %s: %w", sp.name, err)
	}
	l.setMerged(sp, fd)
	l.dropOldWork(sp, work)
	return nil
}

// setMerged makes fd sp's merged root (Before reads the view through it).
func (l *Layer) setMerged(sp *layerSpace, fd int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sp.mergedFD >= 0 {
		unix.Close(sp.mergedFD)
	}
	sp.mergedFD = fd
}

// dropOldWork removes the work directories of sp's earlier mounts.
func (l *Layer) dropOldWork(sp *layerSpace, keep string) {
	names, _ := os.ReadDir(sp.work)
	for _, n := range names {
		if p := filepath.Join(sp.work, n.Name()); p != keep {
			_ = removeLocal(p) // retried at the next mount, and at open
		}
	}
}

// RemountFunc runs mount with the session's view of spaces held back (no
// operation in flight, none started until it returns) and serves each
// space from the descriptor mount gives for it (an O_PATH descriptor of
// its new merged root, which it takes; none or -1: it stays).
// fsys.View.RemountSpaces is one.
type RemountFunc func(spaces []string, mount func() (map[string]int, error)) error

// SetRemount tells the layer how to hold back its view while it changes
// and mounts a space again (commit, discard, Remount). Without one (no
// view serves the layer) it does so at once.
func (l *Layer) SetRemount(f RemountFunc) {
	l.mu.Lock()
	l.remountView = f
	l.mu.Unlock()
}

// exclusive runs edit on sp's upper directory with the view held back,
// then mounts sp again and moves the view onto it.
func (l *Layer) exclusive(sp *layerSpace, edit func() error) error {
	return l.exclusiveAll([]*layerSpace{sp}, edit)
}

// exclusiveAll is exclusive of several spaces under one hold of the view.
func (l *Layer) exclusiveAll(sps []*layerSpace, edit func() error) error {
	l.mu.Lock()
	f := l.remountView
	l.mu.Unlock()
	names := make([]string, len(sps))
	for i, sp := range sps {
		names[i] = sp.name
	}
	mount := func() (map[string]int, error) {
		errs := []error{nil}
		if edit != nil {
			errs[0] = asDaemon(edit)
		}
		fds := map[string]int{}
		for _, sp := range sps {
			if err := l.mountSpace(sp); err != nil {
				errs = append(errs, err)
				continue
			}
			fd, err := unix.FcntlInt(uintptr(sp.mergedFD), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			fds[sp.name] = fd
		}
		return fds, errors.Join(errs...)
	}
	if f == nil {
		fds, err := mount()
		for _, fd := range fds {
			unix.Close(fd)
		}
		return err
	}
	return f(names, mount)
}

// Remount mounts space's layer again, so that the view shows the backing
// tree as it is now wherever the layer holds nothing.
func (l *Layer) Remount(space string) error {
	sp, ok := l.spaces[space]
	if !ok {
		return fmt.Errorf("staged: no space %q", space)
	}
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return nil
	}
	return l.exclusive(sp, nil)
}

// whiteout makes p in the upper directory root a whiteout, as overlayfs
// makes one.
func whiteout(root int, p string) error {
	pfd, name, err := openParent(root, p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil && err != unix.EEXIST {
		return err
	}
	return nil
}

func setOpaque(root int, p string, on bool) error {
	fd, err := safepath.Beneath(root, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if on {
		return unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0)
	}
	if err := unix.Fremovexattr(fd, opaqueXattr); err != nil && err != unix.ENODATA {
		return err
	}
	return nil
}

// revealAbove makes every opaque directory of the layer above p (a path
// the backing tree has) transparent without changing what the view shows
// of it: each backing name it hid gets a whiteout (unless the layer holds
// an entry there), each directory of the layer below it over a backing
// directory is made opaque in turn, and then its own mark goes. Removing
// p's entry from the layer then shows the backing's. Run again after a
// crash it ends the same.
func revealAbove(sp *layerSpace, p string) error {
	if p == "/" {
		return nil
	}
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	dir := "/"
	for _, s := range segs[:len(segs)-1] {
		dir = joinPath(dir, s)
		if !isOpaque(sp.upperFD, dir) {
			continue
		}
		names, err := listDir(sp.lowerFD, dir)
		if err == nil {
			for _, n := range names {
				q := joinPath(dir, n)
				var up unix.Stat_t
				if lstatBeneath(sp.upperFD, q, &up) != nil {
					if err := whiteout(sp.upperFD, q); err != nil {
						return err
					}
					continue
				}
				low, err := lowerState(sp.lowerFD, q)
				if err != nil {
					return err
				}
				if up.Mode&unix.S_IFMT == unix.S_IFDIR && low.T == "d" {
					if err := setOpaque(sp.upperFD, q, true); err != nil {
						return err
					}
				}
			}
		}
		if err := setOpaque(sp.upperFD, dir, false); err != nil {
			return err
		}
	}
	return nil
}

// pruneAbove removes from the layer the directories above p (deepest
// first) that hold nothing and show what the backing directory there has
// (its mode and owner; not opaque): a copy-up leaves them, and one left
// would show its own attributes over the backing's from then on.
func pruneAbove(sp *layerSpace, p string) { pruneFrom(sp, parentOf(p)) }

// pruneFrom is pruneAbove from the directory dir itself.
func pruneFrom(sp *layerSpace, dir string) {
	for ; dir != "/"; dir = parentOf(dir) {
		names, err := listDir(sp.upperFD, dir)
		if err != nil || len(names) > 0 || isOpaque(sp.upperFD, dir) {
			return
		}
		up, err := lowerState(sp.upperFD, dir)
		if err != nil || up.T != "d" {
			return
		}
		low, err := lowerState(sp.lowerFD, dir)
		if err != nil || low.T != "d" || low.Mode != up.Mode || low.UID != up.UID || low.GID != up.GID {
			return
		}
		pfd, name, err := openParent(sp.upperFD, dir)
		if err != nil {
			return
		}
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
		unix.Close(pfd)
		if err != nil {
			return
		}
	}
}

// neutralOpaque: the opaque directory dir of the layer hides nothing the
// backing tree has (each backing name there has an entry of the layer).
func neutralOpaque(sp *layerSpace, dir string) bool {
	names, err := listDir(sp.lowerFD, dir)
	if err != nil {
		return false
	}
	for _, n := range names {
		var st unix.Stat_t
		if lstatBeneath(sp.upperFD, joinPath(dir, n), &st) != nil {
			return false
		}
	}
	return true
}

// pruneCommitted removes from the layer what a commit made the backing
// tree hold (the same entry at the same path), so that the view shows the
// backing tree there, and what another writer changes there later. A file
// written in the session since the commit copied it stays. As the daemon
// (exclusive).
func (l *Layer) pruneCommitted(sp *layerSpace, done []staged, conflicts []Conflict) error {
	conflictUnder := func(dir string) bool {
		for _, c := range conflicts {
			p := strings.TrimSuffix(c.Path, "/")
			if c.Space == sp.name && (p == dir || strings.HasPrefix(p, dir+"/")) {
				return true
			}
		}
		return false
	}
	for _, c := range done { // parents first
		if c.up.T == "d" && isOpaque(sp.upperFD, c.path) && !conflictUnder(c.path) && neutralOpaque(sp, c.path) {
			if err := setOpaque(sp.upperFD, c.path, false); err != nil {
				return err
			}
		}
	}
	for i := len(done) - 1; i >= 0; i-- { // deepest first
		c := done[i]
		if c.up.T == "d" {
			pruneFrom(sp, c.path)
			continue
		}
		up, err := lowerState(sp.upperFD, c.path)
		if err != nil {
			return err
		}
		low, err := lowerState(sp.lowerFD, c.path)
		if err != nil {
			return err
		}
		same := up.T == c.up.T && (up.T == "w" || (up.Ino == c.up.Ino && up.Size == c.up.Size && up.Mtime == c.up.Mtime && up.Ctime == c.up.Ctime))
		if !same && !(up.T != "w" && sameEntry(sp, c.path, up, low)) {
			continue // written since: still the session's change
		}
		if err := removeBeneath(sp.upperFD, c.path); err != nil {
			return err
		}
		l.mu.Lock()
		err = l.forgetBase(key{c.space, c.path})
		l.mu.Unlock()
		if err != nil {
			return err
		}
		pruneAbove(sp, c.path)
	}
	return nil
}

// moveMountBeneath is MOVE_MOUNT_BENEATH (Linux 6.5).
const moveMountBeneath = 0x200

// fsmountOverlay makes an overlayfs mount of upper over lower, attached
// nowhere, and gives its descriptor.
func fsmountOverlay(lower, upper, work string) (int, error) {
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fs)
	for _, kv := range [][2]string{{"lowerdir", lower}, {"upperdir", upper}, {"workdir", work},
		{"redirect_dir", "nofollow"}, {"index", "off"}, {"metacopy", "off"}, {"xino", "off"}} {
		if err := unix.FsconfigSetString(fs, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("overlay %s=%s: %w", kv[0], kv[1], err)
		}
	}
	if err := unix.FsconfigSetFlag(fs, "userxattr"); err != nil {
		return -1, fmt.Errorf("overlay userxattr: %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create the overlay: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount: %w", err)
	}
	return m, nil
}

// asMounter runs f, which mounts a layer, on a thread of its own without
// CAP_DAC_READ_SEARCH, the credentials overlayfs then acts with. Without
// it, overlayfs notes no origin in a file it copies up (a file handle of
// the backing file it came from; an unprivileged daemon's mounts never
// have it either): with one, it takes the copy and that backing file for
// one inode wherever both are seen, as they are once another writer moves
// the backing file to another name (one answers ESTALE, and a listing of
// its directory does, or it shows the other's content). A copy has then a
// number of its own (its upper inode's) from the next mount on. The
// thread is never given back: its goroutine exits locked, which ends it.
func asMounter(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("staged: capget: %w", err)
			return
		}
		data[unix.CAP_DAC_READ_SEARCH/32].Effective &^= 1 << (unix.CAP_DAC_READ_SEARCH % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("staged: capset: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// mountBeneath mounts sp's layer afresh beneath the mount on its merged
// directory and then detaches that one: the merged directory never shows
// an empty directory between the two (a path resolved there meanwhile
// reaches one mount or the other). False, with nothing changed, where the
// kernel cannot (then the old mount is detached first).
func mountBeneath(sp *layerSpace, work string) bool {
	m, err := fsmountOverlay(lowerFDPath(sp.lowerFD), sp.upper, work)
	if err != nil {
		return false
	}
	defer unix.Close(m)
	if unix.MoveMount(m, "", unix.AT_FDCWD, sp.merged, unix.MOVE_MOUNT_F_EMPTY_PATH|moveMountBeneath) != nil {
		return false
	}
	// The old mount is on top now: it goes (once), the new one shows.
	if err := unix.Unmount(sp.merged, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		// Both stay stacked, the new one beneath: the fallback detaches
		// every mount there and mounts again.
		return false
	}
	return true
}
