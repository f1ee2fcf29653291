package fsys

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
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
// writes and fallocate through an open file by a caller other than root
// are too (change). A caller never gains authority over the bits: it sets
// none (a chmod is its own, made as the caller), and it clears them only
// on a file it changes, which it may write.
//
// A write is made as the caller whatever the file's mode, not only when
// an fstat finds a bit: the owner may set one between that fstat and the
// write, and a write made as a root daemon (CAP_FSETID) then keeps it, a
// setuid file with the writer's content, where natively the write, which
// lands after the chmod, clears it (TestSetIDSetBeforeAWriteLandsIsCleared).
// Only the write itself, made without CAP_FSETID, decides atomically.
// A thread usually keeps its caller's credentials between requests
// (creds.go), so most writes switch nothing.
//
// Left as it is: a caller of uid 0 writes as the daemon. Natively, root
// without CAP_FSETID (a capability-dropped root) clears the bits; through
// a view a root daemon's write keeps them (the kernel's
// FUSE_WRITE_KILL_SUIDGID, which says so, does not reach a handle through
// go-fuse's bridge). A uid 0 may chmod its own files as it likes.

// change runs a handle's change to its file's content (a write, fallocate)
// holding a place, as the caller unless the caller is root (or none: the
// daemon's own), so that the backing kernel clears the bits as natively.
func (h *fileHandle) change(ctx context.Context, work func() syscall.Errno) syscall.Errno {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Uid == 0 {
		h.changeDelay()
		return h.node.view.acts(work)
	}
	a, errno := h.node.view.become(ctx)
	if errno != 0 {
		return errno
	}
	defer a.restore()
	h.changeDelay()
	return work()
}

// changeDelay is the test build's window between choosing how a change
// acts and acting (hooks.changeDelay).
func (h *fileHandle) changeDelay() {
	if d := h.node.view.host.hooks.changeDelay; d > 0 {
		time.Sleep(d)
	}
}
