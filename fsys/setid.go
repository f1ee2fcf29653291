package fsys

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The setuid and setgid bits of a file that is written.
//
// Natively, a change to a file's content by a process without CAP_FSETID
// (a write, a truncate, an open with O_TRUNC, fallocate, a chown) clears
// its setuid bit, and its setgid bit where the group may execute it or the
// writer is not of the file's group, with no check of the writer's
// authority over the mode (the writer may change the file; the bits go
// with that). The views negotiate
// FUSE_HANDLE_KILLPRIV_V2, so the kernel sends the change alone and leaves
// the bits to the daemon, rather than first sending a chmod as the writer,
// which a writer who does not own the file may not make (EPERM).
//
// The daemon clears nothing itself: it makes the change as the caller, and
// the backing kernel clears what it clears natively for that caller.
// Truncates, O_TRUNC opens and chowns are made as the caller already;
// writes and fallocate through an open file are made as the caller when
// they would clear a bit (clearsSetID). A caller never gains authority over
// the bits: it sets none (a chmod is its own, made as the caller), and it
// clears them only on a file it changes, which it may write.

// clearsSetID reports whether a change by ctx's caller through fd would
// clear a bit of the file natively, so that it must be made as the caller:
// the caller is not root (root changes a file without clearing them) and
// the file has setuid or setgid (whether setgid goes depends on the
// caller's groups: the backing kernel decides). A file whose attributes
// cannot be read counts as having them.
func clearsSetID(ctx context.Context, fd int) bool {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Uid == 0 {
		return false
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return true
	}
	return st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0
}

// change runs a handle's change to its file's content (a write, fallocate)
// holding a place, as the caller when the change clears a bit the file
// has (clearsSetID): the backing kernel then clears it as natively.
func (h *fileHandle) change(ctx context.Context, work func() syscall.Errno) syscall.Errno {
	asCaller := false
	if errno := h.withFD(func(fd int) syscall.Errno {
		asCaller = clearsSetID(ctx, fd)
		return 0
	}); errno != 0 {
		return errno
	}
	if !asCaller {
		return h.node.view.acts(work)
	}
	a, errno := h.node.view.become(ctx)
	if errno != 0 {
		return errno
	}
	defer a.restore()
	return work()
}
