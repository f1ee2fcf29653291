package daemon

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/changes"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/fsys"
	"github.com/condfs/condfs/internal/fuseconn"
	"github.com/condfs/condfs/internal/safepath"
)

// mountView confines the mountpoint (docs/security.md, "The control socket"), clears a
// dead mount there that the peer may use, and mounts.
func (d *Daemon) mountView(r openRequest, mount string, layer *changes.Layer) (*fsys.View, *control.Error) {
	fd, cerr := d.mountpoint(r.peer, mount)
	if cerr != nil {
		return nil, cerr
	}
	defer unix.Close(fd)
	id := r.id
	memories, workspace, memOver, wsOver := d.cfg.Memories, d.cfg.Workspace, "", ""
	memRoot, wsRoot := 0, 0
	if layer != nil {
		// A staged view serves the layer merged over the backing tree,
		// from the layer's descriptors of its mounts (which an
		// unprivileged daemon's are attached nowhere).
		memories, workspace, memOver, wsOver = layer.Merged("memories"), layer.Merged("workspace"), memories, workspace
		memRoot, wsRoot = layer.MergedRoot("memories"), layer.MergedRoot("workspace")
	}
	var onNames func(space, path string)
	if layer != nil && !layer.Watched() && !d.cfg.NoStagedWatch {
		// No fanotify watch (a daemon that is not root): the view's own
		// watch of the backing directories it looked up tells the layer.
		onNames = layer.BackingNamesChanged
	}
	v, err := d.host.Mount(fsys.Options{
		Mountpoint: mount, MountFD: fd, Memories: memories, Workspace: workspace, MemoriesOver: memOver, WorkspaceOver: wsOver,
		MemoriesRoot: memRoot, WorkspaceRoot: wsRoot, OnBackingNames: onNames,
		Rules: d.conditions, Replaced: &d.replaced, Context: r.atoms, Owner: r.owner, AllowUIDs: r.allowUIDs,
		AllowHardlinks: d.cfg.AllowHardlinks, AllowOther: d.cfg.AllowOther,
		OnDeny: func(atoms cctx.Set, sp acl.Space, p, op string) {
			d.auditPath(id, atoms, sp, p, op)
		},
	})
	if err != nil {
		return nil, control.Errorf(control.CodeMount, "mount %s: %v", mount, err)
	}
	return v, nil
}

// mountpoint opens the directory a view is to be mounted on, without
// following a symlink in any component. Root and the daemon's uid mount
// where they name (missing directories are created). Any other peer mounts
// on an empty directory it owns, or under MountRoot, where the daemon makes
// the directory itself; the daemon creates nothing elsewhere for it. A dead
// FUSE mount there is cleared only once the peer may use the directory
// (clearDead); a live one is refused by Host.Mount, after these checks.
func (d *Daemon) mountpoint(peer uint32, mount string) (int, *control.Error) {
	under := filepath.Dir(mount) == filepath.Clean(d.cfg.MountRoot)
	switch {
	case privileged(peer):
		if err := safepath.MkdirAll(mount, 0o755); err != nil {
			return -1, control.Errorf(control.CodeMount, "create mountpoint: %v", err)
		}
	case under:
		if err := safepath.MkdirAll(d.cfg.MountRoot, 0o755); err != nil {
			return -1, control.Errorf(control.CodeMount, "create --mount-root: %v", err)
		}
		if err := unix.Mkdir(mount, 0o700); err != nil && err != unix.EEXIST {
			return -1, control.Errorf(control.CodeMount, "create mountpoint %s: %v", mount, err)
		}
	}
	fd, cerr := d.clearDead(peer, mount, under)
	if cerr != nil {
		return -1, cerr
	}
	if privileged(peer) {
		return fd, nil
	}
	fail := func(format string, args ...any) (int, *control.Error) {
		unix.Close(fd)
		return -1, control.Errorf(control.CodeForbidden, format, args...)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail("mountpoint %s: %v", mount, err)
	}
	if !d.mayOwn(peer, st.Uid, under) {
		return fail("%s", d.notYours(peer, mount, st.Uid))
	}
	if empty, err := safepath.Empty(fd); err != nil || !empty {
		return fail("mountpoint %s must be an empty directory", mount)
	}
	if under && st.Uid != peer {
		// The daemon made it: give it to the peer, through the fd.
		if err := unix.Fchownat(fd, "", int(peer), -1, unix.AT_EMPTY_PATH); err != nil {
			return fail("mountpoint %s: %v", mount, err)
		}
	}
	return fd, nil
}

// mayOwn reports whether peer may mount on a directory owned by uid.
func (d *Daemon) mayOwn(peer, uid uint32, under bool) bool {
	return uid == peer || (under && uid == uint32(os.Geteuid()))
}

func (d *Daemon) notYours(peer uint32, mount string, uid uint32) string {
	return fmt.Sprintf("mountpoint %s is owned by uid %d: uid %d may mount only on an empty directory it owns, or under %s", mount, uid, peer, d.cfg.MountRoot)
}

// clearDead opens the mountpoint without following a symlink and unmounts
// the dead FUSE mounts (a crashed daemon's) stacked on it, each through the
// fd that was checked, so that no path is resolved again between the check
// and the unmount. For a peer other than root and the daemon's uid it does
// so only where the peer may mount (mayClear): the daemon's privilege never
// unmounts what the peer could not use.
func (d *Daemon) clearDead(peer uint32, mount string, under bool) (int, *control.Error) {
	for range 8 {
		fd, err := safepath.OpenDir(mount)
		if err != nil {
			return -1, control.Errorf(control.CodeMount, "mountpoint: %v", err)
		}
		// A probe error or a live mount is left to the checks that follow:
		// nothing about a directory is told to a peer it does not own.
		if state, err := fuseconn.Probe(fd); err != nil || state != fuseconn.DeadFUSE {
			return fd, nil
		}
		if !privileged(peer) {
			if cerr := d.mayClear(peer, mount, under, fd); cerr != nil {
				unix.Close(fd)
				return -1, cerr
			}
		}
		err = fuseconn.UnmountDead(fd, mount)
		unix.Close(fd)
		if err != nil {
			return -1, control.Errorf(control.CodeMount, "%v", err)
		}
		d.log.Info("cleared a dead mount", "mountpoint", mount, "peer", peer)
	}
	return -1, control.Errorf(control.CodeMount, "clear stale mounts on %s: too many stacked", mount)
}

// mayClear reports whether peer may have the dead mount fd stands for
// cleared: the mount must be the topmost one on the entry mount names in
// its parent, and the directory beneath it one the peer may mount on. That
// directory is seen in a clone of the parent made without the mounts below
// it (open_tree without AT_RECURSIVE, which needs CAP_SYS_ADMIN: without it,
// the answer is no). A mountpoint cannot be renamed or removed while
// mounted on, so the entry stays the one checked.
func (d *Daemon) mayClear(peer uint32, mount string, under bool, fd int) *control.Error {
	refuse := func(why string) *control.Error {
		d.log.Warn("a dead mount is left alone", "mountpoint", mount, "peer", peer, "why", why)
		return control.Errorf(control.CodeForbidden, "mountpoint %s: uid %d may mount only on an empty directory it owns, or under %s", mount, peer, d.cfg.MountRoot)
	}
	parent, err := safepath.OpenDir(filepath.Dir(mount))
	if err != nil {
		return refuse("its parent: " + err.Error())
	}
	defer unix.Close(parent)
	base := filepath.Base(mount)
	top, err := fuseconn.MountID(parent, base)
	ours, err2 := fuseconn.MountID(fd, "")
	if err != nil || err2 != nil || top != ours {
		return refuse("it changed while being checked")
	}
	clone, err := unix.OpenTree(parent, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return refuse("the directory beneath it cannot be seen (open_tree: " + err.Error() + ")")
	}
	defer unix.Close(clone)
	var st unix.Stat_t
	if err := unix.Fstatat(clone, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return refuse("the directory beneath it cannot be seen")
	}
	if !d.mayOwn(peer, st.Uid, under) {
		return control.Errorf(control.CodeForbidden, "%s", d.notYours(peer, mount, st.Uid))
	}
	return nil
}
