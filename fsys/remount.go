package fsys

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A staged view's backing is an overlayfs mount of the session's layer over
// the backing tree (docs/changes.md, "Staged sessions"). overlayfs never
// looks again at a lower entry it has looked up, so the layer is mounted
// afresh (a new overlayfs over the same upper directory) after each commit
// and discard, and when the backing tree changes beneath it; Remount swaps
// the view onto the new mount.
//
// The backing's root descriptor keeps its number: dup3 points it at the new
// mount's root, atomically, so an operation resolving beneath it in another
// thread reaches either the old mount or the new, whole, and a number is
// never closed under it. Inodes keep their identity across mounts: every
// mount of the layer has a device of its own, and each is read as the
// first's (canonDev), so a node (and a process's working directory) looked
// up before a remount still names its inode after it. What a mount of the
// layer shows is the upper directory's and the backing tree's, and with
// the state directory on the backing tree's filesystem overlayfs gives
// every inode the number it has there, the same in every mount.

// mergedGens are the overlayfs mounts a merged backing's root has stood
// for: their devices and mount ids, oldest first, at most maxGens.
type mergedGens struct{ devs, mnts []uint64 }

// maxGens bounds what a backing remembers of its mounts: a descriptor
// opened more remounts ago than this (by a process that kept it) has a
// device no longer read as the first's.
const maxGens = 64

func (b *backing) initGens() {
	g := &mergedGens{devs: []uint64{b.dev}}
	if b.key.mnt != 0 {
		g.mnts = []uint64{b.key.mnt}
	}
	b.gens.Store(g)
}

// canonDev is dev as the view names it: any mount of a merged backing's
// layer is the first.
func (b *backing) canonDev(dev uint64) uint64 {
	if dev == b.dev || !b.merged {
		return dev
	}
	if g := b.gens.Load(); g != nil && slices.Contains(g.devs, dev) {
		return b.dev
	}
	return dev
}

// ownMount: mnt is a mount of b (any of a merged backing's).
func (b *backing) ownMount(mnt uint64) bool {
	if mnt == b.key.mnt {
		return true
	}
	if !b.merged {
		return false
	}
	g := b.gens.Load()
	return g != nil && slices.Contains(g.mnts, mnt)
}

// pastMount: fd is on a mount of a merged backing that is no longer its
// current one (detached by a remount): the kernel names what is on it
// from that mount's root, which is the space's root.
func (b *backing) pastMount(fd int) bool {
	mnt, ok := b.mountOf(fd)
	return ok && mnt != b.curMnt.Load()
}

// mountOf gives the mount fd is on if it is one of a merged backing's.
func (b *backing) mountOf(fd int) (uint64, bool) {
	if !b.merged {
		return 0, false
	}
	var stx unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx) != nil || stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0, false
	}
	return stx.Mnt_id, b.ownMount(stx.Mnt_id)
}

// fstat is unix.Fstat with the device as the view names it.
func (b *backing) fstat(fd int, st *unix.Stat_t) error {
	err := unix.Fstat(fd, st)
	st.Dev = b.canonDev(st.Dev)
	return err
}

// swapRoot points b's root descriptor at fd, a new mount's root (fd is
// closed).
func (b *backing) swapRoot(fd int) error {
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Ino != b.root.Ino {
		return fmt.Errorf("the new mount's root is another directory (inode %d, not %d)", st.Ino, b.root.Ino)
	}
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		return err
	}
	old := b.gens.Load()
	g := &mergedGens{devs: append(slices.Clone(old.devs), st.Dev), mnts: append(slices.Clone(old.mnts), stx.Mnt_id)}
	// The first mount's device names every inode: it stays.
	if len(g.devs) > maxGens {
		g.devs = append(g.devs[:1], g.devs[len(g.devs)-maxGens+1:]...)
	}
	if len(g.mnts) > maxGens {
		g.mnts = append(g.mnts[:1], g.mnts[len(g.mnts)-maxGens+1:]...)
	}
	b.gens.Store(g)
	if err := unix.Dup3(fd, b.fd, unix.O_CLOEXEC); err != nil {
		return err
	}
	b.curMnt.Store(stx.Mnt_id)
	return nil
}

// ErrNotStaged: Remount names a space the view does not serve from a
// staged layer.
var ErrNotStaged = errors.New("the space is not served from a staged layer")

// Remount runs mount with every operation of the view held back (none is
// in flight while it runs, and none starts until it returns), and swaps
// the space onto the mount it gives (an O_PATH descriptor of the new
// merged root, taken; -1 for none: the view stays on its mount). mount
// changes the layer beneath the view and mounts it again: an operation
// resolved on the old mount never changes the layer after the new one has
// looked at it. Before Remount returns the kernel keeps nothing of the
// space from before (every entry expired or dropped, every node's
// attributes and cached pages), as a switch keeps nothing it changes.
//
// The view's open files move onto the new mount with their offsets and
// locks (remount_handles.go); a file the remount's edit removed from the
// layer stays open on the old one, where it reads and writes the inode it
// opened, one no path names any more.
func (v *View) Remount(spaceName string, mount func() (int, error)) error {
	return v.RemountSpaces([]string{spaceName}, func() (map[string]int, error) {
		fd, err := mount()
		return map[string]int{spaceName: fd}, err
	})
}

// RemountSpaces is Remount of several spaces under one hold of the view:
// mount gives each space's new root (a space it leaves out, or gives -1,
// stays on its mount). A change of the layer that spans spaces (a
// rollback) is never seen half made.
func (v *View) RemountSpaces(names []string, mount func() (map[string]int, error)) error {
	sps := make([]space, len(names))
	for i, n := range names {
		sp, ok := spaceByName(n)
		if !ok {
			return fmt.Errorf("remount: no space %q", n)
		}
		sps[i] = sp
	}
	// The backings stay the view's (release waits) until the swap is
	// done: a root descriptor is never closed under dup3.
	v.spaces.mu.Lock()
	served := false
	for _, sp := range sps {
		if b := v.spaces.dirs[sp]; b != nil {
			if !b.merged {
				v.spaces.mu.Unlock()
				return ErrNotStaged
			}
			served = true
		}
	}
	if v.closed.Load() || !served {
		// Nothing to hold back or swap: the layer still changes.
		defer v.spaces.mu.Unlock()
		fds, err := mount()
		closeFDs(fds)
		return err
	}
	v.remountMu.Lock()
	for _, sp := range sps {
		if b := v.spaces.dirs[sp]; b != nil {
			b.remounting.Store(true) // until its root is swapped
		}
	}
	fds, err := mount()
	for i, n := range names {
		fd, ok := fds[n]
		if !ok || fd < 0 {
			continue
		}
		delete(fds, n)
		b := v.spaces.dirs[sps[i]]
		if b == nil {
			unix.Close(fd)
			continue
		}
		if serr := b.swapRoot(fd); serr != nil {
			err = errors.Join(err, serr)
			continue
		}
		moved, kept := v.moveHandles(sps[i], b)
		v.log.Debug("remount", "space", n, "files moved", moved, "files left on the old mount", kept)
	}
	closeFDs(fds) // spaces it was not asked for
	for _, sp := range sps {
		if b := v.spaces.dirs[sp]; b != nil {
			b.remounting.Store(false)
		}
	}
	v.remountMu.Unlock()
	var swapped []space
	for _, sp := range sps {
		if v.spaces.dirs[sp] != nil {
			swapped = append(swapped, sp)
		}
	}
	v.spaces.mu.Unlock()
	for _, sp := range swapped {
		v.remounted(sp)
	}
	if err != nil {
		return fmt.Errorf("remount %s: %w", strings.Join(names, ", "), err)
	}
	return nil
}

func closeFDs(fds map[string]int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// remounted drops what the kernel caches of space sp: any entry, listing,
// attribute or page of it may differ on the new mount.
func (v *View) remounted(sp space) {
	if v.closed.Load() {
		return
	}
	v.dropListings(func(n *node, _, _ bool) bool { return n != nil && n.space == sp })
	top := v.root.EmbeddedInode().GetChild(sp.String())
	if top == nil {
		return
	}
	below := v.stale()
	if below != entryExpired {
		below = entryDropped
	}
	v.restoredBelow(top, below)
	v.notifyFate(v.root.EmbeddedInode(), sp.String(), v.stale())
}

// staged: the view serves a space from a staged layer; its operations
// then hold remountMu (become).
func (v *View) staged() bool {
	for _, b := range v.spaces.dirs {
		if b != nil && b.merged {
			return true
		}
	}
	return false
}
