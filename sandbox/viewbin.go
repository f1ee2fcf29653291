package sandbox

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Binaries of the view. The run shows /workspace and /memories noexec, so
// the kernel maps none of their files executable, by execve or by the ELF
// interpreter. A listed view path that the context allows is bound over
// itself, read-only and executable, from what the view shows there when
// the allowlist is set (at each command's start and each Allow); then, or
// when it is no longer allowed, the bind is made noexec and goes, by the
// descriptor it was made with, wherever it now is, and each set binds what
// the view shows then. A path the view does not show (absent, hidden, a
// symlink, not of the kind listed) gives nothing.
//
// What a run may ever execute there is read-only through the view itself,
// for every caller (fsys: decision.readOnly): no process of the run, by
// any descriptor or working directory, nor the agent's file tools, can
// write, make, remove or move it, or move a directory holding it, so
// nothing a session made is ever bound.

// attachView binds what the view shows at sl.place over itself, read-only
// and executable, as the owner the view admits. Nothing there to bind is
// not an error: the slot stays detached.
func (sl *slot) attachView(owner Spec) error {
	space, rel, ok := splitView(sl.place)
	if !ok {
		return fmt.Errorf("bind %s: not a path of the view", sl.place)
	}
	return asOwner(owner, func() error {
		root, err := unix.Open(space, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", space, err)
		}
		defer unix.Close(root)
		// Beneath the space's own mount (not through another bind), no
		// symlink: a link in the view must not make a host file
		// executable.
		at, err := unix.Openat2(root, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			return nil // absent, hidden, a link, or beneath another bind
		}
		defer unix.Close(at)
		var st unix.Stat_t
		if err := unix.Fstat(at, &st); err != nil {
			return nil
		}
		if mode := st.Mode & unix.S_IFMT; sl.dir && mode != unix.S_IFDIR || !sl.dir && mode != unix.S_IFREG {
			return nil
		}
		fd, err := unix.OpenTree(at, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
		if err != nil {
			return fmt.Errorf("clone %s: %w", sl.place, err)
		}
		attr := &unix.MountAttr{Attr_set: attrRO, Attr_clr: unix.MOUNT_ATTR_NOEXEC}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("set attributes of %s: %w", sl.place, err)
		}
		if err := attachAt(fd, at, sl.place); err != nil {
			unix.Close(fd)
			return err
		}
		sl.spare, sl.attached = fd, true
		return nil
	})
}

// detachView removes sl's bind, if any, by the descriptor of its root: a
// rename in the view may have moved it. It is made noexec first, so that a
// process still in it (its cwd, an open file) executes nothing from it once
// it is detached.
//
// A bind the kernel took away itself (EINVAL: its place was invalidated,
// as every entry is after a reload, and walked through) can no longer be
// made noexec, and a running command may hold a file opened through it,
// which it could map executable whatever the context says next. While a
// command may run (live), such a bind is kept as a ghost as long as the
// slot stays allowed, and withdrawing a slot with a ghost is an error: the
// run, whose allowlist cannot follow, is killed. Between commands no
// process of the run is left to hold one, and ghosts go.
func (sl *slot) detachView(live, stillAllowed bool) error {
	if !live {
		sl.dropGhosts()
	}
	if live && !stillAllowed && len(sl.ghosts) > 0 {
		return fmt.Errorf("unbind %s: a bind the kernel took away may still be held", sl.place)
	}
	if !sl.attached {
		return nil
	}
	err := unix.MountSetattr(sl.spare, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOEXEC})
	if err == nil {
		err = unix.Unmount("/proc/self/fd/"+strconv.Itoa(sl.spare), unix.MNT_DETACH)
	}
	switch {
	case err == nil, errors.Is(err, unix.EINVAL) && !live:
		unix.Close(sl.spare)
	case errors.Is(err, unix.EINVAL) && stillAllowed && len(sl.ghosts) < maxGhosts:
		sl.ghosts = append(sl.ghosts, sl.spare)
	default:
		return fmt.Errorf("unbind %s: %w", sl.place, err)
	}
	sl.spare, sl.attached = -1, false
	return nil
}

// maxGhosts bounds the ghosts one slot keeps (one a reload at most); a run
// that would keep more is ended instead.
const maxGhosts = 64

// dropGhosts closes the descriptors of the binds the kernel took away.
func (sl *slot) dropGhosts() {
	for _, fd := range sl.ghosts {
		unix.Close(fd)
	}
	sl.ghosts = nil
}

// splitView splits a path of the view into its space's root and the path
// beneath it.
func splitView(p string) (space, rel string, ok bool) {
	for _, sp := range []string{"/workspace", "/memories"} {
		if r, ok := strings.CutPrefix(p, sp+"/"); ok && r != "" {
			return sp, r, true
		}
	}
	return "", "", false
}
