package fuseconn

import (
	"errors"
	"fmt"

	"github.com/condfs/condfs/internal/safepath"
	"golang.org/x/sys/unix"
)

// MountState is what a mountpoint's O_PATH fd stands on.
type MountState int

const (
	// Plain is a directory that is not the root of a FUSE mount.
	Plain MountState = iota
	// LiveFUSE is the root of a FUSE mount whose server answers: two views
	// on one mountpoint would hide each other, so nothing mounts there.
	LiveFUSE
	// DeadFUSE is a mount whose connection is gone (ENOTCONN), left behind
	// by a crashed daemon.
	DeadFUSE
)

const fuseSuperMagic = 0x65735546

// Probe tells what the directory fd (O_PATH is enough) stands on. Liveness
// is probed with fstatfs, which always reaches the FUSE server (the mount
// root's own attributes may still be cached); it works on the fd, so no
// path is resolved again. It costs the same whatever the number of mounts
// (no reading of /proc/self/mountinfo).
func Probe(fd int) (MountState, error) {
	var sfs unix.Statfs_t
	err := unix.Fstatfs(fd, &sfs)
	switch {
	case err == nil && sfs.Type == fuseSuperMagic && isMountRoot(fd):
		return LiveFUSE, nil
	case err == nil:
		return Plain, nil
	case errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED):
		return DeadFUSE, nil
	}
	return Plain, fmt.Errorf("probe the mountpoint: %w", err)
}

// UnmountDead detaches the dead mount whose root fd stands for (Probe
// said DeadFUSE), through the fd: the mount unmounted is the one the caller
// opened and checked, whatever the path mp names by now. Without the
// privilege to, fusermount3 clears a FUSE mount of the daemon's own uid,
// resolving mp itself with that uid's authority only.
func UnmountDead(fd int, mp string) error {
	err := unix.Unmount(procPath(fd), unix.MNT_DETACH)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("clear the dead mount on %s: %w", mp, err)
	}
	if err2 := FusermountUnmount(mp); err2 != nil {
		return fmt.Errorf("clear the dead mount on %s: %v; %w", mp, err, err2)
	}
	return nil
}

// ClearStale unmounts the dead FUSE mounts stacked on mp, a path the
// daemon's own config names (the hub, a --mount at start), opened without
// following a symlink. A live FUSE mount there is an error. A mountpoint
// named by a peer is confined first (the daemon's mountpoint check), then
// cleared with Probe and UnmountDead on the checked fd.
func ClearStale(mp string) error {
	for range 8 {
		fd, err := safepath.OpenDir(mp)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		state, err := Probe(fd)
		if err == nil && state == DeadFUSE {
			err = UnmountDead(fd, mp)
		}
		unix.Close(fd)
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", mp, err)
		case state == LiveFUSE:
			return fmt.Errorf("%s is already a live FUSE mount; unmount it or pick another mountpoint", mp)
		case state == Plain:
			return nil
		}
	}
	return fmt.Errorf("clear stale mounts on %s: too many stacked", mp)
}

// isMountRoot reports whether fd is the root of a mount (statx's
// STATX_ATTR_MOUNT_ROOT, Linux ≥ 5.8; on older kernels, a different mount
// id than its parent's). Asking for the mount id alone never reaches a
// FUSE server.
func isMountRoot(fd int) bool {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		return false
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	}
	var parent unix.Statx_t
	if err := unix.Statx(fd, "..", 0, unix.STATX_MNT_ID, &parent); err != nil {
		return false
	}
	return parent.Mnt_id != stx.Mnt_id
}

// MountID is the kernel's id of the mount fd is on; asking for it never
// reaches a FUSE server, dead or alive.
func MountID(dirfd int, name string) (uint64, error) {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	var stx unix.Statx_t
	if err := unix.Statx(dirfd, name, flags, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, err
	}
	return stx.Mnt_id, nil
}
